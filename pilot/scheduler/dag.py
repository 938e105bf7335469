"""Job dependencies: the SSS ``<Dependency>`` element (job spec 5.1) as a graph the daemon feeds.

A dependency names a job by JobId (the default) or every job of a JobName, and a condition:

- ``OnSuccess`` (default): the job ran and completed (exit code 0);
- ``OnFailure``: the job FAILED, including a job that failed because its own dependency could no
  longer be met; a CANCELED job did not fail, so it never satisfies OnFailure;
- ``OnExit``: the job ran and exited, whatever the status; with ``code=N`` only when its exit code is N.

All dependencies of a job must hold for it to run. Once one can no longer hold (its job ended the
other way), the job can never run and ends FAILED with a message naming the dependency.

Names and ids are resolved at submission: a JobId first among the jobs submitted together (their
SSS ``<Id>``), then among the pilot's jobs; a JobName among both. Cycles can only form among jobs
submitted together and are refused then, naming the cycle.

Through PSI/J, ``JobAttributes.custom_attributes["depends_on"]`` carries the same thing as text:
comma-separated items ``[Condition[=code]:][name=]target``, e.g. ``"12"`` (OnSuccess of job 12),
``"OnFailure:12"``, ``"OnExit=3:12"``, ``"OnSuccess:name=prep"`` (every job named prep).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from pilot.model.job_state import JobState
from pilot.model.sss.errors import SssError
from pilot.model.sss.job import Dependency

DEPENDS_ON: Final = "depends_on"


class Verdict(StrEnum):
    WAIT = "wait"
    READY = "ready"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job ended: its final state, exit code, and whether it ever started running."""

    state: JobState
    exit_code: int | None = None
    started: bool = True

    def __str__(self) -> str:
        s = self.state.value
        if self.exit_code is not None:
            s += f" with exit code {self.exit_code}"
        elif not self.started:
            s += " before it started"
        return s


def satisfied(dep: Dependency, outcome: Outcome) -> bool:
    """Whether a finished job's outcome meets ``dep`` (see the module docstring)."""
    if dep.condition == "OnSuccess":
        return outcome.state is JobState.COMPLETED
    if dep.condition == "OnFailure":
        return outcome.state is JobState.FAILED
    if dep.condition == "OnExit":
        if dep.code is not None:
            return outcome.exit_code == dep.code
        return outcome.started
    raise ValueError(f"unknown condition {dep.condition!r}")


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job being submitted, as the graph needs it. ``local_id`` is its SSS ``<Id>`` in the batch."""

    id: str
    name: str | None = None
    local_id: str | None = None
    dependencies: tuple[Dependency, ...] = ()
    where: str = ""


@dataclass(frozen=True, slots=True)
class Edge:
    dependency: Dependency
    targets: tuple[str, ...]  # pilot job ids


@dataclass(slots=True)
class _Node:
    name: str | None
    edges: tuple[Edge, ...]
    where: str


@dataclass(slots=True)
class JobGraph:
    """Every job's dependency edges and every finished job's outcome. Pure: no I/O, no clock."""

    jobs: dict[str, _Node] = field(default_factory=dict)
    names: dict[str, list[str]] = field(default_factory=dict)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    dependents: dict[str, set[str]] = field(default_factory=dict)
    #: Names of targets found by name outside the graph (for messages).
    aliases: dict[str, str] = field(default_factory=dict)

    # -- submission ----------------------------------------------------------------------------------

    def add(
        self,
        batch: Sequence[NewJob],
        *,
        known: Callable[[str], bool] | None = None,
        named: Callable[[str], Sequence[str]] | None = None,
    ) -> None:
        """Register jobs submitted together; all or none. Raises :class:`SssError` naming the
        Dependency that names no job, or the cycle. ``known`` says whether a pilot job id exists
        (beyond those this graph has seen); ``named`` lists the unfinished jobs of a name it has not
        seen (jobs without dependencies stay out of the graph, so submitting them costs nothing)."""
        by_local: dict[str, str] = {j.id: j.id for j in batch}
        local_ids: set[str] = set()
        batch_names: dict[str, list[str]] = {}
        for j in batch:
            if j.id in self.jobs:
                raise SssError(f"job id {j.id!r} is already in the dependency graph", element=j.where)
            if j.local_id:
                if j.local_id in local_ids:
                    raise SssError(
                        f"<Id>{j.local_id}</Id> is used by two jobs of one submission; make Ids unique", element=j.where
                    )
                local_ids.add(j.local_id)
                by_local[j.local_id] = j.id  # a submitter's own <Id> wins over a pilot id
            if j.name:
                batch_names.setdefault(j.name, []).append(j.id)
        resolved: dict[str, tuple[Edge, ...]] = {}
        for j in batch:
            edges = []
            for dep in j.dependencies:
                targets = self._resolve(dep, by_local, batch_names, known, named)
                if not targets:
                    by = "JobId" if dep.designator == "JobId" else "JobName"
                    raise SssError(
                        f'<Dependency designator="{by}">{dep.target}</Dependency> names no job of this submission '
                        "or of this pilot; give an existing job's id (or name)",
                        element=j.where,
                    )
                edges.append(Edge(dep, targets))
            resolved[j.id] = tuple(edges)
        self._check_cycles(batch, resolved)
        for j in batch:
            self.jobs[j.id] = _Node(j.name, resolved[j.id], j.where)
            if j.name:
                self.names.setdefault(j.name, []).append(j.id)
            for e in resolved[j.id]:
                for t in e.targets:
                    self.dependents.setdefault(t, set()).add(j.id)

    def _resolve(
        self,
        dep: Dependency,
        by_local: Mapping[str, str],
        batch_names: Mapping[str, list[str]],
        known: Callable[[str], bool] | None,
        named: Callable[[str], Sequence[str]] | None,
    ) -> tuple[str, ...]:
        if dep.designator == "JobName":
            seen = [*batch_names.get(dep.target, []), *self.names.get(dep.target, [])]
            others = [j for j in named(dep.target) if j not in seen] if named is not None else []
            for j in others:
                self.aliases[j] = dep.target
            return tuple(seen + others)
        if dep.target in by_local:
            return (by_local[dep.target],)
        if dep.target in self.jobs or dep.target in self.outcomes or (known is not None and known(dep.target)):
            return (dep.target,)
        return ()

    def _check_cycles(self, batch: Sequence[NewJob], edges: Mapping[str, tuple[Edge, ...]]) -> None:
        where = {j.id: j for j in batch}
        color: dict[str, int] = {}
        stack: list[str] = []

        def visit(v: str) -> None:
            color[v] = 1
            stack.append(v)
            for e in edges.get(v, ()):
                for t in e.targets:
                    if t not in where:
                        continue
                    if color.get(t) == 1:
                        cycle = [*stack[stack.index(t) :], t]
                        shown = " -> ".join(_show(where[c]) for c in cycle)
                        raise SssError(
                            f"dependency cycle: {shown}; these jobs would wait for each other forever, "
                            "remove one of the Dependencies",
                            element=where[v].where,
                        )
                    if color.get(t) is None:
                        visit(t)
            stack.pop()
            color[v] = 2

        for j in batch:
            if color.get(j.id) is None:
                visit(j.id)

    def restore(self, job_id: str, name: str | None, edges: Sequence[Edge], *, where: str = "") -> None:
        """A job the journal held, with the edges resolved when it was submitted (after a restart)."""
        self.jobs[job_id] = _Node(name, tuple(edges), where)
        if name:
            self.names.setdefault(name, []).append(job_id)
        for e in edges:
            for t in e.targets:
                self.dependents.setdefault(t, set()).add(job_id)

    def edges_of(self, job_id: str) -> list[Any]:
        """A job's resolved edges as the journal keeps them: [[condition, code, designator, target, [ids]]]."""
        node = self.jobs.get(job_id)
        if node is None:
            return []
        return [
            [e.dependency.condition, e.dependency.code, e.dependency.designator, e.dependency.target, list(e.targets)]
            for e in node.edges
        ]

    # -- progress ------------------------------------------------------------------------------------

    def verdict(self, job_id: str) -> tuple[Verdict, list[str]]:
        """Whether the job may run now, must wait (and for what), or can never run (and why)."""
        node = self.jobs.get(job_id)
        if node is None:
            return Verdict.READY, []
        waiting: list[str] = []
        for e in node.edges:
            for t in e.targets:
                out = self.outcomes.get(t)
                label = self._label(t)
                if out is None:
                    waiting.append(f"waits for {label} to end ({_cond(e.dependency)})")
                elif not satisfied(e.dependency, out):
                    return Verdict.NEVER, [
                        f"dependency {_cond(e.dependency)} on {label} can no longer be met: it ended {out}"
                    ]
        return (Verdict.WAIT, waiting) if waiting else (Verdict.READY, [])

    def finish(self, job_id: str, outcome: Outcome) -> list[tuple[str, Verdict, list[str]]]:
        """Record how a job ended; the dependents whose verdict is now settled (READY or NEVER).
        A dependent that can never run should be ended FAILED by the caller, then passed here too."""
        self.outcomes[job_id] = outcome
        out: list[tuple[str, Verdict, list[str]]] = []
        for d in sorted(self.dependents.get(job_id, ()), key=_num_key):
            if d in self.outcomes:
                continue
            v, reasons = self.verdict(d)
            if v is not Verdict.WAIT:
                out.append((d, v, reasons))
        return out

    def forget(self, job_ids: Iterable[str]) -> None:
        """Drop finished jobs nobody waits for (keeps the graph small on long runs)."""
        for j in job_ids:
            if any(d not in self.outcomes for d in self.dependents.get(j, ())):
                continue
            node = self.jobs.pop(j, None)
            if node is not None and node.name and j in self.names.get(node.name, []):
                self.names[node.name].remove(j)
            self.dependents.pop(j, None)
            self.aliases.pop(j, None)

    def _label(self, job_id: str) -> str:
        node = self.jobs.get(job_id)
        name = node.name if node is not None else self.aliases.get(job_id)
        return f"job {job_id} ({name!r})" if name else f"job {job_id}"


def edges_from_wire(raw: Any) -> list[Edge]:
    """Edges from :meth:`JobGraph.edges_of` (read back from the journal): anything else is an error."""
    out = []
    if not isinstance(raw, list):
        raise ValueError("dependency edges must be a list")
    for item in raw:
        if not (isinstance(item, list) and len(item) == 5):
            raise ValueError("a dependency edge is [condition, code, designator, target, ids]")
        cond, code, designator, target, ids = item
        if cond not in ("OnSuccess", "OnFailure", "OnExit") or not (code is None or type(code) is int):
            raise ValueError(f"bad dependency condition {cond!r} {code!r}")
        if not (isinstance(target, str) and isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
            raise ValueError("dependency targets must be strings")
        out.append(Edge(Dependency(target, cond, code, str(designator)), tuple(ids)))
    return out


def _cond(dep: Dependency) -> str:
    return dep.condition + (f" code={dep.code}" if dep.code is not None else "")


def _show(j: NewJob) -> str:
    label = f"job {j.local_id or j.id}"
    return label + (f" ({j.name!r})" if j.name else "")


def _num_key(s: str) -> tuple[int, str]:
    return (int(s), s) if s.isdigit() else (1 << 62, s)


_ATTR: Final = f"custom_attributes[{DEPENDS_ON!r}]"
_COND_ONLY: Final = re.compile(r"^(OnSuccess|OnFailure|OnExit)(=-?\d+)?:")
_ITEM_RE: Final = re.compile(r"^(?:(OnSuccess|OnFailure|OnExit)(?:=(-?\d+))?:)?(?:(name)=)?(.+)$")


def dependencies_from_custom(custom: Mapping[str, Any]) -> list[Dependency]:
    """The ``depends_on`` custom attribute of a PSI/J job as Dependencies (syntax in the module
    docstring). Raises :class:`SssError` naming the attribute and the item at fault."""
    raw = custom.get(DEPENDS_ON)
    if raw is None:
        return []
    items: list[str]
    if isinstance(raw, str):
        items = [i.strip() for i in raw.split(",")]
    elif isinstance(raw, list | tuple) and all(isinstance(i, str) for i in raw):
        items = [i.strip() for i in raw]
    else:
        raise SssError(
            "must be text like '12', 'OnFailure:12', 'OnExit=3:12' or 'OnSuccess:name=prep'",
            element=_ATTR,
        )
    out = []
    for item in items:
        if not item:
            continue
        m = _ITEM_RE.match(item)
        if not m or not m.group(4).strip() or (m.group(1) is None and _COND_ONLY.match(item)):
            raise SssError(f"item {item!r} is not [Condition[=code]:][name=]target", element=_ATTR)
        cond, code, by_name, target = m.groups()
        if code is not None and cond != "OnExit":
            raise SssError(f"item {item!r}: an exit code only goes with OnExit", element=_ATTR)
        out.append(
            Dependency(
                target.strip(),
                cond or "OnSuccess",
                None if code is None else int(code),
                "JobName" if by_name else "JobId",
            )
        )
    return out
