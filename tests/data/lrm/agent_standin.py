"""A pilot-agent stand-in for the LRM tests: reports what a real agent sees on its node, then waits.

It writes $TEST_REPORT_DIR/agent-<node>.json (node name, hostname, the daemon address it was given and
how: environment vs command line, its cpus, the SLURM_*/PILOT_* variables), optionally runs one
launcher command on node $TEST_ORDER_NODE (as an agent would run a launcher's process order) and
records its output, then waits for $TEST_REPORT_DIR/stop (or $TEST_SLEEP seconds) and exits $TEST_EXIT.
Standard library only: it runs under whatever Python the batch system gives it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

node = os.environ.get("SLURMD_NODENAME") or os.environ.get("MOCK_HOST") or os.uname().nodename
out = os.environ["TEST_REPORT_DIR"]


def write(name: str, data: object) -> None:
    tmp = os.path.join(out, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(out, name))


with open("/proc/self/cmdline", "rb") as f:
    cmdline = f.read().decode(errors="replace").split("\0")
write(
    f"agent-{node}.json",
    {
        "node": node,
        "hostname": os.uname().nodename,
        "url": os.environ.get("PILOT_AGENT_URL"),
        "cmdline": cmdline,
        "cpus": sorted(os.sched_getaffinity(0)),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "PILOT_", "TEST_", "MOCK_"))},
    },
)
sys.stderr.write(f"agent stand-in on {node} started\n")
sys.stderr.flush()

order = os.environ.get("TEST_ORDER")
if order and node == os.environ.get("TEST_ORDER_NODE"):
    spec = json.loads(order)
    env = dict(os.environ, **spec.get("env", {}))
    argv = [re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), a) for a in spec["argv"]]
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    write(
        "order.json",
        {
            "argv": argv,
            "rc": proc.returncode,
            "stdout": proc.stdout,
            "stderr": proc.stderr,
            "seconds": time.monotonic() - t0,
        },
    )

deadline = time.monotonic() + float(os.environ.get("TEST_SLEEP", "120"))
while time.monotonic() < deadline and not os.path.exists(os.path.join(out, "stop")):
    time.sleep(0.1)
code = int(os.environ.get("TEST_EXIT", "0"))
if code:
    sys.stderr.write(f"agent stand-in on {node}: exiting with {code} as told\n")
sys.exit(code)
