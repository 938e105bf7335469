"""Frames to agents through a real ROUTER (ROUTER_MANDATORY, as the daemon's): a node whose socket is
not connected yet gets them, in order, once it is; an agent no longer the one they were written for
never does (pilot.agent_delivery).

The case that made it: hosted nodes register in a batch sent on one node's socket, and each is
answered on its own socket, which under load may still be connecting -- its REGISTERED was dropped,
the node left out of its process's heartbeats, and declared lost seconds later."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from pilot.agent_delivery import AgentDelivery

pytestmark = pytest.mark.timeout(30)


class _Agents:
    """The daemon's view: which agent record is active under each name."""

    def __init__(self) -> None:
        self.active: dict[str, object] = {}

    def current(self, name: str) -> object | None:
        return self.active.get(name)


@pytest.fixture
def router(tmp_path: Path):  # type: ignore[no-untyped-def]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    url = f"ipc://{tmp_path / 'agents.sock'}"
    sock.bind(url)
    try:
        yield ctx, sock, url
    finally:
        sock.close(linger=0)
        ctx.term()


def _connect(ctx: zmq.Context[zmq.Socket[bytes]], url: str, name: str) -> zmq.Socket[bytes]:
    """A node's DEALER, connected and known to the ROUTER (it said hello: a ROUTER routes to a peer
    only once the connection is made)."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, name.encode())
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(url)
    dealer.send(b"hello")
    return dealer


def _hello(router: zmq.Socket[bytes]) -> bytes:
    assert router.poll(5000), "the node's hello did not come"
    ident, frame = router.recv_multipart()
    assert frame == b"hello"
    return ident


def _frames(dealer: zmq.Socket[bytes], *, wait_ms: int = 2000) -> list[bytes]:
    out = []
    while dealer.poll(wait_ms):
        out.append(dealer.recv())
        wait_ms = 200
    return out


def test_frames_for_a_node_not_connected_yet_wait_and_go_in_order_once_it_is(router) -> None:  # type: ignore[no-untyped-def]
    ctx, sock, url = router
    agents = _Agents()
    agents.active["n1"] = record = object()
    delivery = AgentDelivery(sock, current=agents.current)

    delivery.send("n1", b"registered")  # its socket is not there yet: a bare ROUTER drops this
    delivery.send("n1", b"launch")  # behind it, in order
    assert delivery.holding == 2
    delivery.retry()  # still no socket: they keep waiting
    assert delivery.holding == 2

    dealer = _connect(ctx, url, "n1")
    try:
        assert _hello(sock) == b"n1"
        delivery.retry()
        assert delivery.holding == 0
        assert _frames(dealer) == [b"registered", b"launch"]
        # Connected: a frame goes at once.
        delivery.send("n1", b"kill")
        assert delivery.holding == 0
        assert _frames(dealer) == [b"kill"]
        assert agents.current("n1") is record
    finally:
        dealer.close(linger=0)


def test_frames_held_for_an_agent_declared_gone_or_replaced_never_reach_the_next_one(router) -> None:  # type: ignore[no-untyped-def]
    ctx, sock, url = router
    agents = _Agents()
    agents.active["n1"] = object()
    agents.active["n2"] = object()
    delivery = AgentDelivery(sock, current=agents.current)
    delivery.send("n1", b"launch for the lost agent")
    delivery.send("n2", b"launch for the replaced agent")
    assert delivery.holding == 2

    del agents.active["n1"]  # declared lost
    agents.active["n2"] = object()  # another agent registered under the name
    dealers = [_connect(ctx, url, "n1"), _connect(ctx, url, "n2")]
    try:
        assert sorted(_hello(sock) for _ in dealers) == [b"n1", b"n2"]
        delivery.retry()
        assert delivery.holding == 0
        assert [_frames(d, wait_ms=300) for d in dealers] == [[], []]
        # A frame for a name no active agent has is not held at all (as before: the ROUTER's answer).
        delivery.send("n3", b"to nobody")
        assert delivery.holding == 0
    finally:
        for d in dealers:
            d.close(linger=0)
