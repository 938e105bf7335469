"""What a task's properties mean at launch: its standard streams (``redirectList``) and its
resource limits (``ResourceLimit``, applied with setrlimit). Pure, so the agent only applies them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pilot.model.sss.errors import SssError
from pilot.model.sss.job import Properties, ResourceLimit

UNLIMITED: Final = -1  # resource.RLIM_INFINITY


@dataclass(frozen=True, slots=True)
class Streams:
    """A task's stdin/stdout/stderr. A None path means the pilot's default (its job directory for
    output, nothing for input); ``*_closed`` means the stream is discarded (/dev/null); ``merge``
    is "stdout" when stderr goes into stdout, "stderr" when stdout goes into stderr."""

    stdin: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    stdin_closed: bool = False
    stdout_closed: bool = False
    stderr_closed: bool = False
    stdout_append: bool = False
    stderr_append: bool = False
    merge: str | None = None


def streams(props: Properties, *, where: str = "Task") -> Streams:
    """The streams ``props`` ask for; contradictions are refused naming both elements."""
    out, err, inp = props.output_file, props.error_file, props.input_file
    if out is not None and err is not None and out.merge and err.merge:
        raise SssError(
            'OutputFile and ErrorFile both say redirectList="Merge": each would go into the other; keep one',
            element=where,
        )
    for tag, r in (("OutputFile", out), ("ErrorFile", err)):
        if r is not None and r.close and (r.merge or r.append):
            other = "Merge" if r.merge else "Append"
            raise SssError(
                f"<{tag}> redirectList says Close (discard) and {other}; keep one", element=f"{where}/<{tag}>"
            )
        if r is not None and r.close and r.path:
            raise SssError(
                f'<{tag}> names {r.path!r} but redirectList="Close" discards the stream; drop one',
                element=f"{where}/<{tag}>",
            )
    if inp is not None and inp.close and inp.path:
        raise SssError(
            f'<InputFile> names {inp.path!r} but redirectList="Close" closes input; drop one',
            element=f"{where}/<InputFile>",
        )
    merge = None
    if err is not None and err.merge:
        merge = "stdout"
    elif out is not None and out.merge:
        merge = "stderr"
    return Streams(
        stdin=inp.path if inp else None,
        stdout=out.path if out else None,
        stderr=err.path if err else None,
        stdin_closed=bool(inp and inp.close),
        stdout_closed=bool(out and out.close),
        stderr_closed=bool(err and err.close),
        stdout_append=bool(out and out.append),
        stderr_append=bool(err and err.append),
        merge=merge,
    )


@dataclass(frozen=True, slots=True)
class RlimitSetting:
    """One ``setrlimit`` call: the ``resource.RLIMIT_*`` name and the limits (None: keep the current)."""

    resource: str
    soft: int | None
    hard: int | None


def rlimit_settings(limits: list[ResourceLimit], *, where: str = "Task") -> list[RlimitSetting]:
    """ResourceLimits grouped per resource: no type sets both limits, Soft or Hard one of them (the
    spec). A soft limit above the hard one is refused (setrlimit would fail at launch)."""
    soft: dict[str, int] = {}
    hard: dict[str, int] = {}
    names: dict[str, str] = {}
    for lim in limits:
        res = lim.resource
        names.setdefault(res, lim.name)
        if lim.kind in (None, "Soft"):
            soft[res] = lim.value
        if lim.kind in (None, "Hard"):
            hard[res] = lim.value
    out = []
    for res in sorted(set(soft) | set(hard)):
        s, h = soft.get(res), hard.get(res)
        if s is not None and h is not None and h != UNLIMITED and (s == UNLIMITED or s > h):
            raise SssError(
                f'ResourceLimit name="{names[res]}": the soft limit {_show(s)} is above the hard limit {h}; '
                "lower the soft limit",
                element=where,
            )
        out.append(RlimitSetting(res, s, h))
    return out


def _show(v: int) -> str:
    return "unlimited" if v == UNLIMITED else str(v)
