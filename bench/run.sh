#!/usr/bin/env bash
# Benchmarks sandboxd against the engine floor (see bench/main.rs and
# bench/RESULTS.md). Needs an engine (with runsc registered for the gVisor
# lines) and the runtime image, like the tests.
#   bench/run.sh [--runs N] [--profile]
#                [--only core|egress|gvisor|pty|pool|shaping|changes|mcp|burst|rate|sequential|density]
#                [--idle-secs S] [--json FILE]
# --runs N (default 3): the whole set N times, each line the median over
# runs; JSON (default bench/runs/DATE-COMMIT[-SECTION].json) keeps every
# run's figures and samples.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-docker.sh
sandbox-images/build.sh
cargo build --release --locked --bin sandboxd --example bench
exec target/release/examples/bench "$@"
