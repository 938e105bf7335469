"""ProcessOrder.from_wire's fast path (exact types, one pass) against its field-by-field check: it
never accepts what the full check refuses, and builds the same order from what both accept."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.model import process_order
from pilot.model.process_order import ProcessOrder
from pilot.wire import ProtocolError

_VALID = ProcessOrder(
    job_id="7",
    slot=0,
    role="rank",
    executable="/bin/true",
    arguments=["a"],
    environment={"A": "1"},
    directory="/tmp",
    stdout_path="out",
    cores=[0],
    walltime=5.0,
    nodefile_hosts=["h"],
    after_cores=True,
).to_wire()

_EDGE: list[Any] = [
    None, True, False, 0, 1, -1, 2.5, 0.0, -3.0, math.nan, math.inf, "", "x", "rank", "pre", "post",
    [], [1], [True], ["a"], ["a", 1], {}, {"A": "1"}, {"A": 1}, {1: "a"}, [["RLIMIT_CORE", 0, 0]],
    [["RLIMIT_NOPE", 0, 0]],
]  # fmt: skip


@st.composite
def _orders(draw: st.DrawFn) -> Any:
    order = dict(_VALID)
    for name in draw(st.lists(st.sampled_from(sorted(order)), max_size=5, unique=True)):
        if draw(st.booleans()):
            del order[name]
        else:
            order[name] = draw(st.sampled_from(_EDGE))
    if draw(st.integers(0, 9)) == 0:
        order["unknown"] = 1
    return order


@pytest.mark.timeout(120)
@settings(max_examples=3000, deadline=None)
@given(_orders())
def test_the_fast_path_accepts_only_what_the_full_check_accepts_and_builds_the_same_order(raw: Any) -> None:
    fast = process_order._from_wire_fast(raw)
    try:
        checked = ProcessOrder._from_wire_checked(raw)
    except ProtocolError:
        assert fast is None, f"the fast path accepted {raw!r}, which the full check refuses"
        return
    if fast is not None:
        assert fast == checked


def test_a_daemons_order_takes_the_fast_path() -> None:
    # The orders a daemon sends (msgpack round trip: exact types) must not fall back to the slow path.
    assert process_order._from_wire_fast(dict(_VALID)) == ProcessOrder._from_wire_checked(dict(_VALID))
