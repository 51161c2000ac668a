#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine of ours or any machine with
# Docker: makes sure an engine answers, builds the runtime image if missing,
# sweeps leftovers of earlier interrupted test runs, then runs the tests
# (cargo nextest when installed, cargo test otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-docker.sh
sandbox-images/build.sh

# Test servers use instances named sbt-*; a killed run can leave objects.
leftovers=$(docker ps -aq --filter 'name=^sbt-' || true)
[ -z "$leftovers" ] || docker rm -f $leftovers >/dev/null
for v in $(docker volume ls -q | grep '^sbt-' || true); do docker volume rm -f "$v" >/dev/null || true; done
for n in $(docker network ls --format '{{.Name}}' | grep '^sbt-' || true); do docker network rm "$n" >/dev/null || true; done

# tests/engine_restart.rs restarts the engine: it runs alone, after the rest.
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast -E 'not binary(engine_restart)' "$@"
  cargo nextest run --no-fail-fast -E 'binary(engine_restart)' "$@"
else
  args=()
  for t in tests/*.rs; do
    name=$(basename "$t" .rs)
    [ "$name" = engine_restart ] || args+=(--test "$name")
  done
  cargo test --no-fail-fast --lib "${args[@]}" "$@"
  cargo test --no-fail-fast --test engine_restart "$@"
fi
