"""What every batch-system executor shares: commands, options, the generated scripts, status upkeep.

A batch module (slurm, pbs, lsf, flux, sge) supplies only what differs: its directives, the line that
starts one agent per node, and how to submit, query and cancel. Everything that must behave the same on
every system lives here, so that it is written (and tested) once:

- one status query for all allocations, rate-limited (``poll_interval``), because a login node's batch
  controller is shared by everyone and a pilot must not hammer it;
- a final state and exit code when a job has left the queue (accounting, else the exit file the batch
  script leaves behind);
- messages in the batch system's own words, with the tails of the batch job's stderr and of the agents'
  logs, so that a failed pilot says why without anyone opening a file;
- the agents' settings (daemon address, CURVE keys) reach them through the job's environment, or a
  0600 file where the batch system shows a job's environment to other users, never a command line.
"""

from __future__ import annotations

import itertools
import math
import os
import shlex
import shutil
import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

import anyio
import hostlist
import structlog

from pilot.config import ConfigError, parse_duration, parse_size
from pilot.lrm.base import Allocation, AllocationRequest, AllocationState, LrmExecutor

log = structlog.get_logger("pilot.lrm")

#: How much of a stderr or log file a message quotes.
TAIL_LINES: Final = 8
TAIL_CHARS: Final = 1500


# -- running commands --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommandResult:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def explain(self) -> str:
        """The command and what it said, for a message a user reads."""
        said = (self.stderr.strip() or self.stdout.strip()).replace("\n", " | ")
        return f"`{shlex.join(self.argv)}` exited {self.returncode}" + (f": {said}" if said else "")


async def run_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    time_limit: float = 60.0,
    cwd: str | Path | None = None,
) -> CommandResult:
    """Run a batch command without blocking the event loop. Never raises for the command's own
    failure: a missing program is exit code 127, a timeout 124 (the process is killed)."""
    cmd = list(argv)
    try:
        with anyio.fail_after(time_limit):
            proc = await anyio.run_process(
                cmd, input=input, env=dict(env) if env is not None else None, cwd=cwd, check=False
            )
    except FileNotFoundError:
        return CommandResult(cmd, 127, "", f"{cmd[0]}: command not found (PATH={os.environ.get('PATH', '')})")
    except PermissionError as exc:
        return CommandResult(cmd, 126, "", f"{cmd[0]}: cannot be run: {exc.strerror}")
    except TimeoutError:
        return CommandResult(cmd, 124, "", f"{cmd[0]}: no answer within {time_limit:g} s")
    return CommandResult(
        cmd,
        proc.returncode,
        proc.stdout.decode(errors="replace"),
        proc.stderr.decode(errors="replace"),
    )


# -- parsing helpers ---------------------------------------------------------------------------------


def expand_hostlist(text: str) -> list[str]:
    """Slurm/Flux host lists: ``node[01-03,7],gpu[1-2]a`` -> node01 node02 node03 node7 gpu1a gpu2a.

    python-hostlist does the expansion (zero padding, several bracket groups in one name); this keeps
    the order and any repeats as given, and turns its errors into a ValueError that quotes the list."""
    try:
        hosts: list[str] = hostlist.expand_hostlist(text.strip(), allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise ValueError(f"cannot expand the host list {text.strip()!r}: {exc}") from exc
    return hosts


def hosts_of(text: str, *, lrm: str) -> list[str] | None:
    """The hosts a batch system reports for a job, None when it reports none. A list this cannot read
    is logged and left out: the hosts only inform messages, so a poll must not fail over them."""
    text = text.strip()
    if not text or text in ("(null)", "None assigned"):
        return None
    try:
        return expand_hostlist(text) or None
    except ValueError as exc:
        log.warning("host list not understood; hosts left out", lrm=lrm, error=str(exc))
        return None


def clock(seconds: float) -> str:
    """``HH:MM:SS`` (hours may exceed 24), rounded up to whole seconds."""
    s = math.ceil(seconds)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def parse_clock(text: str) -> float | None:
    """Slurm's and PBS's forms: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``;
    None when unlimited."""
    t = text.strip()
    if not t or t.upper() in ("UNLIMITED", "INFINITE", "INFINITY", "NOT_SET", "N/A", "INVALID", "-"):
        return None
    days = 0
    with_days = "-" in t
    if with_days:
        d, _, t = t.partition("-")
        days = int(d)
    nums = [float(x) for x in t.split(":")]
    if with_days:
        nums += [0.0] * (3 - len(nums))  # after a day count the hours come first
    elif len(nums) == 1:
        return nums[0] * 60  # plain minutes
    while len(nums) < 3:
        nums.insert(0, 0.0)
    h, m, s = nums
    return days * 86400 + h * 3600 + m * 60 + s


def decode_wait_status(status: int) -> tuple[int | None, int | None]:
    """(exit code, signal) from a raw wait status (Slurm's ``exit_code`` field); (None, None) for a status
    that is neither an exit nor a signal (a stopped process, Slurm's NO_VAL)."""
    try:
        code = os.waitstatus_to_exitcode(status)
    except (ValueError, OverflowError):
        return None, None
    return (code, None) if code >= 0 else (None, -code)


# -- options ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Option:
    """One LRM-specific key of ``[allocation]``: its type, a default, what it is for."""

    kind: str  # str | bool | int | float | duration | size | strlist | choice
    help: str
    default: Any = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None


#: Keys every batch executor accepts.
COMMON_OPTIONS: Final[dict[str, Option]] = {
    "job_name": Option("str", "name of the batch job", "pilot"),
    "directives": Option("strlist", "extra lines for the batch script's header, written as given after the prefix"),
    "prologue": Option("strlist", "shell lines run in the batch script before the agents start (module load ...)"),
    "agent_python": Option("str", "Python interpreter on the compute nodes (default: the daemon's)"),
    "poll_interval": Option("duration", "seconds between status queries to the batch system", 5.0, minimum=0.1),
    "command_timeout": Option(
        "duration", "seconds a batch command may take before it counts as failed", 60.0, minimum=1.0
    ),
    "cancel_wait": Option(
        "duration", "seconds cancel waits for the batch system to confirm the end", 10.0, minimum=0.0
    ),
    "accounting_wait": Option(
        "duration", "seconds a job that left the queue may take to show up in accounting", 30.0, minimum=0.0
    ),
}


def parse_options(
    *,
    kind: str,
    options: Mapping[str, Any],
    schema: Mapping[str, Option],
    source: str,
    hints: Mapping[str, str] | None = None,
    table: str = "allocation",
) -> dict[str, Any]:
    """Checked options with defaults filled in. Errors name the key (in ``table``) and say what is allowed;
    ``hints`` may name other keys as ``{table}.KEY``."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key not in schema:
            hint = (hints or {}).get(key)
            if hint is not None:
                raise ConfigError(f"{source}: {table}.{key} is not a {kind} key; {hint.format(table=table)}")
            raise ConfigError(
                f"{source}: unknown key {table}.{key} for lrm {kind!r}; allowed: "
                f"lrm, nodes, walltime, {', '.join(sorted(schema))}"
            )
        out[key] = _check(f"{table}.{key}", value, schema[key], source)
    for key, opt in schema.items():
        if key not in out:
            out[key] = list(opt.default or []) if opt.kind == "strlist" else opt.default
    return out


def _check(name: str, value: Any, opt: Option, source: str) -> Any:
    bad = f"{source}: {name} = {value!r}"
    if opt.kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{bad} must be true or false")
        return value
    if opt.kind in ("str", "choice"):
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{bad} must be a non-empty string")
        if "\n" in value:
            raise ConfigError(f"{bad} must be one line")
        if opt.kind == "choice" and value not in opt.choices:
            raise ConfigError(f"{bad}; allowed: {', '.join(opt.choices)}")
        return value
    if opt.kind == "strlist":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and "\n" not in v for v in value):
            raise ConfigError(f"{bad} must be a list of one-line strings")
        return list(value)
    if opt.kind in ("int", "float"):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (opt.kind == "int" and not isinstance(value, int))
        ):
            raise ConfigError(f"{bad} must be {'an integer' if opt.kind == 'int' else 'a number'}")
        number: Any = value
    elif opt.kind == "duration":
        zero = isinstance(value, int | float) and not isinstance(value, bool) and value == 0
        number = 0.0 if zero else parse_duration(value, key=name, source=source)
    elif opt.kind == "size":
        number = parse_size(value, key=name, source=source)
    else:  # pragma: no cover - schema bug
        raise AssertionError(opt.kind)
    if opt.minimum is not None and number < opt.minimum:
        raise ConfigError(f"{bad} must be at least {opt.minimum:g}")
    return number


# -- status ------------------------------------------------------------------------------------------


class QueryError(RuntimeError):
    """The status command itself failed (controller down, timeout): states stay as they were."""


@dataclass(slots=True)
class NativeStatus:
    """One job as the batch system reports it, already mapped onto :class:`AllocationState`."""

    state: AllocationState
    native_state: str
    reason: str = ""
    hosts: list[str] | None = None
    started: float | None = None
    walltime: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    #: A sentence for a final state that needs one ("was cancelled outside the pilot").
    detail: str = ""


@dataclass(slots=True)
class Submission:
    """The files of one pilot submission, all in the request's work directory."""

    tag: str
    workdir: Path
    nodes: int
    walltime: float | None
    agent_argv: list[str]
    agent_env: dict[str, str]

    def path(self, suffix: str) -> Path:
        return self.workdir / f"{self.tag}{suffix}"

    @property
    def script(self) -> Path:
        return self.path(".sh")

    @property
    def stdout(self) -> Path:
        return self.path(".out")

    @property
    def stderr(self) -> Path:
        return self.path(".err")

    @property
    def exit_file(self) -> Path:
        return self.path(".exit")

    @property
    def env_file(self) -> Path:
        return self.path(".env")

    @property
    def agent_script(self) -> Path:
        return self.path("-agent.sh")


_SEQ = itertools.count()


class BatchExecutor(LrmExecutor):
    """Template for executors that submit a batch script; subclasses fill in the system's specifics."""

    #: Human name used in messages ("Slurm").
    label: ClassVar[str]
    #: LRM-specific keys on top of :data:`COMMON_OPTIONS`.
    own_options: ClassVar[dict[str, Option]] = {}
    #: Keys people bring from other systems, with the right name here.
    hints: ClassVar[dict[str, str]] = {}
    #: Commands that must be on PATH on the login node.
    commands: ClassVar[tuple[str, ...]] = ()
    #: Directive prefix in the batch script ("#SBATCH").
    prefix: ClassVar[str]
    #: True where the batch system shows a job's environment to other users (PBS, SGE): the agents'
    #: settings then go through a 0600 file, sourced on each node, instead of the job's environment.
    env_in_file: ClassVar[bool] = False
    #: The command that releases a job, named in messages.
    cancel_command: ClassVar[str]

    def __init__(self, *, options: dict[str, Any], source: str, table: str = "allocation") -> None:
        super().__init__(options=options, source=source, table=table)
        schema = {**COMMON_OPTIONS, **self.own_options}
        self.opts: dict[str, Any] = parse_options(
            kind=self.kind, options=options, schema=schema, source=source, hints=self.hints, table=table
        )
        self.poll_interval: float = float(self.opts["poll_interval"])
        self._last_query = -math.inf
        self._force = False
        self._cancelled: set[str] = set()
        self._runs: dict[str, Submission] = {}
        self._absent: dict[str, float] = {}

    # -- what subclasses provide --------------------------------------------------------------------

    @abstractmethod
    def directives(self, sub: Submission) -> list[str]:
        """Header options (without the prefix) for this submission."""

    @abstractmethod
    def launch_lines(self, sub: Submission) -> list[str]:
        """Shell lines, run in the batch script, that start one agent per node and wait for them."""

    @abstractmethod
    def submit_argv(self, sub: Submission) -> list[str]:
        """The submit command for the script at ``sub.script``."""

    @abstractmethod
    def parse_submit(self, result: CommandResult) -> str:
        """The native id from the submit command's output; ValueError when there is none."""

    @abstractmethod
    async def query(self, ids: list[str]) -> dict[str, NativeStatus]:
        """One status call for all ``ids``; jobs the batch system no longer lists are left out."""

    async def query_finished(self, ids: list[str]) -> dict[str, NativeStatus]:
        """Final states of jobs that have left the queue, from accounting where there is one."""
        return {}

    def cancel_argv(self, native_id: str) -> list[str]:
        return [self.cancel_command, native_id]

    def submit_input(self, sub: Submission, script: str) -> bytes | None:
        """What the submit command reads on stdin (LSF's bsub reads the script there)."""
        return None

    def explain_reason(self, reason: str) -> str:
        """A few words on a pending reason, when it is one people ask about."""
        return ""

    # -- the interface --------------------------------------------------------------------------------

    def validate(self, *, nodes: int) -> None:
        missing = [c for c in self.commands if shutil.which(c) is None]
        if missing:
            raise ConfigError(
                f"{self.source}: {self.table}.lrm = {self.kind!r} needs {', '.join(missing)} on PATH, which this "
                f"machine does not have; run the pilot on a {self.label} login node or choose another lrm"
            )

    def prepare(self, request: AllocationRequest) -> Submission:
        argv = list(request.agent_argv)
        if self.opts["agent_python"] and argv:
            argv[0] = self.opts["agent_python"]
        tag = f"{self.kind}-{os.getpid()}-{int(time.time() * 1000) % 10**10}-{next(_SEQ)}"
        return Submission(
            tag=tag,
            workdir=request.workdir,
            nodes=request.nodes,
            walltime=request.walltime,
            agent_argv=argv,
            agent_env=dict(request.agent_env),
        )

    def render_script(self, sub: Submission) -> str:
        """The batch script: directives, then the prologue, then the agents; it records its exit code."""
        lines = ["#!/bin/bash"]
        lines += [f"{self.prefix} {d}" for d in self.directives(sub)]
        lines += [f"{self.prefix} {d}" for d in self.opts["directives"]]
        where = (
            f"a file only you can read ({sub.env_file.name})"
            if self.env_in_file
            else "the environment the job was submitted with"
        )
        lines += [
            f"# Written by pilot/lrm/{self.kind}.py: starts one pilot agent on every node of this job.",
            f"# The agents' settings come from {where}, never from this script or a command line.",
        ]
        lines += list(self.opts["prologue"])  # before `set -u`: module scripts often read unset variables
        lines += ["set -u", *self.launch_lines(sub)]
        lines += [
            "rc=$?",
            f'echo "$rc" > {shlex.quote(str(sub.exit_file))}',
            'exit "$rc"',
        ]
        return "\n".join(lines) + "\n"

    def render_agent_script(self, sub: Submission) -> str:
        """Per-node wrapper for systems whose launcher gives no per-node log: output to its own file."""
        lines = [
            "#!/bin/sh",
            "# Runs once on every node of the pilot: the agent, with its output in the run directory.",
        ]
        if self.env_in_file:
            lines.append(f"set -a; . {shlex.quote(str(sub.env_file))}; set +a")
        log_path = shlex.quote(str(sub.workdir)) + f'/"{sub.tag}-agent-$(uname -n).log"'
        lines.append(f"exec {shlex.join(sub.agent_argv)} >>{log_path} 2>&1")
        return "\n".join(lines) + "\n"

    def submit_env(self, sub: Submission) -> dict[str, str]:
        env = dict(os.environ)
        if not self.env_in_file:
            env.update(sub.agent_env)
        return env

    async def submit(self, request: AllocationRequest) -> Allocation:
        sub = self.prepare(request)
        alloc = Allocation(
            native_id="", lrm=self.kind, state=AllocationState.QUEUED, nodes=request.nodes, walltime=request.walltime
        )
        script = self.render_script(sub)
        try:
            await anyio.to_thread.run_sync(self._write_files, sub, script)
        except OSError as exc:
            alloc.state = AllocationState.FAILED
            alloc.message = f"cannot write the {self.label} batch script in {sub.workdir}: {exc}"
            return alloc
        result = await run_command(
            self.submit_argv(sub),
            env=self.submit_env(sub),
            input=self.submit_input(sub, script),
            time_limit=float(self.opts["command_timeout"]),
            cwd=sub.workdir,
        )
        if not result.ok:
            alloc.state = AllocationState.FAILED
            alloc.message = f"{self.label} refused the pilot: {result.explain()}"
            log.warning("pilot submission refused", lrm=self.kind, error=alloc.message)
            return alloc
        try:
            alloc.native_id = self.parse_submit(result)
        except ValueError as exc:
            alloc.state = AllocationState.FAILED
            alloc.message = f"{self.label} gave no job id: {exc}; {result.explain()}"
            return alloc
        alloc.native_state = "SUBMITTED"
        alloc.message = f"submitted to {self.label} as job {alloc.native_id}"
        self._runs[alloc.native_id] = sub
        self._force = True
        log.info("pilot submitted", lrm=self.kind, id=alloc.native_id, nodes=request.nodes, script=str(sub.script))
        return alloc

    def _write_files(self, sub: Submission, script: str) -> None:
        sub.workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write(sub.script, script, 0o700)
        if self.env_in_file:
            _write(sub.env_file, "".join(f"{k}={shlex.quote(v)}\n" for k, v in sub.agent_env.items()), 0o600)
        if self.uses_agent_script:
            _write(sub.agent_script, self.render_agent_script(sub), 0o700)

    #: Whether launch_lines run :meth:`render_agent_script` (all but Slurm, whose srun names logs per node).
    uses_agent_script: ClassVar[bool] = True

    async def poll(self, allocations: Sequence[Allocation]) -> None:
        live = [a for a in allocations if a.native_id and not a.state.final]
        if not live:
            return
        now = time.monotonic()
        if not self._force and now - self._last_query < self.poll_interval:
            return
        self._last_query = now
        self._force = False
        try:
            statuses = await self.query([a.native_id for a in live])
        except QueryError as exc:
            log.warning("batch status query failed; states kept", lrm=self.kind, error=str(exc))
            return
        gone = [a.native_id for a in live if a.native_id not in statuses]
        if gone:
            try:
                statuses.update(await self.query_finished(gone))
            except QueryError as exc:
                log.warning("accounting query failed", lrm=self.kind, error=str(exc))
        for alloc in live:
            status = statuses.get(alloc.native_id)
            if status is None:
                status = await self._vanished(alloc)
                if status is None:
                    continue
            else:
                self._absent.pop(alloc.native_id, None)
            await self._apply(alloc, status)

    async def _vanished(self, alloc: Allocation) -> NativeStatus | None:
        """A job no query knows. Its exit file tells how it ended; a job we cancelled is simply gone;
        otherwise it is ENDING while accounting catches up (``accounting_wait``), then FAILED with a
        message that says plainly the end is unknown."""
        sub = self._runs.get(alloc.native_id)
        if sub is not None:
            text = await anyio.to_thread.run_sync(_read_small, sub.exit_file)
            if text is not None and text.strip().lstrip("-").isdigit():
                code = int(text.strip())
                state = AllocationState.DONE if code == 0 else AllocationState.FAILED
                return NativeStatus(state, "LEFT_QUEUE", exit_code=code, detail=f"ended with exit code {code}")
        if alloc.native_id in self._cancelled:
            return NativeStatus(AllocationState.DONE, "LEFT_QUEUE")
        first = self._absent.setdefault(alloc.native_id, time.monotonic())
        if time.monotonic() - first < float(self.opts["accounting_wait"]):
            if alloc.state is not AllocationState.ENDING:
                alloc.state = AllocationState.ENDING
                alloc.native_state = "LEFT_QUEUE"
                alloc.message = (
                    f"{self.label} job {alloc.native_id} has left the queue; "
                    "waiting for accounting to tell how it ended"
                )
                log.info("pilot allocation left the queue", lrm=self.kind, id=alloc.native_id)
            return None
        return NativeStatus(
            AllocationState.FAILED,
            "LEFT_QUEUE",
            detail=f"has left the {self.label} queue and neither accounting nor its exit file tells how it ended",
        )

    async def _apply(self, alloc: Allocation, st: NativeStatus) -> None:
        jid = alloc.native_id
        previous = alloc.state
        alloc.native_state = st.native_state
        alloc.reason = st.reason
        if st.hosts:
            alloc.hosts = st.hosts
        if st.started is not None:
            alloc.started = st.started
        if st.walltime is not None:
            alloc.walltime = st.walltime
        if st.exit_code is not None:
            alloc.exit_code = st.exit_code
        cancelled = jid in self._cancelled
        if st.state.final:
            if cancelled:
                alloc.state = AllocationState.DONE
                alloc.message = f"{self.label} job {jid} released by the pilot ({self.cancel_command})"
            elif st.state is AllocationState.DONE:
                alloc.state = AllocationState.DONE
                alloc.message = f"{self.label} job {jid} ended ({st.native_state}, exit code 0): its agents exited"
            else:
                alloc.state = AllocationState.FAILED
                alloc.message = await self._failure_message(alloc, st)
            self._absent.pop(jid, None)
            log.info("pilot allocation ended", lrm=self.kind, id=jid, state=alloc.state.value, message=alloc.message)
            return
        if cancelled and st.state is not AllocationState.QUEUED:
            alloc.state = AllocationState.ENDING
            alloc.message = f"{self.label} job {jid} is being released ({self.cancel_command})"
            return
        alloc.state = st.state
        if st.state is AllocationState.QUEUED:
            why = self.explain_reason(st.reason)
            alloc.message = f"queued in {self.label} as job {jid}" + (
                f": {st.reason}" + (f" ({why})" if why else "") if st.reason and st.reason != "None" else ""
            )
        elif st.state is AllocationState.STARTING:
            alloc.message = f"{self.label} job {jid} is starting" + (
                f" on {','.join(alloc.hosts)}" if alloc.hosts else ""
            )
        elif st.state is AllocationState.ACTIVE:
            alloc.message = f"{self.label} job {jid} running on {','.join(alloc.hosts) or 'its nodes'}" + (
                f" ({st.reason})" if st.reason and st.reason != "None" else ""
            )
        else:
            alloc.message = f"{self.label} job {jid} is ending ({st.native_state})"
        if alloc.state is not previous:
            log.info("pilot allocation", lrm=self.kind, id=jid, state=alloc.state.value, message=alloc.message)

    async def _failure_message(self, alloc: Allocation, st: NativeStatus) -> str:
        jid = alloc.native_id
        what = st.detail or st.native_state
        parts = [f"{self.label} job {jid} {what}"]
        if st.exit_code is not None and "exit code" not in what:
            parts[0] += f" (exit code {st.exit_code})"
        elif st.signal is not None:
            parts[0] += f" (signal {st.signal})"
        if st.reason and st.reason not in ("None", what):
            parts[0] += f"; reason: {st.reason}"
        sub = self._runs.get(jid)
        if sub is not None:
            parts += await anyio.to_thread.run_sync(_diagnostics, sub)
        return "; ".join(parts)

    async def cancel(self, allocation: Allocation) -> None:
        jid = allocation.native_id
        if not jid or allocation.state.final:
            return
        self._cancelled.add(jid)
        result = await run_command(self.cancel_argv(jid), time_limit=float(self.opts["command_timeout"]))
        if not result.ok:
            log.warning("cancel command failed", lrm=self.kind, id=jid, error=result.explain())
        allocation.state = AllocationState.ENDING
        allocation.message = f"{self.label} job {jid} is being released ({self.cancel_command})"
        # Wait for the batch system to confirm, so that `pilot down` returns with the nodes given back.
        with anyio.move_on_after(float(self.opts["cancel_wait"])):
            while not allocation.state.final:
                self._force = True
                await self.poll([allocation])
                if allocation.state.final:
                    break
                await anyio.sleep(0.25)

    def submission(self, native_id: str) -> Submission | None:
        """The files of a submission this executor made (script, stdout/stderr, agent logs)."""
        return self._runs.get(native_id)


def _write(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def _read_small(path: Path) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read(4096)
    except OSError:
        return None


def tail(path: Path, *, lines: int = TAIL_LINES, chars: int = TAIL_CHARS) -> str:
    """The last lines of a file, one line with ' | ' separators; empty when missing or empty."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8 * chars))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    text = " | ".join(line.rstrip() for line in data.strip().splitlines()[-lines:] if line.strip())
    return text[-chars:]


def _diagnostics(sub: Submission) -> list[str]:
    """Tails of the batch job's stderr and of each agent's log, for a failure message."""
    out = []
    err = tail(sub.stderr)
    if err:
        out.append(f"batch stderr ({sub.stderr}): {err}")
    for logf in sorted(sub.workdir.glob(f"{sub.tag}-agent-*.log")):
        text = tail(logf, lines=4, chars=600)
        if text:
            node = logf.name[len(sub.tag) + len("-agent-") : -len(".log")]
            out.append(f"agent on {node}: {text}")
    return out
