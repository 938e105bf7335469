"""``Waiter.block``, the wait of a loop that has a thread of its own (a spawning agent's), on real
ZeroMQ sockets: it returns for a frame, for a poke from another thread, for a frame that was already
queued (ZeroMQ's fd signals edges, which an earlier call may have consumed), and at its timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from pilot.transport import Waiter, drain


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes], Waiter]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://waiter-block")
    b.connect("inproc://waiter-block")
    waiter = Waiter()
    waiter.add(b)
    try:
        yield a, b, waiter
    finally:
        waiter.close()
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


def _blocked_until(action: threading.Timer, waiter: Waiter, limit: float) -> float:
    """Seconds ``block`` took (``limit`` at most) while ``action`` ran from another thread."""
    t0 = time.monotonic()
    action.start()
    try:
        assert waiter.block(t0 + limit), "woken, not timed out"
    finally:
        action.join()
    return time.monotonic() - t0


@pytest.mark.timeout(30)
def test_block_returns_for_a_frame_from_the_peer(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes], Waiter]) -> None:
    a, b, waiter = pair
    took = _blocked_until(threading.Timer(0.05, a.send, args=(b"hello",)), waiter, limit=20)
    assert took < 20, "block waited out its whole timeout: the frame did not wake it"
    assert drain(b, 10) == [[b"hello"]]


@pytest.mark.timeout(30)
def test_block_returns_for_a_poke_from_another_thread(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes], Waiter],
) -> None:
    _, b, waiter = pair
    took = _blocked_until(threading.Timer(0.05, waiter.poke), waiter, limit=20)
    assert took < 20, "block waited out its whole timeout: the poke did not wake it"
    assert drain(b, 10) == []
    # The poke was consumed: the next wait lasts until its own timeout.
    t0 = time.monotonic()
    assert not waiter.block(t0 + 0.05)
    assert time.monotonic() - t0 >= 0.05


@pytest.mark.timeout(30)
def test_block_returns_at_once_for_a_frame_already_queued(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes], Waiter],
) -> None:
    a, b, waiter = pair
    a.send(b"first")
    a.send(b"second")
    deadline = time.monotonic() + 10
    while not b.poll(0):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert b.recv() == b"first"  # the fd's edge is gone; "second" still waits
    t0 = time.monotonic()
    assert waiter.block(t0 + 20)
    assert time.monotonic() - t0 < 20, "block slept through a frame that was already there"
    assert drain(b, 10) == [[b"second"]]


@pytest.mark.timeout(30)
def test_block_returns_at_its_timeout_with_nothing_to_do(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes], Waiter],
) -> None:
    _, b, waiter = pair
    t0 = time.monotonic()
    assert not waiter.block(t0 + 0.1), "nothing came: it says so"
    assert time.monotonic() - t0 >= 0.1
    assert not waiter.block(time.monotonic())  # no wait at all: returns
    assert drain(b, 10) == []


@pytest.mark.timeout(30)
def test_block_looks_at_the_sockets_only_under_its_lock(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes], Waiter],
) -> None:
    """A spawning agent's engine threads send on the loop's socket while the loop sleeps: the loop
    must not read the socket's state while they hold the lock (ZeroMQ sockets are one thread's at a
    time)."""
    a, b, waiter = pair
    lock = threading.Lock()
    woken: list[bool] = []
    with lock:
        sleeper = threading.Thread(target=lambda: woken.append(waiter.block(time.monotonic() + 20, lock=lock)))
        sleeper.start()
        a.send(b"frame")
        sleeper.join(0.3)
        assert sleeper.is_alive() and not woken, "block looked at the socket while another thread held the lock"
    sleeper.join(20)
    assert woken == [True]
    assert drain(b, 10) == [[b"frame"]]
