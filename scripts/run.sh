#!/usr/bin/env bash
# Runs sandboxd on this machine: makes sure an engine answers, builds the
# runtime image if missing, then starts the release build in the foreground.
# Extra arguments go to sandboxd (e.g. --config sandboxd.toml).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-docker.sh
SANDBOXD_IMAGE=${SANDBOXD_IMAGE:-sandboxd-runtime:latest} sandbox-images/build.sh
cargo build --release --locked
exec target/release/sandboxd "$@"
