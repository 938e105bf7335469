"""Talking to the batch systems about allocations: requesting them (at start and when auto-allocation
grows the pilot), re-attaching after a restart, polling their state, reporting a lost node, and
giving them back. Every call here may block on a batch system command, so each runs as its own task
of the daemon's task group, never inside a step of the core."""

from __future__ import annotations

import sys

import anyio
import structlog

from pilot.allocations import AllocationBook, PilotAllocation, Site, fresh_name
from pilot.config import Config
from pilot.lrm.base import AllocationRequest
from pilot.rundir import RunDir

log = structlog.get_logger("pilot.daemon")


class Acquisition:
    def __init__(self, *, config: Config, rundir: RunDir, allocations: AllocationBook) -> None:
        self.config = config
        self.rundir = rundir
        self.allocations = allocations
        #: Where agents connect, and what else their environment needs (credentials): set once bound.
        self.agent_url = ""
        self.agent_env: dict[str, str] = {}

    async def acquire_initial(self) -> str | None:
        """Every site's ``pilots`` allocations. One refused at submission cancels the others: a pilot
        whose config a batch system refuses fails at ``pilot up``, with the batch system's words."""
        for s in self.allocations.sites:
            for _ in range(s.settings.pilots):
                held = await self.acquire(s)
                if held.allocation.state.final:
                    for other in self.allocations.held.values():
                        if other is not held and not other.allocation.state.final:
                            await other.site.lrm.cancel(other.allocation)
                    where = f" (site {s.name})" if len(self.allocations.sites) > 1 else ""
                    return held.allocation.message + where
        return None

    async def acquire(self, source: Site) -> PilotAllocation:
        name = fresh_name(self.allocations.held)
        workdir = self.rundir.agents_dir if name == "a1" else self.rundir.agents_dir / name
        await anyio.to_thread.run_sync(lambda: workdir.mkdir(mode=0o700, parents=True, exist_ok=True))
        env = {
            "PILOT_AGENT_URL": self.agent_url,
            "PILOT_AGENT_HEARTBEAT": str(self.config.pilot.heartbeat_interval),
            "PILOT_AGENT_LOG_LEVEL": self.config.pilot.log_level,
            **self.agent_env,
        }
        suffix = "" if name == "a1" else f"@{name}"
        if suffix:
            env["PILOT_AGENT_NODE_SUFFIX"] = suffix
        request = AllocationRequest(
            nodes=source.settings.nodes,
            walltime=source.settings.walltime,
            agent_argv=[sys.executable, "-m", "agent"],
            agent_env=env,
            workdir=workdir,
            node_suffix=suffix,
        )
        allocation = await source.lrm.submit(request)
        held = self.allocations.held[name] = PilotAllocation(name, source, allocation)
        log.info(
            "allocation requested",
            allocation=name,
            site=source.name,
            native_id=allocation.native_id,
            nodes=allocation.nodes,
            state=allocation.state.value,
        )
        return held

    async def reattach(self) -> None:
        """A restarted daemon: the allocations the journal holds are followed again, not requested again."""
        for held in self.allocations.held.values():
            if held.over:
                continue
            try:
                await held.site.lrm.reattach(held.allocation)
            except Exception as exc:  # a batch system error must not lose the jobs: report and go on
                log.error("cannot re-attach the allocation", native_id=held.allocation.native_id, error=str(exc))

    async def poll(self) -> None:
        """One query per site for all its allocations."""
        for s in self.allocations.sites:
            mine = [h.allocation for h in self.allocations.held.values() if h.site is s and h.alive]
            if mine:
                await s.lrm.poll(mine)

    async def cancel(self, held: PilotAllocation) -> None:
        try:
            await held.site.lrm.cancel(held.allocation)
        except Exception as exc:
            log.error("cannot release the allocation", allocation=held.name, error=str(exc))

    async def node_lost(self, held: PilotAllocation, node: str) -> None:
        try:
            await held.site.lrm.node_lost(held.allocation, node)
        except Exception as exc:  # the batch system's command failed: the node is gone for us all the same
            log.error(
                "cannot report the lost node to the batch system", allocation=held.name, node=node, error=str(exc)
            )
