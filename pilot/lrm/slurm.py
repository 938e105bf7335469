"""The ``slurm`` LRM: the pilot is one ``sbatch`` job; inside it ``srun`` starts one agent per node.

Why it is shaped this way:

- the agents' step is ``srun --ntasks-per-node=1 --whole --overlap --cpu-bind=none``: ``--whole`` gives
  each agent every cpu (and the memory) of its node, so the tasks it pins see the whole node; ``--overlap``
  lets the steps that tasks start themselves (the ``srun`` and ``mpirun`` launchers) share those cpus;
- the agents' settings (daemon address, CURVE keys) travel in the environment ``sbatch --export=ALL``
  hands to the job, which Slurm shows only to the job's owner, never in the script or on a command line;
- the agents drop the step-shaped variables srun sets (``SLURM_NTASKS=<nodes>``, ``SLURM_NTASKS_PER_NODE=1``
  ...), so that a task's own ``srun`` or ``mpirun`` starts from the allocation, not from the agents' step;
- one ``squeue -t all`` answers for all pilots; a job squeue no longer lists is looked up in ``sacct``
  once, then in the exit file the batch script leaves behind.
"""

from __future__ import annotations

import shlex
import time
from typing import Any, ClassVar, Final

from pilot.lrm._batch import (
    BatchExecutor,
    CommandResult,
    NativeStatus,
    Option,
    QueryError,
    Submission,
    decode_wait_status,
    hosts_of,
    parse_clock,
    run_command,
)
from pilot.lrm.base import AllocationState

_S = AllocationState

STATES: Final[dict[str, AllocationState]] = {
    "PENDING": _S.QUEUED,
    "REQUEUED": _S.QUEUED,
    "REQUEUE_HOLD": _S.QUEUED,
    "REQUEUE_FED": _S.QUEUED,
    "RESV_DEL_HOLD": _S.QUEUED,
    "SPECIAL_EXIT": _S.QUEUED,
    "CONFIGURING": _S.STARTING,
    "RUNNING": _S.ACTIVE,
    "SUSPENDED": _S.ACTIVE,
    "STOPPED": _S.ACTIVE,
    "SIGNALING": _S.ACTIVE,
    "RESIZING": _S.ACTIVE,
    "COMPLETING": _S.ENDING,
    "STAGE_OUT": _S.ENDING,
    "COMPLETED": _S.DONE,
    "CANCELLED": _S.FAILED,
    "FAILED": _S.FAILED,
    "TIMEOUT": _S.FAILED,
    "NODE_FAIL": _S.FAILED,
    "PREEMPTED": _S.FAILED,
    "BOOT_FAIL": _S.FAILED,
    "DEADLINE": _S.FAILED,
    "OUT_OF_MEMORY": _S.FAILED,
    "REVOKED": _S.FAILED,
}

DETAILS: Final[dict[str, str]] = {
    "CANCELLED": "was cancelled outside the pilot (scancel by its owner or an administrator)",
    "TIMEOUT": "reached its time limit (TIMEOUT)",
    "NODE_FAIL": "lost a node (NODE_FAIL)",
    "PREEMPTED": "was preempted (PREEMPTED)",
    "BOOT_FAIL": "could not boot its nodes (BOOT_FAIL)",
    "DEADLINE": "missed its deadline (DEADLINE)",
    "OUT_OF_MEMORY": "ran out of memory (OUT_OF_MEMORY)",
    "FAILED": "failed",
    "REVOKED": "was revoked (REVOKED)",
}

REASONS: Final[dict[str, str]] = {
    "Priority": "jobs with higher priority are ahead",
    "Resources": "waiting for nodes to become free",
    "PartitionConfig": "the request does not fit the partition's configuration; it may never start",
    "PartitionNodeLimit": "more nodes than the partition allows; it will never start",
    "PartitionTimeLimit": "walltime above the partition's limit; it will never start",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "ReqNodeNotAvail": "requested nodes are unavailable",
    "NodeDown": "a required node is down",
    "BeginTime": "its start time has not come",
    "Dependency": "waiting for a dependency",
    "JobHeldUser": "held by its owner (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "Reservation": "waiting for its reservation",
    "InvalidAccount": "the account is not valid; it will never start",
    "InvalidQOS": "the QOS is not valid; it will never start",
    "BadConstraints": "the constraints cannot be met; it will never start",
}

#: Variables srun sets for the agents' step that would steer a task's own srun/mpirun; the agents drop them.
STEP_VARIABLES: Final = (
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_DISTRIBUTION",
    "SLURM_CPU_BIND",
    "SLURM_CPU_BIND_LIST",
    "SLURM_CPU_BIND_TYPE",
    "SLURM_CPU_BIND_VERBOSE",
    "SLURM_KILL_BAD_EXIT",
    "SLURM_OVERLAP",
    "SLURM_WHOLE",
)

_FIELDS: Final = "JobID:|,State:|,Reason:|,exit_code:|,NodeList:|,StartTime:|,TimeLimit:|"


class SlurmExecutor(BatchExecutor):
    kind: ClassVar[str] = "slurm"
    label: ClassVar[str] = "Slurm"
    prefix: ClassVar[str] = "#SBATCH"
    cancel_command: ClassVar[str] = "scancel"
    commands: ClassVar[tuple[str, ...]] = ("sbatch", "squeue", "scancel")
    uses_agent_script: ClassVar[bool] = False
    job_fields: ClassVar[dict[str, str]] = {
        "queue_name": "partition",
        "project_name": "account",
        "reservation_id": "reservation",
    }
    own_options: ClassVar[dict[str, Option]] = {
        "partition": Option("str", "partition (sbatch --partition); default: the cluster's default partition"),
        "account": Option("str", "account charged (sbatch --account)"),
        "reservation": Option("str", "reservation to run in (sbatch --reservation)"),
        "qos": Option("str", "quality of service (sbatch --qos)"),
        "constraint": Option("str", "node features required (sbatch --constraint)"),
        "exclusive": Option("bool", "whole nodes, shared with no other job (sbatch --exclusive)", True),
        "cores_per_node": Option("int", "cpus per node when not exclusive (--cpus-per-task)", minimum=1),
        "gpus_per_node": Option("int", "GPUs per node (sbatch --gpus-per-node)", minimum=0),
        "memory_per_node": Option("size", "memory per node (sbatch --mem), e.g. '64G'"),
        "srun_args": Option("strlist", "extra arguments for the srun that starts the agents"),
        "use_sacct": Option("bool", "ask sacct for jobs squeue no longer lists", True),
    }
    hints: ClassVar[dict[str, str]] = {
        "queue": "Slurm calls it {table}.partition",
        "project": "Slurm calls it {table}.account",
        "pe": "parallel environments are Grid Engine's; Slurm needs none",
    }

    def __init__(self, *, options: dict[str, Any], source: str, table: str = "allocation") -> None:
        super().__init__(options=options, source=source, table=table)
        self._sacct_ok = bool(self.opts["use_sacct"])

    def directives(self, sub: Submission) -> list[str]:
        o = self.opts
        out = [f"--job-name={o['job_name']}", f"--nodes={sub.nodes}", "--ntasks-per-node=1"]
        if sub.walltime is not None:
            out.append(f"--time={slurm_time(sub.walltime)}")
        for key, flag in (
            ("partition", "partition"),
            ("account", "account"),
            ("reservation", "reservation"),
            ("qos", "qos"),
            ("constraint", "constraint"),
        ):
            if o[key]:
                out.append(f"--{flag}={o[key]}")
        if o["exclusive"]:
            out.append("--exclusive")
        if o["cores_per_node"]:
            out.append(f"--cpus-per-task={o['cores_per_node']}")
        if o["gpus_per_node"]:
            out.append(f"--gpus-per-node={o['gpus_per_node']}")
        if o["memory_per_node"] is not None:
            out.append(f"--mem={max(1, o['memory_per_node'] // 2**20)}M")
        out += [
            "--no-requeue",
            f"--chdir={sub.workdir}",
            f"--output={sub.stdout}",
            f"--error={sub.stderr}",
        ]
        return out

    def launch_lines(self, sub: Submission) -> list[str]:
        srun = [
            "srun",
            '--nodes="$SLURM_JOB_NUM_NODES"',
            '--ntasks="$SLURM_JOB_NUM_NODES"',
            "--ntasks-per-node=1",
            "--whole",
            "--overlap",
            "--cpu-bind=none",
            "--kill-on-bad-exit=0",
            "--export=ALL",
            f"--output={_q(str(sub.workdir))}/{sub.tag}-agent-%N.log",
            *(_q(a) for a in self.opts["srun_args"]),
            "env " + " ".join(f"-u {v}" for v in STEP_VARIABLES),
            shlex.join(sub.agent_argv),
        ]
        return [" \\\n    ".join(srun)]

    def submit_argv(self, sub: Submission) -> list[str]:
        return ["sbatch", "--parsable", "--export=ALL", str(sub.script)]

    def submit_env(self, sub: Submission) -> dict[str, str]:
        """The daemon's environment plus the agents' settings, without the SLURM_* variables of a job the
        daemon itself may run in: exported into the pilot's job they would steer its srun (SLURM_NTASKS
        from an salloc, say). SLURM_CONF stays; SBATCH_* stay too, as a user's deliberate defaults."""
        env = {k: v for k, v in super().submit_env(sub).items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        return env

    def parse_submit(self, result: CommandResult) -> str:
        for line in result.stdout.splitlines():
            jid = line.strip().split(";")[0]
            if jid.isdigit():
                return jid
        raise ValueError("sbatch --parsable printed no job id")

    def explain_reason(self, reason: str) -> str:
        return REASONS.get(reason.split(",")[0].strip(), "")

    async def query(self, ids: list[str]) -> dict[str, NativeStatus]:
        result = await run_command(
            ["squeue", "--noheader", "--states=all", f"--jobs={','.join(ids)}", f"--Format={_FIELDS}"],
            time_limit=float(self.opts["command_timeout"]),
        )
        if not result.ok:
            if "Invalid job id" in result.stderr:
                return {}  # none of them is known any more
            raise QueryError(result.explain())
        return parse_squeue(result.stdout, set(ids))

    async def query_finished(self, ids: list[str]) -> dict[str, NativeStatus]:
        if not self._sacct_ok:
            return {}
        result = await run_command(
            [
                "sacct",
                "--noheader",
                "--parsable2",
                "--allocations",
                f"--jobs={','.join(ids)}",
                "--format=JobID,State,ExitCode,NodeList,Start,Timelimit",
            ],
            time_limit=float(self.opts["command_timeout"]),
        )
        if not result.ok:
            if "accounting storage is disabled" in result.stderr or result.returncode == 127:
                self._sacct_ok = False  # this cluster has no sacct; do not ask again
                return {}
            raise QueryError(result.explain())
        return parse_sacct(result.stdout, set(ids))


def slurm_time(seconds: float) -> str:
    """``D-HH:MM:SS`` for ``--time`` (Slurm rounds up to whole minutes)."""
    s = max(1, int(-(-seconds // 1)))
    days, rest = divmod(s, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def _q(text: str) -> str:
    return shlex.quote(text)


def _timestamp(text: str) -> float | None:
    text = text.strip()
    if not text or text in ("N/A", "Unknown", "None"):
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _status(native: str, reason: str, nodes: str, start: str, limit: str) -> NativeStatus:
    word = native.split()[0] if native.strip() else "UNKNOWN"
    state = STATES.get(word)
    hosts = hosts_of(nodes, lrm="slurm")
    if state is None:
        state = _S.ACTIVE if hosts else _S.QUEUED
    st = NativeStatus(state=state, native_state=word, reason=reason.strip(), hosts=hosts)
    if state is not _S.QUEUED:
        st.started = _timestamp(start)
    try:
        st.walltime = parse_clock(limit)
    except ValueError:
        st.walltime = None
    st.detail = DETAILS.get(word, "")
    return st


def parse_squeue(text: str, ids: set[str]) -> dict[str, NativeStatus]:
    """``squeue --Format=JobID:|,State:|,Reason:|,exit_code:|,NodeList:|,StartTime:|,TimeLimit:|`` lines."""
    out: dict[str, NativeStatus] = {}
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 7 or f[0].strip() not in ids:
            continue
        st = _status(f[1], f[2], f[4], f[5], f[6])
        if st.state.final and f[3].strip().isdigit():
            st.exit_code, st.signal = decode_wait_status(int(f[3]))
            if st.state is _S.DONE and st.exit_code not in (0, None):
                st.state = _S.FAILED
        out[f[0].strip()] = st
    return out


def parse_sacct(text: str, ids: set[str]) -> dict[str, NativeStatus]:
    """``sacct -n -P -X -o JobID,State,ExitCode,NodeList,Start,Timelimit`` lines (final states only)."""
    out: dict[str, NativeStatus] = {}
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 6 or f[0].strip() not in ids:
            continue
        st = _status(f[1], "", f[3], f[4], f[5])
        if not st.state.final:
            continue  # accounting not final yet (slurmdbd lags); squeue or the next poll will tell
        code, _, sig = f[2].partition(":")
        if code.isdigit():
            st.exit_code = int(code)
        if sig.isdigit() and int(sig):
            st.signal = int(sig)
        out[f[0].strip()] = st
    return out
