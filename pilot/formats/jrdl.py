"""JRDL documents (``../shared/specs/jrdl-job-resource-description.txt``) read into :class:`JrdlJob`
objects with every ``substitutionRef`` resolved, and written back out resolved.

A JRDL document is a collection of jobs, each with job attributes (what to run, timing, subjobs) and
resource attributes (where it may run). Values use the RSL2 shapes: a string is a run of
``stringElement`` and ``substitutionRef`` children, concatenated (so one ``path`` can be
``$(HOME)/executable``); ``path``, ``pathArray``, ``stringArray``, ``hashtable``, ``integer`` and
``enumeration`` wrap them. ``substitutionDef`` may appear in the document, a job or a subjob; its
definitions are seen by everything inside that element (a job's own replace the document's), a
definition may use the ones before it, and a later one of the same name replaces an earlier one.

The reader is strict: an element it does not know is refused naming the element and its line, so
nothing a user wrote is silently dropped. The XML itself is parsed by :mod:`pilot.formats.xml` (defusedxml: no
DTDs, entities or external references). :func:`write_jrdl` writes one job resolved (no references
left), which is what the journal keeps to rebuild it after a restart.
"""

from __future__ import annotations

import calendar
import dataclasses
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pilot.formats import xml
from pilot.formats.xml import Node, XmlElement
from pilot.model.sss.errors import SssError

#: Job types of the spec: one process, an MPI launch, count independent tasks.
JOB_TYPES: Final = ("single", "xmpi", "htc")
#: The one scheduling plug-in this pilot has (the spec's default name).
SCHEDULING_PLUGINS: Final = ("Default",)
#: Table 1 names that have no meaning in a pilot (no Globus): refused unless the document defines them.
GLOBUS_ONLY: Final = {
    "GLOBUS_LOCATION": "names a Globus installation",
    "X509_CERT_DIR": "names a Globus certificate directory",
    "GLOBUS_RMS_JOB_CONTACT": "names a Globus resource manager's contact",
    "GLOBUSRUN_GASS_URL": "names a GASS server started by globusrun",
}
#: Table 1 names the submitter's side supplies (sent with the document by the client and the CLI).
SUBMITTER_NAMES: Final = ("HOME", "LOGNAME", "CUR_DIRL")
#: Table 1 names the nodes supply (the same on every node, or the reference is refused).
HOST_NAMES: Final = ("GLOBUS_HOST_CPUTYPE", "GLOBUS_HOST_MANUFACTURER", "GLOBUS_HOST_OSNAME", "GLOBUS_HOST_OSVERSION")
#: jobManagerType values (the spec's two local job managers).
JOB_MANAGERS: Final = ("fork", "pbs")
#: What JOBID becomes: the agent substitutes ``${VAR}`` in executable, arguments and environment values.
JOBID_VALUE: Final = "${PILOT_JOB_ID}"

_REMOTE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_DURATION: Final = re.compile(
    r"P(?:(?P<Y>\d+)Y)?(?:(?P<Mo>\d+)M)?(?:(?P<W>\d+)W)?(?:(?P<D>\d+)D)?"
    r"(?:T(?:(?P<H>\d+)H)?(?:(?P<Mi>\d+)M)?(?:(?P<S>\d+(?:\.\d+)?)S)?)?"
)
_DATETIME: Final = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})?")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class JrdlError(SssError):
    """A JRDL document that cannot be accepted: the message names the line and element."""


@dataclass(frozen=True, slots=True)
class Executable:
    """The executable and job-type attributes of a job or subjob (None: not given at this level)."""

    executable: str | None = None
    arguments: tuple[str, ...] | None = None
    directory: str | None = None
    environment: tuple[tuple[str, str], ...] | None = None
    stdin: str | None = None
    stdout: tuple[str, ...] | None = None
    stderr: tuple[str, ...] | None = None
    library_path: tuple[str, ...] | None = None
    job_type: str | None = None
    count: int | None = None
    #: Co-allocation: where it runs (resourceManagerContact: a site, or ``site/allocation``) and on which
    #: kind of job manager (jobManagerType ``fork`` or ``pbs``); a subjob inherits its job's.
    contact: str | None = None
    manager: str | None = None
    where: str = "<job>"

    def over(self, base: Executable) -> Executable:
        """This subjob's attributes over its job's: each attribute given here replaces the job's whole."""
        inherited = {
            n: getattr(base, n)
            for n in _INHERITED
            if getattr(self, n) is None  # a subjob's own count is its own (1 when not given)
        }
        return dataclasses.replace(self, **inherited)


_INHERITED: Final = (
    "executable",
    "arguments",
    "directory",
    "environment",
    "stdin",
    "stdout",
    "stderr",
    "library_path",
    "job_type",
    "contact",
    "manager",
)


@dataclass(frozen=True, slots=True)
class Resource:
    """Resource attributes: the user's requirements on the nodes (MB for memory and storage, % for load)."""

    count: int | None = None
    os_name: str | None = None
    min_ram_available: int | None = None
    min_ram_size: int | None = None
    min_storage_available: int | None = None
    min_free_cpu: int | None = None
    load: tuple[tuple[str, int], ...] = ()  # ("last1Min", 10), ...: % availability at least
    clock_mhz: int | None = None  # processor clockSpeed at least
    scheduling_type: str | None = None
    scheduling_plugin: str | None = None


@dataclass(frozen=True, slots=True)
class JrdlJob:
    attributes: Executable
    subjobs: tuple[Executable, ...] = ()
    resource: Resource = field(default_factory=Resource)
    start_time: float | None = None  # seconds since the epoch
    start_before: float | None = None  # seconds after submission
    duration: float | None = None  # seconds of walltime
    where: str = "<job>"
    stage_in: tuple[tuple[str, str], ...] = ()  # (url, path): fileStageIn, into the cache and linked
    stage_out: tuple[tuple[str, str], ...] = ()  # (path, url): fileStageOut
    clean_up: tuple[str, ...] = ()  # fileCleanUp


@dataclass(frozen=True, slots=True)
class Facts:
    """What Table 1's reserved names resolve to: the submitter's (HOME, LOGNAME, CUR_DIRL) and the
    nodes' (GLOBUS_HOST_*: a value, or why it has none)."""

    submitter: Mapping[str, str] = field(default_factory=dict)
    host: Mapping[str, str] = field(default_factory=dict)
    host_missing: str = "no node has registered yet; submit again once 'pilot nodes' lists them"


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _w(el: XmlElement) -> str:
    return f"<{_local(el.tag)}>"


def _err(message: str, el: XmlElement) -> JrdlError:
    return JrdlError(message, element=_w(el), line=el.line)


class _Scope:
    """The substitution definitions visible at one point: the document's, a job's, a subjob's."""

    def __init__(self, facts: Facts, parent: _Scope | None = None) -> None:
        self.facts = facts
        self.parent = parent
        self.defs: dict[str, str] = {}

    def lookup(self, name: str) -> str | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.defs:
                return scope.defs[name]
            scope = scope.parent
        return None

    def resolve(self, name: str, el: XmlElement) -> str:
        value = self.lookup(name)
        if value is not None:
            return value
        if name in SUBMITTER_NAMES:
            found = self.facts.submitter.get(name)
            if found is None:
                raise _err(
                    f'substitutionRef name="{name}": the submission does not say the submitter\'s {name}; '
                    "submit with 'pilot submit' or submit_jrdl, or define it with a substitutionDef",
                    el,
                )
            return found
        if name in HOST_NAMES:
            found = self.facts.host.get(name)
            if found is None:
                raise _err(f'substitutionRef name="{name}" cannot be resolved: {self.facts.host_missing}', el)
            return found
        if name == "JOBID":
            return JOBID_VALUE
        if name in GLOBUS_ONLY:
            raise _err(
                f'substitutionRef name="{name}" {GLOBUS_ONLY[name]}, which this pilot does not use; define it '
                f'with <substitutionDef name="{name}"> if the job needs a value',
                el,
            )
        raise _err(
            f'substitutionRef name="{name}" is not defined: add <substitutionDef name="{name}"> before it '
            "(reserved names: " + ", ".join((*SUBMITTER_NAMES, "JOBID", *HOST_NAMES)) + ")",
            el,
        )


# -- values ---------------------------------------------------------------------------------------------


def _attr(el: XmlElement, name: str) -> str:
    value = el.attrib.get(name)
    if value is None:
        raise _err(f'needs a {name}="..." attribute', el)
    return value


def _only_attrs(el: XmlElement, *allowed: str) -> None:
    for k in el.attrib:
        if k not in allowed and not k.startswith("{"):
            raise _err(f'has an attribute {k}="..." that JRDL does not define here; remove it', el)


def _string(el: XmlElement, scope: _Scope) -> str:
    """A string: its stringElement and substitutionRef children, concatenated in order."""
    return _concatenated(el, scope, "stringElement", what="a string")


def _concatenated(el: XmlElement, scope: _Scope, element: str, *, what: str) -> str:
    """A value made of ``element`` (value=...) and substitutionRef children, concatenated in order."""
    parts: list[str] = []
    for child in el.children:
        tag = _local(child.tag)
        if tag == element:
            _only_attrs(child, "value")
            parts.append(_attr(child, "value"))
        elif tag == "substitutionRef":
            _only_attrs(child, "name")
            parts.append(scope.resolve(_attr(child, "name"), child))
        else:
            raise _err(f"holds <{tag}> (line {child.line}); {what} is made of {element} and substitutionRef", el)
    if el.text.strip():
        raise _err(f'holds text {el.text.strip()!r}; write it as <{element} value="..."/>', el)
    if not parts:
        raise _err(f'is empty: give a <{element} value="..."/>', el)
    return "".join(parts)


def _one(el: XmlElement, tag: str) -> XmlElement:
    kids = [c for c in el.children if _local(c.tag) == tag]
    others = [c for c in el.children if _local(c.tag) != tag]
    if others:
        raise _err(f"holds <{_local(others[0].tag)}> (line {others[0].line}); it takes one <{tag}>", el)
    if len(kids) != 1:
        raise _err(f"takes exactly one <{tag}>, not {len(kids)}", el)
    if el.text.strip():
        raise _err(f"holds text {el.text.strip()!r}; put the value in <{tag}>", el)
    return kids[0]


def _many(el: XmlElement, tag: str) -> list[XmlElement]:
    for c in el.children:
        if _local(c.tag) != tag:
            raise _err(f"holds <{_local(c.tag)}> (line {c.line}); it takes <{tag}> elements", el)
    if not el.children:
        raise _err(f"is empty: give at least one <{tag}>", el)
    return el.children


def _local_path(value: str, el: XmlElement) -> str:
    if _REMOTE.match(value):
        raise _err(
            f"{value!r} is a remote URL; give a path on the nodes (<fileStageIn> brings a file there first)",
            el,
        )
    return value


def _url(el: XmlElement, scope: _Scope) -> str:
    """A url: its urlElement and substitutionRef children, concatenated in order."""
    return _concatenated(el, scope, "urlElement", what="a url")


def _url_and_path(el: XmlElement, scope: _Scope) -> tuple[str, str]:
    """A fileInput's or fileOutput's (url, path), each given once."""
    kids = {_local(c.tag): c for c in _many_of(el, ("url", "path"))}
    if set(kids) != {"url", "path"}:
        raise _err("needs both a <url> and a <path>", el)
    return _url(kids["url"], scope), _string(kids["path"], scope)


def _staging(kids: dict[str, XmlElement], scope: _Scope) -> dict[str, Any]:
    """fileStageIn, fileStageOut and fileCleanUp of a job (JrdlJob fields)."""
    out: dict[str, Any] = {}
    if (i := kids.get("fileStageIn")) is not None:
        items = _many(_one(i, "fileInputArray"), "fileInput")
        out["stage_in"] = tuple(_url_and_path(f, scope) for f in items)
    if (o := kids.get("fileStageOut")) is not None:
        items = _many(_one(o, "fileOutputArray"), "fileOutput")
        out["stage_out"] = tuple((path, url) for url, path in (_url_and_path(f, scope) for f in items))
    if (c := kids.get("fileCleanUp")) is not None:
        array = _one(c, "pathArray")
        out["clean_up"] = tuple(_string(p, scope) for p in _many(array, "path"))
    return out


def _path(el: XmlElement, scope: _Scope) -> str:
    return _local_path(_string(_one(el, "path"), scope), el)


def _paths(el: XmlElement, scope: _Scope) -> tuple[str, ...]:
    """A pathArray (or one path, as RSL2 also allows)."""
    kinds = {_local(c.tag) for c in el.children}
    if kinds == {"path"} and len(el.children) == 1:
        return (_path(el, scope),)
    array = _one(el, "pathArray")
    return tuple(_local_path(_string(p, scope), p) for p in _many(array, "path"))


def _integer(el: XmlElement, *, least: int = 1) -> int:
    i = _one(el, "integer")
    _only_attrs(i, "value")
    raw = _attr(i, "value").strip()
    if not re.fullmatch(r"[+-]?\d{1,12}", raw) or int(raw) < least:
        raise _err(f'value="{raw}" must be a whole number of at least {least}', i)
    return int(raw)


def _enumeration(el: XmlElement, allowed: tuple[str, ...]) -> str:
    value = _one(_one(el, "enumeration"), "enumerationValue")
    if len(value.children) != 1:
        raise _err("takes exactly one value element, e.g. <" + allowed[0] + "/>", value)
    tag = _local(value.children[0].tag)
    if tag not in allowed:
        raise _err(f"<{tag}/> is not known here: use one of " + ", ".join(f"<{a}/>" for a in allowed), value)
    return tag


def _text(el: XmlElement) -> str:
    if el.children:
        raise _err(f"holds <{_local(el.children[0].tag)}>; write the value as text", el)
    return el.text.strip()


def duration_seconds(text: str, el: XmlElement) -> float:
    """An ISO 8601 duration (``PT10H3M``) in seconds. Years and months have no fixed length: refused."""
    m = _DURATION.fullmatch(text)
    if not m or text in ("P", "PT") or text.endswith("T") or not any(m.groupdict().values()):
        raise _err(f"{text!r} is not an ISO 8601 duration; write it like PT10H3M or P1DT2H", el)
    if m["Y"] or m["Mo"]:
        raise _err(f"{text!r} counts years or months, which have no fixed length; write days (P30D)", el)
    g = {k: float(v) for k, v in m.groupdict().items() if v}
    seconds = (
        g.get("W", 0) * 604800 + g.get("D", 0) * 86400 + g.get("H", 0) * 3600 + g.get("Mi", 0) * 60 + g.get("S", 0)
    )
    if seconds <= 0:
        raise _err(f"{text!r} is no time at all; give a positive duration", el)
    return seconds


def datetime_seconds(text: str, el: XmlElement) -> float:
    """``YYYY-MM-DDThh:mm:ss[.fff](Z|+hh:mm)`` in seconds since the epoch. A time zone is required: the
    pilot's nodes and its submitter may not share one."""
    m = _DATETIME.fullmatch(text)
    if not m:
        raise _err(f"{text!r} is not a dateTime; write it like 2004-10-21T01:10:00Z", el)
    if m[8] is None:
        raise _err(f"{text!r} has no time zone; add Z (UTC) or an offset like +09:00", el)
    y, mo, d, h, mi, s = (int(m[i]) for i in range(1, 7))
    if not (1 <= mo <= 12 and 1 <= d <= 31 and h <= 23 and mi <= 59 and s <= 59):
        raise _err(f"{text!r} is not a valid date and time", el)
    try:
        t = float(calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)))
    except (OverflowError, ValueError):
        raise _err(f"{text!r} is not a valid date and time", el) from None
    if calendar.monthrange(y, mo)[1] < d:
        raise _err(f"{text!r} is not a valid date: that month has {calendar.monthrange(y, mo)[1]} days", el)
    if m[7]:
        t += float(m[7])
    if m[8] != "Z":
        sign = 1 if m[8][0] == "+" else -1
        t -= sign * (int(m[8][1:3]) * 3600 + int(m[8][4:6]) * 60)
    return t


# -- elements -------------------------------------------------------------------------------------------

_EXECUTABLE_TAGS: Final = (
    "executable",
    "arguments",
    "directory",
    "environment",
    "stdin",
    "stdout",
    "stderr",
    "libraryPath",
    "jobType",
    "count",
    "resourceManagerContact",
    "jobManagerType",
)
_JOB_TAGS: Final = (
    *_EXECUTABLE_TAGS,
    "jobStartTime",
    "jobStartBefore",
    "jobDuration",
    "subjob",
    "resource",
    "fileStageIn",
    "fileStageOut",
    "fileCleanUp",
)
_SUBJOB_TAGS: Final = _EXECUTABLE_TAGS
_RESOURCE_TAGS: Final = (
    "count",
    "operatingSystem",
    "processor",
    "minMainMemory",
    "minStorage",
    "minFreeCPU",
    "processorLoad",
    "schedulingType",
    "schedulingPlugin",
)


def _children(el: XmlElement, allowed: tuple[str, ...], scope: _Scope) -> dict[str, XmlElement]:
    """An element's children by tag, each at most once; substitutionDefs are read into ``scope`` in order."""
    seen: dict[str, XmlElement] = {}
    if el.text.strip():
        raise _err(f"holds text {el.text.strip()[:40]!r}; it takes elements only", el)
    for child in el.children:
        tag = _local(child.tag)
        if tag == "substitutionDef":
            _only_attrs(child, "name")
            scope.defs[_attr(child, "name")] = _string(child, scope)
            continue
        if tag not in allowed:
            raise _err(
                f"is not a JRDL element inside <{_local(el.tag)}>; allowed: {', '.join(allowed)}, substitutionDef",
                child,
            )
        if tag in seen and tag not in ("job", "subjob"):
            raise _err(f"appears twice in <{_local(el.tag)}> (first on line {seen[tag].line}); keep one", child)
        _only_attrs(child)
        seen.setdefault(tag, child)
    return seen


def _executable(el: XmlElement, kids: dict[str, XmlElement], scope: _Scope, where: str) -> Executable:
    def get(tag: str) -> XmlElement | None:
        return kids.get(tag)

    environment = None
    if (e := get("environment")) is not None:
        table = _one(e, "hashtable")
        pairs: dict[str, str] = {}
        for entry in _many(table, "entry"):
            _only_attrs(entry, "name")
            name = _attr(entry, "name")
            if not _ENV_NAME.fullmatch(name):
                raise _err(f'name="{name}" is not a valid environment variable name', entry)
            if name in pairs:
                raise _err(f'name="{name}" is given twice; keep one', entry)
            pairs[name] = _string(entry, scope)
        environment = tuple(pairs.items())
    arguments = None
    if (a := get("arguments")) is not None:
        arguments = tuple(_string(s, scope) for s in _many(_one(a, "stringArray"), "string"))
    return Executable(
        executable=_path(x, scope) if (x := get("executable")) is not None else None,
        arguments=arguments,
        directory=_path(d, scope) if (d := get("directory")) is not None else None,
        environment=environment,
        stdin=_path(i, scope) if (i := get("stdin")) is not None else None,
        stdout=_paths(o, scope) if (o := get("stdout")) is not None else None,
        stderr=_paths(r, scope) if (r := get("stderr")) is not None else None,
        library_path=_paths(lp, scope) if (lp := get("libraryPath")) is not None else None,
        job_type=_enumeration(t, JOB_TYPES) if (t := get("jobType")) is not None else None,
        count=_integer(c) if (c := get("count")) is not None else None,
        contact=_contact(rc, scope) if (rc := get("resourceManagerContact")) is not None else None,
        manager=_enumeration(m, JOB_MANAGERS) if (m := get("jobManagerType")) is not None else None,
        where=where,
    )


def _contact(el: XmlElement, scope: _Scope) -> str:
    value = _string(_one(el, "string"), scope).strip()
    if not value:
        raise _err("is empty: name a site of the pilot, or site/allocation", el)
    return value


def _resource(el: XmlElement, scope: _Scope) -> Resource:
    kids = _children(el, _RESOURCE_TAGS, scope)
    clock = None
    if (p := kids.get("processor")) is not None:
        clock = _integer(_one(p, "clockSpeed"))
    os_name = None
    if (o := kids.get("operatingSystem")) is not None:
        os_name = _string(_one(_one(o, "name"), "string"), scope).strip()
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", os_name):
            raise _err(f"name {os_name!r} is not an operating system name like Linux", o)
    ram_available = ram_size = storage = None
    if (m := kids.get("minMainMemory")) is not None:
        for child in m.children:
            tag = _local(child.tag)
            if tag not in ("minRAMAvailable", "minRAMSize"):
                raise _err(f"holds <{tag}> (line {child.line}); it takes minRAMAvailable and minRAMSize", m)
        if not m.children:
            raise _err("is empty: give <minRAMAvailable> or <minRAMSize>", m)
        for child in m.children:
            if _local(child.tag) == "minRAMAvailable":
                ram_available = _integer(child, least=0)
            else:
                ram_size = _integer(child, least=0)
    if (s := kids.get("minStorage")) is not None:
        storage = _integer(_one(s, "minStorageAvailable"), least=0)
    load: list[tuple[str, int]] = []
    if (pl := kids.get("processorLoad")) is not None:
        for child in _many_of(pl, ("last1Min", "last5Min", "last15Min")):
            pct = _integer(child, least=0)
            if pct > 100:
                raise _err(f"{pct} % is more than all of a processor; give 0 to 100", child)
            load.append((_local(child.tag), pct))
    scheduling_type = scheduling_plugin = None
    if (st := kids.get("schedulingType")) is not None:
        scheduling_type = _string(_one(st, "string"), scope)
        if scheduling_type != "scheduler":
            raise _err(
                f"{scheduling_type!r}: this pilot places every job with its scheduler (a job is never forked "
                "unscheduled); write scheduler or leave it out",
                st,
            )
    if (sp := kids.get("schedulingPlugin")) is not None:
        scheduling_plugin = _string(_one(sp, "string"), scope)
        if scheduling_plugin not in SCHEDULING_PLUGINS:
            raise _err(
                f"{scheduling_plugin!r} is not a scheduling plug-in of this pilot; its plug-ins: "
                + ", ".join(SCHEDULING_PLUGINS),
                sp,
            )
    return Resource(
        count=_integer(c) if (c := kids.get("count")) is not None else None,
        os_name=os_name,
        min_ram_available=ram_available,
        min_ram_size=ram_size,
        min_storage_available=storage,
        min_free_cpu=_integer(f) if (f := kids.get("minFreeCPU")) is not None else None,
        load=tuple(load),
        clock_mhz=clock,
        scheduling_type=scheduling_type,
        scheduling_plugin=scheduling_plugin,
    )


def _many_of(el: XmlElement, tags: tuple[str, ...]) -> list[XmlElement]:
    seen: set[str] = set()
    for c in el.children:
        tag = _local(c.tag)
        if tag not in tags:
            raise _err(f"holds <{tag}> (line {c.line}); it takes " + ", ".join(tags), el)
        if tag in seen:
            raise _err(f"<{tag}> appears twice; keep one", c)
        seen.add(tag)
    if not el.children:
        raise _err("is empty: give one of " + ", ".join(tags), el)
    return el.children


def _job(el: XmlElement, index: int, scope: _Scope) -> JrdlJob:
    where = f"<job> #{index + 1} (line {el.line})"
    kids = _children(el, _JOB_TAGS, scope)
    attrs = _executable(el, kids, scope, where)
    subjobs = []
    for k, sub in enumerate(c for c in el.children if _local(c.tag) == "subjob"):
        sub_scope = _Scope(scope.facts, scope)
        sub_kids = _children(sub, _SUBJOB_TAGS, sub_scope)
        subjobs.append(_executable(sub, sub_kids, sub_scope, f"{where}/<subjob> #{k + 1} (line {sub.line})"))
    start_time = start_before = None
    if (t := kids.get("jobStartTime")) is not None:
        start_time = datetime_seconds(_text(t), t)
    if (b := kids.get("jobStartBefore")) is not None:
        if t is not None:
            raise _err(f"and <jobStartTime> (line {t.line}) are mutually exclusive (the spec says so); keep one", b)
        start_before = duration_seconds(_text(b), b)
    duration = duration_seconds(_text(d), d) if (d := kids.get("jobDuration")) is not None else None
    resource = _resource(r, scope) if (r := kids.get("resource")) is not None else Resource()
    return JrdlJob(attrs, tuple(subjobs), resource, start_time, start_before, duration, where, **_staging(kids, scope))


def is_jrdl(data: str | bytes) -> bool:
    """Whether a document's root element is ``<jrdl>`` (so the CLI sends it as JRDL, not SSS): a look at
    the first element's name only; reading it is the daemon's."""
    text = data[:4096].decode("utf-8", "replace") if isinstance(data, bytes) else data[:4096]
    text = re.sub(r"<\?.*?\?>|<!--.*?-->", "", text, flags=re.S)
    m = re.search(r"<\s*([A-Za-z_][\w.-]*:)?([A-Za-z_][\w.-]*)", text)
    return m is not None and m.group(2) == "jrdl"


def read_jrdl(data: str | bytes, facts: Facts | None = None) -> list[JrdlJob]:
    """Every job of a JRDL document, references resolved. Raises :class:`JrdlError` naming the line and
    element of the first thing that cannot be accepted."""
    try:
        root = xml.parse(data, what="JRDL document")
    except JrdlError:
        raise
    except SssError as exc:
        raise JrdlError(exc.reason, element=exc.element, line=exc.line) from None
    if _local(root.tag) != "jrdl":
        raise _err("is not a JRDL document: its root element must be <jrdl>", root)
    _only_attrs(root)
    scope = _Scope(facts or Facts())
    _children(root, ("job",), scope)
    jobs = [c for c in root.children if _local(c.tag) == "job"]
    if not jobs:
        raise _err("holds no <job>: nothing to run", root)
    return [_job(j, i, _Scope(scope.facts, scope)) for i, j in enumerate(jobs)]


# -- writing --------------------------------------------------------------------------------------------


def _s(tag: str, value: str) -> Node:
    return Node(tag, children=[Node("stringElement", (("value", value),))])


def _p(tag: str, value: str) -> Node:
    return Node(tag, children=[_s("path", value)])


def _pa(tag: str, values: tuple[str, ...]) -> Node:
    return Node(tag, children=[Node("pathArray", children=[_s("path", v) for v in values])])


def _i(tag: str, value: int) -> Node:
    return Node(tag, children=[Node("integer", (("value", str(value)),))])


def _duration_text(seconds: float) -> str:
    return f"PT{seconds!r}S" if not float(seconds).is_integer() else f"PT{int(seconds)}S"


def _executable_nodes(x: Executable) -> list[Node]:
    out: list[Node] = []
    if x.executable is not None:
        out.append(_p("executable", x.executable))
    if x.arguments is not None:
        out.append(Node("arguments", children=[Node("stringArray", children=[_s("string", a) for a in x.arguments])]))
    if x.directory is not None:
        out.append(_p("directory", x.directory))
    if x.environment is not None:
        entries = [
            Node("entry", (("name", k),), children=[Node("stringElement", (("value", v),))]) for k, v in x.environment
        ]
        out.append(Node("environment", children=[Node("hashtable", children=entries)]))
    if x.stdin is not None:
        out.append(_p("stdin", x.stdin))
    for tag, paths in (("stdout", x.stdout), ("stderr", x.stderr), ("libraryPath", x.library_path)):
        if paths is not None:
            out.append(_pa(tag, paths))
    if x.job_type is not None:
        value = Node("enumerationValue", children=[Node(x.job_type)])
        out.append(Node("jobType", children=[Node("enumeration", children=[value])]))
    if x.count is not None:
        out.append(_i("count", x.count))
    if x.contact is not None:
        out.append(Node("resourceManagerContact", children=[_s("string", x.contact)]))
    if x.manager is not None:
        value = Node("enumerationValue", children=[Node(x.manager)])
        out.append(Node("jobManagerType", children=[Node("enumeration", children=[value])]))
    return out


def write_jrdl(job: JrdlJob) -> str:
    """One job as a JRDL document with every value written out (what the journal keeps)."""
    nodes = _executable_nodes(job.attributes)
    if job.start_time is not None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(job.start_time))
        frac = job.start_time - int(job.start_time)
        nodes.append(Node("jobStartTime", text=stamp + (f"{frac:.6f}"[1:] if frac else "") + "Z"))
    if job.start_before is not None:
        nodes.append(Node("jobStartBefore", text=_duration_text(job.start_before)))
    if job.duration is not None:
        nodes.append(Node("jobDuration", text=_duration_text(job.duration)))
    nodes += [Node("subjob", children=_executable_nodes(s)) for s in job.subjobs]
    r = job.resource
    res: list[Node] = []
    if r.count is not None:
        res.append(_i("count", r.count))
    if r.os_name is not None:
        res.append(Node("operatingSystem", children=[Node("name", children=[_s("string", r.os_name)])]))
    if r.clock_mhz is not None:
        res.append(Node("processor", children=[_i("clockSpeed", r.clock_mhz)]))
    memory = [
        _i(t, v) for t, v in (("minRAMAvailable", r.min_ram_available), ("minRAMSize", r.min_ram_size)) if v is not None
    ]
    if memory:
        res.append(Node("minMainMemory", children=memory))
    if r.min_storage_available is not None:
        res.append(Node("minStorage", children=[_i("minStorageAvailable", r.min_storage_available)]))
    if r.min_free_cpu is not None:
        res.append(_i("minFreeCPU", r.min_free_cpu))
    if r.load:
        res.append(Node("processorLoad", children=[_i(t, v) for t, v in r.load]))
    if r.scheduling_type is not None:
        res.append(Node("schedulingType", children=[_s("string", r.scheduling_type)]))
    if r.scheduling_plugin is not None:
        res.append(Node("schedulingPlugin", children=[_s("string", r.scheduling_plugin)]))
    if res:
        nodes.append(Node("resource", children=res))
    nodes += _staging_nodes(job)
    return xml.write(Node("jrdl", children=[Node("job", children=nodes)]))


def _staging_nodes(job: JrdlJob) -> list[Node]:
    def url(value: str) -> Node:
        return Node("url", children=[Node("urlElement", (("value", value),))])

    out: list[Node] = []
    if job.stage_in:
        inputs = [Node("fileInput", children=[url(u), _s("path", p)]) for u, p in job.stage_in]
        out.append(Node("fileStageIn", children=[Node("fileInputArray", children=inputs)]))
    if job.stage_out:
        outputs = [Node("fileOutput", children=[_s("path", p), url(u)]) for p, u in job.stage_out]
        out.append(Node("fileStageOut", children=[Node("fileOutputArray", children=outputs)]))
    if job.clean_up:
        out.append(_pa("fileCleanUp", job.clean_up))
    return out


__all__ = [
    "JOB_TYPES",
    "Executable",
    "Facts",
    "JrdlError",
    "JrdlJob",
    "Resource",
    "is_jrdl",
    "read_jrdl",
    "write_jrdl",
]
