#!/usr/bin/env bash
# Builds the web console (ui/) into ui/dist, which build.rs embeds into
# sandboxd: `npm ci` from the lockfile, then the type check and the bundle.
# Run it before `cargo build` for a binary that serves the console at /ui/;
# without it sandboxd builds all the same and /ui/ says to run this.
set -euo pipefail
cd "$(dirname "$0")/../ui"
if ! command -v npm >/dev/null 2>&1; then
  echo "build-ui.sh: npm is missing (Debian: apt-get install nodejs npm)" >&2
  exit 1
fi
npm ci --no-audit --no-fund --loglevel=error
npm run --silent build
echo "build-ui.sh: built $(ls dist | wc -l) files into ui/dist" >&2
