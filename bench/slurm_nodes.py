"""Issue 24's real batch system row: short tasks on many emulated Slurm nodes against the local 1-node pilot.

    python -m bench --only slurm        # 2,000 x /bin/true on 16 nodes (--quick: 500 on 4)

The cluster is the real one of ``../shared/slurm`` (``start-slurm.sh`` with ``SLURM_CI_NODES``): the pilot
is one sbatch job, its agents are started by ``srun`` (one per node) and connect over CURVE/TCP. All the
nodes share this machine's cpus, so the row says what the daemon and its wire cost with 16 agents where
one did the same work, not what 16 real nodes would give. The cluster is put back to its default size
(the tests' two nodes) afterwards.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Final

#: The shared kit's start script (beside the checkout, as the tests find it: tests/slurm_fixture.py).
START: Final = Path(__file__).resolve().parents[2] / "shared" / "slurm" / "start-slurm.sh"


def start_cluster(nodes: int | None) -> None:
    """(Re)start the kit's cluster with ``nodes`` emulated nodes (None: its default); raises with its
    output when it cannot (it must run as root)."""
    if not START.is_file():
        raise RuntimeError(f"{START} is absent: no Slurm kit on this machine")
    env = dict(os.environ)
    env.pop("SLURM_CI_NODES", None)
    if nodes is not None:
        env["SLURM_CI_NODES"] = str(nodes)
    proc = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=300, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{START} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-1500:]}")


def slurm_config(nodes: int) -> str:
    return (
        f'[allocation]\nlrm = "slurm"\nnodes = {nodes}\nwalltime = "30m"\npartition = "debug"\n'
        "poll_interval = 1\nexclusive = true\n"
    )
