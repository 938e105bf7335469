"""SSS job XML (``../shared/specs/sss-job-object-3.1.txt``) to the model and back.

Reading checks each element against :mod:`pilot.model.sss.schema` and applies the spec's
``awarenessPolicy`` (section 9) to whatever this pilot does not understand or cannot honour: an
element, an attribute, or a value. The policy is per element, inherited by everything it encloses,
and Reject when absent. Under Reject the submission is refused naming the element, its line and
what to change; under Warn it is accepted without the element and a warning is returned for the
requestor; under Ignore it is accepted silently. Malformed input (bad numbers, missing required
attributes, duplicates) is refused whatever the policy: a policy covers what is not *understood*,
not what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from pilot.formats import xml
from pilot.formats.xml import XmlElement
from pilot.model.sss.errors import SssError
from pilot.model.sss.job import Job, JobGroup, Properties, Property, Task, TaskGroup
from pilot.model.sss.schema import (
    CONJS,
    DELIVERED_ATTRS,
    OPS,
    REQUESTED_ATTRS,
    Kind,
    Level,
    check_value,
    spec_for,
)

POLICIES: Final = ("Reject", "Warn", "Ignore")
_CHILD_LEVEL: Final = {
    Level.JOB_GROUP: ("Job", "JobDefaults", Level.JOB),
    Level.JOB: ("TaskGroup", "TaskGroupDefaults", Level.TASK_GROUP),
    Level.TASK_GROUP: ("Task", "TaskDefaults", Level.TASK),
}


@dataclass(slots=True)
class _Reader:
    warnings: list[str] = field(default_factory=list)
    #: Read as a job to run here: a job's own values this pilot cannot honour (<User>, <Machine>, ...)
    #: go to the awareness policy. Read as a record (examples, a job shown back), they are kept.
    submitted: bool = False

    # -- awareness ------------------------------------------------------------------------------------

    def policy(self, el: XmlElement, inherited: str, path: str) -> str:
        p = el.attrib.get("awarenessPolicy")
        if p is None:
            return inherited
        if p not in POLICIES:
            raise SssError(
                f'awarenessPolicy="{p}" is not known: use Reject, Warn or Ignore', element=path, line=el.line
            )
        return p

    def not_understood(self, policy: str, what: str, *, path: str, line: int) -> None:
        """Apply the awareness policy to something this pilot cannot honour."""
        if policy == "Reject":
            raise SssError(
                f'{what}; remove it, or mark it (or an enclosing element) awarenessPolicy="Warn" or "Ignore" '
                "to run without it",
                element=path,
                line=line,
            )
        if policy == "Warn":
            self.warnings.append(f"line {line}, {path}: {what}; ignored")

    # -- containers -----------------------------------------------------------------------------------

    def job_group(self, el: XmlElement, policy: str) -> JobGroup:
        path = "<JobGroup>"
        policy = self.policy(el, policy, path)
        self.container_attributes(el, path, policy)
        props, children = self.properties(el, Level.JOB_GROUP, path, policy)
        group = JobGroup(props, attributes=_attrs(el), line=el.line)
        for child, cpath, cpolicy in children:
            if child.tag == "Job":
                group.jobs.append(self.job(child, cpolicy, cpath))
            else:
                if group.job_defaults is not None:
                    raise SssError("appears twice; a JobGroup has at most one", element=cpath, line=child.line)
                group.job_defaults = self.job(child, cpolicy, cpath)
        if not group.jobs:
            raise SssError("holds no <Job>: a JobGroup must contain one or more jobs", element=path, line=el.line)
        if not props.items:
            raise SssError("has no properties: give it at least an <Id>", element=path, line=el.line)
        return group

    def job(self, el: XmlElement, policy: str, path: str) -> Job:
        props, children = self.properties(el, Level.JOB, path, policy)
        job = Job(props, attributes=_attrs(el), line=el.line)
        for child, cpath, cpolicy in children:
            if child.tag == "TaskGroup":
                job.task_groups.append(self.task_group(child, cpolicy, cpath))
            else:
                if job.task_group_defaults is not None:
                    raise SssError("appears twice; a Job has at most one", element=cpath, line=child.line)
                job.task_group_defaults = self.task_group(child, cpolicy, cpath)
        return job

    def task_group(self, el: XmlElement, policy: str, path: str) -> TaskGroup:
        props, children = self.properties(el, Level.TASK_GROUP, path, policy)
        tg = TaskGroup(props, attributes=_attrs(el), line=el.line)
        for child, cpath, cpolicy in children:
            tprops, _ = self.properties(child, Level.TASK, cpath, cpolicy)
            task = Task(tprops, _attrs(child), child.line)
            if child.tag == "Task":
                tg.tasks.append(task)
            else:
                if tg.task_defaults is not None:
                    raise SssError("appears twice; a TaskGroup has at most one", element=cpath, line=child.line)
                tg.task_defaults = task
        return tg

    def container_attributes(self, el: XmlElement, path: str, policy: str) -> None:
        for name in el.attrib:
            if name != "awarenessPolicy":
                self.not_understood(policy, f"attribute {name}= is not understood", path=path, line=el.line)

    def properties(
        self, el: XmlElement, level: Level, path: str, policy: str
    ) -> tuple[Properties, list[tuple[XmlElement, str, str]]]:
        """The properties of one container and its child containers (element, path, policy)."""
        if level is not Level.JOB_GROUP:
            policy = self.policy(el, policy, path)
            self.container_attributes(el, path, policy)
        if el.text.strip() and not el.children:
            raise SssError(
                f"holds only the text {el.text.strip()!r}; a reference to a predefined object is not a "
                "submission: give its properties",
                element=path,
                line=el.line,
            )
        props = Properties()
        children: list[tuple[XmlElement, str, str]] = []
        counts: dict[str, int] = {}
        seen: set[str] = set()
        child_tags = _CHILD_LEVEL.get(level)
        for child in el.children:
            counts[child.tag] = counts.get(child.tag, 0) + 1
            cpath = f"{path}/<{child.tag}>"
            if child_tags and child.tag in child_tags[:2]:
                n = counts[child.tag]
                cpath = f"{path}/<{child.tag}>" + (f"[{n}]" if child.tag in ("Job", "TaskGroup", "Task") else "")
                children.append((child, cpath, self.policy(child, policy, cpath)))
                continue
            if child.tag in ("Requested", "Delivered") and level is not Level.JOB_GROUP:
                cpolicy = self.policy(child, policy, cpath)
                self.container_attributes(child, cpath, cpolicy)
                category = self.category(child, level, cpath, cpolicy)
                if child.tag == "Requested":
                    props.requested = (props.requested or []) + category
                else:
                    props.delivered = (props.delivered or []) + category
                continue
            prop = self.property(child, level, cpath, policy, category=None)
            if prop is None:
                continue
            spec, _ = spec_for(level, prop.name)
            if spec is not None and not spec.repeatable:
                if prop.name in seen:
                    raise SssError(f"appears more than once in {path}; give it once", element=cpath, line=child.line)
                seen.add(prop.name)
            props.items.append(prop)
        return props, children

    def category(self, el: XmlElement, level: Level, path: str, policy: str) -> list[Property]:
        out = []
        if el.text.strip():
            raise SssError("holds text; it only encloses property elements", element=path, line=el.line)
        for child in el.children:
            prop = self.property(child, level, f"{path}/<{child.tag}>", policy, category=el.tag)
            if prop is not None:
                out.append(prop)
        return out

    # -- properties -----------------------------------------------------------------------------------

    def property(
        self, el: XmlElement, level: Level, path: str, inherited: str, *, category: str | None
    ) -> Property | None:
        policy = self.policy(el, inherited, path)
        spec, level_reason = spec_for(level, el.tag)
        if spec is None:
            where = {Level.JOB_GROUP: "a JobGroup"}.get(level, f"a {level.value}")
            self.not_understood(
                policy, f"<{el.tag}> is not an element this pilot understands in {where}", path=path, line=el.line
            )
            return None
        if level_reason is not None and category != "Delivered":
            self.not_understood(policy, level_reason, path=path, line=el.line)
            return None
        if category is not None and category[0] not in spec.categories:
            self.not_understood(policy, f"<{el.tag}> cannot be a {category} property", path=path, line=el.line)
            return None
        allowed = spec.attributes | {"awarenessPolicy"}
        if category == "Requested":
            allowed |= REQUESTED_ATTRS
        elif category == "Delivered":
            allowed |= DELIVERED_ATTRS
        attrs: list[tuple[str, str]] = []
        for name, value in el.attrib.items():
            if name not in allowed:
                self.not_understood(
                    policy, f"attribute {name}= is not understood on <{el.tag}>", path=path, line=el.line
                )
                continue
            if category == "Requested" and name in REQUESTED_ATTRS:
                bad = _requested_attr(name, value)
                if bad is not None:
                    self.not_understood(policy, bad, path=path, line=el.line)
                    continue
            attrs.append((name, value))
        for name in sorted(spec.required - set(el.attrib)):
            raise SssError(f"needs a {name}= attribute", element=path, line=el.line)
        children: list[Property] = []
        if spec.kind is Kind.CONTAINER:
            children = self.variables(el, path, policy)
            text = ""
        else:
            if el.children:
                raise SssError(
                    f"holds the element <{el.children[0].tag}> (line {el.children[0].line}); "
                    f"<{el.tag}> holds only text",
                    element=path,
                    line=el.line,
                )
            text = el.text if spec.kind is Kind.STRING else el.text.strip()
        prop = Property(el.tag, text, tuple(sorted(attrs)), tuple(children), el.line)
        if not (category == "Requested" and prop.get("op") == "Match"):
            bad = check_value(spec, prop)
            if bad is not None:
                raise SssError(bad, element=path, line=el.line)
        why = spec.unsupported_value(prop) if category != "Delivered" else None
        if why is None and category is None and spec.plain is not None and self.submitted:
            why = spec.plain(prop)
        if why is not None:
            self.not_understood(policy, why, path=path, line=el.line)
            return None
        return prop

    def variables(self, el: XmlElement, path: str, policy: str) -> list[Property]:
        out = []
        names: set[str] = set()
        for child in el.children:
            cpath = f"{path}/<{child.tag}>"
            cpolicy = self.policy(child, policy, cpath)
            if child.tag != "Variable":
                self.not_understood(
                    cpolicy, f"<{child.tag}> is not understood in <Environment>", path=cpath, line=child.line
                )
                continue
            name = child.attrib.get("name")
            if not name or "=" in name or "\0" in name:
                raise SssError("needs a name= attribute: a variable name without '='", element=cpath, line=child.line)
            if name in names:
                raise SssError(f"variable {name!r} is set twice; set it once", element=cpath, line=child.line)
            names.add(name)
            for attr in child.attrib:
                if attr not in ("name", "awarenessPolicy"):
                    self.not_understood(
                        cpolicy, f"attribute {attr}= is not understood on <Variable>", path=cpath, line=child.line
                    )
            if child.children:
                raise SssError("holds elements; a Variable holds only its value", element=cpath, line=child.line)
            kept = tuple(sorted((k, v) for k, v in child.attrib.items() if k in ("name", "awarenessPolicy")))
            out.append(Property("Variable", child.text, kept, (), child.line))
        return out


def _requested_attr(name: str, value: str) -> str | None:
    if name == "op" and value not in OPS:
        return f'op="{value}" is not known: use one of {", ".join(OPS)}'
    if name == "conj" and value not in CONJS:
        return f'conj="{value}" is not known: use one of {", ".join(CONJS)}'
    if name in ("group", "preference"):
        try:
            int(value)
        except ValueError:
            return f'{name}="{value}" is not an integer'
    if name == "performanceFactor":
        try:
            float(value)
        except ValueError:
            return f'performanceFactor="{value}" is not a number'
    return None


def _attrs(el: XmlElement) -> dict[str, str]:
    return {k: v for k, v in el.attrib.items() if k == "awarenessPolicy"}


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What :func:`read_job` accepted, and the warnings owed to the requestor (``awarenessPolicy="Warn"``)."""

    value: JobGroup | Job
    warnings: tuple[str, ...] = ()


def read_job(data: str | bytes, *, submitted: bool = False) -> ReadResult:
    """A JobGroup or Job from SSS job XML. Raises :class:`SssError` naming the element and line.
    ``submitted``: it is to run here (see ``_Reader.submitted``)."""
    root = xml.parse(data, what="SSS job XML")
    reader = _Reader(submitted=submitted)
    if root.tag == "JobGroup":
        value: JobGroup | Job = reader.job_group(root, "Reject")
    elif root.tag == "Job":
        path = "<Job>"
        policy = reader.policy(root, "Reject", path)
        value = reader.job(root, policy, path)
        if not value.properties.items and not value.task_groups:
            raise SssError("has no properties: a job needs at least an <Executable>", element=path, line=root.line)
    else:
        raise SssError("the root element must be <JobGroup> or <Job>", element=f"<{root.tag}>", line=root.line)
    return ReadResult(value, tuple(reader.warnings))


# -- writing -------------------------------------------------------------------------------------------


def write_job(obj: JobGroup | Job) -> str:
    """``obj`` as SSS job XML. Reading it back gives an equal object."""
    if isinstance(obj, JobGroup):
        return xml.write(_group_node(obj))
    return xml.write(_job_node("Job", obj))


def _props(props: Properties) -> list[xml.Node]:
    nodes = [_prop_node(p) for p in props.items]
    if props.requested is not None:
        nodes.append(xml.Node("Requested", children=[_prop_node(p) for p in props.requested]))
    if props.delivered is not None:
        nodes.append(xml.Node("Delivered", children=[_prop_node(p) for p in props.delivered]))
    return nodes


def _prop_node(p: Property) -> xml.Node:
    return xml.Node(p.name, p.attributes, p.value, [_prop_node(c) for c in p.children])


def _group_node(g: JobGroup) -> xml.Node:
    children = _props(g.properties)
    if g.job_defaults is not None:
        children.append(_job_node("JobDefaults", g.job_defaults))
    children += [_job_node("Job", j) for j in g.jobs]
    return xml.Node("JobGroup", sorted(g.attributes.items()), children=children)


def _job_node(tag: str, j: Job) -> xml.Node:
    children = _props(j.properties)
    if j.task_group_defaults is not None:
        children.append(_tg_node("TaskGroupDefaults", j.task_group_defaults))
    children += [_tg_node("TaskGroup", tg) for tg in j.task_groups]
    return xml.Node(tag, sorted(j.attributes.items()), children=children)


def _tg_node(tag: str, tg: TaskGroup) -> xml.Node:
    children = _props(tg.properties)
    if tg.task_defaults is not None:
        children.append(_task_node("TaskDefaults", tg.task_defaults))
    children += [_task_node("Task", t) for t in tg.tasks]
    return xml.Node(tag, sorted(tg.attributes.items()), children=children)


def _task_node(tag: str, t: Task) -> xml.Node:
    return xml.Node(tag, sorted(t.attributes.items()), children=_props(t.properties))
