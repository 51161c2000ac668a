#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine of ours or any machine with
# Docker: makes sure an engine answers, builds the runtime image if missing,
# sweeps leftovers of earlier interrupted test runs, then runs the tests
# (cargo nextest when installed, cargo test otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."

# What the suite needs besides an engine, installed from Debian's packages
# on a root Debian machine when missing: node and npm (the TypeScript
# client test and the web console's build), python3 with venv (the OpenAPI
# validator and Selenium, from PyPI), ip (the egress tests' network
# namespaces), chromium and its driver, and firefox-esr (the web console's
# browser tests). Those tests also need root.
need_root() {
  echo "test.sh: $1 is missing and this is not a root Debian machine: install it, or run as root" >&2
  exit 1
}
missing=()
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
[ -x /usr/bin/firefox-esr ] || missing+=(firefox-esr)
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then need_root "${missing[*]}"; fi
  echo "test.sh: installing ${missing[*]} from Debian's packages" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "$(id -u)" != 0 ]; then
  echo "test.sh: the egress tests make network namespaces and pause the engine: run as root" >&2
  exit 1
fi

scripts/ensure-docker.sh
sandbox-images/build.sh
# The web console, embedded into sandboxd by build.rs: the ui:: tests
# drive the real one.
scripts/build-ui.sh
# Firefox's WebDriver, geckodriver, has no Debian package: built from
# crates.io once into target/ (about 230 s of CPU), for the ui:: Firefox test.
[ -x target/geckodriver/bin/geckodriver ] ||
  cargo install --quiet --locked geckodriver --version 0.37.1 --root target/geckodriver

# Test servers use instances named sbt-*; a killed run can leave objects.
leftovers=$(docker ps -aq --filter 'name=^sbt-' || true)
[ -z "$leftovers" ] || docker rm -f $leftovers >/dev/null
for v in $(docker volume ls -q | grep '^sbt-' || true); do docker volume rm -f "$v" >/dev/null || true; done
for n in $(docker network ls --format '{{.Name}}' | grep '^sbt-' || true); do docker network rm "$n" >/dev/null || true; done

# The integration tests are one binary, tests/it, one module per capability.
# Its engine_restart module restarts and pauses the engine: it runs alone,
# after the rest, one test at a time. Then every module that makes
# sandboxes runs again with all of them under gVisor
# (SANDBOXD_TEST_OCI_RUNTIME=runsc; see tests/it/harness/mod.rs);
# openapi is about the document and its client, not the runtime; of mcp
# (the protocol over the same domain), of files_watch (gVisor's inotify), of
# e2b (E2B's Python SDK; its JavaScript SDK runs under runc only) and of ui
# (the web console) only their smoke tests run again.
under_gvisor=(env SANDBOXD_TEST_OCI_RUNTIME=runsc)
if ! docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' | grep -qw runsc; then
  echo "test.sh: the engine has no runsc runtime, which the gVisor pass needs;" \
    "scripts/ensure-docker.sh registers it when it starts dockerd (see README, gVisor)" >&2
  exit 1
fi
# docs/openapi.json must validate as OpenAPI 3.1: openapi-spec-validator
# from PyPI, in a venv of its own under target/.
validator=target/openapi-validator
if [ ! -x "$validator/bin/openapi-spec-validator" ]; then
  python3 -m venv "$validator"
  "$validator/bin/pip" install --quiet 'openapi-spec-validator==0.9.0'
fi
"$validator/bin/openapi-spec-validator" docs/openapi.json
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast -E 'not (binary(it) and test(/^engine_restart::/))' "$@"
  cargo nextest run --no-fail-fast --test-threads 1 -E 'binary(it) and test(/^engine_restart::/)' "$@"
  "${under_gvisor[@]}" cargo nextest run --no-fail-fast \
    -E 'binary(it) and not test(/^(engine_restart|gvisor|http_contract|openapi)::/) and not (test(/^mcp::/) and not test(/^mcp::smoke_/)) and not (test(/^files_watch::/) and not test(/^files_watch::smoke_/)) and not (test(/^ui::/) and not test(/^ui::smoke_/)) and not (test(/^e2b::/) and not test(/^e2b::smoke_/)) and not test(/^e2b_js::/)' "$@"
else
  # libtest filters match substrings of the test path (module::test).
  cargo test --no-fail-fast --workspace "$@" -- --skip engine_restart::
  cargo test --no-fail-fast --test it "$@" -- engine_restart:: --test-threads 1
  "${under_gvisor[@]}" cargo test --no-fail-fast --test it "$@" -- \
    --skip engine_restart:: --skip gvisor:: --skip http_contract:: --skip openapi:: --skip mcp:: \
    --skip files_watch:: --skip ui:: --skip e2b:: --skip e2b_js::
  "${under_gvisor[@]}" cargo test --no-fail-fast --test it "$@" -- mcp::smoke_ files_watch::smoke_ ui::smoke_ e2b::smoke_
fi
