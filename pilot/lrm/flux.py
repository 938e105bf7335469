"""The ``flux`` LRM: the pilot is one ``flux batch`` job (a Flux sub-instance); agents via ``flux run``.

Why it is shaped this way:

- ``flux batch`` reads ``#flux:`` directives from the script (flux-core 0.48 and later) and copies the
  submission environment, which Flux shows only to the job's owner, so the agents' settings travel there;
- inside the batch instance ``flux run -N n -n n`` puts one agent on each node;
- Flux prints job ids in F58 (``ƒ2Xz7rE1``), which is awkward in file names and needs UTF-8; every flux
  command also takes the decimal id, so the native id is kept in decimal;
- one ``flux jobs -a`` with all ids answers for every pilot; Flux keeps inactive jobs, with their
  result, return code and exception note.
"""

from __future__ import annotations

import math
import shlex
from typing import ClassVar, Final

from pilot.lrm._batch import (
    BatchExecutor,
    CommandResult,
    NativeStatus,
    Option,
    QueryError,
    Submission,
    hosts_of,
    run_command,
)
from pilot.lrm.base import AllocationState

_S = AllocationState

STATES: Final[dict[str, AllocationState]] = {
    "NEW": _S.QUEUED,
    "DEPEND": _S.QUEUED,
    "PRIORITY": _S.QUEUED,
    "SCHED": _S.QUEUED,
    "RUN": _S.ACTIVE,
    "CLEANUP": _S.ENDING,
    "INACTIVE": _S.DONE,
}

_F58: Final = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_FORMAT: Final = (
    "{id}|{state}|{result}|{returncode}|{nodelist}|{t_run}|{expiration}|{exception.type}|{exception.note}"
    "|{sched.reason_pending}"
)


def f58_to_int(text: str) -> int:
    """RFC 19 F58 job id (``ƒ2Xz7rE1`` or ASCII ``f2Xz7rE1``) to its integer."""
    t = text.strip()
    if t[:1] in ("ƒ", "f"):
        t = t[1:]
    if not t:
        raise ValueError("empty F58 id")
    n = 0
    for ch in t:
        idx = _F58.find(ch)
        if idx < 0:
            raise ValueError(f"{text!r} is not an F58 job id")
        n = n * 58 + idx
    return n


class FluxExecutor(BatchExecutor):
    kind: ClassVar[str] = "flux"
    label: ClassVar[str] = "Flux"
    prefix: ClassVar[str] = "#flux:"
    cancel_command: ClassVar[str] = "flux cancel"
    commands: ClassVar[tuple[str, ...]] = ("flux",)
    job_fields: ClassVar[dict[str, str]] = {"queue_name": "queue", "project_name": "account"}
    own_options: ClassVar[dict[str, Option]] = {
        "queue": Option("str", "queue (flux batch --queue)"),
        "account": Option("str", "flux-accounting bank charged (--setattr=system.bank=...)"),
        "exclusive": Option("bool", "whole nodes, shared with no other job (flux batch --exclusive)", True),
    }
    hints: ClassVar[dict[str, str]] = {
        "partition": "Flux calls it {table}.queue",
        "project": "Flux charges {table}.account (a flux-accounting bank)",
        "reservation": "Flux has no reservations to submit into",
        "pe": "parallel environments are Grid Engine's; Flux needs none",
    }

    def directives(self, sub: Submission) -> list[str]:
        o = self.opts
        out = [f"--job-name={o['job_name']}", f"--nodes={sub.nodes}"]
        if o["exclusive"]:
            out.append("--exclusive")
        if sub.walltime is not None:
            out.append(f"--time-limit={max(1, math.ceil(sub.walltime))}s")
        if o["queue"]:
            out.append(f"--queue={o['queue']}")
        if o["account"]:
            out.append(f"--setattr=system.bank={o['account']}")
        out += [f"--output={sub.stdout}", f"--error={sub.stderr}"]  # runs in the work directory: submitted there
        return out

    def launch_lines(self, sub: Submission) -> list[str]:
        return [f"flux run --nodes={sub.nodes} --ntasks={sub.nodes} /bin/sh {shlex.quote(str(sub.agent_script))}"]

    def submit_argv(self, sub: Submission) -> list[str]:
        return ["flux", "batch", str(sub.script)]

    def parse_submit(self, result: CommandResult) -> str:
        for line in reversed(result.stdout.strip().splitlines()):
            word = line.strip()
            if word.isdigit():
                return word
            try:
                return str(f58_to_int(word))
            except ValueError:
                continue
        raise ValueError("flux batch printed no job id")

    def cancel_argv(self, native_id: str) -> list[str]:
        return ["flux", "cancel", native_id]

    async def query(self, ids: list[str]) -> dict[str, NativeStatus]:
        result = await run_command(
            ["flux", "jobs", "-n", "-a", f"--format={_FORMAT}", *ids], time_limit=float(self.opts["command_timeout"])
        )
        out = parse_flux_jobs(result.stdout, set(ids))
        if not result.ok and not out:
            err = result.stderr.lower()
            if "unknown" in err or "not found" in err or "invalid jobid" in err:
                return {}
            raise QueryError(result.explain())
        return out


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def parse_flux_jobs(text: str, ids: set[str]) -> dict[str, NativeStatus]:
    """Lines of ``flux jobs -n --format='{id}|{state}|{result}|{returncode}|{nodelist}|{t_run}|{expiration}|...'``."""
    out: dict[str, NativeStatus] = {}
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 10 or f[0].strip() not in ids:
            continue
        word = f[1].strip()
        state = STATES.get(word, _S.QUEUED)
        result = f[2].strip()
        st = NativeStatus(state=state, native_state=result or word, reason=f[9].strip())
        st.hosts = hosts_of(f[4], lrm="flux")
        t_run, expiration = _float(f[5]), _float(f[6])
        if t_run > 0:
            st.started = t_run
            if expiration > t_run:
                st.walltime = expiration - t_run
        code = f[3].strip()
        if code.lstrip("-").isdigit():
            rc = int(code)
            if rc >= 0:
                st.exit_code = rc
            elif rc != -128:
                st.signal = -rc
        if state is _S.DONE and result != "COMPLETED":
            st.state = _S.FAILED
            note = f[8].strip()
            kind = f[7].strip()
            if result == "CANCELED":
                st.detail = "was canceled outside the pilot (flux cancel by its owner or an administrator)"
            elif result == "TIMEOUT":
                st.detail = "reached its time limit (TIMEOUT)"
            else:
                st.detail = "failed"
            if kind or note:
                st.detail += f" [{kind}: {note}]" if note else f" [{kind}]"
        out[f[0].strip()] = st
    return out
