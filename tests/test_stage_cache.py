"""The node's stage-in cache with real threads: one fetch per source, a fetch stopped for one order is
taken over by the order waiting on it (never failing it), and a stopped order stops waiting."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent.stage_cache import StageCache
from agent.transfers import Interrupted, Stop

pytestmark = pytest.mark.timeout(30)


def test_a_fetch_stopped_for_one_order_is_taken_over_by_the_order_waiting_on_it(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache")
    first, second = Stop(), Stop()
    begun = threading.Event()
    fetchers: list[str] = []

    def stalls(path: Path) -> None:  # the first order's fetch: blocks until its order is stopped
        fetchers.append("first")
        broken = threading.Event()
        first.on_set(broken.set)
        begun.set()
        broken.wait()
        first.check()

    def fetches(path: Path) -> None:
        fetchers.append("second")
        path.write_text("DATA")

    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(cache.get, "http://h/f", stalls, stop=first)
        assert begun.wait(10)
        b = pool.submit(cache.get, "http://h/f", fetches, stop=second)
        first.set("canceled")
        with pytest.raises(Interrupted, match="canceled"):
            a.result(timeout=10)
        path, hit = b.result(timeout=10)
    assert fetchers == ["first", "second"] and not hit
    assert path.read_text() == "DATA" and list((tmp_path / "cache").iterdir()) == [path]
    again, hit = cache.get("http://h/f", fetches, stop=Stop())
    assert again == path and hit and fetchers == ["first", "second"]


def test_an_order_waiting_on_another_orders_fetch_stops_waiting_when_it_is_stopped(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache")
    owner, waiter = Stop(), Stop()
    begun, release = threading.Event(), threading.Event()

    def slow(path: Path) -> None:
        begun.set()
        release.wait()
        path.write_text("D")

    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(cache.get, "http://h/g", slow, stop=owner)
        assert begun.wait(10)
        b = pool.submit(cache.get, "http://h/g", slow, stop=waiter)
        waiter.set("walltime")
        with pytest.raises(Interrupted, match="walltime"):
            b.result(timeout=10)
        release.set()
        assert a.result(timeout=10)[1] is False
