"""Describe this node in SSS Node terms (Configured). Runs once at start, before any task exists."""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from pilot.model.node import NodeConfigured


def detect_gpus() -> list[int]:
    """NVIDIA GPUs the driver lists; AMD through KFD topology. No subprocess (the reaper owns children)."""
    nv = Path("/proc/driver/nvidia/gpus")
    if nv.is_dir():
        return list(range(len(list(nv.iterdir()))))
    kfd = Path("/sys/class/kfd/kfd/topology/nodes")
    if kfd.is_dir():
        count = 0
        for node in kfd.iterdir():
            props = node / "properties"
            try:
                if "simd_count 0" not in props.read_text():
                    count += 1
            except OSError:
                continue
        return list(range(count))
    return []


def probe(*, name: str | None, spec: dict[str, Any] | None) -> NodeConfigured:
    """The node as found, overridden by the LRM's ``spec`` (virtual nodes, declared GPUs)."""
    spec = spec or {}
    hostname = socket.gethostname()
    node_name = name or spec.get("name") or hostname
    processors = spec.get("processors") or sorted(os.sched_getaffinity(0))
    memory = int(spec.get("memory") or psutil.virtual_memory().total)
    gpus = spec.get("gpus")
    if gpus is None:
        gpus = detect_gpus()
    return NodeConfigured(
        name=str(node_name),
        hostname=hostname,
        processors=[int(p) for p in processors],
        memory=memory,
        gpus=[int(g) for g in gpus],
        os=f"{platform.system()} {platform.release()}",
        architecture=platform.machine(),
        features=[str(f) for f in spec.get("features", [])],
        clock_mhz=processor_clock(),
    )


def processor_clock() -> float:
    """The processor clock in MHz for JRDL's clockSpeed: the rated maximum where the kernel reports one
    (the current clock moves with power saving), else the current one; 0 when psutil cannot read it
    (no cpufreq in many containers), which matching treats as unknown."""
    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError, RuntimeError):
        return 0.0
    if freq is None:
        return 0.0
    return float(round(freq.max if freq.max > 0 else freq.current, 1))


def cpu_map_from_spec(spec: dict[str, Any] | None) -> dict[int, int]:
    """Logical processor id -> the real cpu to pin to (identity unless the LRM declared virtual cores)."""
    raw = (spec or {}).get("cpu_map") or {}
    return {int(k): int(v) for k, v in raw.items()}


def spec_from_env() -> dict[str, Any] | None:
    raw = os.environ.get("PILOT_NODE_SPEC")
    if not raw:
        return None
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("PILOT_NODE_SPEC must be a JSON object")
    return value


def specs_from_env() -> list[dict[str, Any]] | None:
    """The virtual nodes one agent process hosts (simulated launches only): a JSON array of node specs
    in the file ``PILOT_NODE_SPECS_FILE`` names."""
    path = os.environ.get("PILOT_NODE_SPECS_FILE")
    if not path:
        return None
    value = json.loads(Path(path).read_text())
    if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"{path} (PILOT_NODE_SPECS_FILE) must hold a non-empty JSON array of objects")
    return value


def measures(
    node: NodeConfigured, *, disk_path: str, tasks_rss: Callable[[], int] | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """This node's SGE load values (refreshed with every heartbeat, what matching compares against)
    and its SSS Utilized amounts, measured with psutil. Cheap non-blocking calls only: it runs on the
    agent's loop once per heartbeat; the machine-wide figures are shared by the virtual nodes of one
    agent process (``nodes_per_agent``) for a fraction of a second, not measured once per node.
    ``tasks_rss``: the node's tasks' memory, its Utilized memory when it is a slice of this machine
    (a virtual node: configured with less memory than the machine has)."""
    (load1, load5, load15), vm, sw, cpus, (disk_free, disk_used) = _machine(disk_path)
    n = max(1, len(node.processors))
    values = {
        "load_short": load1,
        "load_medium": load5,
        "load_long": load15,
        "load_avg": load5,
        "np_load_short": load1 / n,
        "np_load_medium": load5 / n,
        "np_load_long": load15 / n,
        "np_load_avg": load5 / n,
        "mem_free": float(vm.available),
        "mem_used": float(vm.total - vm.available),
        "swap_total": float(sw.total),
        "swap_free": float(sw.free),
        "swap_used": float(sw.used),
        "virtual_total": float(vm.total + sw.total),
        "virtual_free": float(vm.available + sw.free),
        "virtual_used": float(vm.total - vm.available + sw.used),
        "disk_free": disk_free,
    }
    real = {c for c in node.processors if c < len(cpus)}
    busy = sum(cpus[c] for c in real) / 100.0 if real else sum(cpus) / 100.0
    used = float(vm.total - vm.available)
    if tasks_rss is not None and node.memory < vm.total * 0.99:
        used = float(tasks_rss())  # a virtual node (a slice of this machine): what its tasks hold
    utilized = {
        "processors": round(busy, 2),
        "memory": used,
        "swap": float(sw.used),
        "disk": disk_used,
    }
    return values, utilized


_MACHINE_TTL = 0.25  # seconds a machine-wide measure serves every virtual node of this process
_machine_cache: dict[str, tuple[float, Any]] = {}


def _machine(disk_path: str) -> Any:
    now = time.monotonic()
    hit = _machine_cache.get(disk_path)
    if hit is not None and now - hit[0] < _MACHINE_TTL:
        return hit[1]
    try:
        du = psutil.disk_usage(disk_path)
        disk: tuple[float, float] = (float(du.free), float(du.used))
    except OSError:
        disk = (0.0, 0.0)
    # cpu_percent covers the time since its previous call: one caller per interval keeps it meaningful.
    value = (os.getloadavg(), psutil.virtual_memory(), psutil.swap_memory(), psutil.cpu_percent(percpu=True), disk)
    _machine_cache[disk_path] = (now, value)
    return value
