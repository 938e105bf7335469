"""Stand-in for batch-system commands (qsub, bjobs, flux, ...), used by tests/test_lrm_mock.py.

Each command in this folder is a two-line shell shim that runs this file with its own name. Every call is
recorded as one JSON line in $MOCK_LRM_DIR/calls.jsonl (argv, stdin, cwd, the PILOT_* variables it saw).

Query and submit commands answer what the test put in $MOCK_LRM_DIR/<command>.json (for flux:
flux-<subcommand>.json): {"stdout": ..., "stderr": ..., "rc": ...}, or a list of those, consumed one per
call, the last one repeating. The test fills them from recorded output in tests/data/lrm/.

Launch commands (pbsdsh, mpiexec, blaunch, jsrun, qrsh -inherit, flux run) really run their command
once per host, locally, with MOCK_HOST set to the host it stands for, so a generated batch script can be
executed end to end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def record(name: str, argv: list[str], stdin: str) -> Path:
    state = Path(os.environ["MOCK_LRM_DIR"])
    env = {k: v for k, v in os.environ.items() if k.startswith(("PILOT_", "TEST_", "SLURM_", "SBATCH_"))}
    with open(state / "calls.jsonl", "a") as f:
        f.write(json.dumps({"cmd": name, "argv": argv, "stdin": stdin, "cwd": os.getcwd(), "env": env}) + "\n")
    return state


def answer(state: Path, key: str) -> int:
    path = state / f"{key}.json"
    if not path.exists():
        sys.stderr.write(f"mock {key}: no answer prepared ({path})\n")
        return 99
    data = json.loads(path.read_text())
    if isinstance(data, list):
        reply = data[0]
        if len(data) > 1:
            path.write_text(json.dumps(data[1:]))
    else:
        reply = data
    sys.stdout.write(reply.get("stdout", ""))
    sys.stderr.write(reply.get("stderr", ""))
    return int(reply.get("rc", 0))


def run_on(hosts: list[str], command: list[str], *, shell: bool = False) -> int:
    """Start ``command`` once per host, all at once, like a parallel launcher; the worst exit code wins."""
    procs = []
    for i, host in enumerate(hosts):
        env = dict(os.environ, MOCK_HOST=host, MOCK_TASK=str(i))
        argv = ["/bin/sh", "-c", command[0]] if shell else command
        procs.append(subprocess.Popen(argv, env=env))
    return max((p.wait() for p in procs), default=0)


def unique(lines: list[str]) -> list[str]:
    seen: list[str] = []
    for line in lines:
        host = line.split()[0] if line.split() else ""
        if host and host not in seen:
            seen.append(host)
    return seen


def after(argv: list[str], flag_values: set[str], flags: set[str]) -> list[str]:
    """The command part of a launcher's argv: skip options (and the values of those that take one)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv[i + 1 :]
        if a in flag_values:
            i += 2
        elif a in flags or (a.startswith("-") and "=" in a):
            i += 1
        else:
            return argv[i:]
    return []


def main() -> int:
    name, argv = sys.argv[1], sys.argv[2:]
    stdin = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read() if name in ("bsub",) else ""
    state = record(name, argv, stdin)
    nodes_env = os.environ.get("MOCK_NODES", "mock1,mock2").split(",")
    if name == "pbsdsh":
        hosts = unique(Path(os.environ["PBS_NODEFILE"]).read_text().splitlines())
        return run_on(hosts, after(argv, {"-c", "-n"}, {"-u", "-s", "-v", "-o"}))
    if name == "mpiexec":
        n = int(argv[argv.index("-n") + 1])
        return run_on(nodes_env[:n], after(argv, {"-n", "--ppn", "-ppn"}, set()))
    if name == "jsrun":
        n = int(argv[argv.index("--nrs") + 1])
        values = {"--nrs", "--rs_per_host", "--tasks_per_rs", "--cpu_per_rs", "--gpu_per_rs", "--bind"}
        return run_on(nodes_env[:n], after(argv, values, set()))
    if name == "blaunch":
        hosts = argv[argv.index("-z") + 1].split()
        return run_on(hosts, after(argv[argv.index("-z") + 2 :], set(), set()))
    if name == "qrsh":
        rest = after(argv, set(), {"-inherit", "-nostdin", "-V"})
        return run_on([rest[0]], [" ".join(rest[1:])], shell=True)
    if name == "flux" and argv[:1] == ["run"]:
        n = next(int(a.split("=")[1]) for a in argv if a.startswith("--nodes="))
        return run_on(nodes_env[:n], after(argv[1:], set(), set()))
    key = f"flux-{argv[0]}" if name == "flux" and argv else name
    return answer(state, key)


if __name__ == "__main__":
    sys.exit(main())
