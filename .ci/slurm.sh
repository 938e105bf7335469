#!/usr/bin/env bash
# .ci/slurm.sh -- what the Slurm and MPI tests need on a CI machine, as root, before pytest runs:
#   * Debian's Open MPI (openmpi-bin) for the real `mpirun` tests (tests/test_launchers_mpi.py),
#   * the real 2-node Slurm cluster on this machine (../shared/slurm/start-slurm.sh; idempotent, and the
#     tests' session fixture calls it again, which costs under a second once it is up).
# Settings: SLURM_KIT (default: <repo>/../shared/slurm) and the SLURM_CI_* variables of start-slurm.sh.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
kit="${SLURM_KIT:-$repo/../shared/slurm}"
log() { echo ".ci/slurm.sh: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "ERROR: must run as root (it installs packages and starts slurmctld/slurmd)"; exit 1; }

if ! command -v mpirun >/dev/null; then
    log "installing openmpi-bin (apt-get) ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends openmpi-bin >/tmp/ci-openmpi-apt.log 2>&1 \
        || { apt-get update -q >>/tmp/ci-openmpi-apt.log 2>&1 \
             && apt-get install -y -q --no-install-recommends openmpi-bin >>/tmp/ci-openmpi-apt.log 2>&1; } \
        || { tail -20 /tmp/ci-openmpi-apt.log >&2; log "ERROR: apt-get install openmpi-bin failed"; exit 1; }
fi
mpirun --version | head -n 1 >&2

[ -f "$kit/start-slurm.sh" ] || { log "ERROR: $kit/start-slurm.sh not found (set SLURM_KIT)"; exit 1; }
bash "$kit/start-slurm.sh"
