#!/usr/bin/env bash
# Benchmarks sandboxd against the engine floor (see bench/main.rs and
# bench/RESULTS.md). Needs an engine and the runtime image, like the tests.
#   bench/run.sh [--profile] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-docker.sh
sandbox-images/build.sh
cargo build --release --locked --bin sandboxd --example bench
exec target/release/examples/bench "$@"
