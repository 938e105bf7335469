"""Describe this node in SSS Node terms (Configured). Runs once at start, before any task exists."""

from __future__ import annotations

import json
import os
import platform
import socket
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
    )


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
