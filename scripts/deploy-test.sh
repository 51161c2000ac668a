#!/usr/bin/env bash
# The deployment as operators run it, on a machine without a registry:
# builds the `prebuilt` sandboxd image on the offline Debian base, starts
# docker-compose.yml (+ docker-compose.prebuilt.yml) with Debian's
# docker-compose (v1), and drives a full flow with the token: health,
# create, a command with streamed logs, a file written and read, a published
# port fetched from the host, a session token; then restarts the stack and
# checks that the session and the token survived, and stops it. The "no route around the egress proxy"
# check aims at a listener of its own (a network namespace on this host, see
# start_listener) that a container with an ordinary route reaches. Needs
# root (apt-get, ip netns). Cleans up after itself, also on failure, and
# touches only objects of its own compose project and instance.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "deploy-test: $*" >&2; }
passed=0
ok() { passed=$((passed + 1)); log "ok - $*"; }
fail() { log "FAILED - $*"; echo "deploy-test: $passed passed, 1 failed"; exit 1; }

scripts/ensure-docker.sh
if ! command -v docker-compose >/dev/null 2>&1; then
  log "installing Debian's docker-compose"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null; }
fi
command -v jq >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null
sandbox-images/build.sh
BASE_IMAGE=$(sandbox-images/build.sh --base-only)
export BASE_IMAGE
log "building the web console and the release binary"
scripts/build-ui.sh
cargo build --release --locked --quiet
# The prebuilt image copies target/release/sandboxd from this directory;
# bring it here when CARGO_TARGET_DIR put it elsewhere.
target_dir=$(cargo metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
if ! [ "$target_dir/release/sandboxd" -ef target/release/sandboxd ]; then
  mkdir -p target/release
  cp "$target_dir/release/sandboxd" target/release/sandboxd
fi

export SANDBOXD_ADMIN_TOKEN
SANDBOXD_ADMIN_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export DOCKER_GID
DOCKER_GID=$(stat -c %g /var/run/docker.sock)
export SANDBOXD_INSTANCE="deploytest-$$"
export SANDBOXD_HOST_PORT
SANDBOXD_HOST_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export SANDBOXD_COMPOSE_IMAGE="sandboxd:deploytest-$$"
project="sbxdeploy$$"
base="http://127.0.0.1:$SANDBOXD_HOST_PORT"

compose() { docker-compose -p "$project" -f docker-compose.yml -f docker-compose.prebuilt.yml "$@"; }

# The listener a direct route would reach: a network namespace joined to
# the host by a veth pair, serving HTTP on a private address. The host
# routes to it like to any network outside, so a container whose traffic
# leaves through the host (an ordinary bridge network) reaches it; a
# sandbox, whose only way out is the egress proxy, must not.
listen_ns="sbxdt$$"
listen_ip=10.250.77.10
listen_net=10.250.77.8/30
listen_log=/tmp/deploy-test-listener-$$.log
listen_pid=""
direct_net="${project}-direct"

start_listener() {
  [ "$(id -u)" = 0 ] || fail "the route check needs root (ip netns)"
  if ip route show | grep -q '^10\.250\.77\.'; then
    fail "10.250.77.8/30 is already routed on this host; cannot place the listener"
  fi
  ip netns add "$listen_ns"
  ip link add "${listen_ns}h" type veth peer name "${listen_ns}n"
  ip link set "${listen_ns}n" netns "$listen_ns"
  ip addr add 10.250.77.9/30 dev "${listen_ns}h"
  ip link set "${listen_ns}h" up
  ip -n "$listen_ns" addr add "$listen_ip/30" dev "${listen_ns}n"
  ip -n "$listen_ns" link set "${listen_ns}n" up
  ip -n "$listen_ns" link set lo up
  ip -n "$listen_ns" route add default via 10.250.77.9
  mkdir -p "/tmp/deploy-test-www-$$"
  echo listener-$$ >"/tmp/deploy-test-www-$$/index.html"
  ip netns exec "$listen_ns" python3 -u -m http.server 80 --bind "$listen_ip" \
    --directory "/tmp/deploy-test-www-$$" >"$listen_log" 2>&1 &
  listen_pid=$!
  local deadline=$((SECONDS + 20))
  until [ "$(curl -s -m 2 "http://$listen_ip/index.html")" = "listener-$$" ]; do
    [ $SECONDS -lt $deadline ] || fail "the listener in netns $listen_ns did not answer the host"
    sleep 0.2
  done
}

# Requests the listener has served so far.
listener_hits() { grep -c '"GET ' "$listen_log" || true; }

cleanup() {
  [ -z "$listen_pid" ] || kill "$listen_pid" 2>/dev/null || true
  # Whatever else runs in our namespace (only what start_listener began).
  for p in $(ip netns pids "$listen_ns" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
  ip netns del "$listen_ns" 2>/dev/null || true
  ip link del "${listen_ns}h" 2>/dev/null || true
  rm -rf "/tmp/deploy-test-www-$$" "$listen_log" /tmp/deploy-test-ui.html
  docker network rm "$direct_net" >/dev/null 2>&1 || true
  compose logs --no-color >/tmp/deploy-test-sandboxd.log 2>&1 || true
  # -v: the project's state volume (the session tokens) goes too.
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  local f="label=sandboxd.instance=$SANDBOXD_INSTANCE"
  local ids
  ids=$(docker ps -aq --filter "$f")
  [ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
  ids=$(docker volume ls -q --filter "$f")
  [ -z "$ids" ] || docker volume rm -f $ids >/dev/null 2>&1 || true
  for n in $(docker network ls -q --filter "$f"); do docker network rm "$n" >/dev/null 2>&1 || true; done
  docker rmi "$SANDBOXD_COMPOSE_IMAGE" >/dev/null 2>&1 || true
}
trap cleanup EXIT

api() { # METHOD PATH [JSON]
  if [ $# -ge 3 ]; then
    curl -sS -m 60 -X "$1" -H "x-sandboxd-admin-token: $SANDBOXD_ADMIN_TOKEN" -H 'content-type: application/json' -d "$3" "$base$2"
  else
    curl -sS -m 60 -X "$1" -H "x-sandboxd-admin-token: $SANDBOXD_ADMIN_TOKEN" "$base$2"
  fi
}

wait_healthy() {
  local deadline=$((SECONDS + 90))
  until [ "$(curl -s -m 3 "$base/v1/health" | jq -r .ok 2>/dev/null)" = true ]; do
    [ $SECONDS -lt $deadline ] || { compose logs --no-color | tail -30 >&2; fail "sandboxd did not become healthy"; }
    sleep 0.5
  done
}

# Compose must refuse to start without the token.
if SANDBOXD_ADMIN_TOKEN= compose config >/dev/null 2>/tmp/deploy-test-notoken.err; then
  fail "compose accepted a missing SANDBOXD_ADMIN_TOKEN"
fi
grep -q SANDBOXD_ADMIN_TOKEN /tmp/deploy-test-notoken.err || fail "the refusal names SANDBOXD_ADMIN_TOKEN"
ok "compose refuses to start without SANDBOXD_ADMIN_TOKEN"

log "docker-compose up (project $project, port $SANDBOXD_HOST_PORT)"
compose up -d --build >/dev/null 2>&1 || { compose up -d --build; fail "compose up"; }
wait_healthy
version=$(curl -s "$base/v1/health" | jq -r .version)
ok "health ok (engine $version)"

cid=$(compose ps -q sandboxd)
[ "$(docker inspect -f '{{.Config.User}}' "$cid")" = "10001:10001" ] || fail "sandboxd runs as its non-root user"
state=""
for _ in $(seq 60); do
  state=$(docker inspect -f '{{.State.Health.Status}}' "$cid")
  [ "$state" = healthy ] && break
  sleep 1
done
[ "$state" = healthy ] || fail "the compose healthcheck reports $state"
ok "non-root, and the image healthcheck (sandboxd healthcheck) reports healthy"

[ "$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/sandboxes")" = 401 ] || fail "no token -> 401"
ok "the token is required"

ui_headers=$(curl -s -D - -o /tmp/deploy-test-ui.html "$base/ui/")
grep -qi "^content-security-policy: default-src 'self'" <<<"$ui_headers" || fail "/ui/ CSP: $ui_headers"
grep -q 'app.js' /tmp/deploy-test-ui.html || fail "/ui/ is the built console: $(head -c 300 /tmp/deploy-test-ui.html)"
ok "the web console is served at /ui/ with its CSP"

sid=$(api POST /v1/sandboxes '{"sessionKey":"deploy:1","ports":[3000]}' | jq -r .sandboxId)
[ -n "$sid" ] && [ "$sid" != null ] || fail "create"
ok "sandbox $sid created"

cmd=$(api POST "/v1/sandboxes/$sid/commands" '{"cmd":"bash","args":["-lc","for i in 1 2 3; do echo line$i; done"],"timeoutMs":30000,"detached":true}' | jq -r .commandId)
logs=$(api GET "/v1/sandboxes/$sid/commands/$cmd/logs")
[ "$(echo "$logs" | jq -r 'select(.stream=="stdout") | .data' | tr -d '\n')" = line1line2line3 ] || fail "streamed logs: $logs"
[ "$(api GET "/v1/sandboxes/$sid/commands/$cmd/wait" | jq -r .exitCode)" = 0 ] || fail "wait"
ok "command with streamed logs"

# The egress policy works with only the engine socket: a private address is
# refused by the proxy (before any connection is made), and there is no
# route around it. The address is the listener's, which answers a container
# with an ordinary route out (the control: same image, same curl, on a
# plain bridge network of this run), so a refusal in the sandbox is its
# network's doing, not an address nobody answers on or a broken client.
start_listener
docker network create --label "sandboxd.instance=$SANDBOXD_INSTANCE" "$direct_net" >/dev/null
control=$(docker run --rm --label "sandboxd.instance=$SANDBOXD_INSTANCE" --network "$direct_net" \
  "${SANDBOXD_IMAGE:-sandboxd-runtime:latest}" \
  curl -s -m 5 --noproxy '*' "http://$listen_ip/index.html" 2>&1) || true
[ "$control" = "listener-$$" ] || fail "control: a container with a direct route reaches the listener at $listen_ip: $control"
ok "control: the listener at $listen_ip answers a container with a direct route"
hits=$(listener_hits)
egress=$(api POST "/v1/sandboxes/$sid/commands:run" "{\"command\":\"curl -s -o /dev/null -w %{http_code} http://$listen_ip/index.html; echo; curl -s -m 3 --noproxy '*' -o /dev/null -w %{http_code} http://$listen_ip/index.html; echo\"}" | jq -r .stdout)
[ "$egress" = "$(printf '403\n000')" ] || fail "egress policy in compose: $egress"
[ "$(listener_hits)" = "$hits" ] || fail "the listener was reached from the sandbox: $(tail -3 "$listen_log")"
ok "egress policy: private refused by the proxy, no route around it (the listener saw nothing)"

content=$(printf 'deployed\n' | base64)
[ "$(api POST "/v1/sandboxes/$sid/files:write" "{\"files\":[{\"path\":\"/workspace/note.txt\",\"contentBase64\":\"$content\"}]}" | jq -r .ok)" = true ] || fail "write"
[ "$(api GET "/v1/sandboxes/$sid/files:read?path=/workspace/note.txt" | jq -r .contentBase64)" = "$content" ] || fail "read"
ok "file written and read"

api POST "/v1/sandboxes/$sid/commands" '{"command":"mkdir -p /tmp/www && echo served-from-compose > /tmp/www/index.html && cd /tmp/www && exec python3 -m http.server 3000 --bind 127.0.0.1","timeoutMs":600000}' >/dev/null
url=$(api GET "/v1/sandboxes/$sid/ports/3000?waitMs=15000" | jq -r .url)
case "$url" in http://127.0.0.1:*) ;; *) fail "port URL $url" ;; esac
[ "$(curl -s -m 5 "$url/index.html")" = served-from-compose ] || fail "fetching $url from the host"
ok "published port fetched from the host at $url"

token_id=$(api POST /v1/sessions/deploy:1/tokens '{"ttlMs":600000}' | jq -r .id)
[ -n "$token_id" ] && [ "$token_id" != null ] || fail "session token"
ok "session token $token_id made"

log "restarting the stack"
compose down >/dev/null 2>&1
compose up -d >/dev/null 2>&1
wait_healthy
again=$(api POST /v1/sandboxes '{"sessionKey":"deploy:1"}')
[ "$(echo "$again" | jq -r .sandboxId)" = "$sid" ] && [ "$(echo "$again" | jq -r .created)" = false ] || fail "rehydration: $again"
[ "$(api GET "/v1/sandboxes/$sid/files:read?path=note.txt" | jq -r .contentBase64)" = "$content" ] || fail "file after restart"
[ "$(curl -s -m 5 "$url/index.html")" = served-from-compose ] || fail "port URL after restart"
[ "$(api GET /v1/sessions/deploy:1/tokens | jq -r '.tokens[0].id')" = "$token_id" ] || fail "session token after restart"
ok "the session, its files, its URL and its token survived a restart of the stack"

[ "$(api POST "/v1/sandboxes/$sid:stop" | jq -r .ok)" = true ] || fail "stop"
[ -z "$(docker ps -aq --filter "label=sandboxd.sandbox_id=$sid")" ] || fail "containers left after stop"
ok "stop removed the sandbox and its proxy"

echo "deploy-test: $passed passed, 0 failed"
