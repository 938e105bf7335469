"""The ``local`` LRM: the allocation is this machine, split into ``nodes`` virtual nodes.

Each virtual node gets its own share of the cpus (or ``cores_per_node`` declared cores, mapped onto
the real ones, which oversubscribes when the machine has fewer), its share of memory, and declared
GPUs (``gpus_per_node``), so that multi-node behaviour is testable on one machine.

``launch = "null"`` makes every agent simulate its orders instead of running them (``null_duration``
seconds each; see :mod:`agent.simulated`): a benchmark mode for the scheduler and the wire. With it,
``nodes_per_agent`` virtual nodes share one agent process (each still its own agent: socket,
identity, registration, heartbeats), so a thousand nodes cost a few processes, not a thousand.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import anyio
import anyio.abc
import psutil
import structlog

from pilot.config import ConfigError, parse_size
from pilot.lrm.base import Allocation, AllocationRequest, AllocationState, LrmExecutor
from pilot.model.node import NodeConfigured

log = structlog.get_logger("pilot.lrm.local")

_OPTIONS = {
    "cores_per_node",
    "gpus_per_node",
    "memory_per_node",
    "features",
    "agent_python",
    "launch",
    "null_duration",
    "nodes_per_agent",
}


class LocalExecutor(LrmExecutor):
    kind: ClassVar[str] = "local"

    def __init__(self, *, options: dict[str, Any], source: str, table: str = "allocation") -> None:
        super().__init__(options=options, source=source, table=table)
        for key in options:
            if key not in _OPTIONS:
                raise ConfigError(
                    f"{source}: unknown key {table}.{key} for lrm 'local'; allowed: "
                    f"nodes, walltime, {', '.join(sorted(_OPTIONS))}"
                )
        self._cores_per_node = _opt_int(options, "cores_per_node", source, table)
        self._gpus_per_node = _opt_int(options, "gpus_per_node", source, table)
        mem = options.get("memory_per_node")
        self._memory_per_node = None if mem is None else parse_size(mem, key=f"{table}.memory_per_node", source=source)
        features = options.get("features", [])
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise ConfigError(f"{source}: {table}.features must be a list of strings")
        self._features: list[str] = features
        python = options.get("agent_python")
        if python is not None and not isinstance(python, str):
            raise ConfigError(f"{source}: {table}.agent_python must be a path to a Python interpreter")
        self._agent_python: str | None = python
        launch = options.get("launch", "spawn")
        if launch not in ("spawn", "null"):
            raise ConfigError(
                f"{source}: {table}.launch = {launch!r} must be 'spawn' (run the tasks) or 'null' "
                "(simulate them: benchmarks only)"
            )
        self._launch: str = launch
        duration = options.get("null_duration", 0.0)
        if isinstance(duration, bool) or not isinstance(duration, int | float) or not 0 <= duration < float("inf"):
            raise ConfigError(f"{source}: {table}.null_duration = {duration!r} must be a number of seconds >= 0")
        if "null_duration" in options and launch != "null":
            raise ConfigError(f"{source}: {table}.null_duration needs {table}.launch = 'null'")
        self._null_duration = float(duration)
        self._nodes_per_agent = _opt_int(options, "nodes_per_agent", source, table) or 1
        if self._nodes_per_agent > 1 and launch != "null":
            raise ConfigError(
                f"{source}: {table}.nodes_per_agent = {self._nodes_per_agent} needs {table}.launch = 'null' "
                "(agents that run real processes need one process per node: each reaps its own children)"
            )
        self._workdirs: dict[str, Path] = {}
        self._procs: dict[str, list[_AgentProcess]] = {}
        self.cpu_maps: list[dict[int, int]] = []

    def validate(self, *, nodes: int) -> None:
        if nodes * (self._cores_per_node or 1) > 10_000_000:
            raise ConfigError(
                f"{self.source}: {self.table}.nodes x cores_per_node = {nodes} x {self._cores_per_node} is over "
                "10,000,000 cores: a local allocation builds every slot in memory"
            )
        self.node_layout(nodes)

    def node_layout(self, count: int, *, suffix: str = "") -> list[NodeConfigured]:
        cpus = sorted(os.sched_getaffinity(0))
        hostname = socket.gethostname()
        total_mem = psutil.virtual_memory().total
        if self._cores_per_node is None and count > len(cpus):
            raise ConfigError(
                f"{self.source}: {self.table}.nodes = {count} but this machine has {len(cpus)} cpus; "
                f"set {self.table}.cores_per_node to declare (oversubscribed) cores per virtual node"
            )
        nodes = []
        self.cpu_maps = []
        for i in range(count):
            if self._cores_per_node is None:
                base, extra = divmod(len(cpus), count)
                start = i * base + min(i, extra)
                mine = cpus[start : start + base + (1 if i < extra else 0)]
                cpu_map = {c: c for c in mine}
            else:
                # Declared cores: logical ids 0..n-1, pinned onto the real cpus round-robin.
                cpn = self._cores_per_node
                mine = list(range(cpn))
                cpu_map = {j: cpus[(i * cpn + j) % len(cpus)] for j in range(cpn)}
            self.cpu_maps.append(cpu_map)
            nodes.append(
                NodeConfigured(
                    name=f"local-{i}{suffix}",
                    hostname=hostname,
                    processors=mine,
                    memory=self._memory_per_node or total_mem // count,
                    gpus=list(range(self._gpus_per_node)) if self._gpus_per_node else [],
                    os=f"{platform.system()} {platform.release()}",
                    architecture=platform.machine(),
                    features=list(self._features),
                )
            )
        return nodes

    async def submit(self, request: AllocationRequest) -> Allocation:
        nodes = self.node_layout(request.nodes, suffix=request.node_suffix)
        cpu_maps = list(self.cpu_maps)  # node_layout may run again while this submit awaits
        native_id = f"local-{os.getpid()}-{int(time.time())}{request.node_suffix.replace('@', '-')}"
        alloc = Allocation(
            native_id=native_id,
            lrm=self.kind,
            state=AllocationState.ACTIVE,
            nodes=len(nodes),
            expected_nodes=nodes,
            started=time.time(),
            walltime=request.walltime,
        )
        procs = []
        per = self._nodes_per_agent
        for first in range(0, len(nodes), per):
            group = list(zip(nodes[first : first + per], cpu_maps[first : first + per], strict=True))
            name = group[0][0].name
            env = dict(os.environ)
            env.update(request.agent_env)
            env["PILOT_ALLOCATION"] = native_id  # tasks inherit it: how their leftovers are found (_reap)
            if self._launch == "null":
                env["PILOT_AGENT_LAUNCH"] = "null"
                env["PILOT_AGENT_NULL_DURATION"] = repr(self._null_duration)
            specs = [self._spec(node, cpu_map) for node, cpu_map in group]
            if per == 1:
                workdir = request.workdir / name
                env["PILOT_AGENT_NODE"] = name
                env["PILOT_NODE_SPEC"] = json.dumps(specs[0])
            else:
                workdir = request.workdir / f"{name}+{len(group) - 1}"
            workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
            if per > 1:  # a file: the environment holds at most 128 KiB per variable
                specs_file = workdir / "nodes.json"
                await anyio.to_thread.run_sync(specs_file.write_text, json.dumps(specs))
                env["PILOT_NODE_SPECS_FILE"] = str(specs_file)
            env["PILOT_AGENT_DIR"] = str(workdir)
            logf = await anyio.to_thread.run_sync(_open_log, request.workdir / f"{name}.log")
            try:
                argv = list(request.agent_argv)
                if self._agent_python:
                    argv[0] = self._agent_python
                proc = await anyio.open_process(
                    argv, env=env, stdin=None, stdout=logf, stderr=logf, start_new_session=True
                )
            finally:
                logf.close()
            procs.append(_AgentProcess.started(name, proc))
        self._procs[native_id] = procs
        self._workdirs[native_id] = request.workdir
        alloc.detail = {"workdir": str(request.workdir), "agents": [a.to_wire() for a in procs]}
        log.info("local allocation active", id=native_id, nodes=[n.name for n in nodes])
        return alloc

    def _spec(self, node: NodeConfigured, cpu_map: dict[int, int]) -> dict[str, Any]:
        """What the agent of ``node`` is told about it (``PILOT_NODE_SPEC``)."""
        return {
            "name": node.name,
            "processors": node.processors,
            "memory": node.memory,
            "gpus": node.gpus if self._gpus_per_node is not None else None,
            "features": node.features,
            "cpu_map": {str(k): v for k, v in cpu_map.items()},
        }

    async def reattach(self, allocation: Allocation) -> None:
        """The agents a previous daemon started outlived it (their own sessions): find them by pid and
        start time (a reused pid is not mistaken for one), so poll and cancel see them again."""
        detail = allocation.detail
        agents = detail.get("agents")
        workdir = detail.get("workdir")
        if not isinstance(agents, list) or not isinstance(workdir, str):
            raise ConfigError(
                f"the journal's local allocation {allocation.native_id} has no agent list; "
                "it cannot be re-attached (move journal.db aside to start afresh)"
            )
        self._procs[allocation.native_id] = [_AgentProcess.adopted(a) for a in agents]
        self._workdirs[allocation.native_id] = Path(workdir)
        await self.poll([allocation])

    async def poll(self, allocations: Sequence[Allocation]) -> None:
        for alloc in allocations:
            procs = self._procs.get(alloc.native_id, [])
            if alloc.state is AllocationState.ACTIVE and _past_walltime(alloc):
                await self._end_at_walltime(alloc, procs)
                continue
            if alloc.state is AllocationState.ACTIVE and procs and all(p.exited for p in procs):
                alloc.state = AllocationState.FAILED
                workdir = self._workdirs.get(alloc.native_id)
                parts = []
                for p in procs:
                    tail = _tail(workdir / f"{p.name}.log") if workdir is not None else ""
                    parts.append(f"agent {p.name} {p.describe_exit()}" + (f": {tail}" if tail else ""))
                alloc.message = "every agent exited; " + "; ".join(parts)
                reaped = await anyio.to_thread.run_sync(_reap, alloc.native_id)
                if reaped:
                    alloc.message += f"; {reaped} task process(es) they left were killed"

    async def _end_at_walltime(self, alloc: Allocation, procs: list[_AgentProcess]) -> None:
        """As a batch system ends a job at its time limit: the agents are stopped (SIGTERM to their
        groups, SIGKILL after 5 s), what they leave is killed, and the allocation is over."""
        log.info("local allocation reached its walltime", id=alloc.native_id, walltime=alloc.walltime)
        alloc.state = AllocationState.ENDING
        for p in procs:
            p.signal_group(signal.SIGTERM)
        with anyio.move_on_after(5):
            for p in procs:
                await p.wait()
        for p in procs:
            p.kill_group()
            await p.wait()
            await p.aclose()
        reaped = await anyio.to_thread.run_sync(_reap, alloc.native_id)
        alloc.message = f"ended at its walltime of {alloc.walltime:g} s (allocation.walltime)"
        if reaped:
            alloc.message += f"; {reaped} task process(es) left were killed"
        alloc.state = AllocationState.DONE
        self._procs.pop(alloc.native_id, None)

    async def node_lost(self, allocation: Allocation, node: str) -> None:
        reaped = await anyio.to_thread.run_sync(_reap, allocation.native_id, node)
        if reaped:
            log.warning("killed tasks left on a lost node", node=node, processes=reaped)

    async def cancel(self, allocation: Allocation) -> None:
        procs = self._procs.get(allocation.native_id, [])
        allocation.state = AllocationState.ENDING
        with anyio.move_on_after(5):
            for p in procs:
                await p.wait()
        for p in procs:
            if not p.exited:
                log.warning("agent did not stop, killing", pid=p.pid)
                p.kill_group()
        for p in procs:
            await p.wait()
            await p.aclose()
        reaped = await anyio.to_thread.run_sync(_reap, allocation.native_id)
        if reaped:
            log.warning("killed tasks left by agents that died", allocation=allocation.native_id, processes=reaped)
        allocation.state = AllocationState.DONE
        self._procs.pop(allocation.native_id, None)


class _AgentProcess:
    """One local agent: our child (started here) or adopted from a daemon that died (not our child:
    followed through psutil, which checks the pid still names the same process)."""

    def __init__(self, name: str, pid: int, create_time: float, child: anyio.abc.Process | None) -> None:
        self.name = name
        self.pid = pid
        self.create_time = create_time
        self._child = child
        self._gone = False

    @classmethod
    def started(cls, name: str, proc: anyio.abc.Process) -> _AgentProcess:
        try:
            created = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            created = 0.0
        return cls(name, proc.pid, created, proc)

    @classmethod
    def adopted(cls, raw: Any) -> _AgentProcess:
        if not (
            isinstance(raw, list)
            and len(raw) == 3
            and isinstance(raw[0], str)
            and isinstance(raw[1], int)
            and isinstance(raw[2], int | float)
        ):
            raise ConfigError(f"the journal's local agent record {raw!r} is not [name, pid, start time]")
        return cls(raw[0], raw[1], float(raw[2]), None)

    def to_wire(self) -> list[Any]:
        return [self.name, self.pid, self.create_time]

    @property
    def exited(self) -> bool:
        if self._child is not None:
            return self._child.returncode is not None
        if not self._gone:
            try:
                proc = psutil.Process(self.pid)
                self._gone = abs(proc.create_time() - self.create_time) > 0.5 or proc.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                self._gone = True
        return self._gone

    def describe_exit(self) -> str:
        if self._child is not None:
            return f"exited with {self._child.returncode}"
        return "exited (its exit code went to the daemon that started it)"

    def kill_group(self) -> None:
        self.signal_group(signal.SIGKILL)

    def signal_group(self, sig: signal.Signals) -> None:
        if self.exited:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    async def wait(self) -> None:
        if self._child is not None:
            await self._child.wait()
            return
        while not self.exited:  # noqa: ASYNC110 -- not our child: no exit notification to wait on
            await anyio.sleep(0.05)

    async def aclose(self) -> None:
        if self._child is not None:
            await self._child.aclose()


def _reap(native_id: str, node: str | None = None) -> int:
    """Kill what still runs of an allocation (or of one of its nodes) whose agents are gone. Tasks run in
    their own sessions, so an agent that was SIGKILLed leaves them running (on a real node, the node's
    end takes them); they are this user's processes whose environment carries the allocation's id (and
    the node that started them)."""
    me = os.getuid()
    found = 0
    for proc in psutil.process_iter(["uids", "environ"], ad_value=None):
        uids, environ = proc.info["uids"], proc.info["environ"]
        if uids is None or uids.real != me or not environ or environ.get("PILOT_ALLOCATION") != native_id:
            continue
        if node is not None and environ.get("PILOT_NODE") != node:
            continue
        found += 1
        try:
            os.killpg(proc.pid, signal.SIGKILL) if os.getpgid(proc.pid) == proc.pid else proc.kill()
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def _opt_int(options: dict[str, Any], key: str, source: str, table: str) -> int | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "gpus_per_node" else 1):
        raise ConfigError(f"{source}: {table}.{key} = {value!r} must be a positive integer")
    if value > _MOST[key]:
        raise ConfigError(f"{source}: {table}.{key} = {value} is more than a node can have here (at most {_MOST[key]})")
    return value


#: Bounds on declared virtual hardware: a typo of a few digits must not build millions of slots at `pilot up`.
_MOST: dict[str, int] = {"cores_per_node": 16_384, "gpus_per_node": 1_024, "nodes_per_agent": 100_000}


def _open_log(path: Path) -> BinaryIO:
    return open(path, "ab")


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())


def _past_walltime(alloc: Allocation) -> bool:
    return alloc.walltime is not None and alloc.started is not None and time.time() >= alloc.started + alloc.walltime
