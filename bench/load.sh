#!/usr/bin/env bash
# Load test: 50 concurrent clients over 20 sandboxes (see bench/load.rs).
# Fails on any 5xx answer, log stream cut before its exit record, or
# command that did not exit 0.
#   bench/load.sh [--seconds N]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-docker.sh
sandbox-images/build.sh
cargo build --release --locked --bin sandboxd --example load
exec target/release/examples/load "$@"
