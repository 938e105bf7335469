"""Pilot configuration: one TOML file per site kind, validated at ``pilot up``.

Every error names the key and says what is allowed, because a typo in a site config should cost
seconds, not a lost allocation.
"""

from __future__ import annotations

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
    #: Short one-process tasks that may wait at an agent behind each busy core (0 or 1).
    backlog: int = 1
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


@dataclass(frozen=True, slots=True)
class AllocationSettings:
    lrm: str = "local"
    nodes: int = 1
    walltime: float | None = None  # seconds
    options: dict[str, Any] = field(default_factory=dict)  # LRM-specific keys, checked by the LRM


@dataclass(frozen=True, slots=True)
class Config:
    pilot: PilotSettings = field(default_factory=PilotSettings)
    allocation: AllocationSettings = field(default_factory=AllocationSettings)
    source: str = "<defaults>"


_LOG_LEVELS: Final = ("debug", "info", "warning", "error")
_SIZE_RE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?)?\s*$", re.IGNORECASE | re.ASCII)
_TIME_RE: Final = re.compile(r"^(?:(\d{1,9})-)?(\d{1,12})(?::(\d{1,12}))?(?::(\d{1,12}))?$", re.ASCII)
_UNIT_RE: Final = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)([smhd])$", re.ASCII)
_NAME_RE: Final = re.compile(r"[A-Za-z0-9_.-]+")


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
    _only(raw, {"pilot", "allocation"}, "", source)
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
    )
    if pilot.agent_transport not in (None, "ipc", "tcp"):
        raise ConfigError(f"{source}: pilot.agent_transport = {pilot.agent_transport!r}; allowed: 'ipc' or 'tcp'")
    if pilot.max_queued < 1:
        raise ConfigError(f"{source}: pilot.max_queued = {pilot.max_queued} must be at least 1")
    if pilot.backlog not in (0, 1):
        raise ConfigError(f"{source}: pilot.backlog = {pilot.backlog}; allowed: 0 (off) or 1")
    if pilot.log_level not in _LOG_LEVELS:
        raise ConfigError(f"{source}: pilot.log_level = {pilot.log_level!r}; allowed: {', '.join(_LOG_LEVELS)}")
    if not _NAME_RE.fullmatch(pilot.name):
        raise ConfigError(f"{source}: pilot.name = {pilot.name!r}; use letters, digits, '.', '_' or '-'")
    if pilot.agent_timeout <= pilot.heartbeat_interval:
        raise ConfigError(
            f"{source}: pilot.agent_timeout ({pilot.agent_timeout}) must exceed pilot.heartbeat_interval "
            f"({pilot.heartbeat_interval}), or every agent is declared lost"
        )
    a = _table(raw, "allocation", source)
    lrm = _get(a, "lrm", str, "allocation.", source, "local")
    nodes = _get(a, "nodes", int, "allocation.", source, 1)
    if nodes < 1:
        raise ConfigError(f"{source}: allocation.nodes = {nodes}; it must be at least 1")
    walltime = a.get("walltime")
    seconds = None if walltime is None else parse_duration(walltime, key="allocation.walltime", source=source)
    if seconds is not None and seconds <= 0:
        raise ConfigError(f"{source}: allocation.walltime = {walltime!r}; it must be longer than 0 seconds")
    options = {k: v for k, v in a.items() if k not in ("lrm", "nodes", "walltime")}
    return Config(
        pilot=pilot,
        allocation=AllocationSettings(
            lrm=lrm,
            nodes=nodes,
            walltime=seconds,
            options=options,
        ),
        source=source,
    )


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
