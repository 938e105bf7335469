"""The ``pbs`` LRM (PBS Pro / OpenPBS, and Torque): the pilot is one ``qsub`` job, agents via pbsdsh.

Why it is shaped this way:

- ``qstat -f`` shows a job's ``Variable_List`` to other users on most sites, so the agents' settings
  are not put in the job's environment: they go to a 0600 file in the run directory, which the
  per-node wrapper sources (the run directory must be on a file system the compute nodes see);
- one chunk per node (``select=N:mpiprocs=1`` with ``place=scatter``, or Torque's ``nodes=N:ppn=1``)
  makes ``$PBS_NODEFILE`` list each node once, so ``pbsdsh`` (or ``mpiexec --ppn 1``) starts one agent
  per node;
- one ``qstat -f`` (with ``-x`` for PBS Pro's job history) answers for all pilots; a job it no longer
  lists is judged by the exit file the batch script leaves behind.
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Any, ClassVar, Final

from pilot.config import ConfigError
from pilot.lrm._batch import (
    BatchExecutor,
    CommandResult,
    NativeStatus,
    Option,
    QueryError,
    Submission,
    clock,
    parse_clock,
    run_command,
)
from pilot.lrm.base import AllocationState

_S = AllocationState

STATES: Final[dict[str, AllocationState]] = {
    "Q": _S.QUEUED,
    "H": _S.QUEUED,
    "W": _S.QUEUED,
    "T": _S.QUEUED,
    "M": _S.QUEUED,
    "R": _S.ACTIVE,
    "B": _S.ACTIVE,
    "S": _S.ACTIVE,
    "U": _S.ACTIVE,
    "E": _S.ENDING,
    "C": _S.DONE,  # Torque: completed (kept for keep_completed seconds)
    "F": _S.DONE,  # PBS Pro: finished (job history)
    "X": _S.DONE,
}

_UNKNOWN = re.compile(r"Unknown Job Id(?: Error)?\s+(\S+)", re.IGNORECASE)


class PbsExecutor(BatchExecutor):
    kind: ClassVar[str] = "pbs"
    label: ClassVar[str] = "PBS"
    prefix: ClassVar[str] = "#PBS"
    cancel_command: ClassVar[str] = "qdel"
    commands: ClassVar[tuple[str, ...]] = ("qsub", "qstat", "qdel")
    env_in_file: ClassVar[bool] = True
    job_fields: ClassVar[dict[str, str]] = {"queue_name": "queue", "project_name": "project"}
    own_options: ClassVar[dict[str, Option]] = {
        "flavor": Option("choice", "pbspro (PBS Pro, OpenPBS) or torque", "pbspro", choices=("pbspro", "torque")),
        "queue": Option("str", "queue (qsub -q); a PBS Pro reservation is its queue, e.g. 'R1234'"),
        "account": Option("str", "account charged (qsub -A)"),
        "project": Option("str", "project (PBS Pro qsub -P)"),
        "reservation": Option("str", "Torque advance reservation (qsub -W x=ADVRES:<name>)"),
        "exclusive": Option("bool", "whole nodes, shared with no other job (place=excl / Torque -n)", True),
        "cores_per_node": Option("int", "cpus per node (ncpus= / ppn=); default 1 chunk cpu", minimum=1),
        "gpus_per_node": Option("int", "GPUs per node (ngpus= / gpus=)", minimum=0),
        "memory_per_node": Option("size", "memory per node (mem=), e.g. '64G'"),
        "agent_launcher": Option(
            "choice",
            "how the agents start: pbsdsh, or mpiexec --ppn 1 (Cray PALS, Hydra)",
            "pbsdsh",
            choices=("pbsdsh", "mpiexec"),
        ),
    }
    hints: ClassVar[dict[str, str]] = {
        "partition": "PBS calls it {table}.queue",
        "pe": "parallel environments are Grid Engine's; PBS needs none",
    }

    def __init__(self, *, options: dict[str, Any], source: str, table: str = "allocation") -> None:
        super().__init__(options=options, source=source, table=table)
        if self.opts["flavor"] == "pbspro" and self.opts["reservation"]:
            raise ConfigError(
                f"{source}: {table}.reservation is Torque's; on PBS Pro submit to the reservation's queue "
                f"with {table}.queue = 'R<id>'"
            )
        if self.opts["flavor"] == "torque" and self.opts["project"]:
            raise ConfigError(f"{source}: {table}.project is PBS Pro's; Torque charges {table}.account")

    @property
    def torque(self) -> bool:
        return bool(self.opts["flavor"] == "torque")

    def directives(self, sub: Submission) -> list[str]:
        o = self.opts
        out = [f"-N {o['job_name']}"]
        if self.torque:
            spec = f"nodes={sub.nodes}:ppn={o['cores_per_node'] or 1}"
            if o["gpus_per_node"]:
                spec += f":gpus={o['gpus_per_node']}"
            out.append(f"-l {spec}")
            if o["memory_per_node"] is not None:
                out.append(f"-l mem={max(1, o['memory_per_node'] * sub.nodes // 2**20)}mb")
            if o["exclusive"]:
                out.append("-n")
            if o["reservation"]:
                out.append(f"-W x=FLAGS:ADVRES:{o['reservation']}")
        else:
            chunk = f"select={sub.nodes}:mpiprocs=1"
            if o["cores_per_node"]:
                chunk += f":ncpus={o['cores_per_node']}"
            if o["gpus_per_node"]:
                chunk += f":ngpus={o['gpus_per_node']}"
            if o["memory_per_node"] is not None:
                chunk += f":mem={max(1, o['memory_per_node'] // 2**20)}mb"
            out.append(f"-l {chunk}")
            out.append("-l place=scatter:excl" if o["exclusive"] else "-l place=scatter")
        if sub.walltime is not None:
            out.append(f"-l walltime={clock(sub.walltime)}")
        if o["queue"]:
            out.append(f"-q {o['queue']}")
        if o["account"]:
            out.append(f"-A {o['account']}")
        if o["project"]:
            out.append(f"-P {o['project']}")
        out += ["-r n", f"-o {sub.stdout}", f"-e {sub.stderr}"]
        return out

    def launch_lines(self, sub: Submission) -> list[str]:
        wrapper = shlex.quote(str(sub.agent_script))
        if self.opts["agent_launcher"] == "mpiexec":
            return [f"mpiexec -n {sub.nodes} --ppn 1 /bin/sh {wrapper}"]
        if self.torque:
            return [f"pbsdsh -u /bin/sh {wrapper}"]
        return [f"pbsdsh -- /bin/sh {wrapper}"]

    def submit_argv(self, sub: Submission) -> list[str]:
        return ["qsub", str(sub.script)]

    def parse_submit(self, result: CommandResult) -> str:
        for line in result.stdout.splitlines():
            jid = line.strip()
            if jid and jid[0].isdigit():
                return jid
        raise ValueError("qsub printed no job id")

    async def query(self, ids: list[str]) -> dict[str, NativeStatus]:
        argv = ["qstat", "-f", *([] if self.torque else ["-x"]), *ids]
        result = await run_command(argv, time_limit=float(self.opts["command_timeout"]))
        jobs = parse_qstat_full(result.stdout)
        if not result.ok:
            unknown = set(_UNKNOWN.findall(result.stderr))
            other = [ln for ln in result.stderr.splitlines() if ln.strip() and not _UNKNOWN.search(ln)]
            if not unknown or other:
                raise QueryError(result.explain())
        out: dict[str, NativeStatus] = {}
        for jid in ids:
            attrs = jobs.get(jid) or jobs.get(_short(jid, jobs))
            if attrs is not None:
                out[jid] = status_from_qstat(attrs)
        return out


def _short(jid: str, jobs: dict[str, dict[str, str]]) -> str:
    """qstat may print ``123.server.domain`` for ``123.server`` (or the reverse): match on the number."""
    num = jid.split(".")[0]
    for key in jobs:
        if key.split(".")[0] == num:
            return key
    return ""


def parse_qstat_full(text: str) -> dict[str, dict[str, str]]:
    """``qstat -f`` blocks: ``Job Id: X`` then ``key = value`` lines. Long values wrap at a fixed width onto
    lines starting with a tab; the break falls anywhere, so the pieces are joined as they are."""
    jobs: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    last = ""
    for raw in text.splitlines():
        if raw.startswith("Job Id:"):
            current = jobs[raw.split(":", 1)[1].strip()] = {}
            last = ""
        elif current is None or not raw.strip():
            continue
        elif raw.startswith("\t") and last:
            current[last] += raw[1:]
        elif " = " in raw:
            key, _, value = raw.lstrip().partition(" = ")
            last = key.strip()
            current[last] = value
    return {jid: {k: v.strip() for k, v in attrs.items()} for jid, attrs in jobs.items()}


def _timestamp(text: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return float(text)  # Torque's start_time is epoch seconds
    try:
        return time.mktime(time.strptime(text, "%a %b %d %H:%M:%S %Y"))
    except ValueError:
        return None


def status_from_qstat(attrs: dict[str, str]) -> NativeStatus:
    """One job's attributes mapped onto an allocation state, with exit status and reason."""
    word = attrs.get("job_state", "?")
    state = STATES.get(word, _S.QUEUED)
    low = {k.lower(): v for k, v in attrs.items()}
    st = NativeStatus(state=state, native_state=word, reason=attrs.get("comment", ""))
    exec_host = attrs.get("exec_host", "")
    if exec_host:
        hosts: list[str] = []
        for part in exec_host.split("+"):
            host = part.split("/")[0]
            if host and host not in hosts:
                hosts.append(host)
        st.hosts = hosts
    if state is not _S.QUEUED:
        st.started = _timestamp(attrs.get("stime", "") or attrs.get("start_time", ""))
    limit = attrs.get("Resource_List.walltime", "")
    if limit:
        try:
            st.walltime = parse_clock(limit)
        except ValueError:
            st.walltime = None
    if state is _S.DONE:
        code_text = low.get("exit_status", "")
        if not code_text.lstrip("-").isdigit():
            st.state = _S.FAILED
            st.detail = "was deleted before it ran" if not exec_host else "ended without an exit status"
            return st
        code = int(code_text)
        if code == 0:
            return st
        st.state = _S.FAILED
        if code > 256:
            st.signal = code - 256
            st.detail = f"was killed by signal {code - 256} (qdel outside the pilot, or its walltime ran out)"
        elif code < 0:
            st.exit_code = code
            st.detail = f"could not be run by PBS (Exit_status {code})"
        else:
            st.exit_code = code
            st.detail = "failed"
    return st
