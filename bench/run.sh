#!/usr/bin/env bash
# Benchmarks sandboxd against the engine floor (see bench/main.rs and
# bench/RESULTS.md). Needs an engine (with runsc registered for the gVisor
# lines) and the runtime image, like the tests.
#   bench/run.sh [--runs N] [--profile]
#                [--only core|egress|gvisor|pty|pool|shaping|changes|checkpoints|mcp|e2b|burst|rate|sustained|sequential|fifty|density]
#                [--idle-secs S] [--json FILE]
# --runs N (default 3): the whole set N times, each line the median over
# runs; JSON (default bench/runs/DATE-COMMIT[-SECTION].json) keeps every
# run's figures and samples.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-docker.sh
sandbox-images/build.sh
# The E2B section's client: E2B's Python SDK, pinned as the tests pin it.
venv=target/e2b-python-venv
if ! cmp -s clients/e2b-python/requirements.txt "$venv/requirements.txt"; then
  python3 -m venv --clear "$venv"
  "$venv/bin/pip" install --quiet -r clients/e2b-python/requirements.txt
  cp clients/e2b-python/requirements.txt "$venv/requirements.txt"
fi
cargo build --release --locked --bin sandboxd --example bench
exec target/release/examples/bench "$@"
