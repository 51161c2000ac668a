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
# Then every suite that makes sandboxes runs again with all of them under
# gVisor (SANDBOXD_TEST_OCI_RUNTIME=runsc; see tests/common/mod.rs).
under_gvisor=(env SANDBOXD_TEST_OCI_RUNTIME=runsc)
if ! docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' | grep -qw runsc; then
  echo "test.sh: the engine has no runsc runtime, which the gVisor pass needs;" \
    "scripts/ensure-docker.sh registers it when it starts dockerd (see README, gVisor)" >&2
  exit 1
fi
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast -E 'not binary(engine_restart)' "$@"
  cargo nextest run --no-fail-fast -E 'binary(engine_restart)' "$@"
  "${under_gvisor[@]}" cargo nextest run --no-fail-fast \
    -E 'kind(test) and not binary(engine_restart) and not binary(gvisor) and not binary(http_contract)' "$@"
else
  args=()
  gvisor_args=()
  for t in tests/*.rs; do
    name=$(basename "$t" .rs)
    [ "$name" = engine_restart ] || args+=(--test "$name")
    case "$name" in engine_restart | gvisor | http_contract) ;; *) gvisor_args+=(--test "$name") ;; esac
  done
  cargo test --no-fail-fast --lib "${args[@]}" "$@"
  cargo test --no-fail-fast --test engine_restart "$@"
  "${under_gvisor[@]}" cargo test --no-fail-fast "${gvisor_args[@]}" "$@"
fi
