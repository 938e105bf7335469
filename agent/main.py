"""``python -m agent``: started by the LRM executor, once per allocated node (or once for many
virtual nodes with simulated launches, ``PILOT_NODE_SPECS_FILE``: see :mod:`agent.simulated`).

The daemon address and the node's description come through the environment (never credentials on
the command line, which every user of the node can read in ``ps``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import anyio
import zmq

from agent.agent import Agent
from agent.hosting import Host
from agent.probe import cpu_map_from_spec, probe, spec_from_env, specs_from_env
from pilot.collector import collect_rarely
from pilot.logs import configure
from pilot.security import credentials_from_env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agent", description="pilot agent (one per node)")
    parser.add_argument("--daemon", default=os.environ.get("PILOT_AGENT_URL"), help="daemon's agent address")
    parser.add_argument("--node", default=os.environ.get("PILOT_AGENT_NODE"), help="node name (default: hostname)")
    parser.add_argument("--workdir", default=os.environ.get("PILOT_AGENT_DIR"), help="scratch directory")
    parser.add_argument("--heartbeat", type=float, default=float(os.environ.get("PILOT_AGENT_HEARTBEAT", "1.0")))
    parser.add_argument(
        "--orphan-timeout", type=float, default=float(os.environ.get("PILOT_AGENT_ORPHAN_TIMEOUT", "600"))
    )
    parser.add_argument("--log-level", default=os.environ.get("PILOT_AGENT_LOG_LEVEL", "info"))
    parser.add_argument(
        "--launch",
        choices=["spawn", "null"],
        default=os.environ.get("PILOT_AGENT_LAUNCH", "spawn"),
        help="null: simulate every order (no process is started; for benchmarks and tests only)",
    )
    parser.add_argument(
        "--null-duration",
        type=float,
        default=float(os.environ.get("PILOT_AGENT_NULL_DURATION", "0")),
        help="seconds each simulated process lasts with --launch null (default 0)",
    )
    # First, before anything can start a process: take the credentials out of the environment.
    creds = credentials_from_env()
    args = parser.parse_args(argv)
    if not args.daemon:
        parser.error("no daemon address: pass --daemon or set PILOT_AGENT_URL")
    configure(level=args.log_level)
    specs = specs_from_env()
    if specs is not None:
        # Several virtual nodes in this one process (the local LRM's nodes_per_agent): one agent, one
        # socket and one registration each, one event loop and ZeroMQ context for all of them.
        if args.launch != "null":
            parser.error("PILOT_NODE_SPECS_FILE (several nodes in one agent process) needs --launch null")
        base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="pilot-agents-"))
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        host = Host()
        agents = [
            Agent(
                daemon_url=args.daemon,
                node=probe(name=None, spec=spec),
                workdir=base,
                heartbeat_interval=args.heartbeat,
                orphan_timeout=args.orphan_timeout,
                credentials=creds,
                launch="null",
                null_duration=args.null_duration,
                context=ctx,
                host=host,
            )
            for spec in specs
        ]

        async def run_all() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(host.run)
                async with anyio.create_task_group() as each:
                    for agent in agents:
                        each.start_soon(agent.run)
                tg.cancel_scope.cancel()  # every agent is done: nothing left to beat for

        collect_rarely()
        try:
            anyio.run(run_all)
        except KeyboardInterrupt:
            sys.exit(130)
        finally:
            ctx.term()
        return
    node_name = args.node or os.environ.get("SLURMD_NODENAME")
    spec = spec_from_env()
    node = probe(name=node_name, spec=spec)
    if not args.node:
        # A later allocation of the same pilot may share this host with an earlier one: its nodes are
        # ``host@a2`` to the daemon (the host name stays what launchers use).
        node.name += os.environ.get("PILOT_AGENT_NODE_SUFFIX", "")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix=f"pilot-agent-{node.name}-"))
    workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    agent = Agent(
        daemon_url=args.daemon,
        node=node,
        workdir=workdir,
        heartbeat_interval=args.heartbeat,
        orphan_timeout=args.orphan_timeout,
        cpu_map=cpu_map_from_spec(spec),
        credentials=creds,
        launch=args.launch,
        null_duration=args.null_duration,
    )
    collect_rarely()
    try:
        anyio.run(agent.run)
    except KeyboardInterrupt:
        sys.exit(130)
