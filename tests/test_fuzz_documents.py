"""Fuzzing of the documents the pilot reads: config files and SSS XML (see test_fuzz.py for the contract)."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from fuzzing import (
    SCALE,
    STRETCH,
    UNIT,
    Strategy,
    _check_description,
)
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from pilot import config, lrm
from pilot.formats import read_job, read_nodes, write_job
from pilot.formats.xml import MAX_DEPTH
from pilot.lrm._batch import COMMON_OPTIONS
from pilot.model.job_description import DescriptionError, JobDescription
from pilot.model.sss import Job, SssError, effective_jobs
from pilot.model.sss.psij import description, from_sss, to_sss

# Config files
# ============================================================================================================


def _toml_str(s: str) -> str:
    out = ['"']
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out) + '"'


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_str(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise AssertionError(v)


def _toml(doc: dict[str, Any]) -> str:
    lines = []
    for table, body in doc.items():
        if isinstance(body, dict):
            lines.append(f"[{_toml_str(table)}]")
            lines += [f"{_toml_str(k)} = {_toml_value(v)}" for k, v in body.items()]
        else:
            lines.insert(0, f"{_toml_str(table)} = {_toml_value(body)}")
    return "\n".join(lines) + "\n"


_toml_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_toml_scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-3, 100),
    st.floats(),
    st.floats(0.001, 100),
    _toml_text,
    st.sampled_from(
        ["", "1", "1h", "2h30m", "30m", "10s", "0s", "1.5d", "01:00:00", "1-00:00:00", "00:00", "4G", "512M", "4GiB"]
    ),
    st.sampled_from(["1e999s", "9" * 400 + "s", "9" * 400 + ":00", "9" * 5000 + ":00", "9" * 400, "²s", "1_0s"]),
    st.sampled_from(["ipc", "tcp", "info", "debug", "default", "a b", "name\n", "8G\n"]),
)
_toml_values = st.recursive(
    _toml_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_toml_text, inner, max_size=2),
    max_leaves=6,
)
_PILOT_KEYS = sorted(f.name for f in fields(config.PilotSettings))
_LRM_KEYS = sorted(
    {"lrm", "nodes", "walltime", "cores_per_node", "gpus_per_node", "memory_per_node", "features", "agent_python"}
    | set(COMMON_OPTIONS)
    | {k for cls in lrm._REGISTRY.values() for k in getattr(cls, "own_options", {})}
)


@st.composite
def _config_docs(draw: st.DrawFn) -> dict[str, Any]:
    def table(keys: list[str]) -> dict[str, Any]:
        chosen = draw(st.lists(st.sampled_from(keys) | _toml_text, max_size=5, unique=True))
        return {k: draw(_toml_values) for k in chosen}

    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["pilot"] = table(_PILOT_KEYS)
    if draw(st.integers(0, 4)):
        alloc = table(_LRM_KEYS)
        alloc.setdefault("lrm", draw(st.sampled_from(sorted(lrm._REGISTRY)) | _toml_values))
        doc["allocation"] = alloc
    if not draw(st.integers(0, 9)):
        doc[draw(_toml_text)] = draw(_toml_values)
    return doc


def _check_config(cfg: config.Config) -> None:
    p = cfg.pilot
    for name in ("heartbeat_interval", "agent_timeout", "kill_grace", "walltime_margin", "agent_start_timeout"):
        value = getattr(p, name)
        assert math.isfinite(value) and value > 0, f"accepted pilot.{name} = {value}"
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", p.name), f"accepted pilot.name = {p.name!r}"
    assert p.agent_timeout > p.heartbeat_interval
    w = cfg.allocation.walltime
    assert w is None or (math.isfinite(w) and w > 0), f"accepted allocation.walltime = {w}"
    assert cfg.allocation.nodes >= 1


def _load_config(path: Path) -> None:
    """What ``pilot up`` does with a config file before it starts anything."""
    try:
        cfg = config.load(path)
        _check_config(cfg)
        lrm.create(cfg.allocation.lrm, options=cfg.allocation.options, source=cfg.source)
    except config.ConfigError as exc:
        assert str(exc)


@pytest.mark.timeout(60 * STRETCH)
def test_config_files_raise_only_config_error(tmp_path: Path) -> None:
    path = tmp_path / "fuzz.toml"

    @UNIT
    @given(_config_docs())
    @example({"allocation": {"lrm": "slurm", "walltime": "9" * 400 + ":00"}})
    @example({"pilot": {"heartbeat_interval": math.nan}})
    @example({"allocation": {"lrm": "local", "memory_per_node": "9" * 400}})
    def load(doc: dict[str, Any]) -> None:
        text = _toml(doc)
        note(text)
        path.write_text(text)
        _load_config(path)

    load()


@pytest.mark.timeout(60 * STRETCH)
def test_damaged_config_files_raise_only_config_error(tmp_path: Path) -> None:
    path = tmp_path / "fuzz.toml"
    shipped = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.toml"))
    assert shipped
    sources = [p.read_bytes() for p in shipped]

    @UNIT
    @given(st.sampled_from(sources), st.lists(st.tuples(st.floats(0, 1), st.binary(max_size=3)), max_size=4))
    @example(b'[pilot]\nname = "x"\n', [(0.5, b"\xff")])
    def load(source: bytes, edits: list[tuple[float, bytes]]) -> None:
        data = bytearray(source)
        for where, new in edits:
            pos = int(where * len(data))
            data[pos : pos + len(new)] = new
        path.write_bytes(bytes(data))
        _load_config(path)

    load()


# ============================================================================================================
# SSS XML
# ============================================================================================================

_XML_TAGS = [
    "JobGroup", "Job", "JobDefaults", "TaskGroup", "TaskGroupDefaults", "Task", "TaskDefaults", "Requested",
    "Delivered", "Environment", "Variable", "Executable", "Arguments", "Processors", "Memory", "Duration",
    "NodeCount", "TaskCount", "TaskDistribution", "Resource", "ResourceLimit", "Dependency", "Extension",
    "Feature", "Node", "Hold", "OutputFile", "InputFile", "Name", "Id", "Priority", "StartTime", "Interactive",
    "Data", "Configured", "Available", "Utilized", "Opsys", "Arch", "Swap", "Teleport",
]  # fmt: skip
_XML_ATTRS = [
    "awarenessPolicy", "op", "conj", "group", "preference", "performanceFactor", "units", "metric", "name",
    "type", "export", "redirectList", "aggregation", "count", "condition", "code", "designator", "context",
    "dynamic", "wallDuration", "colour",
]  # fmt: skip
_XML_WORDS = st.sampled_from(
    [
        "", "1", "0", "-1", "16", "3600", "1.5", "nan", "inf", "-0", "1e400", "9" * 5000, "true", "false",
        "Reject", "Warn", "Ignore", "EQ", "GE", "Match", "And", "MB", "GB", "B", "GPU", "TasksPerNode",
        "RoundRobin", "CustomAttribute", "PSIJ", "Launcher", "OnExit", "JobId", "/bin/true", "#1", "'unbalanced",
        "unlimited", "CPUTime", "Hard", '{"a": [1]}', "Append,Close", "List",
    ]
)  # fmt: skip
_xml_safe_text = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00\ufffe\uffff", min_codepoint=9).filter(
        lambda c: c in "\t\n\r" or ord(c) >= 32
    ),
    max_size=12,
)


def _esc(s: str, attr: bool = False) -> str:
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace('"', "&quot;").replace("\n", "&#10;") if attr else s


def _render(tag: str, attrs: dict[str, str], text: str, children: list[str]) -> str:
    attributes = "".join(f' {k}="{_esc(v, True)}"' for k, v in attrs.items())
    return f"<{tag}{attributes}>{_esc(text)}{''.join(children)}</{tag}>"


_attrs = st.dictionaries(st.sampled_from(_XML_ATTRS), _XML_WORDS | _xml_safe_text, max_size=3)
_element: Strategy[str] = st.recursive(
    st.builds(_render, st.sampled_from(_XML_TAGS), _attrs, _XML_WORDS | _xml_safe_text, st.just([])),
    lambda inner: st.builds(
        _render, st.sampled_from(_XML_TAGS), _attrs, _XML_WORDS | _xml_safe_text, st.lists(inner, max_size=4)
    ),
    max_leaves=20,
)
_roots = st.builds(
    lambda root, attrs, body: _render(root, attrs, "", body),
    st.sampled_from(["Job", "JobGroup", "Node", "Data", "Task"]),
    _attrs,
    st.lists(_element, max_size=6),
)
_documents = st.builds(
    lambda decl, root: decl + root,
    st.sampled_from(["", '<?xml version="1.0"?>\n', '<?xml version="1.0" encoding="UTF-8"?>']),
    _roots,
)
_ACCESSORS = ("arguments", "environment", "resource_limits", "dependencies", "duration", "custom_attributes")


def _read_sss(data: str | bytes) -> None:
    """Everything a reader of an SSS document does with it: read, resolve defaults, convert to the job
    descriptions the daemon would run, write back. Only SssError (a DescriptionError) may escape."""
    try:
        read_nodes(data)
    except SssError as exc:
        assert str(exc)
    try:
        result = read_job(data)
    except SssError as exc:
        assert str(exc)
        return
    value = result.value
    assert read_job(write_job(value)).value == value
    try:
        for job in effective_jobs(value):
            for p in (job.properties, *(tg.properties for tg in job.task_groups)):
                for accessor in _ACCESSORS:
                    getattr(p, accessor)
            for tg in job.task_groups:
                _check_description(description(job, tg))
        if isinstance(value, Job):
            _check_description(from_sss(value))
    except DescriptionError as exc:
        assert str(exc)


@pytest.mark.timeout(60 * STRETCH)
@UNIT
@given(_documents)
@example(
    "<Job><Executable>x</Executable><TaskGroup>"
    '<TaskDistribution type="TasksPerNode">abc</TaskDistribution></TaskGroup></Job>'
)
def test_generated_sss_documents_raise_only_sss_error(doc: str) -> None:
    _read_sss(doc)
    _read_sss(doc.encode())


_psij_maps = st.fixed_dictionaries(
    {"executable": st.sampled_from(["/bin/true", "/usr/bin/env"])},
    optional={
        "arguments": st.lists(st.sampled_from(["a", "b c", "'q'", '"', "${HOME}"]), max_size=3),
        "directory": st.sampled_from(["/tmp", "~/x"]),
        "name": _xml_safe_text,
        "inherit_environment": st.booleans(),
        "environment": st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,5}", fullmatch=True), _xml_safe_text),
        "stdout_path": st.just("/tmp/out"),
        "launcher": st.sampled_from(["single", "multiple", "mpirun"]),
        "pre_launch": st.just("/tmp/pre.sh"),
        "duration": st.floats(0.5, 1e6),
        "queue_name": _xml_safe_text,
        "custom_attributes": st.dictionaries(st.sampled_from(["a", "b.c"]), st.integers() | _xml_safe_text, max_size=2),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "process_count": st.integers(1, 8),
                "node_count": st.integers(1, 4),
                "processes_per_node": st.integers(1, 4),
                "cpu_cores_per_process": st.integers(1, 4),
                "gpu_cores_per_process": st.integers(0, 2),
                "memory_per_process": st.integers(0, 2**40),
                "exclusive_node_use": st.booleans(),
            },
        ),
    },
)


def _valid_description(job: dict[str, Any]) -> JobDescription | None:
    try:
        return JobDescription.from_wire(job)
    except DescriptionError:
        return None


_psij_descriptions = _psij_maps.map(_valid_description).filter(lambda d: d is not None)
_SPOTS = re.compile(r'>([^<]*)</|="([^"]*)"')


@st.composite
def _psij_documents(draw: st.DrawFn) -> tuple[JobDescription, str, int]:
    """A PSI/J job as SSS XML (what to_sss writes), with a few of its texts and attribute values changed."""
    d = draw(_psij_descriptions)
    assert d is not None
    text = write_job(to_sss(d))
    changes = draw(st.integers(0, 3))
    for _ in range(changes):
        spot = draw(st.sampled_from(list(_SPOTS.finditer(text))))
        group = 1 if spot.group(1) is not None else 2
        word = _esc(draw(_XML_WORDS | _xml_safe_text), attr=True)
        text = text[: spot.start(group)] + word + text[spot.end(group) :]
    return d, text, changes


@pytest.mark.timeout(60 * STRETCH)
@UNIT
@given(_psij_documents())
@example(
    (
        JobDescription(executable="/bin/true"),
        '<Job><Executable>x</Executable><TaskGroup><TaskCount>1</TaskCount><Memory units="EB">1e300</Memory>'
        "</TaskGroup></Job>",
        1,
    )
)
def test_psij_jobs_as_changed_sss_xml_raise_only_sss_error(case: tuple[JobDescription, str, int]) -> None:
    """to_sss/from_sss invert each other; a document changed in a few places is refused with SssError
    or gives a description the daemon accepts."""
    d, text, changes = case
    note(text)
    if not changes:
        read = read_job(text).value
        assert isinstance(read, Job) and from_sss(read) == d
    _read_sss(text)


@pytest.mark.timeout(60 * STRETCH)
@UNIT
@given(
    st.one_of(
        st.text(max_size=200),
        st.text(st.characters(categories=["Cs", "Cc", "Co", "Zs"]), max_size=20),
        st.binary(max_size=200),
        st.tuples(st.sampled_from(["utf-8", "utf-16", "latin-1", "ascii", "bogus", "", "x" * 300]), _roots).map(
            lambda t: f'<?xml version="1.0" encoding="{t[0]}"?>{t[1]}'
        ),
        _documents.flatmap(lambda d: st.integers(0, len(d)).map(lambda n: d[:n])),
    ).flatmap(lambda d: st.sampled_from([d, d.encode("utf-8", "surrogatepass")]) if isinstance(d, str) else st.just(d))
)
@example("\ud800")
@example(b'<?xml version="1.0" encoding="bogus"?><Job/>')
def test_random_and_truncated_xml_raise_only_sss_error(data: str | bytes) -> None:
    _read_sss(data)


@st.composite
def _hostile_xml(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["entities", "external", "parameter", "deep", "attribute", "attributes", "wide"]))
    if kind == "entities":
        depth, width = draw(st.integers(1, 6)), draw(st.integers(2, 10))
        ents = ['<!ENTITY e0 "lol">'] + [f'<!ENTITY e{i} "{f"&e{i - 1};" * width}">' for i in range(1, depth + 1)]
        return f'<?xml version="1.0"?><!DOCTYPE Job [{"".join(ents)}]><Job><Executable>&e{depth};</Executable></Job>'
    if kind == "external":
        url = draw(st.sampled_from(["file:///etc/passwd", "http://127.0.0.1:9/x", "/dev/zero", "x.dtd"]))
        return f'<!DOCTYPE Job [<!ENTITY x SYSTEM "{url}">]><Job><Executable>&x;</Executable></Job>'
    if kind == "parameter":
        return '<!DOCTYPE Job [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]><Job/>'
    if kind == "deep":
        n = draw(st.integers(MAX_DEPTH - 2, MAX_DEPTH + 50))
        tag = draw(st.sampled_from(["TaskGroup", "Job", "Environment", "x"]))
        return "<Job>" + f"<{tag}>" * n + f"</{tag}>" * n + "</Job>"
    if kind == "attribute":
        size = draw(st.integers(1, 4 << 20))
        return f'<Job><Executable name="{"a" * size}">x</Executable></Job>'
    if kind == "attributes":
        n = draw(st.integers(1, 3000))
        attrs = " ".join(f'a{i}="{i}"' for i in range(n))
        return f'<Job awarenessPolicy="Ignore"><Executable {attrs}>x</Executable></Job>'
    n = draw(st.integers(1, 20_000))
    return "<Job><Executable>x</Executable>" + "<Hold>User</Hold>" * n + "</Job>"


@pytest.mark.timeout(60 * STRETCH)
@settings(UNIT, max_examples=int(60 * SCALE))
@given(_hostile_xml())
def test_hostile_xml_is_refused_or_read_within_limits(doc: str) -> None:
    _read_sss(doc)
    if "<!ENTITY" in doc:
        with pytest.raises(SssError, match="DTD"):
            read_job(doc)


# ============================================================================================================
