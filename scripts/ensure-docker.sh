#!/usr/bin/env bash
# Make sure a Docker engine answers. On a Debian machine where we are root and
# none runs (our development and CI machines), install Debian's docker.io,
# start dockerd in the background and wait, bounded, until it answers.
# Prints what it did; exits non-zero with a reason when it cannot.
set -euo pipefail

log() { echo "ensure-docker: $*" >&2; }

engine_answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && engine_answers; then
  log "engine already answers (server $(docker version --format '{{.Server.Version}}'))"
  exit 0
fi

if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
  log "no Docker engine answers, and this is not a root Debian machine: start one yourself (e.g. 'sudo systemctl start docker')"
  exit 1
fi

if ! command -v dockerd >/dev/null 2>&1; then
  log "installing docker.io from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker.io iptables ca-certificates >/dev/null
fi

# gVisor (runsc) as an extra OCI runtime, registered before we start the
# daemon; we never restart an engine someone else runs. On these machines
# runsc needs the container's own network namespace, and ptrace starts
# programs faster than systrap, its default (bench/RESULTS.md). bookworm's
# own runsc (2022-12) rejects statx(AT_NO_AUTOMOUNT), so coreutils' ls and
# stat fail inside; bookworm-backports carries a 2024 build that works.
runsc_release() { runsc --version 2>/dev/null | head -n 1 | grep -oE '[0-9]{8}' | head -n 1; }
register_runsc() {
  if [ "$(runsc_release || true)" \< 20240101 ]; then
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    log "installing runsc (gVisor) from ${codename}-backports"
    if [ -n "$codename" ] && ! grep -rqsE "^(deb .*|Suites:.*)${codename}-backports" /etc/apt/sources.list /etc/apt/sources.list.d; then
      echo "deb http://deb.debian.org/debian ${codename}-backports main" >/etc/apt/sources.list.d/backports.list
    fi
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -t "${codename}-backports" runsc >/dev/null; } ||
      log "runsc could not be installed from backports"
  fi
  if ! command -v runsc >/dev/null 2>&1; then
    log "no runsc; gVisor runtimes will be unavailable"
    return 0
  fi
  mkdir -p /etc/docker
  RUNSC=$(command -v runsc) python3 - <<'PY'
import json, os
path = "/etc/docker/daemon.json"
cfg = json.load(open(path)) if os.path.exists(path) else {}
cfg.setdefault("runtimes", {})["runsc"] = {
    "path": os.environ["RUNSC"],
    "runtimeArgs": ["--network=host", "--platform=ptrace"],
}
json.dump(cfg, open(path, "w"), indent=2)
PY
  log "registered runsc in /etc/docker/daemon.json"
}

if ! pgrep -x dockerd >/dev/null 2>&1; then
  register_runsc
  log "starting dockerd in the background (log: /var/log/dockerd.log)"
  # With every signal at its default: ignored signals are inherited across
  # exec, and the engine would pass its caller's on to every container.
  nohup python3 -c '
import os, signal
for s in range(1, signal.NSIG):
    try:
        signal.signal(s, signal.SIG_DFL)
    except (OSError, ValueError, RuntimeError):
        pass
os.execvp("dockerd", ["dockerd"])
' >/var/log/dockerd.log 2>&1 &
fi

deadline=$((SECONDS + 60))
until engine_answers; do
  if [ $SECONDS -ge $deadline ]; then
    log "dockerd did not answer within 60 s; last lines of /var/log/dockerd.log:"
    tail -n 20 /var/log/dockerd.log >&2 || true
    exit 1
  fi
  sleep 0.5
done
log "engine answers (server $(docker version --format '{{.Server.Version}}'); runtimes: $(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}'))"
