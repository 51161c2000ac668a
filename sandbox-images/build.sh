#!/usr/bin/env bash
# Build sandboxd's runtime image (default: sandboxd-runtime:latest) from
# sandbox-images/default/Dockerfile.
#
# The Dockerfile is standard (ARG BASE_IMAGE=debian:bookworm-slim). Where that
# base can be pulled, it is used. Where no registry is reachable (our machines),
# the same Debian release is built as a rootfs with debootstrap and imported as
# a local base image; the Dockerfile is not changed.
#
#   build.sh                 build the runtime image unless it exists
#   build.sh --force         rebuild it even if it exists
#   build.sh --base-only     only make sure a base image exists; print its name
#
# Env: SANDBOXD_IMAGE (target tag), BASE_IMAGE (default debian:bookworm-slim),
#      OFFLINE_BASE_IMAGE (default sandboxd-base:bookworm), DEBIAN_MIRROR.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
image=${SANDBOXD_IMAGE:-sandboxd-runtime:latest}
base=${BASE_IMAGE:-debian:bookworm-slim}
offline_base=${OFFLINE_BASE_IMAGE:-sandboxd-base:bookworm}
suite=bookworm
force=0 base_only=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --base-only) base_only=1 ;;
    *) echo "usage: $0 [--force] [--base-only]" >&2; exit 2 ;;
  esac
done

log() { echo "build.sh: $*" >&2; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# The Debian mirror this machine's apt already uses, so that debootstrap goes
# where apt goes; debootstrap's own default otherwise.
host_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local uri
  uri=$(grep -hE '^\s*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '{print $2}' | grep -v -- '-security' | grep -E '/debian/?$' | head -n1 || true)
  if [ -z "$uri" ]; then
    uri=$(grep -hE '^\s*deb\s' /etc/apt/sources.list 2>/dev/null \
          | awk '{print $2}' | grep -v -- '-security' | grep -E '/debian/?$' | head -n1 || true)
  fi
  echo "$uri"
}

ensure_base() {
  if have_image "$base"; then echo "$base"; return; fi
  log "trying to pull $base"
  if timeout 60 docker pull "$base" >/dev/null 2>&1; then echo "$base"; return; fi
  log "cannot pull $base (no registry reachable?): using the offline base $offline_base"
  if have_image "$offline_base"; then log "$offline_base exists, reusing it"; echo "$offline_base"; return; fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      log "installing debootstrap from Debian's packages"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    else
      log "debootstrap is missing and cannot be installed here (need root on Debian)"; exit 1
    fi
  fi
  local mirror
  # Global, so the EXIT trap still sees it when this function has returned.
  rootfs=$(mktemp -d /tmp/sandboxd-rootfs.XXXXXX)
  trap 'rm -rf "${rootfs:-}"' EXIT
  mirror=$(host_mirror)
  log "debootstrap $suite (minbase) into $rootfs ${mirror:+from $mirror}; this takes a few minutes"
  debootstrap --variant=minbase "$suite" "$rootfs" ${mirror:+"$mirror"} >/tmp/sandboxd-debootstrap.log 2>&1 \
    || { tail -n 30 /tmp/sandboxd-debootstrap.log >&2; exit 1; }
  # What debian:*-slim images also do: no docs, no apt caches.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
  log "importing the rootfs as $offline_base"
  tar -C "$rootfs" -c . | docker import --change 'CMD ["bash"]' - "$offline_base" >/dev/null
  echo "$offline_base"
}

if [ "$base_only" = 1 ]; then ensure_base; exit 0; fi

if [ "$force" = 0 ] && have_image "$image"; then
  log "$image exists, reusing it (--force rebuilds)"
  exit 0
fi
base_image=$(ensure_base)
log "building $image from $base_image (full output: /tmp/sandboxd-image-build.log)"
# Only the step lines: the package manager's output would bury everything else.
if ! docker build --build-arg BASE_IMAGE="$base_image" -t "$image" "$here/default" >/tmp/sandboxd-image-build.log 2>&1; then
  tail -n 40 /tmp/sandboxd-image-build.log >&2
  log "building $image failed"
  exit 1
fi
grep -E '^Step [0-9]+/' /tmp/sandboxd-image-build.log | sed 's/^/build.sh:   /' >&2 || true
log "built $image"
