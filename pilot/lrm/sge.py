"""The ``sge`` LRM (Son of Grid Engine, Univa/Altair Grid Engine): one ``qsub`` job in a parallel
environment; the batch script starts one agent on each granted host with ``qrsh -inherit``.

Why it is shaped this way:

- Grid Engine grants slots, not nodes: the pilot asks the configured parallel environment for
  ``nodes x slots_per_node`` slots, and the PE's ``allocation_rule`` decides how they spread. The PE
  must allow ``qrsh -inherit`` (``control_slaves TRUE``); with ``allocation_rule`` equal to
  ``slots_per_node`` the job spans exactly ``nodes`` hosts;
- ``qstat -j`` shows a job's environment to every user, so the agents' settings go to a 0600 file in the
  run directory that the per-node wrapper sources, never to ``qsub -v`` or ``-V``;
- ``qrsh -inherit`` joins its arguments into one command line for the remote shell, so the wrapper's
  command is quoted twice;
- one ``qstat -u <user> -g t -xml`` answers for all pilots (``-g t`` lists every host of a parallel job);
  a job that has left it is looked up once in ``qacct`` (written up to ``flush_time`` later).
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import time
import xml.etree.ElementTree as ET
from typing import Any, ClassVar

from pilot.config import ConfigError
from pilot.lrm._batch import (
    BatchExecutor,
    CommandResult,
    NativeStatus,
    Option,
    QueryError,
    Submission,
    clock,
    run_command,
)
from pilot.lrm.base import AllocationState

_S = AllocationState


def state_of(letters: str) -> AllocationState:
    """Grid Engine's state letters (``qw``, ``hqw``, ``t``, ``r``, ``Rr``, ``dr``, ``Eqw``, ``s``...)."""
    if "E" in letters:
        return _S.FAILED
    if "d" in letters:
        return _S.ENDING
    if "t" in letters:
        return _S.STARTING
    if "r" in letters or "s" in letters.lower() or "T" in letters:
        return _S.ACTIVE
    return _S.QUEUED


class SgeExecutor(BatchExecutor):
    kind: ClassVar[str] = "sge"
    label: ClassVar[str] = "Grid Engine"
    prefix: ClassVar[str] = "#$"
    cancel_command: ClassVar[str] = "qdel"
    commands: ClassVar[tuple[str, ...]] = ("qsub", "qstat", "qdel")
    env_in_file: ClassVar[bool] = True
    job_fields: ClassVar[dict[str, str]] = {"queue_name": "queue", "project_name": "project"}
    own_options: ClassVar[dict[str, Option]] = {
        "pe": Option("str", "parallel environment (qsub -pe); it must have control_slaves TRUE"),
        "slots_per_node": Option("int", "slots asked per node: the job asks for nodes x this many", 1, minimum=1),
        "queue": Option("str", "queue (qsub -q)"),
        "project": Option("str", "project (qsub -P)"),
        "account": Option("str", "account string (qsub -A)"),
        "reservation": Option("str", "advance reservation id (qsub -ar)"),
        "exclusive": Option("bool", "ask for whole hosts (-l exclusive=true; the site must define it)", False),
    }
    hints: ClassVar[dict[str, str]] = {
        "partition": "Grid Engine calls it {table}.queue",
    }

    def __init__(self, *, options: dict[str, Any], source: str, table: str = "allocation") -> None:
        super().__init__(options=options, source=source, table=table)
        if not self.opts["pe"]:
            raise ConfigError(
                f"{source}: {table}.pe is required for lrm 'sge': the parallel environment the pilot's "
                "slots come from (`qconf -spl` lists them; it needs control_slaves TRUE)"
            )
        self._user = pwd.getpwuid(os.getuid()).pw_name

    def directives(self, sub: Submission) -> list[str]:
        o = self.opts
        out = [f"-N {o['job_name']}", "-S /bin/bash", f"-pe {o['pe']} {sub.nodes * o['slots_per_node']}"]
        if sub.walltime is not None:
            out.append(f"-l h_rt={clock(sub.walltime)}")
        if o["queue"]:
            out.append(f"-q {o['queue']}")
        if o["project"]:
            out.append(f"-P {o['project']}")
        if o["account"]:
            out.append(f"-A {o['account']}")
        if o["reservation"]:
            out.append(f"-ar {o['reservation']}")
        if o["exclusive"]:
            out.append("-l exclusive=true")
        out += ["-r n", f"-wd {sub.workdir}", f"-o {sub.stdout}", f"-e {sub.stderr}"]
        return out

    def launch_lines(self, sub: Submission) -> list[str]:
        remote = shlex.quote(shlex.join(["/bin/sh", str(sub.agent_script)]))
        return [
            "pids=",
            "for host in $(awk '!seen[$1]++ {print $1}' \"$PE_HOSTFILE\"); do",
            f'    qrsh -inherit -nostdin "$host" {remote} &',
            '    pids="$pids $!"',
            "done",
            "status=0",
            'for pid in $pids; do wait "$pid" || status=$?; done',
            '(exit "$status")',
        ]

    def submit_argv(self, sub: Submission) -> list[str]:
        return ["qsub", "-terse", str(sub.script)]

    def parse_submit(self, result: CommandResult) -> str:
        for line in result.stdout.splitlines():
            jid = line.strip().split(".")[0]
            if jid.isdigit():
                return jid
        raise ValueError("qsub -terse printed no job id")

    async def query(self, ids: list[str]) -> dict[str, NativeStatus]:
        result = await run_command(
            ["qstat", "-u", self._user, "-g", "t", "-xml"], time_limit=float(self.opts["command_timeout"])
        )
        if not result.ok:
            raise QueryError(result.explain())
        try:
            out = parse_qstat_xml(result.stdout, set(ids))
        except ET.ParseError as exc:
            raise QueryError(f"qstat -xml gave no XML: {exc}") from None
        for jid, st in out.items():
            if st.state is _S.FAILED:
                # Error state (Eqw): the job would sit in the queue forever. Say why, and remove it.
                why = await run_command(["qstat", "-j", jid], time_limit=float(self.opts["command_timeout"]))
                reason = next(
                    (ln.split(":", 1)[1].strip() for ln in why.stdout.splitlines() if ln.startswith("error reason")), ""
                )
                st.detail = f"is in Grid Engine's error state ({st.native_state})" + (f": {reason}" if reason else "")
                await run_command(["qdel", jid], time_limit=float(self.opts["command_timeout"]))
        return out

    async def query_finished(self, ids: list[str]) -> dict[str, NativeStatus]:
        out: dict[str, NativeStatus] = {}
        for jid in ids:  # qacct takes one job; this runs once per pilot, when it has ended
            result = await run_command(["qacct", "-j", jid], time_limit=float(self.opts["command_timeout"]))
            if result.ok:
                st = parse_qacct(result.stdout)
                if st is not None:
                    out[jid] = st
        return out


def parse_qstat_xml(text: str, ids: set[str]) -> dict[str, NativeStatus]:
    """``qstat -g t -xml``: one ``job_list`` per job, or per master/slave queue instance of a running one."""
    root = ET.fromstring(text)
    out: dict[str, NativeStatus] = {}
    for job in root.iter("job_list"):
        jid = (job.findtext("JB_job_number") or "").strip()
        if jid not in ids:
            continue
        letters = (job.findtext("state") or "").strip()
        queue = (job.findtext("queue_name") or "").strip()
        host = queue.split("@", 1)[1] if "@" in queue else ""
        st = out.get(jid)
        if st is None:
            st = out[jid] = NativeStatus(state=state_of(letters), native_state=letters, hosts=[])
            start = (job.findtext("JAT_start_time") or "").strip()
            if start:
                try:
                    st.started = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
                except ValueError:
                    st.started = None
        if host and st.hosts is not None and host not in st.hosts:
            st.hosts.append(host)
    for st in out.values():
        if not st.hosts:
            st.hosts = None
    return out


def parse_qacct(text: str) -> NativeStatus | None:
    """``qacct -j``: the last record (the master's; slave tasks of ``qrsh -inherit`` come first)."""
    records = [r for r in re.split(r"^=+\s*$", text, flags=re.MULTILINE) if r.strip()]
    if not records:
        return None
    fields: dict[str, str] = {}
    for line in records[-1].splitlines():
        key, _, value = line.partition(" ")
        if key:
            fields[key] = value.strip()
    failed = fields.get("failed", "0")
    code_text = fields.get("exit_status", "").split()[0] if fields.get("exit_status") else ""
    code = int(code_text) if code_text.isdigit() else None
    st = NativeStatus(state=_S.DONE, native_state="FINISHED", exit_code=code)
    host = fields.get("hostname")
    st.hosts = [host] if host else None
    if failed.split()[0] != "0":
        st.state = _S.FAILED
        st.native_state = "FAILED"
        st.detail = f"ended abnormally (qacct failed: {failed}; qdel outside the pilot, or its h_rt ran out)"
    elif code not in (0, None):
        st.state = _S.FAILED
        st.detail = "failed"
    return st
