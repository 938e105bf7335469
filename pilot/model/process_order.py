"""What the daemon tells an agent to start: one process of a job, already placed.

Launchers (in the daemon) turn a placed job into process orders; agents only spawn and watch.
"""

from __future__ import annotations

import math
import sys
from dataclasses import MISSING, dataclass, field, fields
from typing import Annotated, Any, Final, Literal

import msgspec

from pilot import wire
from pilot.model.staging import Step

#: Slot numbers of the non-rank processes of a job.
PRE: Final = -1
POST: Final = -2
STAGE_IN: Final = -3
STAGE_OUT: Final = -4
CLEANUP: Final = -5


def staging_slot(base: int, node_index: int) -> int:
    """The slot of a staging order (``base``: STAGE_IN, STAGE_OUT or CLEANUP) on the job's ``node_index``-th
    node: one order per node, each its own slot (node 0's is ``base`` itself)."""
    return base - 3 * node_index


#: Roles an agent does itself, in a worker thread, instead of spawning a process (agent.staging).
STAGING_ROLES: Final = ("stage_in", "stage_out", "cleanup")
ROLES: Final = ("rank", "pre", "post", *STAGING_ROLES)


@dataclass(slots=True)
class ProcessOrder:
    job_id: str
    slot: int
    role: str  # rank | pre | post | stage_in | stage_out | cleanup
    executable: str
    arguments: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    #: What the job's pre_launch script set and unset, applied over the environment each node builds
    #: (never the launching node's whole environment: node-local variables stay local).
    pre_environment: dict[str, str] = field(default_factory=dict)
    pre_unset: list[str] = field(default_factory=list)
    inherit_environment: bool = True
    directory: str = ""
    stdin_path: str | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    truncate_output: bool = True
    cores: list[int] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    walltime: float | None = None
    rank_environment: dict[str, str] = field(default_factory=dict)
    nodefile_hosts: list[str] | None = None
    script: str | None = None  # pre_launch / post_launch path for those roles
    #: Its cores are still held by processes the agent runs or was told to run: start it when they exit.
    after_cores: bool = False
    #: SSS ResourceLimits: [[resource.RLIMIT_* name, soft or None, hard or None]], set in the child
    #: before exec (None keeps the current limit; -1 is unlimited).
    rlimits: list[list[Any]] = field(default_factory=list)
    #: The staging roles' steps (pilot.model.staging.Step wire forms), relative paths under ``directory``.
    staging: list[list[Any]] = field(default_factory=list)
    #: Its stdout/stderr without a file go to its node's stream file (pilot.model.output_stream).
    stream: bool = False

    def to_wire(self) -> dict[str, Any]:
        """The fields every order has (:data:`_REQUIRED`), then the optional ones that differ from their
        defaults, in field order (an absent one reads back as its default): a common order is half the
        bytes to pack, journal, send and check. Written out field by field: it runs for every order,
        and a loop of getattr and comparisons costs twice as much (not dataclasses.asdict: it deep-copies
        every list and map, ~170 us per order)."""
        out = {
            "job_id": self.job_id,
            "slot": self.slot,
            "role": self.role,
            "executable": self.executable,
            "arguments": self.arguments,
            "inherit_environment": self.inherit_environment,
            "directory": self.directory,
            "truncate_output": self.truncate_output,
            "cores": self.cores,
            "gpus": self.gpus,
        }
        if self.environment:
            out["environment"] = self.environment
        if self.pre_environment:
            out["pre_environment"] = self.pre_environment
        if self.pre_unset:
            out["pre_unset"] = self.pre_unset
        if self.stdin_path is not None:
            out["stdin_path"] = self.stdin_path
        if self.stdout_path is not None:
            out["stdout_path"] = self.stdout_path
        if self.stderr_path is not None:
            out["stderr_path"] = self.stderr_path
        if self.walltime is not None:
            out["walltime"] = self.walltime
        if self.rank_environment:
            out["rank_environment"] = self.rank_environment
        if self.nodefile_hosts is not None:
            out["nodefile_hosts"] = self.nodefile_hosts
        if self.script is not None:
            out["script"] = self.script
        if self.after_cores:
            out["after_cores"] = self.after_cores
        if self.rlimits:
            out["rlimits"] = self.rlimits
        if self.staging:
            out["staging"] = self.staging
        if self.stream:
            out["stream"] = self.stream
        return out

    @classmethod
    def from_wire(cls, raw: Any) -> ProcessOrder:
        """An order from a frame (hostile input: every field checked). The orders a daemon sends pass
        one exact-type pass (:func:`_from_wire_fast`, a fraction of the cost); anything else takes the
        field-by-field path, which accepts it or says precisely what is wrong."""
        order = _from_wire_fast(raw)
        return order if order is not None else cls._from_wire_checked(raw)

    @classmethod
    def _from_wire_checked(cls, raw: Any) -> ProcessOrder:
        if not isinstance(raw, dict):
            raise wire.ProtocolError("process order must be a map")
        unknown = set(raw) - _FIELDS
        if unknown:
            raise wire.ProtocolError(f"unknown process order field(s): {sorted(map(str, unknown))}")
        role = wire.field(raw, "role", str)
        if role not in ROLES:
            raise wire.ProtocolError(f"unknown process role {role!r}")
        env = wire.opt_field(raw, "environment", dict, {})
        rank_env = wire.opt_field(raw, "rank_environment", dict, {})
        pre_env = wire.opt_field(raw, "pre_environment", dict, {})
        for m in (env, rank_env, pre_env):
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
                raise wire.ProtocolError("environments must map strings to strings")
        hosts = raw.get("nodefile_hosts")
        walltime = wire.opt_field(raw, "walltime", (int, float))
        if walltime is not None and not (walltime > 0 and math.isfinite(walltime)):
            # NaN would break the agent's timer heap; 0 or less kills at once: no daemon sends them.
            raise wire.ProtocolError(f"walltime {walltime!r} is not a positive number of seconds")
        return cls(
            job_id=wire.field(raw, "job_id", str),
            slot=wire.field(raw, "slot", int),
            role=role,
            executable=wire.field(raw, "executable", str),
            arguments=wire.str_list(raw, "arguments"),
            environment=env,
            pre_environment=pre_env,
            pre_unset=wire.str_list(raw, "pre_unset") if raw.get("pre_unset") is not None else [],
            inherit_environment=wire.field(raw, "inherit_environment", bool),
            directory=wire.field(raw, "directory", str),
            stdin_path=wire.opt_field(raw, "stdin_path", str),
            stdout_path=wire.opt_field(raw, "stdout_path", str),
            stderr_path=wire.opt_field(raw, "stderr_path", str),
            truncate_output=wire.field(raw, "truncate_output", bool),
            cores=wire.int_list(raw, "cores"),
            gpus=wire.int_list(raw, "gpus"),
            walltime=walltime,
            rank_environment=rank_env,
            nodefile_hosts=None if hosts is None else wire.str_list(raw, "nodefile_hosts"),
            script=wire.opt_field(raw, "script", str),
            after_cores=wire.opt_field(raw, "after_cores", bool, False),
            rlimits=_rlimits(raw.get("rlimits")),
            staging=_staging(raw.get("staging")),
            stream=wire.opt_field(raw, "stream", bool, False),
        )


#: The limits a task may set (setrlimit's own names), and nothing else from a hostile order.
RLIMIT_NAMES: Final = frozenset(
    {
        "RLIMIT_AS",
        "RLIMIT_CORE",
        "RLIMIT_CPU",
        "RLIMIT_DATA",
        "RLIMIT_FSIZE",
        "RLIMIT_MEMLOCK",
        "RLIMIT_NOFILE",
        "RLIMIT_NPROC",
        "RLIMIT_RSS",
        "RLIMIT_STACK",
    }
)


#: A walltime an order may carry: positive and finite (NaN would break the agent's timer heap; 0 or less
#: kills at once: no daemon sends them).
_Walltime = Annotated[float, msgspec.Meta(gt=0, le=sys.float_info.max)]
#: Limits and staging steps take the field-by-field path (:func:`_rlimits`, :func:`_staging`).
_Empty = Annotated[list[Any], msgspec.Meta(max_length=0)]


class _WireOrder(msgspec.Struct, forbid_unknown_fields=True):
    """An order as :meth:`ProcessOrder.to_wire` writes it, every field of exactly its type, checked by
    msgspec in C: the fields to_wire always sends required, the others as their defaults when absent.
    Stricter than the field-by-field check (no limits, no staging steps), never looser."""

    job_id: str
    slot: int
    role: Literal["rank", "pre", "post", "stage_in", "stage_out", "cleanup"]
    executable: str
    arguments: list[str]
    inherit_environment: bool
    directory: str
    truncate_output: bool
    cores: list[int]
    gpus: list[int]
    environment: dict[str, str] = {}
    pre_environment: dict[str, str] = {}
    pre_unset: list[str] = []
    stdin_path: str | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    walltime: _Walltime | None = None
    rank_environment: dict[str, str] = {}
    nodefile_hosts: list[str] | None = None
    script: str | None = None
    after_cores: bool = False
    rlimits: _Empty = []
    staging: _Empty = []
    stream: bool = False


_PACKED_ORDERS: Final = msgspec.msgpack.Decoder(list[_WireOrder])


def _made(w: _WireOrder) -> ProcessOrder:
    # Positional, in field order: a keyword call of 24 names costs more than the decoding.
    return ProcessOrder(
        w.job_id, w.slot, w.role, w.executable, w.arguments, w.environment, w.pre_environment, w.pre_unset,
        w.inherit_environment, w.directory, w.stdin_path, w.stdout_path, w.stderr_path, w.truncate_output,
        w.cores, w.gpus, w.walltime, w.rank_environment, w.nodefile_hosts, w.script, w.after_cores, [], [],
        w.stream,
    )  # fmt: skip


def _from_wire_fast(raw: Any) -> ProcessOrder | None:
    """The order if every field has exactly the type the full check wants (:class:`_WireOrder`: what
    passes here passes there, with the same values), else None."""
    try:
        return _made(msgspec.convert(raw, _WireOrder))
    except msgspec.ValidationError:
        return None


def orders_from_packed(data: bytes | memoryview) -> list[ProcessOrder] | None:
    """The orders of a msgpack array of orders in the form the daemon sends them, decoded and checked in
    one pass in C (a quarter of the cost of unpacking, then checking each map); None when any of them
    is otherwise, or the bytes are not such an array: then the field-by-field path
    (:meth:`ProcessOrder.from_wire`) accepts them or says what is wrong."""
    try:
        return [_made(w) for w in _PACKED_ORDERS.decode(data)]
    except (msgspec.MsgspecError, UnicodeDecodeError):  # (a string that is no UTF-8 raises the latter)
        return None


def _rlimits(raw: Any) -> list[list[Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > len(RLIMIT_NAMES):
        raise wire.ProtocolError("rlimits must be a short list")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3 and item[0] in RLIMIT_NAMES):
            raise wire.ProtocolError(f"an rlimit is [RLIMIT_* name, soft, hard], not {item!r}")
        for v in item[1:]:
            if v is not None and (type(v) is not int or v < -1):
                raise wire.ProtocolError(f"rlimit {item[0]}: limits are whole numbers >= -1 or None")
        out.append(list(item))
    return out


def _staging(raw: Any) -> list[list[Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > 4096:
        raise wire.ProtocolError("staging must be a list of at most 4096 steps")
    try:
        return [Step.from_wire(item).to_wire() for item in raw]
    except ValueError as exc:
        raise wire.ProtocolError(str(exc)) from None


_FIELD_NAMES: Final = tuple(f.name for f in fields(ProcessOrder))
_FIELDS: Final = frozenset(_FIELD_NAMES)
#: The fields the full check requires: to_wire always sends them.
_REQUIRED: Final = (
    "job_id", "slot", "role", "executable", "arguments", "inherit_environment", "directory", "truncate_output",
    "cores", "gpus",
)  # fmt: skip
#: The others with their defaults, which to_wire leaves out (the full check reads an absent one as it).
_OPTIONAL: Final = tuple(
    (f.name, f.default if f.default_factory is MISSING else f.default_factory())
    for f in fields(ProcessOrder)
    if f.name not in _REQUIRED
)
