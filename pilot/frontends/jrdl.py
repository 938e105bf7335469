"""The JRDL front-end: each job of a ``<jrdl>`` document compiled to a :class:`~pilot.request.Request`,
every job checked before any is accepted.

A job is first written as the SSS Job it means (one TaskGroup per part that runs something of its
own) and compiled by the SSS front-end, so placement, node requirements and ``pilot show`` are the
ones SSS jobs have; what SSS has no word for is added to the request after:

- ``jobType`` and ``count`` (CPUs): ``single`` is one process holding ``count`` cores, ``htc`` is
  ``count`` independent one-core processes, ``xmpi`` is one ``mpirun`` launch of ``count`` ranks.
  A job's ``count`` and its resource ``count`` are its total; each subjob runs its own attributes
  over the job's with its own ``count`` (1 when not given), and whatever the total leaves over runs
  the job's own attributes (the spec's Figure 5: ``a.out`` and ``b.out`` in a job of count 2).
- ``libraryPath`` and second and further ``stdout``/``stderr`` destinations: the task runs under a
  short ``/bin/sh`` wrapper that prepends the paths to ``LD_LIBRARY_PATH`` and copies each stream
  through ``tee`` into the other destinations (the first is the task's own stream file), keeping the
  program's exit code. With several processes the extra destinations are appended to, as the first
  one is (truncated once before any process starts); with one they are truncated.
- A relative ``executable`` (``a.out``) is in the job's directory, as in GRAM; a relative ``directory``
  is the submitter's (CUR_DIRL), which is also the directory of a job that names none.
- ``jobStartTime`` and ``jobStartBefore``: the request's ``not_before`` and ``start_within``.
- ``resourceManagerContact`` and ``jobManagerType`` (of a subjob, or of the job for all its parts):
  the request's ``targets`` (see :mod:`pilot.core.coallocation`): each part runs inside one allocation
  its target admits, every part started at once.
- Resource attributes become SSS node requirements on the agents' facts: ``operatingSystem`` on
  ``opsys``, ``minRAMAvailable``/``minRAMSize`` on ``mem_free``/``mem_total``, ``minStorageAvailable``
  on ``disk_free``, ``minFreeCPU`` on ``free_proc`` (the processors the last minute's load leaves free),
  ``processorLoad`` on ``np_load_*``, ``processor clockSpeed`` on ``clock_mhz``. Those on load values
  wait while a node is busy; only what no node could meet even idle is refused at submit.
"""

from __future__ import annotations

import dataclasses
import os.path
import re
import shlex
from typing import Any, Final

from pilot.formats.jrdl import JOBID_VALUE, Executable, Facts, JrdlError, JrdlJob, read_jrdl, write_jrdl
from pilot.frontends import sss
from pilot.launchers.base import GroupLaunch, TaskLaunch
from pilot.model.job_description import DescriptionError, JobDescription
from pilot.model.sss.errors import SssError
from pilot.model.sss.job import Job, Properties, Property, TaskGroup
from pilot.model.staging import Staging, StagingError
from pilot.request import JOB_MANAGER_LRMS, Request, Submission, Target
from pilot.scheduler.cluster import Cluster

#: Where a JRDL submission carries its document (in SUBMIT and in the journal).
DOCUMENT_KEY: Final = "jrdl"
#: Where it carries the submitter's HOME, LOGNAME and CUR_DIRL (Table 1's names of the submitter).
SUBMITTER_KEY: Final = "submitter"
#: The launcher each job type starts its processes with.
LAUNCHERS: Final = {"single": "multiple", "htc": "multiple", "xmpi": "mpirun"}
#: processorLoad's windows and the node load value (per processor) each is read from.
LOAD_VALUES: Final = {"last1Min": "np_load_short", "last5Min": "np_load_medium", "last15Min": "np_load_long"}
#: Among the nodes that meet a job's minimums, placement prefers the best, in turn: the fastest
#: processor clock, then the most processors the load leaves free, then the most free memory
#: (a node that does not report one ranks last on it; equal nodes in registration order).
BEST: Final = (("clock_mhz", True), ("free_proc", True), ("mem_free", True))


def compile_entry(raw: dict[str, Any], *, cluster: Cluster) -> Submission:
    """A JRDL submission ``{"jrdl": document, "submitter": {...}}``: every job of it, or an error."""
    document = raw.get(DOCUMENT_KEY)
    if not isinstance(document, str):
        raise DescriptionError("a JRDL submission carries its XML document as text under 'jrdl'")
    submitter = raw.get(SUBMITTER_KEY) or {}
    if not isinstance(submitter, dict) or not all(
        k in ("HOME", "LOGNAME", "CUR_DIRL") and isinstance(v, str) and v for k, v in submitter.items()
    ):
        raise DescriptionError("a JRDL submission's 'submitter' maps HOME, LOGNAME and CUR_DIRL to text")
    facts = Facts(submitter, *_host_facts(cluster, document))
    jobs = [_anchored(job, submitter.get("CUR_DIRL")) for job in read_jrdl(document, facts)]
    requests = [prepare(job, cluster) for job in jobs]
    entries = [
        {**r.description.to_wire(), DOCUMENT_KEY: write_jrdl(job)} for r, job in zip(requests, jobs, strict=True)
    ]
    return Submission(requests, entries, [], document=True)


def rebuild(description: JobDescription, extra: dict[str, Any], *, cluster: Cluster) -> Request:
    """A journaled JRDL job, from the resolved document the journal kept."""
    return prepare(read_jrdl(extra[DOCUMENT_KEY])[0], cluster)


def _host_facts(cluster: Cluster, document: str) -> tuple[dict[str, str], str]:
    """GLOBUS_HOST_* from the nodes' facts (only looked up when the document names one): the CPU type
    is the node's architecture, the OS name and version its ``opsys``; the manufacturer is the vendor
    field of the GNU host triple, ``unknown`` as on every Linux host. Nodes that differ have no one value."""
    if "GLOBUS_HOST_" not in document:
        return {}, ""
    seen: dict[tuple[str, str], str] = {}
    for node in cluster.nodes.values():
        values = node.values.effective(cluster.registry)
        seen.setdefault((str(values.get("arch", "")), str(values.get("opsys", ""))), node.name)
    if not seen:
        return {}, "no node has registered yet; submit again once 'pilot nodes' lists them"
    if len(seen) > 1:
        differ = "; ".join(f"{a} {o} on {n}" for (a, o), n in seen.items())
        return {}, f"the nodes differ ({differ}), so no one value stands for them; define it in the document"
    ((arch, opsys),) = seen
    if not arch or not opsys:
        return {}, "the nodes do not report their architecture and operating system; define it in the document"
    name, _, version = opsys.partition(" ")
    return {
        "GLOBUS_HOST_CPUTYPE": arch,
        "GLOBUS_HOST_MANUFACTURER": "unknown",
        "GLOBUS_HOST_OSNAME": name,
        "GLOBUS_HOST_OSVERSION": version,
    }, ""


def _anchored(job: JrdlJob, cwd: str | None) -> JrdlJob:
    """Directories made absolute against the submitter's directory (CUR_DIRL), which is also the job's
    directory when it names none: what the journal keeps then means the same after a restart."""

    def anchor(x: Executable, where: str) -> Executable:
        d = x.directory
        if d is not None and (d.startswith("/") or d == "~" or d.startswith("~/")):
            return x
        if cwd is None:
            if d is None:
                return x
            raise JrdlError(
                f"<directory> {d!r} is relative and the submission does not say the submitter's directory; "
                "give an absolute path",
                element=where,
            )
        return dataclasses.replace(x, directory=cwd if d is None else os.path.normpath(os.path.join(cwd, d)))

    attrs = anchor(job.attributes, job.where)
    subjobs = tuple(s if s.directory is None else anchor(s, s.where) for s in job.subjobs)
    return dataclasses.replace(job, attributes=attrs, subjobs=subjobs)


# -- compiling one job ----------------------------------------------------------------------------------


def _parts(job: JrdlJob) -> list[tuple[Executable, int]]:
    """What runs: (attributes, CPUs) per part, the job's own part first."""
    a, r = job.attributes, job.resource
    total = a.count
    if total is not None and r.count is not None and total != r.count:
        raise JrdlError(
            f"<count> {total} contradicts <resource><count> {r.count}: both are the job's CPUs; give one",
            element=job.where,
        )
    total = total if total is not None else r.count
    if not job.subjobs:
        return [(a, total or 1)]
    parts = [(s.over(a), s.count or 1) for s in job.subjobs]
    used = sum(n for _, n in parts)
    if total is None:
        return parts
    if used > total:
        raise JrdlError(
            f"its subjobs ask for {used} CPUs, more than the job's count of {total}; raise the count or lower "
            "the subjobs'",
            element=job.where,
        )
    if used < total:
        parts.insert(0, (a, total - used))
    return parts


def _group(x: Executable, cpus: int) -> TaskGroup:
    if not x.executable:
        raise JrdlError("names no <executable>: give one in the job or in the subjob", element=x.where)
    for what, value in (("directory", x.directory), ("stdin", x.stdin)):
        if value is not None and JOBID_VALUE in value:
            raise JrdlError(
                f"<{what}> uses JOBID, which is known only once the job runs; use it in executable, "
                "arguments, environment, libraryPath, stdout or stderr",
                element=x.where,
            )
    job_type = x.job_type or "single"
    executable = x.executable
    if x.directory is not None and not executable.startswith(("/", "~", "$")):
        executable = os.path.join(x.directory, executable)  # as GRAM has it: a.out is the job directory's
    items = [Property.of("Executable", executable)]
    if x.arguments:
        items.append(Property.of("Arguments", shlex.join(x.arguments)))
    if x.directory is not None:
        items.append(Property.of("InitialWorkingDirectory", x.directory))
    if x.environment:
        items.append(Property.of("Environment", "", *(Property.of("Variable", v, name=k) for k, v in x.environment)))
    if x.stdin is not None:
        items.append(Property.of("InputFile", x.stdin))
    if x.stdout and JOBID_VALUE not in x.stdout[0]:
        items.append(Property.of("OutputFile", x.stdout[0]))
    if x.stderr and JOBID_VALUE not in x.stderr[0]:
        items.append(Property.of("ErrorFile", x.stderr[0]))
    tasks = 1 if job_type == "single" else cpus
    items += [Property.of("TaskCount", tasks), Property.of("Processors", cpus)]
    items.append(Property.of("Extension", LAUNCHERS[job_type], name="Launcher", type="PSIJ"))
    return TaskGroup(Properties.of(*items))


def _requirements(job: JrdlJob) -> tuple[list[Property], list[Property]]:
    """The resource attributes as SSS node requirements: (uncategorized, Requested)."""
    r = job.resource
    items: list[Property] = []
    requested: list[Property] = []

    def attribute(name: str, value: str, op: str | None = None) -> Property:
        return Property.of("Extension", value, name=name, type="Attribute", op=op)

    if r.os_name is not None:  # opsys is "<name> <release>": the name alone, or followed by a release
        items.append(attribute("opsys", f"{r.os_name}|{r.os_name} *"))
    if r.min_ram_available is not None:
        items.append(attribute("mem_free", f"{r.min_ram_available}M"))
    if r.min_ram_size is not None:
        items.append(attribute("mem_total", f"{r.min_ram_size}M"))
    if r.min_storage_available is not None:
        items.append(attribute("disk_free", f"{r.min_storage_available}M"))
    if r.min_free_cpu is not None:  # processors the load leaves free, not the node's count
        requested.append(attribute("free_proc", str(r.min_free_cpu), "GE"))
    if r.clock_mhz is not None:  # a node whose clock is unknown does not meet it
        requested.append(attribute("clock_mhz", str(r.clock_mhz), "GE"))
    for window, pct in r.load:  # at least pct % available: the load per processor at most 1 - pct/100
        items.append(attribute(LOAD_VALUES[window], f"{(100 - pct) / 100:g}"))
    return items, requested


def sss_job(job: JrdlJob) -> tuple[Job, list[tuple[Executable, int]]]:
    """The SSS Job a JRDL job means, and its parts (one TaskGroup each, in order)."""
    parts = _parts(job)
    groups = [_group(x, n) for x, n in parts]
    items, requested = _requirements(job)
    if job.duration is not None:
        requested.append(Property.of("Duration", job.duration))
    return Job(Properties.of(*items, requested=requested or None), groups), parts


def prepare(job: JrdlJob, cluster: Cluster) -> Request:
    """One JRDL job compiled, or :class:`JrdlError` naming what cannot run."""
    source, parts = sss_job(job)
    try:
        request = sss.prepare(source, cluster)
    except SssError as exc:
        raise JrdlError(
            _retold(exc.reason, job, parts), element=_retold(exc.element or "", job, parts) or None
        ) from None
    processes = sum(1 if (x.job_type or "single") == "single" else n for x, n in parts)
    for g, (x, _) in zip(request.groups, parts, strict=True):
        _wrap(g, x, alone=processes == 1)
    request.where = job.where
    resolved = request.resolved
    if resolved is not None:  # placement's messages name the document's job and subjobs, not the SSS ones
        request.resolved = dataclasses.replace(
            resolved,
            where=job.where,
            variants=tuple(
                tuple(
                    dataclasses.replace(tg, where=x.where, requirement=dataclasses.replace(tg.requirement, best=BEST))
                    for tg, (x, _) in zip(v, parts, strict=True)
                )
                for v in resolved.variants
            ),
        )
    request.targets = targets(parts)
    request.not_before = job.start_time
    request.start_within = job.start_before
    if job.stage_in or job.stage_out or job.clean_up:
        request.staging = staging(job)
        request.description = dataclasses.replace(request.description, staging=request.staging)
    return request


def targets(parts: list[tuple[Executable, int]]) -> tuple[Target | None, ...] | None:
    """Where each part runs when any names it (co-allocation: each in an allocation of its own, all
    started together): ``resourceManagerContact`` ``site`` or ``site/allocation``, ``jobManagerType``
    ``fork`` (the local LRM) or ``pbs``. None: no part names one; the job runs inside one allocation."""
    if not any(x.contact is not None or x.manager is not None for x, _ in parts):
        return None
    out: list[Target | None] = []
    for x, _ in parts:
        if x.contact is None and x.manager is None:
            out.append(None)
            continue
        site, allocation = None, None
        named = []
        if x.contact is not None:
            site, _, rest = x.contact.partition("/")
            allocation = rest or None
            named.append(f"<resourceManagerContact> {x.contact!r}")
        if x.manager is not None:
            named.append(f"<jobManagerType> {x.manager}")
        lrm = JOB_MANAGER_LRMS[x.manager] if x.manager is not None else None
        out.append(Target(site or None, allocation, lrm, named=f"{x.where}: {' with '.join(named)}"))
    return tuple(out)


#: Where staging's messages name a directive, in the document's words.
_STAGING_WORDS: Final = (("stage_in", "<fileStageIn>"), ("stage_out", "<fileStageOut>"), ("cleanup", "<fileCleanUp>"))


def staging(job: JrdlJob) -> Staging:
    """fileStageIn (into the node's cache where the scheme has one, and a symbolic link from there to the
    path, as the spec says), fileStageOut (copied after the job, whatever its outcome) and fileCleanUp,
    through the staging every language shares; a scheme no transfer module takes is refused, naming the
    ones that are."""
    raw = {
        "stage_in": [[url, path, "link"] for url, path in job.stage_in],
        "stage_out": [[path, url, "copy"] for path, url in job.stage_out],
        "cleanup": list(job.clean_up),
    }
    try:
        return Staging.from_wire(raw, where="JRDL")
    except StagingError as exc:
        message = str(exc)
        for field, element in _STAGING_WORDS:
            message = message.replace(f"JRDL.{field}", element)
        raise JrdlError(message, element=job.where) from None


def _retold(text: str, job: JrdlJob, parts: list[tuple[Executable, int]]) -> str:
    """An SSS message about the generated Job, retold in the JRDL document's terms."""
    for i, (x, _) in enumerate(parts):
        text = text.replace(f"Job/TaskGroup[{i + 1}]", x.where)
    return re.sub(r"\bJob/TaskGroup\b|\bJob\b(?=[/ :]|$)", job.where, text)


# -- the wrapper: library path and stream fan-out ---------------------------------------------------------


def _wrap(group: GroupLaunch, x: Executable, *, alone: bool) -> None:
    """Run the group's tasks under :func:`wrapper_script` when the part needs it."""
    script = wrapper_script(x, alone=alone)
    if script is None:
        return
    d = group.template.description
    wrapped = dataclasses.replace(
        d, executable="/bin/sh", arguments=["-c", script, "jrdl-task", d.executable, *d.arguments]
    )
    group.template = TaskLaunch(wrapped, group.template.truncate, group.template.rlimits)


def wrapper_script(x: Executable, *, alone: bool) -> str | None:
    """The ``/bin/sh -c`` script that runs ``"$@"`` with ``libraryPath`` prepended to LD_LIBRARY_PATH and
    each stream copied to its further destinations; None when the part needs none of it. It holds no
    ``${NAME}`` of its own: the agent substitutes those (JOBID becomes ``${PILOT_JOB_ID}`` there)."""
    out = _extra(x.stdout)
    err = _extra(x.stderr)
    if not x.library_path and not out and not err:
        return None
    lines = []
    if x.library_path:
        lib = shlex.quote(":".join(x.library_path))
        lines.append(
            f'if [ -n "$LD_LIBRARY_PATH" ]; then LD_LIBRARY_PATH={lib}:"$LD_LIBRARY_PATH"; '
            f"else LD_LIBRARY_PATH={lib}; fi; export LD_LIBRARY_PATH"
        )
    if not out and not err:
        return "\n".join([*lines, 'exec "$@"'])
    tee = "tee" if alone else "tee -a"
    tee_out = f"{tee} {' '.join(map(shlex.quote, out))} >&3"
    tee_err = f"{tee} {' '.join(map(shlex.quote, err))} >&5"
    lines.append("exec 3>&1 5>&2")
    if out and err:
        run = f'{{ {{ {{ "$@" 4>&- 6>&-; echo $? >&4; }} 2>&6 | {tee_out}; }} 6>&1 | {tee_err}; }} 4>&1'
    elif out:
        run = f'{{ {{ "$@" 4>&-; echo $? >&4; }} | {tee_out}; }} 4>&1'
    else:
        run = f'{{ {{ {{ "$@" 4>&- 6>&-; echo $? >&4; }} 2>&6 >&3; }} 6>&1 | {tee_err}; }} 4>&1'
    lines += [f"s=$({run})", '[ -n "$s" ] || s=1', 'exit "$s"']
    return "\n".join(lines)


def _extra(paths: tuple[str, ...] | None) -> tuple[str, ...]:
    """The destinations the wrapper writes: after the first, or all when the first names JOBID (the task's
    own stream file is opened before the agent substitutes anything)."""
    if not paths:
        return ()
    return paths if JOBID_VALUE in paths[0] else paths[1:]


__all__ = ["DOCUMENT_KEY", "SUBMITTER_KEY", "compile_entry", "prepare", "rebuild", "sss_job", "wrapper_script"]
