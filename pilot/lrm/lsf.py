"""The ``lsf`` LRM (IBM Spectrum LSF): the pilot is one ``bsub`` job, agents via blaunch or jsrun.

Why it is shaped this way:

- the script goes to ``bsub`` on stdin, the one way every LSF version reads its ``#BSUB`` lines;
- LSF copies the submission environment into the job and shows it to nobody else, so the agents'
  settings travel there, and ``blaunch``/``jsrun`` pass it on to every node;
- ``-n N -R "span[ptile=1]"`` gives one slot on each of N hosts and ``blaunch -z`` runs one agent on
  each distinct host of ``$LSB_HOSTS``; CSM systems (Summit, Sierra) allocate with ``-nnodes N`` and
  start the agents with ``jsrun`` (``agent_launcher = "jsrun"``);
- one ``bjobs -a -json`` answers for all pilots (LSF keeps finished jobs for ``CLEAN_PERIOD``).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from typing import ClassVar, Final

from pilot.lrm._batch import (
    BatchExecutor,
    CommandResult,
    NativeStatus,
    Option,
    QueryError,
    Submission,
    run_command,
)
from pilot.lrm.base import AllocationState

_S = AllocationState

STATES: Final[dict[str, AllocationState]] = {
    "PEND": _S.QUEUED,
    "PROV": _S.STARTING,
    "PSUSP": _S.QUEUED,
    "WAIT": _S.QUEUED,
    "RUN": _S.ACTIVE,
    "USUSP": _S.ACTIVE,
    "SSUSP": _S.ACTIVE,
    "UNKWN": _S.ACTIVE,
    "ZOMBI": _S.ENDING,
    "DONE": _S.DONE,
    "EXIT": _S.FAILED,
}

_SUBMITTED = re.compile(r"Job <(\d+)> is submitted")
_FIELDS: Final = "jobid stat exit_code exec_host pend_reason start_time exit_reason"


class LsfExecutor(BatchExecutor):
    kind: ClassVar[str] = "lsf"
    label: ClassVar[str] = "LSF"
    prefix: ClassVar[str] = "#BSUB"
    cancel_command: ClassVar[str] = "bkill"
    commands: ClassVar[tuple[str, ...]] = ("bsub", "bjobs", "bkill")
    job_fields: ClassVar[dict[str, str]] = {"queue_name": "queue", "project_name": "project"}
    own_options: ClassVar[dict[str, Option]] = {
        "queue": Option("str", "queue (bsub -q)"),
        "project": Option("str", "project charged (bsub -P)"),
        "reservation": Option("str", "advance reservation (bsub -U)"),
        "exclusive": Option("bool", "whole hosts, shared with no other job (bsub -x)", True),
        "cores_per_node": Option("int", "slots per host (span[ptile=N]); default 1", minimum=1),
        "gpus_per_node": Option("int", "GPUs per host (bsub -gpu num=N)", minimum=0),
        "agent_launcher": Option(
            "choice",
            "how the agents start: blaunch, or jsrun on CSM systems (-nnodes)",
            "blaunch",
            choices=("blaunch", "jsrun"),
        ),
    }
    hints: ClassVar[dict[str, str]] = {
        "partition": "LSF calls it {table}.queue",
        "account": "LSF charges {table}.project",
        "pe": "parallel environments are Grid Engine's; LSF needs none",
    }

    def directives(self, sub: Submission) -> list[str]:
        o = self.opts
        out = [f"-J {o['job_name']}"]
        if o["agent_launcher"] == "jsrun":
            out.append(f"-nnodes {sub.nodes}")
        else:
            per = o["cores_per_node"] or 1
            out += [f"-n {sub.nodes * per}", f'-R "span[ptile={per}]"']
        if o["gpus_per_node"]:
            out.append(f'-gpu "num={o["gpus_per_node"]}"')
        if sub.walltime is not None:
            minutes = max(1, -(-int(sub.walltime) // 60))
            out.append(f"-W {minutes // 60}:{minutes % 60:02d}")
        if o["queue"]:
            out.append(f"-q {o['queue']}")
        if o["project"]:
            out.append(f"-P {o['project']}")
        if o["reservation"]:
            out.append(f"-U {o['reservation']}")
        if o["exclusive"] and o["agent_launcher"] != "jsrun":
            out.append("-x")  # -nnodes allocations are whole nodes already
        out += [f"-o {sub.stdout}", f"-e {sub.stderr}"]  # runs in the work directory: submitted there
        return out

    def launch_lines(self, sub: Submission) -> list[str]:
        wrapper = shlex.quote(str(sub.agent_script))
        if self.opts["agent_launcher"] == "jsrun":
            return [
                f"jsrun --nrs {sub.nodes} --rs_per_host 1 --tasks_per_rs 1 --cpu_per_rs ALL_CPUS "
                f"--gpu_per_rs ALL_GPUS --bind none /bin/sh {wrapper}"
            ]
        return [
            "hosts=$(for h in $LSB_HOSTS; do echo \"$h\"; done | awk '!seen[$0]++' | tr '\\n' ' ')",
            f'blaunch -z "$hosts" /bin/sh {wrapper}',
        ]

    def submit_argv(self, sub: Submission) -> list[str]:
        return ["bsub"]

    def submit_input(self, sub: Submission, script: str) -> bytes | None:
        return script.encode()

    def parse_submit(self, result: CommandResult) -> str:
        m = _SUBMITTED.search(result.stdout)
        if m is None:
            raise ValueError("bsub did not say 'Job <id> is submitted'")
        return m.group(1)

    async def query(self, ids: list[str]) -> dict[str, NativeStatus]:
        result = await run_command(
            ["bjobs", "-a", "-json", "-o", _FIELDS, *ids], time_limit=float(self.opts["command_timeout"])
        )
        try:
            data = json.loads(result.stdout) if result.stdout.strip() else None
        except json.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            if "is not found" in result.stderr and not result.stdout.strip():
                return {}
            raise QueryError(result.explain())
        return parse_bjobs_json(data, set(ids))


def _timestamp(text: str) -> float | None:
    """bjobs start times carry no year (``Nov 21 20:32`` or ``Nov 21 20:32:05 L``): this year's, or last."""
    words = text.replace(" L", "").replace(" E", "").strip()
    if not words or words == "-":
        return None
    now = time.localtime()
    for fmt in ("%b %d %H:%M:%S %Y", "%b %d %H:%M %Y"):
        try:
            t = time.mktime(time.strptime(f"{words} {now.tm_year}", fmt))
        except ValueError:
            continue
        return t if t <= time.time() + 86400 else time.mktime(time.strptime(f"{words} {now.tm_year - 1}", fmt))
    return None


def parse_bjobs_json(data: dict[str, object], ids: set[str]) -> dict[str, NativeStatus]:
    """``bjobs -json`` RECORDS; entries with ERROR (``Job <x> is not found``) are left out."""
    out: dict[str, NativeStatus] = {}
    records = data.get("RECORDS", [])
    if not isinstance(records, list):
        return out
    for rec in records:
        if not isinstance(rec, dict) or "ERROR" in rec:
            continue
        jid = str(rec.get("JOBID", ""))
        if jid not in ids:
            continue
        word = str(rec.get("STAT", ""))
        state = STATES.get(word, _S.QUEUED)
        st = NativeStatus(state=state, native_state=word, reason=str(rec.get("PEND_REASON", "") or "").strip())
        hosts: list[str] = []
        for part in str(rec.get("EXEC_HOST", "") or "").split(":"):
            host = part.split("*")[-1].strip()
            if host and host != "-" and host not in hosts:
                hosts.append(host)
        st.hosts = hosts or None
        if state is not _S.QUEUED:
            st.started = _timestamp(str(rec.get("START_TIME", "") or ""))
        code = str(rec.get("EXIT_CODE", "") or "").strip()
        if code.isdigit():
            st.exit_code = int(code)
        reason = str(rec.get("EXIT_REASON", "") or "").strip()
        if state is _S.FAILED:
            st.detail = f"exited ({reason})" if reason and reason != "-" else "exited"
        out[jid] = st
    return out
