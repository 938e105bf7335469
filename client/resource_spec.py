"""ResourceSpecV1 with psij-python's fields and constraint inference."""

from __future__ import annotations

from client.exceptions import InvalidJobException


class ResourceSpec:
    @property
    def version(self) -> int:
        raise NotImplementedError


class ResourceSpecV1(ResourceSpec):
    """Homogeneous ranks. ``memory`` is the job's total bytes, split evenly over its processes."""

    def __init__(
        self,
        node_count: int | None = None,
        process_count: int | None = None,
        processes_per_node: int | None = None,
        cpu_cores_per_process: int | None = None,
        gpu_cores_per_process: int | None = None,
        exclusive_node_use: bool = False,
        memory: int | None = None,
    ) -> None:
        self.node_count = node_count
        self.process_count = process_count
        self.processes_per_node = processes_per_node
        self.cpu_cores_per_process = cpu_cores_per_process
        self.gpu_cores_per_process = gpu_cores_per_process
        self.exclusive_node_use = exclusive_node_use
        self.memory = memory
        self._check()

    @property
    def version(self) -> int:
        return 1

    def _check(self) -> None:
        for name in (
            "node_count",
            "process_count",
            "processes_per_node",
            "cpu_cores_per_process",
            "gpu_cores_per_process",
            "memory",
        ):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise InvalidJobException(f"ResourceSpecV1.{name} must be a non-negative integer, not {v!r}")
        n, p, k = self.node_count, self.process_count, self.processes_per_node
        if n is not None and p is not None and k is not None and n * k != p:
            raise InvalidJobException(
                f"ResourceSpecV1: process_count ({p}) != node_count ({n}) x processes_per_node ({k})"
            )
        if n is None and p is not None and k is not None and p % k:
            raise InvalidJobException(
                f"ResourceSpecV1: process_count ({p}) is not a multiple of processes_per_node ({k})"
            )
        if k is None and p is not None and n is not None and p % n:
            raise InvalidJobException(f"ResourceSpecV1: process_count ({p}) is not a multiple of node_count ({n})")

    @property
    def computed_process_count(self) -> int:
        if self.process_count is not None:
            return self.process_count
        if self.node_count is not None:
            return self.node_count * (self.processes_per_node or 1)
        return self.processes_per_node or 1

    @property
    def computed_node_count(self) -> int:
        if self.node_count is not None:
            return self.node_count
        if self.process_count is not None and self.processes_per_node:
            return self.process_count // self.processes_per_node
        return 1

    @property
    def computed_processes_per_node(self) -> int:
        if self.processes_per_node is not None:
            return self.processes_per_node
        return max(1, self.computed_process_count // self.computed_node_count)

    @property
    def memory_kb(self) -> int | None:
        return None if self.memory is None else self.memory // 1024

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if v not in (None, False))
        return f"ResourceSpecV1({fields})"
