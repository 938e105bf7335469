"""Admission against ``pilot.max_queued``, in process: a request is taken as far as there is room, job by
job; the rest is answered 'no room, nothing done' for its client to send again, and a job sent again
under a submit id the pilot knows is followed however full the pilot is."""

from __future__ import annotations

import pytest
from core_env import CoreEnv, true

pytestmark = pytest.mark.timeout(10)


def test_a_request_is_taken_up_to_the_room_left_and_the_rest_answered_no_room() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    env.submit(true(), true())  # 2 unfinished
    results = env.core.on_submit(b"c", [true().to_wire() for _ in range(6)], None, max_queued=5)
    assert ["id" in r for r in results] == [True] * 3 + [False] * 3
    assert all(r["retry"] and r["transient"] and "pilot.max_queued" in r["error"] for r in results[3:])
    assert env.core.book.unfinished() == 5


def test_a_job_sent_again_is_followed_though_the_pilot_is_full_and_new_ones_wait() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    first = env.core.on_submit(b"c", [true().to_wire()], ["k-1"], max_queued=1)
    assert "id" in first[0]
    again = env.core.on_submit(b"c", [true().to_wire(), true().to_wire()], ["k-1", "k-2"], max_queued=1)
    assert again[0]["id"] == first[0]["id"], "the job its submit id made is followed, not made again"
    assert again[1]["retry"], again[1]
    assert env.core.book.unfinished() == 1
