"""Node requirements and preferences on a PSI/J job: ``custom_attributes`` named ``pilot.*``.

A PSI/J JobSpec has no words for "only on nodes with feature X" or "rather on node 2", which an SSS
job says with ``<Feature>``, ``<Node>``, ``<Requested>`` and ``preference``. These attributes say
the same; each becomes the SSS property that says it, so one matcher judges both languages:

========================================  =====================================================
``pilot.feature = "gpu,ib"``              every listed feature (SSS ``<Feature aggregation="List">``)
``pilot.feature_match = "gpu.*"``         some feature matching the regular expression
``pilot.node = "n1,n[4-6]"``              one of these nodes (names, and ranges as SSS writes them)
``pilot.node_match = "n.*"``              a node whose name matches the regular expression
``pilot.architecture = "x86*"``           SGE string pattern on the node's ``arch``
``pilot.os = "Linux*"``                   SGE string pattern on the node's ``opsys``
``pilot.attribute.<name> = ">=100G"``     a typed attribute with a relop (none: the attribute's own)
``pilot.resource.<name>[:<type>] = 1``    a consumable per process (typed as ``License:ESSL2``)
``pilot.disk`` / ``swap`` / ``network``  SSS Disk, Swap, Network per process (a size: ``"10G"``)
``pilot.prefer.<kind> = ...``             a wish of any node kind above: ranks nodes, never waits
========================================  =====================================================

Values are text (a resource or size may be a number): the client sends custom attributes as scalars.
A malformed one is refused naming its key (``InvalidJobException`` at the client).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any, Final

from pilot.config import ConfigError, parse_size
from pilot.model.job_description import RESTARTABLE, RETRIES, RUN_TAG, DescriptionError, JobDescription
from pilot.model.output_stream import STREAM_OUTPUT
from pilot.model.sss import Property, SssError, effective_jobs
from pilot.model.sss.job import Properties
from pilot.model.sss.psij import to_sss
from pilot.request import PRIORITY
from pilot.scheduler.attributes import Requestable
from pilot.scheduler.cluster import Cluster, consumable_definition
from pilot.scheduler.distribution import JobRequest, resolve_job
from pilot.scheduler.matching import compile_requirements

PREFIX: Final = "pilot."
#: ``pilot.*`` custom attributes other parts of the pilot act on (not requirements): add a new one here.
OTHER_KEYS: Final = frozenset({RESTARTABLE, RETRIES, PRIORITY, STREAM_OUTPUT, RUN_TAG})
#: Node kinds, which may also be preferences: key -> how its value becomes an SSS property.
NODE_KINDS: Final = ("feature", "feature_match", "node", "node_match", "architecture", "os")
SIZES: Final = {"disk": "Disk", "swap": "Swap", "network": "Network"}
_OPS: Final = {"==": "EQ", "!=": "NE", "<=": "LE", ">=": "GE", "<": "LT", ">": "GT", "~": "Match"}
_OP_RE: Final = re.compile(r"^\s*(==|!=|<=|>=|<|>|~)?\s*(.*?)\s*$", re.DOTALL)
_NAME_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*(?::[A-Za-z0-9_.\-]+)?")
_MAX_TEXT: Final = 4096


def has_requirements(custom: Mapping[str, Any]) -> bool:
    return any(k.startswith(PREFIX) and k not in OTHER_KEYS for k in custom)


def resolve(description: JobDescription, cluster: Cluster) -> JobRequest:
    """The job's placement request with its ``pilot.*`` requirements, as SSS matching resolves it.
    Raises :class:`DescriptionError` naming the attribute at fault."""
    items: list[Property] = []
    requested: list[Property] = []
    for key, value in sorted(description.custom_attributes.items()):
        if not key.startswith(PREFIX) or key in OTHER_KEYS:
            continue
        where = f"JobAttributes.custom_attributes[{key!r}]"
        try:
            hard, soft = _properties(key[len(PREFIX) :], value, where, cluster)
            compile_requirements(Properties.of(*hard, requested=soft), cluster, where=where)
        except (SssError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, SssError) else str(exc)
            raise DescriptionError(f"{where}: {reason}") from None
        items += hard
        requested += soft
    job = to_sss(description)
    group = job.task_groups[0]
    group.properties = Properties.of(
        *group.properties.items, *items, requested=[*(group.properties.requested or ()), *requested] or None
    )
    try:
        return resolve_job(effective_jobs(job)[0], cluster)
    except SssError as exc:
        raise DescriptionError(
            f"JobAttributes.custom_attributes 'pilot.*' with JobSpec.resources: {exc.reason}"
        ) from None


def _properties(kind: str, value: Any, where: str, cluster: Cluster) -> tuple[list[Property], list[Property]]:
    """(uncategorized, requested) SSS properties one attribute stands for."""
    if kind.startswith("prefer."):
        sub = kind[len("prefer.") :]
        if sub not in NODE_KINDS and not sub.startswith("attribute."):
            raise ValueError(
                f"a preference names a node kind: pilot.prefer.<kind> with kind one of {', '.join(NODE_KINDS)} "
                "or attribute.<name>"
            )
        hard, soft = _properties(sub, value, where, cluster)
        # SSS: a negative preference is a wish (the job runs where it cannot be met); its size is the weight.
        return [], [dataclasses.replace(p, attributes=_with(p, preference="-1")) for p in (*hard, *soft)]
    if kind in SIZES:
        return [Property.of(SIZES[kind], _size(value, where), units="B")], []
    if kind.startswith("resource."):
        name = kind[len("resource.") :]
        if not _NAME_RE.fullmatch(name):
            raise ValueError(f"{name!r} is not a resource name: write pilot.resource.<name> or <name>:<type>")
        d = consumable_definition(cluster.registry, "Resource:" + name)
        if d is not None and d.requestable is Requestable.NO:
            raise ValueError(f"{d.name} cannot be requested (requestable = NO in the pilot config): remove it")
        base, _, typ = name.partition(":")
        return [Property.of("Resource", _amount(value), name=base, type=typ or None)], []
    if kind.startswith("attribute."):
        name = kind[len("attribute.") :]
        if not _NAME_RE.fullmatch(name):
            raise ValueError(f"{name!r} is not an attribute name")
        op, operand = _relop(_text(value))
        prop = Property.of("Extension", operand, type="Attribute", name=name, op=op)
        return [], [prop]
    text = _text(value)
    if kind == "feature":
        features = [f.strip() for f in text.split(",") if f.strip()]
        if not features:
            raise ValueError("names no feature: write one or more, comma-separated")
        return [Property.of("Feature", ",".join(features), aggregation="List")], []
    if kind in ("feature_match", "node_match"):
        tag = "Feature" if kind == "feature_match" else "Node"
        return [Property.of(tag, text, aggregation="Pattern")], []
    if kind == "node":
        return [Property.of("Node", text, aggregation="Range")], []
    if kind in ("architecture", "os"):
        tag = "Architecture" if kind == "architecture" else "OperatingSystem"
        return [], [Property.of(tag, text, op="Match")]
    known = [*NODE_KINDS, "attribute.<name>", "resource.<name>", *SIZES, "prefer.<kind>"]
    raise ValueError(f"is not a pilot requirement; known: {', '.join('pilot.' + k for k in known)}")


def _with(p: Property, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({**dict(p.attributes), **extra}.items()))


def _text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"must be text, not {type(value).__name__}")
    text = str(value).strip()
    if not text or len(text) > _MAX_TEXT:
        raise ValueError(f"must be non-empty text of at most {_MAX_TEXT} characters")
    return text


def _relop(text: str) -> tuple[str | None, str]:
    """``">=100G"`` -> ("GE", "100G"); no operator: the attribute's own relop (as ``qsub -l``)."""
    m = _OP_RE.match(text)
    assert m is not None
    op, operand = m.group(1), m.group(2)
    if not operand:
        raise ValueError(f"{text!r} has no value: write [OP]VALUE with OP one of {', '.join(_OPS)} (e.g. '>=100G')")
    return (_OPS[op] if op else None), operand


def _amount(value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an amount: give a number >= 0") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{value!r} is not an amount: give a number >= 0")
    return float(value)


def _size(value: Any, where: str) -> int:
    try:
        return parse_size(value, key=where, source="job")
    except ConfigError:
        raise ValueError(f"{value!r} is not a size: give bytes or a size such as '512M' or '10G'") from None


__all__ = ["OTHER_KEYS", "PREFIX", "has_requirements", "resolve"]
