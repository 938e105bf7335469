"""The daemon's two ROUTER sockets and how they are bound: ipc in the private run directory, and TCP
with CURVE where peers come from other hosts (agents of a batch allocation, remote clients), where ZAP
admits only this pilot's keys."""

from __future__ import annotations

import functools

import anyio
import structlog
import zmq

from pilot import wire
from pilot.config import Config
from pilot.rundir import RunDir
from pilot.security import AGENT_DOMAIN, CLIENT_DOMAIN, credentials_file_env
from pilot.wire.addresses import bind_host, tcp_endpoint
from pilot.wire.curve import ZapAuthenticator, secure_server, watch_handshakes

log = structlog.get_logger("pilot.daemon")


class EndpointError(RuntimeError):
    """A socket cannot be bound; the message says why and what to do."""


class Endpoints:
    def __init__(self, *, config: Config, rundir: RunDir) -> None:
        self.config = config
        self.rundir = rundir
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.clients = self.ctx.socket(zmq.ROUTER)
        self.agents = self.ctx.socket(zmq.ROUTER)
        for sock in (self.clients, self.agents):
            sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a peer at its high-water mark says so (see delivery.send)
        self.zap: ZapAuthenticator | None = None
        #: Sockets with a CURVE endpoint: their handshakes are logged.
        self.curve_socks: list[zmq.Socket[bytes]] = []
        #: What agents need in their environment to find their credentials (a 0600 file).
        self.agent_env: dict[str, str] = {}
        #: The clients' CURVE endpoint and key to pin, for pilot.json.
        self.remote_info: dict[str, str] = {}
        sd = rundir.socket_dir()
        self.client_url = f"ipc://{sd / 'client.sock'}"
        self.agent_url = f"ipc://{sd / 'agent.sock'}"

    def _zap(self) -> None:
        if self.zap is None:  # one per context, for both sockets' domains
            self.zap = ZapAuthenticator(self.ctx, self.rundir.keys().policy())
            self.zap.start()

    async def bind_agents(self, *, local: bool, endpoint: str | None = None) -> None:
        """ipc in the private run directory for a local allocation; otherwise TCP with CURVE, where
        only agents holding this pilot's agent key get past the handshake (ZAP) and agents check the
        daemon's key; the agents find their credentials through a 0600 file, never on a command line.
        ``endpoint``: where a restarted daemon's agents reconnect."""
        transport = self.config.pilot.agent_transport or ("ipc" if local else "tcp")
        if transport == "ipc":
            self.agents.bind(self.agent_url)
            return
        if endpoint is not None and not endpoint.startswith("tcp://"):
            endpoint = None
        keys = self.rundir.keys()
        self._zap()
        secure_server(self.agents, keys.daemon, domain=AGENT_DOMAIN)
        if endpoint is not None:
            try:
                self.agents.bind(endpoint)
            except zmq.ZMQError as exc:
                raise EndpointError(
                    f"cannot listen for the running agents on {endpoint} again ({exc}); another process holds "
                    "the port. Stop it, then start the pilot again: the agents wait for their daemon"
                ) from None
        else:
            host = await anyio.to_thread.run_sync(lambda: bind_host(self.config.pilot.bind, local=local))
            self.agents.bind(tcp_endpoint(host))
        bound = self.agents.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(bound, bytes)
        self.agent_url = bound.decode()
        self.curve_socks.append(self.agents)
        # A file only the user can read, named in the environment: /proc/<pid>/environ keeps what a process
        # was started with, so the keys themselves must not travel there.
        self.agent_env = credentials_file_env(keys.write_credentials_file("agent"))

    async def bind_clients(self, *, resumed: bool) -> None:
        """The ipc endpoint; with ``client_transport = "tcp"``, also a CURVE endpoint for remote clients:
        ZAP admits only the client keys of this pilot (``keys/client.key``, ``keys/authorized/``), so other
        keys fail the handshake and never reach the daemon's logic. The ipc endpoint stays plain (libzmq
        fixes an endpoint's security at bind time): the private run directory protects it."""
        self.clients.bind(self.client_url)
        p = self.config.pilot
        if p.client_transport != "tcp":
            return
        keys = self.rundir.keys()
        self._zap()
        secure_server(self.clients, keys.daemon, domain=CLIENT_DOMAIN)
        host = await anyio.to_thread.run_sync(lambda: bind_host(p.client_bind or p.bind))
        endpoint = tcp_endpoint(host, p.client_port or "*")
        last = (self.rundir.last_info() or {}).get("client_tcp_url") if resumed else None
        if not p.client_port and isinstance(last, str) and last.startswith(tcp_endpoint(host, "")):
            endpoint = last  # a daemon resuming after a crash: its remote clients reconnect where they were
        try:
            self.clients.bind(endpoint)
        except zmq.ZMQError as exc:
            if endpoint == last:
                log.warning("cannot listen for remote clients where the last daemon did", url=last, error=str(exc))
                self.clients.bind(tcp_endpoint(host))
            else:
                raise EndpointError(
                    f"cannot listen for remote clients on {endpoint} ({exc}); free the port or change "
                    "pilot.client_port / pilot.client_bind"
                ) from None
        bound = self.clients.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(bound, bytes)
        self.curve_socks.append(self.clients)
        self.remote_info = {"client_tcp_url": bound.decode(), "server_public": keys.daemon.public.decode()}
        log.info("remote clients admitted over CURVE", url=bound.decode(), authorized=len(keys.policy()[CLIENT_DOMAIN]))

    def watch(self, tg: anyio.abc.TaskGroup) -> None:
        """ZAP, and a log of the peers refused before ZAP hears of them (no CURVE, another daemon's key)."""
        if self.zap is not None:
            tg.start_soon(self.zap.serve)
        for sock in self.curve_socks:
            tg.start_soon(functools.partial(watch_handshakes, sock, server=True))

    def close(self) -> None:
        self.clients.close(linger=500)
        self.agents.close(linger=0)
        if self.zap is not None:
            self.zap.close()
        self.ctx.term()
