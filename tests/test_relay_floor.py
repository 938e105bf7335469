"""bench/relay_floor.py: the round trip's floor (the pilot's three processes and hops, none of its work)
really relays through two more processes and a spawned /bin/true, answers every payload of a burst
(its threads' sends must not lose a wake-up of the socket they share), and leaves none of them behind."""

from __future__ import annotations

import psutil
import pytest

from bench import relay_floor


@pytest.mark.timeout(60)
def test_relay_floor_round_trips_through_real_processes() -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    trips, spawns = relay_floor.measure(5, burst=200)
    assert len(trips) == 5 and len(spawns) == 5
    assert all(t > 0 for t in trips) and all(s > 0 for s in spawns)
    left = [p for p in me.children(recursive=True) if p.pid not in before and p.is_running() and p.status() != "zombie"]
    assert left == []
