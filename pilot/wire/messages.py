"""One typed message per kind, each decoded (and checked) once where it arrives.

A frame's body is hostile input: ``from_body`` checks every field and raises :class:`ProtocolError`
naming the field. Senders build the message and ``encode`` it; receivers call :func:`decode` with the
kinds their side accepts (``TO_DAEMON_FROM_AGENT``, ``TO_AGENT``, ``TO_DAEMON_FROM_CLIENT``), so a
message a peer may not send is refused before any of it is read. Per-item records inside a batch
(a task event, a job's status) are named tuples: decoded once, cheap by the thousand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, NamedTuple, Protocol, Self

from pilot.core.leases import MOST as LEASE_MOST
from pilot.model.job_state import FINAL_NAMES
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder, orders_from_packed
from pilot.wire.codec import MAX_FRAME_BYTES, Kind, ProtocolError, array_header, field, frame_head, opt_field
from pilot.wire.codec import decode as decode_frame
from pilot.wire.codec import encode as encode_frame
from pilot.wire.codec import pack as pack_value

#: A process on an agent: (its job id, with ``~attempt`` after a re-run; its slot).
ProcessRef = tuple[str, int]

#: Most characters of a submit id, the client's own id for one job of a SUBMIT (a uuid is 36).
_SUBMIT_ID_CHARS = 128


class Body(Protocol):
    KIND: ClassVar[str]

    def body(self) -> dict[str, Any]: ...

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self: ...


def encode(msg: Body) -> bytes:
    return encode_frame(msg.KIND, msg.body())


def decode(frame: bytes, kinds: Mapping[str, type[Body]]) -> Body:
    """The typed message in ``frame``, which must be one of ``kinds`` (kind -> class). A LAUNCH as the
    daemon writes it (:meth:`Launch.frame`) is decoded and checked in one pass (:func:`orders_from_packed`);
    any other frame, or one that pass does not take, is unpacked, then checked field by field."""
    if frame.startswith(_LAUNCH_HEAD) and Kind.LAUNCH in kinds and len(frame) <= MAX_FRAME_BYTES:
        orders = orders_from_packed(memoryview(frame)[len(_LAUNCH_HEAD) :])
        if orders is not None:
            return Launch(tuple(orders))
    m = decode_frame(frame, allowed=frozenset(kinds))
    return kinds[m.kind].from_body(m.body)


# -- records --------------------------------------------------------------------------------------------


class TaskEvent(NamedTuple):
    """What happened to one process: ``started``, ``exited`` (data: exit code, signal, rusage, ...),
    ``failed`` (never started; data: message) or ``withdrawn`` (given back unstarted)."""

    job_id: str  # the process's job id, as its order carries it (``<id>~<attempt>`` after a re-run)
    slot: int
    kind: str
    time: float
    data: dict[str, Any]

    @classmethod
    def from_wire(cls, raw: Any) -> TaskEvent:
        # An agent's events, decoded by msgpack, have exact types: one pass of identity tests for them
        # (two per task arrive), the general checks below for anything else.
        if type(raw) is list and len(raw) == 5:
            job_id, slot, kind, t, data = raw
            if (
                type(job_id) is str
                and type(slot) is int
                and type(kind) is str
                and type(data) is dict
                and kind in _TASK_EVENT_KINDS
            ):
                if type(t) is float:
                    return cls(job_id, slot, kind, t, data)
                if type(t) is int:
                    return cls(job_id, slot, kind, float(t), data)
        if not (isinstance(raw, list) and len(raw) == 5):
            raise ProtocolError("a task event is [job_id, slot, kind, time, data]")
        job_id, slot, kind, t, data = raw
        if not (
            isinstance(job_id, str)
            and type(slot) is int
            and isinstance(kind, str)
            and isinstance(t, int | float)
            and not isinstance(t, bool)
            and isinstance(data, dict)
        ):
            raise ProtocolError("a task event has wrong field types")
        if kind not in _TASK_EVENT_KINDS:
            raise ProtocolError(f"unknown task event kind {kind!r}")
        return cls(job_id, slot, kind, float(t), data)

    def to_wire(self) -> list[Any]:
        return [self.job_id, self.slot, self.kind, self.time, self.data]


_TASK_EVENT_KINDS = frozenset({"started", "exited", "failed", "withdrawn"})


class StatusReport(NamedTuple):
    """A job's status as the daemon reports it to clients (and as a client reports to itself a job it
    gave up, whose ``job_id`` may then be None: it never got one)."""

    job_id: str | None
    state: str
    time: float
    exit_code: int | None
    message: str | None
    metadata: dict[str, Any] | None

    @classmethod
    def from_wire(cls, raw: Any) -> StatusReport:
        if not (isinstance(raw, list) and len(raw) == 6):
            raise ProtocolError("a job status is [id, state, time, exit_code, message, metadata]")
        job_id, state, t, code, message, metadata = raw
        if not (
            isinstance(job_id, str)
            and isinstance(state, str)
            and isinstance(t, int | float)
            and not isinstance(t, bool)
            and (code is None or type(code) is int)
            and (message is None or isinstance(message, str))
            and (metadata is None or isinstance(metadata, dict))
        ):
            raise ProtocolError("a job status has wrong field types")
        return cls(job_id, state, float(t), code, message, metadata)


def _refs(body: dict[str, Any], name: str = "processes") -> tuple[ProcessRef, ...]:
    refs = []
    for raw in field(body, name, list):
        if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], str) and type(raw[1]) is int):
            raise ProtocolError(f"{name} must be [job_id, slot] pairs")
        refs.append((raw[0], raw[1]))
    return tuple(refs)


def _events(body: dict[str, Any], *, required: bool) -> tuple[TaskEvent, ...]:
    raw = field(body, "events", list) if required else opt_field(body, "events", list, [])
    return tuple(TaskEvent.from_wire(ev) for ev in raw)


def _measures(body: dict[str, Any]) -> tuple[dict[str, int | float | str] | None, dict[str, float] | None]:
    """A heartbeat's load values (a map of at most 64) and Utilized amounts (at most 16), the entries of
    the wrong type left out; None for either when it is absent or not such a map."""
    values = body.get("values")
    clean: dict[str, int | float | str] | None = None
    if isinstance(values, dict) and len(values) <= 64:
        clean = {k: v for k, v in values.items() if isinstance(k, str) and isinstance(v, int | float | str)}
    used = body.get("utilized")
    utilized: dict[str, float] | None = None
    if isinstance(used, dict) and len(used) <= 16:
        utilized = {k: float(v) for k, v in used.items() if isinstance(k, str) and isinstance(v, int | float)}
    return clean, utilized


# -- agent -> daemon ------------------------------------------------------------------------------------


#: Most nodes one REGISTER or HEARTBEAT speaks for (the sender's own node and the others its process hosts).
MOST_HOSTED = 10_000
#: Most characters of a node's name where a message names other nodes than its sender's.
_NODE_NAME_CHARS = 255


@dataclass(frozen=True, slots=True)
class Register:
    """An agent (re)registers its node, with what it runs and the events not acknowledged yet.

    ``more``: REGISTERs of other nodes the sender's process hosts (simulated nodes), sent in one frame
    so ten thousand nodes register in a few messages; each is answered on its own node's socket, as if
    it had come alone. They carry no ``more`` themselves."""

    KIND: ClassVar[str] = Kind.REGISTER
    node: NodeConfigured
    running: tuple[ProcessRef, ...] = ()
    events: tuple[TaskEvent, ...] = ()
    seq: int = 0
    values: Mapping[str, int | float | str] | None = None
    utilized: dict[str, float] | None = None
    more: tuple[Register, ...] = ()

    def body(self) -> dict[str, Any]:
        out = {
            "node": self.node.to_wire(),
            "running": [list(ref) for ref in self.running],
            "events": [e.to_wire() for e in self.events],
            "seq": self.seq,
            "values": self.values or {},
            "utilized": self.utilized or {},
        }
        if self.more:
            out["more"] = [r.body() for r in self.more]
        return out

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        one = cls._one(body)
        raw = opt_field(body, "more", list)
        if raw is None:
            return one
        if len(raw) >= MOST_HOSTED:
            raise ProtocolError(f"field 'more' names {len(raw)} nodes; at most {MOST_HOSTED - 1} go with one REGISTER")
        more = []
        for entry in raw:
            if not isinstance(entry, dict):
                raise ProtocolError("field 'more' must be a list of REGISTER bodies")
            if "more" in entry:
                raise ProtocolError("a REGISTER in field 'more' must not carry 'more' itself")
            more.append(cls._one(entry))
        names = {one.node.name, *(r.node.name for r in more)}
        if len(names) != len(more) + 1:
            raise ProtocolError("a REGISTER names a node twice (its own node and field 'more')")
        return cls(one.node, one.running, one.events, one.seq, one.values, one.utilized, tuple(more))

    @classmethod
    def _one(cls, body: dict[str, Any]) -> Self:
        values, utilized = _measures(body)
        return cls(
            NodeConfigured.from_wire(field(body, "node", dict)),
            _refs(body, "running"),
            _events(body, required=False),
            opt_field(body, "seq", int, 0),
            values,
            utilized,
        )


def _node_names(body: dict[str, Any], name: str) -> tuple[str, ...]:
    raw = opt_field(body, name, list, [])
    if len(raw) >= MOST_HOSTED:
        raise ProtocolError(f"field {name!r} names {len(raw)} nodes; at most {MOST_HOSTED - 1} go with one message")
    # Checked in C (a combined heartbeat names up to ten thousand nodes every second): msgpack gives
    # exact strs; anything else, or a length out of bounds, is refused.
    if raw and not (set(map(type, raw)) <= _STR and min(map(len, raw)) > 0 and max(map(len, raw)) <= _NODE_NAME_CHARS):
        raise ProtocolError(f"field {name!r} must be a list of node names of 1 to {_NODE_NAME_CHARS} characters")
    return tuple(raw)


_STR: Final = frozenset({str})


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The sender's node is alive, with its load. ``nodes``: other nodes its process hosts (simulated
    nodes) whose heartbeat this is too -- one message per process, not per node; the load and values
    are the same machine's, so they hold for each."""

    KIND: ClassVar[str] = Kind.HEARTBEAT
    load: tuple[float, ...] = ()
    values: Mapping[str, int | float | str] | None = None
    utilized: dict[str, float] | None = None
    nodes: tuple[str, ...] = ()

    def body(self) -> dict[str, Any]:
        out = {"load": list(self.load), "values": self.values or {}, "utilized": self.utilized or {}}
        if self.nodes:
            out["nodes"] = list(self.nodes)
        return out

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        load = body.get("load")
        ok = isinstance(load, list) and all(isinstance(x, int | float) and not isinstance(x, bool) for x in load)
        values, utilized = _measures(body)
        loads = tuple(float(x) for x in load[:3]) if ok else ()  # type: ignore[index]
        return cls(loads, values, utilized, _node_names(body, "nodes"))


@dataclass(frozen=True, slots=True)
class TaskEvents:
    KIND: ClassVar[str] = Kind.TASK_EVENTS
    events: tuple[TaskEvent, ...]
    seq: int = 0

    def body(self) -> dict[str, Any]:
        return {"events": [e.to_wire() for e in self.events], "seq": self.seq}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        return cls(_events(body, required=True), opt_field(body, "seq", int, 0))


@dataclass(frozen=True, slots=True)
class Bye:
    KIND: ClassVar[str] = Kind.BYE
    node: str = ""

    def body(self) -> dict[str, Any]:
        return {"node": self.node}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        return cls(opt_field(body, "node", str, ""))


# -- daemon -> agent ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Registered:
    KIND: ClassVar[str] = Kind.REGISTERED
    heartbeat_interval: float
    acked: int = 0

    def body(self) -> dict[str, Any]:
        return {"heartbeat_interval": self.heartbeat_interval, "acked": self.acked}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        interval = float(field(body, "heartbeat_interval", (int, float)))
        if not 0.01 <= interval <= 3600:  # NaN included: never again, or every loop turn, is no heartbeat
            raise ProtocolError(f"heartbeat_interval {interval!r} is not between 0.01 and 3600 s")
        return cls(interval, opt_field(body, "acked", int, 0))


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """``known``: the daemon knows this agent (else it must register again); ``acked``: events handled.
    To a heartbeat that spoke for other nodes too: ``acks``, node -> events handled, for each of them
    the daemon knows; ``unknown``, those it does not (they must register again)."""

    KIND: ClassVar[str] = Kind.HEARTBEAT
    known: bool
    acked: int = 0
    acks: Mapping[str, int] | None = None
    unknown: tuple[str, ...] = ()

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"known": True, "acked": self.acked} if self.known else {"known": False}
        if self.acks:
            out["acks"] = dict(self.acks)
        if self.unknown:
            out["unknown"] = list(self.unknown)
        return out

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        acks: dict[str, int] | None = opt_field(body, "acks", dict)
        if acks is not None:
            if len(acks) >= MOST_HOSTED or not all(
                isinstance(k, str) and type(v) is int and v >= 0 for k, v in acks.items()
            ):
                raise ProtocolError(f"field 'acks' must map at most {MOST_HOSTED - 1} node names to event counts")
        return cls(
            opt_field(body, "known", bool, True),
            opt_field(body, "acked", int, 0),
            acks or None,
            _node_names(body, "unknown"),
        )


@dataclass(frozen=True, slots=True)
class Launch:
    KIND: ClassVar[str] = Kind.LAUNCH
    orders: tuple[ProcessOrder, ...]

    def body(self) -> dict[str, Any]:
        return {"orders": [o.to_wire() for o in self.orders]}

    @staticmethod
    def frame(orders: list[dict[str, Any]], packed: Callable[[Mapping[str, Any]], bytes | None] | None = None) -> bytes:
        """The frame of orders already in their wire form (as the journal keeps them): encoded once.
        ``packed``: an order's msgpack bytes when already packed (for the journal), else None; the frame
        is then put together from those bytes (the same bytes ``encode_frame`` would write)."""
        if packed is None:
            return encode_frame(Kind.LAUNCH, {"orders": orders})
        parts = [_LAUNCH_HEAD, array_header(len(orders))]
        for o in orders:
            blob = packed(o)
            parts.append(pack_value(o) if blob is None else blob)
        return b"".join(parts)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        return cls(tuple(ProcessOrder.from_wire(o) for o in field(body, "orders", list)))


_LAUNCH_HEAD: Final = frame_head(Kind.LAUNCH, "orders")


@dataclass(frozen=True, slots=True)
class Kill:
    KIND: ClassVar[str] = Kind.KILL
    processes: tuple[ProcessRef, ...]
    reason: str

    def body(self) -> dict[str, Any]:
        return {"processes": [list(ref) for ref in self.processes], "reason": self.reason}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        return cls(_refs(body), field(body, "reason", str))


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Take back orders still waiting for their cores; each one taken back is reported ``withdrawn``."""

    KIND: ClassVar[str] = Kind.WITHDRAW
    processes: tuple[ProcessRef, ...]

    def body(self) -> dict[str, Any]:
        return {"processes": [list(ref) for ref in self.processes]}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        return cls(_refs(body))


@dataclass(frozen=True, slots=True)
class Stop:
    KIND: ClassVar[str] = Kind.STOP
    reason: str = "pilot stopping"

    def body(self) -> dict[str, Any]:
        return {"reason": self.reason}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        return cls(opt_field(body, "reason", str, "pilot stopping"))


# -- client -> daemon -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submit:
    """Jobs, each a PSI/J description (checked by ``JobDescription.from_wire``) or ``{"sss": document}``;
    ``submit_ids``: the client's own id for each job, so a resent one is never made twice; ``again``: some
    of them were sent before, on a connection lost before its answer (only then may the journal know
    them: a first send's submit ids are new, and are not looked up there)."""

    KIND: ClassVar[str] = Kind.SUBMIT
    rid: int
    jobs: list[Any]
    submit_ids: list[str | None] | None = None
    again: bool = False

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rid": self.rid, "jobs": self.jobs}
        if self.submit_ids is not None:
            out["submit_ids"] = self.submit_ids
        if self.again:
            out["again"] = True
        return out

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        jobs = field(body, "jobs", list)
        submit_ids: list[str | None] | None = opt_field(body, "submit_ids", list)
        if submit_ids is not None:
            if len(submit_ids) != len(jobs):
                raise ProtocolError(
                    f"'submit_ids' has {len(submit_ids)} entries for {len(jobs)} jobs; send one per job (or null)"
                )
            for submit_id in submit_ids:
                if submit_id is not None and not (
                    isinstance(submit_id, str) and 0 < len(submit_id) <= _SUBMIT_ID_CHARS
                ):
                    raise ProtocolError(
                        f"a submit id must be a string of 1 to {_SUBMIT_ID_CHARS} characters, not {submit_id!r:.80}"
                    )
        return cls(field(body, "rid", int), jobs, submit_ids, bool(opt_field(body, "again", bool, False)))


@dataclass(frozen=True, slots=True)
class Abandon:
    """Submit ids whose client gave up waiting for the SUBMIT's answer (and told its caller the job will
    not run): the pilot refuses them from now on and cancels any job it made under one."""

    KIND: ClassVar[str] = Kind.ABANDON
    rid: int
    submit_ids: tuple[str, ...]

    def body(self) -> dict[str, Any]:
        return {"rid": self.rid, "submit_ids": list(self.submit_ids)}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        submit_ids = field(body, "submit_ids", list)
        for submit_id in submit_ids:
            if not (isinstance(submit_id, str) and 0 < len(submit_id) <= _SUBMIT_ID_CHARS):
                raise ProtocolError(
                    f"a submit id must be a string of 1 to {_SUBMIT_ID_CHARS} characters, not {submit_id!r:.80}"
                )
        return cls(field(body, "rid", int), tuple(submit_ids))


@dataclass(frozen=True, slots=True)
class Lease:
    """Ask for ``count`` job ids to give jobs as they are sent (their submit ids): the reply's ``first``
    and ``last``, journaled before the reply leaves. ``give_back``: ranges [first, last] of ids leased
    before that the client will never use (it closes); ``count`` may then be 0."""

    KIND: ClassVar[str] = Kind.LEASE
    rid: int
    count: int
    give_back: tuple[tuple[int, int], ...] = ()

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rid": self.rid, "count": self.count}
        if self.give_back:
            out["give_back"] = [list(r) for r in self.give_back]
        return out

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        count = field(body, "count", int)
        raw = opt_field(body, "give_back", list, [])
        if len(raw) > 2 or not all(
            isinstance(r, list) and len(r) == 2 and all(type(x) is int and x > 0 for x in r) and r[0] <= r[1]
            for r in raw
        ):
            raise ProtocolError(f"'give_back' must be at most 2 ranges [first, last] of job ids, not {raw!r:.80}")
        if not (0 < count <= LEASE_MOST or (count == 0 and raw)):
            raise ProtocolError(f"'count' must be 1 to {LEASE_MOST} job ids (0 only to give ids back), not {count}")
        return cls(field(body, "rid", int), count, tuple((r[0], r[1]) for r in raw))


@dataclass(frozen=True, slots=True)
class _ByIds:
    """A request about jobs named by their ids."""

    KIND: ClassVar[str]
    rid: int
    ids: tuple[str, ...]

    def body(self) -> dict[str, Any]:
        return {"rid": self.rid, "ids": list(self.ids)}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        ids = field(body, "ids", list)
        if not all(isinstance(v, str) for v in ids):
            raise ProtocolError("field 'ids' must be a list of strings")
        return cls(field(body, "rid", int), tuple(ids))


class Cancel(_ByIds):
    __slots__ = ()
    KIND = Kind.CANCEL


@dataclass(frozen=True, slots=True)
class CancelWhere:
    """Cancel every unfinished job in one of ``states`` and of the run ``run`` (at least one given)."""

    KIND: ClassVar[str] = Kind.CANCEL_WHERE
    rid: int
    states: tuple[str, ...] = ()
    run: str | None = None

    def body(self) -> dict[str, Any]:
        return {"rid": self.rid, "states": list(self.states), "run": self.run}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        states, run = _states(body), opt_field(body, "run", str)
        if not states and run is None:
            raise ProtocolError("name the jobs to cancel: give 'states', 'run' or both")
        return cls(field(body, "rid", int), states, run)


def _states(body: dict[str, Any]) -> tuple[str, ...]:
    states = opt_field(body, "states", list, [])
    if not all(isinstance(s, str) and len(s) <= 64 for s in states) or len(states) > 16:
        raise ProtocolError("field 'states' must be a list of at most 16 state names")
    return tuple(states)


class Attach(_ByIds):
    """Follow jobs: their statuses come to this connection from now on."""

    __slots__ = ()
    KIND = Kind.ATTACH


class Explain(_ByIds):
    """Why jobs wait (or how they ended)."""

    __slots__ = ()
    KIND = Kind.EXPLAIN


class Show(_ByIds):
    """Jobs as SSS Job XML, with State, Delivered and placed Tasks."""

    __slots__ = ()
    KIND = Kind.SHOW


class Release(_ByIds):
    """Lift an SSS <Hold>."""

    __slots__ = ()
    KIND = Kind.RELEASE


@dataclass(frozen=True, slots=True)
class _About:
    """A request about the pilot itself."""

    KIND: ClassVar[str]
    rid: int

    def body(self) -> dict[str, Any]:
        return {"rid": self.rid}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        return cls(field(body, "rid", int))


class Hello(_About):
    __slots__ = ()
    KIND = Kind.HELLO


@dataclass(frozen=True, slots=True)
class ListJobs:
    """Every job id the pilot holds. With ``ranges`` the answer is ``ranges``, runs of consecutive ids
    as ``[first, last]`` pairs, which stays small however many jobs a pilot ran; without it (a client
    from before ranges) ``ids``, one string per job."""

    KIND: ClassVar[str] = Kind.LIST
    rid: int
    ranges: bool = False

    def body(self) -> dict[str, Any]:
        return {"rid": self.rid, "ranges": self.ranges}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        return cls(field(body, "rid", int), opt_field(body, "ranges", bool, False))


@dataclass(frozen=True, slots=True)
class Jobs:
    """Summary rows of the jobs that match every filter given: states, a glob on the name, the run
    (custom attribute ``pilot.run``), submitted at or after ``since``; at most the last ``limit``. With
    ``delivered``, each row carries its Delivered ('pilot report'). With ``latest`` (and ``limit``, and
    final ``states`` or none): the last ``limit`` jobs to end, in the order they ended ('pilot top')."""

    KIND: ClassVar[str] = Kind.JOBS
    rid: int
    states: tuple[str, ...] = ()
    name: str | None = None
    run: str | None = None
    since: float | None = None
    limit: int | None = None
    delivered: bool = False
    latest: bool = False

    def body(self) -> dict[str, Any]:
        return {
            "rid": self.rid,
            "states": list(self.states),
            "name": self.name,
            "run": self.run,
            "since": self.since,
            "limit": self.limit,
            "delivered": self.delivered,
            "latest": self.latest,
        }

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        states = _states(body)
        since = opt_field(body, "since", (int, float))
        limit = opt_field(body, "limit", int)
        if limit is not None and limit < 0:
            raise ProtocolError("field 'limit' must not be negative")
        latest = opt_field(body, "latest", bool, False)
        if latest and (limit is None or not all(s in FINAL_NAMES for s in states)):
            raise ProtocolError(
                "field 'latest' asks for the last jobs to have ended: give it a 'limit', and 'states' of "
                f"final states only ({', '.join(FINAL_NAMES)}) or none"
            )
        return cls(
            field(body, "rid", int),
            states,
            opt_field(body, "name", str),
            opt_field(body, "run", str),
            None if since is None else float(since),
            limit,
            opt_field(body, "delivered", bool, False),
            latest,
        )


class Status(_About):
    __slots__ = ()
    KIND = Kind.STATUS


class Nodes(_About):
    """The nodes as SSS Node XML."""

    __slots__ = ()
    KIND = Kind.NODES


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop the pilot; with ``drain``, refuse new jobs and stop once every accepted one has ended."""

    KIND: ClassVar[str] = Kind.SHUTDOWN
    rid: int
    drain: bool = False

    def body(self) -> dict[str, Any]:
        return {"rid": self.rid, "drain": self.drain}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        return cls(field(body, "rid", int), opt_field(body, "drain", bool, False))


ClientRequest = (
    Submit
    | Abandon
    | Lease
    | Cancel
    | CancelWhere
    | Attach
    | Explain
    | Show
    | Release
    | Hello
    | ListJobs
    | Jobs
    | Status
    | Nodes
    | Shutdown
)

TO_DAEMON_FROM_CLIENT: Mapping[str, type[Body]] = {
    c.KIND: c
    for c in (
        Submit,
        Abandon,
        Lease,
        Cancel,
        CancelWhere,
        Attach,
        Explain,
        Show,
        Release,
        Hello,
        ListJobs,
        Jobs,
        Status,
        Nodes,
        Shutdown,
    )
}

_CLIENT_KINDS = frozenset(TO_DAEMON_FROM_CLIENT)


def decode_request(frame: bytes) -> tuple[int, Body | ProtocolError]:
    """A client's request: its rid and the typed request, or the error that makes it unreadable, saying
    which kind of request it is (the rid is known, so the client hears why). A frame without a readable
    rid raises ProtocolError."""
    m = decode_frame(frame, allowed=_CLIENT_KINDS)
    rid: int = field(m.body, "rid", int)
    try:
        return rid, TO_DAEMON_FROM_CLIENT[m.kind].from_body(m.body)
    except ProtocolError as exc:
        return rid, ProtocolError(f"bad {m.kind} request: {exc}")


TO_DAEMON_FROM_AGENT: Mapping[str, type[Register | Heartbeat | TaskEvents | Bye]] = {
    Kind.REGISTER: Register,
    Kind.HEARTBEAT: Heartbeat,
    Kind.TASK_EVENTS: TaskEvents,
    Kind.BYE: Bye,
}
TO_AGENT: Mapping[str, type[Body]] = {
    Kind.REGISTERED: Registered,
    Kind.HEARTBEAT: HeartbeatReply,
    Kind.LAUNCH: Launch,
    Kind.KILL: Kill,
    Kind.WITHDRAW: Withdraw,
    Kind.STOP: Stop,
}

AgentMessage = Register | Heartbeat | TaskEvents | Bye
