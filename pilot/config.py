"""Pilot configuration: one TOML file per site kind, validated at ``pilot up``.

Every error names the key and says what is allowed, because a typo in a site config should cost
seconds, not a lost allocation.
"""

from __future__ import annotations

import fnmatch
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

DEFAULT_CONFIG: Final = Path(__file__).resolve().parent.parent / "configs" / "local.toml"


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key and the fix."""


@dataclass(frozen=True, slots=True)
class PilotSettings:
    name: str = "default"
    heartbeat_interval: float = 1.0
    agent_timeout: float = 5.0
    kill_grace: float = 2.0
    log_level: str = "info"
    #: Short one-process tasks that may wait at an agent behind each busy core (0: none, up to 1024).
    backlog: int = 128
    #: How agents reach the daemon: "ipc" (private socket, same machine) or "tcp" (CURVE-encrypted and
    #: authenticated); None picks ipc for a local allocation and tcp for a batch system.
    agent_transport: str | None = None
    #: Address, host name or interface for TCP endpoints; None: the one compute nodes route to.
    bind: str | None = None
    #: Seconds before the allocation's end at which running tasks are stopped (SIGTERM, then SIGKILL).
    walltime_margin: float = 30.0
    #: Seconds an allocation may run before every agent must have registered; later ones are reported.
    agent_start_timeout: float = 120.0
    #: Unfinished (queued and running) jobs the pilot holds; beyond it, submits wait, then are refused
    #: (transient) -- the bound on the daemon's memory under a flood of submissions.
    max_queued: int = 100_000
    #: How clients reach the daemon: "ipc" (the private socket in the run directory only) or "tcp" (also a
    #: CURVE endpoint for remote clients holding this pilot's client key: ``pilot credentials --client``).
    client_transport: str = "ipc"
    #: Address, host name or interface of the clients' TCP endpoint; None: ``bind``, else this host's address.
    client_bind: str | None = None
    #: Port of the clients' TCP endpoint; 0: a free one (reused when a daemon resumes after a crash).
    client_port: int = 0
    #: The ``mpirun`` launcher's MPI: "openmpi" (``mpirun --host``) or "mpich" (Hydra ``mpiexec -hosts``).
    mpi_flavor: str = "openmpi"
    #: MiB of journal WAL after which the daemon copies it into the journal file, in a worker thread.
    journal_checkpoint_mib: float = 4.0
    #: Seconds between two snapshots of the journal ('pilot up --restore' rebuilds from the last); 0: none.
    journal_snapshot_seconds: float = 60.0
    #: Seconds a queued job that does not fit may wait before the queue holds for it: then no job queued
    #: behind it (lower priority, or later) starts until it has, so smaller jobs cannot starve it; 0: never.
    reserve_after: float = 300.0
    #: Tasks' stdout/stderr without a file go to a few stream files per node (a job's custom attribute
    #: ``pilot.stream_output`` overrides it): pilot.model.output_stream.
    stream_output: bool = False


@dataclass(frozen=True, slots=True)
class AllocationSettings:
    """One site: where allocations come from (``[allocation]``, or ``[sites.NAME]`` for more)."""

    lrm: str = "local"
    nodes: int = 1
    walltime: float | None = None  # seconds
    options: dict[str, Any] = field(default_factory=dict)  # LRM-specific keys, checked by the LRM
    #: Allocations of this site acquired at ``pilot up`` (more may follow with ``[autoscale]``).
    pilots: int = 1
    #: "main" for ``[allocation]``, else the NAME of ``[sites.NAME]``.
    name: str = "main"

    @property
    def table(self) -> str:
        """The config table this site comes from, for error messages that name keys."""
        return "allocation" if self.name == "main" else f"sites.{self.name}"


@dataclass(frozen=True, slots=True)
class AutoscaleSettings:
    """Growing on demand: another allocation when queued work has waited ``grow_after`` seconds and the
    allocations held cannot take it, within the limits; idle allocations released after ``idle_timeout``."""

    enabled: bool = False
    max_pilots: int = 1
    max_nodes: int | None = None
    #: Seconds an allocation may have nothing to run before it is released (None: kept to its end).
    idle_timeout: float | None = None
    #: Allocations that fail to start in a row before auto-allocation gives up (never a submit loop).
    max_failures: int = 2
    grow_after: float = 5.0
    #: Allocations idle release keeps.
    min_pilots: int = 0


@dataclass(frozen=True, slots=True)
class LevelSettings:
    """What the site says of one level (the allocation as a whole, or the nodes a pattern names):
    features, fixed typed attribute values, and consumable capacities (SGE complex values)."""

    features: tuple[str, ...] = ()
    attributes: dict[str, str | float | bool] = field(default_factory=dict)
    consumables: dict[str, float] = field(default_factory=dict)
    #: [global] only: the allocation's Machine, Queue, User, Project ... for SSS Requested properties.
    context: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Config:
    pilot: PilotSettings = field(default_factory=PilotSettings)
    allocation: AllocationSettings = field(default_factory=AllocationSettings)
    #: Every site, ``allocation`` first, then ``[sites.NAME]`` in config order.
    sites: tuple[AllocationSettings, ...] = (AllocationSettings(),)
    autoscale: AutoscaleSettings = field(default_factory=AutoscaleSettings)
    #: Site-defined complex attributes: name -> {type, relop, shortcut, requestable, consumable, default}.
    attributes: dict[str, Any] = field(default_factory=dict)
    #: Allocation-wide (global) values and consumables, e.g. licenses shared by every node.
    global_level: LevelSettings = field(default_factory=LevelSettings)
    #: Per-node values, by node name or pattern (``*``, ``?``, ``[..]``), in config order.
    nodes: tuple[tuple[str, LevelSettings], ...] = ()
    source: str = "<defaults>"

    def node_level(self, name: str) -> LevelSettings:
        """Everything the patterns matching ``name`` give it, later tables overriding earlier ones. A
        node of a later allocation (``node1@a2``) is matched by its host's name."""
        name = name.partition("@")[0]
        features: list[str] = []
        attributes: dict[str, str | float | bool] = {}
        consumables: dict[str, float] = {}
        for pattern, level in self.nodes:
            if fnmatch.fnmatchcase(name, pattern):
                features += [f for f in level.features if f not in features]
                attributes.update(level.attributes)
                consumables.update(level.consumables)
        return LevelSettings(tuple(features), attributes, consumables)


_LOG_LEVELS: Final = ("debug", "info", "warning", "error")
_SIZE_RE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?)?\s*$", re.IGNORECASE | re.ASCII)
_TIME_RE: Final = re.compile(r"^(?:(\d{1,9})-)?(\d{1,12})(?::(\d{1,12}))?(?::(\d{1,12}))?$", re.ASCII)
_UNIT_RE: Final = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)([smhd])$", re.ASCII)
_NAME_RE: Final = re.compile(r"[A-Za-z0-9_.-]+")
_CONSUMABLE_RE: Final = re.compile(r"[A-Za-z0-9_.-]+(?::[A-Za-z0-9_.-]+)?")
#: Consumables a node may be configured with that SSS names itself (Configured Disk, Swap, Network):
#: sizes in bytes ("100G"), matched against a task's <Disk>, <Swap>, <Network>.
SIZED_CONSUMABLES: Final = ("Disk", "Swap", "Network")


def load(path: Path | None) -> Config:
    """The config at ``path``; with none, configs/local.toml when the source tree is at hand, else the
    same defaults built in (an installed package carries no configs/ folder)."""
    if path is None:
        if not DEFAULT_CONFIG.is_file():
            return parse({}, source="<built-in defaults>")
        path = DEFAULT_CONFIG
    try:
        raw = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (TOML is): byte {exc.start} is not valid") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return parse(raw, source=str(path))


def parse(raw: dict[str, Any], *, source: str = "<config>") -> Config:
    _only(raw, {"pilot", "allocation", "sites", "autoscale", "attributes", "global", "nodes"}, "", source)
    p = _table(raw, "pilot", source)
    d = PilotSettings()
    _only(p, set(PilotSettings.__dataclass_fields__), "pilot.", source)
    pilot = PilotSettings(
        name=_get(p, "name", str, "pilot.", source, d.name),
        heartbeat_interval=_pos(p, "heartbeat_interval", "pilot.", source, d.heartbeat_interval),
        agent_timeout=_pos(p, "agent_timeout", "pilot.", source, d.agent_timeout),
        kill_grace=_pos(p, "kill_grace", "pilot.", source, d.kill_grace),
        log_level=_get(p, "log_level", str, "pilot.", source, d.log_level),
        backlog=_get(p, "backlog", int, "pilot.", source, d.backlog),
        agent_transport=_get(p, "agent_transport", str, "pilot.", source, d.agent_transport),
        bind=_get(p, "bind", str, "pilot.", source, d.bind),
        walltime_margin=_pos(p, "walltime_margin", "pilot.", source, d.walltime_margin),
        agent_start_timeout=_pos(p, "agent_start_timeout", "pilot.", source, d.agent_start_timeout),
        max_queued=_get(p, "max_queued", int, "pilot.", source, d.max_queued),
        client_transport=_get(p, "client_transport", str, "pilot.", source, d.client_transport),
        client_bind=_get(p, "client_bind", str, "pilot.", source, d.client_bind),
        client_port=_get(p, "client_port", int, "pilot.", source, d.client_port),
        mpi_flavor=_get(p, "mpi_flavor", str, "pilot.", source, d.mpi_flavor),
        journal_checkpoint_mib=_get(p, "journal_checkpoint_mib", float, "pilot.", source, d.journal_checkpoint_mib),
        journal_snapshot_seconds=_get(
            p, "journal_snapshot_seconds", float, "pilot.", source, d.journal_snapshot_seconds
        ),
        reserve_after=_get(p, "reserve_after", float, "pilot.", source, d.reserve_after),
        stream_output=_get(p, "stream_output", bool, "pilot.", source, d.stream_output),
    )
    if not pilot.reserve_after >= 0:
        raise ConfigError(
            f"{source}: pilot.reserve_after = {pilot.reserve_after}; give the seconds a job that does not fit may "
            "wait before the queue holds for it, or 0 for never"
        )
    if not 0.0625 <= pilot.journal_checkpoint_mib <= 4096:
        raise ConfigError(
            f"{source}: pilot.journal_checkpoint_mib = {pilot.journal_checkpoint_mib}; give 0.0625 to 4096 (MiB)"
        )
    if not (pilot.journal_snapshot_seconds == 0 or 0.5 <= pilot.journal_snapshot_seconds <= 86400):
        raise ConfigError(
            f"{source}: pilot.journal_snapshot_seconds = {pilot.journal_snapshot_seconds}; give 0.5 to 86400 "
            "(seconds), or 0 for no snapshots"
        )
    if pilot.mpi_flavor not in ("openmpi", "mpich"):
        raise ConfigError(
            f"{source}: pilot.mpi_flavor = {pilot.mpi_flavor!r}; allowed: 'openmpi' (mpirun) or 'mpich' (mpiexec)"
        )
    if pilot.client_transport not in ("ipc", "tcp"):
        raise ConfigError(
            f"{source}: pilot.client_transport = {pilot.client_transport!r}; allowed: 'ipc' (local clients only) "
            "or 'tcp' (also remote clients over CURVE)"
        )
    if not 0 <= pilot.client_port <= 65535:
        raise ConfigError(f"{source}: pilot.client_port = {pilot.client_port}; give 1-65535, or 0 for a free port")
    if pilot.agent_transport not in (None, "ipc", "tcp"):
        raise ConfigError(f"{source}: pilot.agent_transport = {pilot.agent_transport!r}; allowed: 'ipc' or 'tcp'")
    if pilot.max_queued < 1:
        raise ConfigError(f"{source}: pilot.max_queued = {pilot.max_queued} must be at least 1")
    if not 0 <= pilot.backlog <= 1024:
        raise ConfigError(f"{source}: pilot.backlog = {pilot.backlog}; allowed: 0 (off) to 1024 tasks per busy core")
    if pilot.log_level not in _LOG_LEVELS:
        raise ConfigError(f"{source}: pilot.log_level = {pilot.log_level!r}; allowed: {', '.join(_LOG_LEVELS)}")
    if not _NAME_RE.fullmatch(pilot.name):
        raise ConfigError(f"{source}: pilot.name = {pilot.name!r}; use letters, digits, '.', '_' or '-'")
    if pilot.agent_timeout <= pilot.heartbeat_interval:
        raise ConfigError(
            f"{source}: pilot.agent_timeout ({pilot.agent_timeout}) must exceed pilot.heartbeat_interval "
            f"({pilot.heartbeat_interval}), or every agent is declared lost"
        )
    main = _site(_table(raw, "allocation", source), "main", source)
    site_tables = _table(raw, "sites", source)
    sites = [main]
    for name in site_tables:
        if not _NAME_RE.fullmatch(name) or name == "main":
            raise ConfigError(f"{source}: [sites.{name}]: use letters, digits, '.', '_' or '-', and not 'main'")
        if not isinstance(site_tables[name], dict):
            raise ConfigError(f"{source}: [sites.{name}] must be a table (lrm, nodes, walltime, pilots, ...)")
        sites.append(_site(site_tables[name], name, source))
    autoscale = _autoscale(_table(raw, "autoscale", source), sites, source)
    attributes = _table(raw, "attributes", source)
    registry = _registry(attributes, source)
    global_level = _level(_table(raw, "global", source), "global.", source, registry)
    node_tables = _table(raw, "nodes", source)
    node_levels = tuple(
        (
            str(pattern),
            _level(_sub_table(node_tables, pattern, "nodes.", source), f"nodes.{pattern}.", source, registry),
        )
        for pattern in node_tables
    )
    _check_overrides(global_level, node_levels, registry, source)
    return Config(
        pilot=pilot,
        allocation=main,
        sites=tuple(sites),
        autoscale=autoscale,
        attributes=attributes,
        global_level=global_level,
        nodes=node_levels,
        source=source,
    )


def _site(a: dict[str, Any], name: str, source: str) -> AllocationSettings:
    prefix = "allocation." if name == "main" else f"sites.{name}."
    lrm = _get(a, "lrm", str, prefix, source, "local")
    nodes = _get(a, "nodes", int, prefix, source, 1)
    if nodes < 1:
        raise ConfigError(f"{source}: {prefix}nodes = {nodes}; it must be at least 1")
    walltime = a.get("walltime")
    seconds = None if walltime is None else parse_duration(walltime, key=f"{prefix}walltime", source=source)
    if seconds is not None and seconds <= 0:
        raise ConfigError(f"{source}: {prefix}walltime = {walltime!r}; it must be longer than 0 seconds")
    pilots = _get(a, "pilots", int, prefix, source, 1 if name == "main" else 0)
    if pilots < 0:
        raise ConfigError(f"{source}: {prefix}pilots = {pilots}; give how many allocations to acquire at start, >= 0")
    options = {k: v for k, v in a.items() if k not in ("lrm", "nodes", "walltime", "pilots")}
    return AllocationSettings(lrm=lrm, nodes=nodes, walltime=seconds, options=options, pilots=pilots, name=name)


def _autoscale(t: dict[str, Any], sites: list[AllocationSettings], source: str) -> AutoscaleSettings:
    allowed = {"enabled", "max_pilots", "max_nodes", "idle_timeout", "max_failures", "grow_after", "min_pilots"}
    _only(t, allowed, "autoscale.", source)
    start = sum(s.pilots for s in sites)
    enabled = _get(t, "enabled", bool, "autoscale.", source, bool(t))
    d = AutoscaleSettings()
    max_pilots = _get(t, "max_pilots", int, "autoscale.", source, max(start, 1) + (1 if enabled else 0))
    max_nodes = _get(t, "max_nodes", int, "autoscale.", source, None)
    idle = t.get("idle_timeout")
    idle_s = None if idle is None else parse_duration(idle, key="autoscale.idle_timeout", source=source)
    out = AutoscaleSettings(
        enabled=enabled,
        max_pilots=max_pilots,
        max_nodes=max_nodes,
        idle_timeout=idle_s,
        max_failures=_get(t, "max_failures", int, "autoscale.", source, d.max_failures),
        grow_after=float(_get(t, "grow_after", float, "autoscale.", source, d.grow_after)),
        min_pilots=_get(t, "min_pilots", int, "autoscale.", source, d.min_pilots),
    )
    if start == 0 and not out.enabled:
        raise ConfigError(
            f"{source}: allocation.pilots = 0 and no site acquires an allocation at start; set pilots >= 1, "
            "or enable [autoscale] to acquire them when work comes"
        )
    if out.max_pilots < max(start, 1):
        raise ConfigError(
            f"{source}: autoscale.max_pilots = {out.max_pilots} is below the {start} allocation(s) the sites "
            "acquire at start (their 'pilots' keys)"
        )
    smallest = min(s.nodes for s in sites)
    if out.max_nodes is not None and out.max_nodes < smallest:
        raise ConfigError(
            f"{source}: autoscale.max_nodes = {out.max_nodes} is below the smallest site's nodes ({smallest}): "
            "no allocation could ever be acquired"
        )
    if out.max_failures < 1:
        raise ConfigError(f"{source}: autoscale.max_failures = {out.max_failures} must be at least 1")
    if not 0 <= out.grow_after < 1e9:
        raise ConfigError(f"{source}: autoscale.grow_after = {out.grow_after} must be seconds >= 0")
    if not 0 <= out.min_pilots <= out.max_pilots:
        raise ConfigError(f"{source}: autoscale.min_pilots = {out.min_pilots} must be 0 to max_pilots")
    return out


def _registry(table: dict[str, Any], source: str) -> Any:
    from pilot.scheduler.attributes import AttributeRegistry, ComplexAttributeError

    try:
        return AttributeRegistry.from_config(table, source=source)
    except ComplexAttributeError as exc:
        raise ConfigError(str(exc)) from None


def _check_overrides(
    global_level: LevelSettings, node_levels: tuple[tuple[str, LevelSettings], ...], registry: Any, source: str
) -> None:
    """SGE's override rules between levels: a node table may not override a global ``==``/``!=``
    attribute, nor loosen a global ``<``/``<=``/``>``/``>=`` one (the matching is strict-hierarchical:
    such a node value would never be the one that decides)."""
    from pilot.scheduler.attributes import ComplexAttributeError, check_override

    for pattern, level in node_levels:
        for name, raw in level.attributes.items():
            d = registry[name]
            upper = next(((k, v) for k, v in global_level.attributes.items() if registry[k].name == d.name), None)
            if upper is None:
                continue
            try:
                check_override(
                    d,
                    d.value(upper[1]),
                    d.value(raw),
                    where=f"{source}: nodes.{pattern}.attributes.{name}",
                    upper_key=f"by global.attributes.{upper[0]}",
                )
            except ComplexAttributeError as exc:
                raise ConfigError(str(exc)) from None


def _sub_table(table: dict[str, Any], key: str, prefix: str, source: str) -> dict[str, Any]:
    value = table[key]
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [{prefix}{key}] must be a table (features, attributes, consumables)")
    return value


def _level(table: dict[str, Any], prefix: str, source: str, registry: Any) -> LevelSettings:
    """One level's settings, each value checked against its attribute's type now, not at first match."""
    from pilot.scheduler.attributes import AttributeValues, ComplexAttributeError, ConsumableKind
    from pilot.scheduler.matching import GLOBAL_NAMES

    names = set(GLOBAL_NAMES) if prefix == "global." else set()
    _only(table, {"features", "attributes", "consumables"} | names, prefix, source)
    context: dict[str, str] = {}
    for name in names & set(table):
        if not isinstance(table[name], str) or not table[name]:
            raise ConfigError(f"{source}: {prefix}{name} must be a non-empty string")
        context[name] = table[name]
    features = table.get("features", [])
    if not isinstance(features, list) or not all(isinstance(f, str) and f for f in features):
        raise ConfigError(f"{source}: {prefix}features must be a list of non-empty strings")
    attrs = table.get("attributes", {})
    if not isinstance(attrs, dict) or not all(isinstance(v, str | int | float | bool) for v in attrs.values()):
        raise ConfigError(f"{source}: {prefix}attributes must be a table of name = value (text, number or boolean)")
    for name, value in attrs.items():
        try:
            AttributeValues().set_fixed(registry, {name: value}, level=f"{source}: {prefix}attributes")
        except ComplexAttributeError as exc:
            raise ConfigError(f"{source}: {prefix}attributes.{name}: {exc}") from None
    cons = table.get("consumables", {})
    if not isinstance(cons, dict):
        raise ConfigError(f"{source}: {prefix}consumables must be a table of name = capacity")
    capacities: dict[str, float] = {}
    for name, value in cons.items():
        key = f"{source}: {prefix}consumables.{name}"
        if not _CONSUMABLE_RE.fullmatch(name):
            raise ConfigError(
                f"{key}: use letters, digits, '.', '_' or '-' in a consumable's name, and 'name:type' for a typed "
                "resource (SSS <Resource name=... type=...>)"
            )
        if name in SIZED_CONSUMABLES:  # SSS Disk, Swap, Network: a size, as memory is given
            capacities[name] = float(parse_size(value, key=f"{prefix}consumables.{name}", source=source))
            continue
        d = registry.get(name) or registry.get(name.split(":", 1)[0])
        if d is not None and d.consumable is ConsumableKind.NO:
            raise ConfigError(f"{key}: attribute {d.name!r} is not consumable; give it under attributes instead")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{key} = {value!r}; give a capacity as a number >= 0")
        capacities[name] = float(value)
    return LevelSettings(tuple(features), dict(attrs), capacities, context)


def parse_size(value: Any, *, key: str, source: str) -> int:
    """Bytes from an int or a string like ``8G``, ``512M``, ``4GiB`` (powers of 1024)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            number = float(m.group(1)) * 1024 ** " KMGTP".index(m.group(2).upper() or " ")
            if math.isfinite(number):
                return int(number)
    raise ConfigError(f"{source}: {key} = {value!r}; give bytes as an integer or a size such as '512M' or '8G'")


def parse_duration(value: Any, *, key: str, source: str) -> float:
    """Seconds from a number, or ``[D-]HH:MM:SS`` / ``MM:SS`` / ``30m`` / ``2h`` strings; always finite."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        s = value.strip()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        u = _UNIT_RE.match(s)
        if u and math.isfinite(seconds := float(u.group(1)) * units[u.group(2)]):
            return seconds
        m = _TIME_RE.match(s)
        if m and ":" in s:
            days = int(m.group(1) or 0)
            parts = [int(x) for x in m.group(2, 3, 4) if x is not None]
            while len(parts) < 3:
                parts.insert(0, 0)
            h, mi, se = parts
            return float(days * 86400 + h * 3600 + mi * 60 + se)
    raise ConfigError(f"{source}: {key} = {value!r}; give seconds, 'HH:MM:SS', or a number with s/m/h/d")


def _table(raw: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [{key}] must be a table")
    return value


def _only(table: dict[str, Any], allowed: set[str], prefix: str, source: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{source}: unknown key {prefix}{key}; allowed here: {', '.join(sorted(allowed))}")


def _get(table: dict[str, Any], key: str, typ: type[Any], prefix: str, source: str, default: Any) -> Any:
    if key not in table:
        return default
    value = table[key]
    if isinstance(value, bool) and typ is not bool:
        raise ConfigError(f"{source}: {prefix}{key} must be {typ.__name__}, not a boolean")
    if typ is float and isinstance(value, int):
        value = float(value)
    if not isinstance(value, typ):
        raise ConfigError(f"{source}: {prefix}{key} = {value!r} must be {typ.__name__}")
    return value


def _pos(table: dict[str, Any], key: str, prefix: str, source: str, default: float) -> float:
    value = float(_get(table, key, float, prefix, source, default))
    if not value > 0 or not math.isfinite(value):
        raise ConfigError(f"{source}: {prefix}{key} = {value}; it must be a positive number of seconds")
    return value
