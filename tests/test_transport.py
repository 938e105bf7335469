"""pilot.wire.transport.Waiter on real ZeroMQ sockets (ipc, a DEALER in this process): it wakes for input
and pokes, returns False at its ``until`` time, absorbs ZeroMQ's command-only signals without
returning, and never misses a frame that came meanwhile; ``Waiter.block``, its form for a loop in a
thread of its own, the same, looking at the sockets only under the lock it is given."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq

from pilot.wire.transport import Waiter, drain

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=[False, True], ids=["getsockopt", "polled"])
def pair(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any], Waiter]]:
    ctx: zmq.Context[zmq.Socket[Any]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"d")
    url = f"ipc://{tmp_path / 's.sock'}"
    router.bind(url)
    dealer.connect(url)
    dealer.send(b"hello")
    assert router.poll(5000)
    assert router.recv_multipart() == [b"d", b"hello"]
    waiter = Waiter(polled=request.param)
    waiter.add(router)
    try:
        yield router, dealer, waiter
    finally:
        waiter.close()
        router.close(linger=0)
        dealer.close(linger=0)
        ctx.term()


async def test_until_passes_without_input(pair: tuple[zmq.Socket[Any], zmq.Socket[Any], Waiter]) -> None:
    _, _, waiter = pair
    assert not await waiter.wait(until=time.monotonic() - 1)
    assert not await waiter.wait(until=time.monotonic() + 0.05)


async def test_the_old_call_form_under_a_cancel_scope(pair: tuple[zmq.Socket[Any], zmq.Socket[Any], Waiter]) -> None:
    """``with move_on_after(t): await waiter.wait()`` (the agent's loop) still works, and a wait
    cancelled that way leaves the waiter usable."""
    router, dealer, waiter = pair
    with anyio.move_on_after(0.05) as scope:
        await waiter.wait()
    assert scope.cancelled_caught
    dealer.send(b"after")
    with anyio.fail_after(30):
        await waiter.wait()
    assert drain(router, 10) == [[b"d", b"after"]]


async def test_wakes_for_a_frame_and_for_a_poke(pair: tuple[zmq.Socket[Any], zmq.Socket[Any], Waiter]) -> None:
    router, dealer, waiter = pair

    async def main() -> list[Any]:
        out: list[Any] = []
        # A frame sent from another thread while the owner waits (no deadline: it must wake).
        threading.Timer(0.05, lambda: dealer.send(b"one")).start()
        out.append(await waiter.wait(until=time.monotonic() + 30))
        out.append(drain(router, 10))
        # A poke from another thread.
        threading.Timer(0.05, waiter.poke).start()
        out.append(await waiter.wait(until=time.monotonic() + 30))
        # A poke made while the owner is busy is seen by the next wait at once.
        waiter.poke()
        out.append(await waiter.wait(until=time.monotonic() + 30))
        # Nothing left: the next wait times out.
        out.append(await waiter.wait(until=time.monotonic() + 0.05))
        return out

    assert await main() == [True, [[b"d", b"one"]], True, True, False]


async def test_command_signals_do_not_end_a_wait(pair: tuple[zmq.Socket[Any], zmq.Socket[Any], Waiter]) -> None:
    """Sends and peers' traffic make the socket's FD signal without input: the wait goes on until its
    deadline, and a frame that comes later still ends it."""
    router, dealer, waiter = pair
    for _ in range(20):
        router.send_multipart([b"d", b"x" * 100])  # traffic on the router's pipes and mailbox, no input
    assert not await waiter.wait(until=time.monotonic() + 0.1)
    assert [dealer.recv() for _ in range(20)] == [b"x" * 100] * 20
    assert not await waiter.wait(until=time.monotonic() + 0.1)  # the peer read them: still no input
    threading.Timer(0.05, lambda: dealer.send(b"late")).start()
    assert await waiter.wait(until=time.monotonic() + 30)
    assert drain(router, 10) == [[b"d", b"late"]]


async def test_many_frames_none_missed(pair: tuple[zmq.Socket[Any], zmq.Socket[Any], Waiter]) -> None:
    """Frames sent at random moments from another thread all reach an owner that drains then waits."""
    router, dealer, waiter = pair
    n = 2000

    def sender() -> None:  # the only user of the dealer from here on
        for i in range(n):
            dealer.send(str(i).encode())
            if i % 7 == 0:
                time.sleep(0.0005)

    t = threading.Thread(target=sender)
    t.start()
    got: list[bytes] = []
    end = time.monotonic() + 30
    while len(got) < n and time.monotonic() < end:
        got += [m[1] for m in drain(router, 100)]
        if len(got) < n:
            await waiter.wait(until=time.monotonic() + 1)
    t.join()
    assert got == [str(i).encode() for i in range(n)]


# -- Waiter.block: the wait of a loop that has a thread of its own (a spawning agent's) -------------


def _block_while(action: threading.Timer, waiter: Waiter, *, limit: float) -> float:
    """Seconds ``block`` took (``limit`` at most) while ``action`` ran from another thread."""
    t0 = time.monotonic()
    action.start()
    try:
        assert waiter.block(t0 + limit), "woken, not timed out"
    finally:
        action.join()
    return time.monotonic() - t0


def test_block_returns_for_a_frame_and_for_a_poke(pair: tuple[zmq.Socket[Any], zmq.Socket[Any], Waiter]) -> None:
    router, dealer, waiter = pair
    assert _block_while(threading.Timer(0.05, dealer.send, args=(b"frame",)), waiter, limit=20) < 20
    assert drain(router, 10) == [[b"d", b"frame"]]
    assert _block_while(threading.Timer(0.05, waiter.poke), waiter, limit=20) < 20
    # The poke was consumed with that wait: the next one lasts until its deadline.
    t0 = time.monotonic()
    assert not waiter.block(t0 + 0.05)
    assert time.monotonic() - t0 >= 0.05
    assert not waiter.block(time.monotonic())  # a deadline already past: no wait at all


def test_block_returns_at_once_for_a_frame_already_queued(
    pair: tuple[zmq.Socket[Any], zmq.Socket[Any], Waiter],
) -> None:
    router, dealer, waiter = pair
    dealer.send(b"first")
    dealer.send(b"second")
    assert router.poll(5000)
    assert router.recv_multipart() == [b"d", b"first"]  # the fd's signal is gone; "second" still waits
    t0 = time.monotonic()
    assert waiter.block(t0 + 20)
    assert time.monotonic() - t0 < 20, "block slept through a frame that was already there"
    assert drain(router, 10) == [[b"d", b"second"]]


def test_block_looks_at_the_sockets_only_under_its_lock(
    pair: tuple[zmq.Socket[Any], zmq.Socket[Any], Waiter],
) -> None:
    """A spawning agent's engine threads send on the loop's socket while the loop sleeps: the loop
    must not read the socket's state while they hold the lock (ZeroMQ sockets are one thread's at a
    time)."""
    router, dealer, waiter = pair
    lock = threading.Lock()
    woken: list[bool] = []
    with lock:
        sleeper = threading.Thread(target=lambda: woken.append(waiter.block(time.monotonic() + 20, lock=lock)))
        sleeper.start()
        dealer.send(b"frame")
        sleeper.join(0.3)
        assert sleeper.is_alive() and not woken, "block looked at the socket while another thread held the lock"
    sleeper.join(20)
    assert woken == [True]
    assert drain(router, 10) == [[b"d", b"frame"]]


@pytest.mark.parametrize("polled", [False, True], ids=["getsockopt", "polled"])
def test_drain_takes_whole_messages_up_to_its_limit(
    pair: tuple[zmq.Socket[Any], zmq.Socket[Any], Waiter], polled: bool
) -> None:
    """Both ways of looking for input (ZMQ_EVENTS through getsockopt, or through zmq_poll) read the same."""
    router, dealer, _ = pair
    for i in range(5):
        dealer.send_multipart([b"part", str(i).encode()])
    deadline = time.monotonic() + 5
    got: list[list[bytes]] = []
    while len(got) < 5 and time.monotonic() < deadline:
        got += drain(router, 2, polled=polled)
    assert got == [[b"d", b"part", str(i).encode()] for i in range(5)]
    assert drain(router, 2, polled=polled) == []
