#!/usr/bin/env bash
# .ci/tools.sh -- the terminal and browser the CLI's tests drive, as root, before pytest runs:
#   * tmux: tests/test_cli_top.py runs 'pilot top' in a detached session and reads its pane,
#   * chromium (Debian's): tests/test_cli_report.py opens 'pilot report''s page headless,
#   * a C compiler: the agent builds its spawn helper (agent/forkserver.c; tests/test_spawn_path.py).
# Idempotent: installs only what is missing.
set -euo pipefail
log() { echo ".ci/tools.sh: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "ERROR: must run as root (it installs packages)"; exit 1; }

missing=()
command -v tmux >/dev/null || missing+=(tmux)
command -v chromium >/dev/null || missing+=(chromium)
command -v cc >/dev/null || missing+=(gcc libc6-dev)
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]} (apt-get) ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/ci-tools-apt.log 2>&1 \
        || { apt-get update -q >>/tmp/ci-tools-apt.log 2>&1 \
             && apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/ci-tools-apt.log 2>&1; } \
        || { tail -20 /tmp/ci-tools-apt.log >&2; log "ERROR: apt-get install ${missing[*]} failed"; exit 1; }
fi
tmux -V >&2
chromium --version >&2
cc --version | head -n 1 >&2
