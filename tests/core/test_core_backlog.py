"""How deep orders queue behind busy cores (``pilot.backlog``): never deeper than the queue's share."""

from __future__ import annotations

from collections import Counter

from core_env import CoreEnv, true


def _orders_per_node(env: CoreEnv, jobs: int) -> Counter[str]:
    for name in ("n0", "n1"):
        env.register(name)
    env.submit(*[true() for _ in range(jobs)])
    step = env.step()
    return Counter({node: len(orders) for node, orders in step.out.orders.items()})


def test_a_short_queue_spreads_over_every_node_and_mostly_stays_in_the_daemon() -> None:
    env = CoreEnv(nodes=2, cores=2, pilot={"backlog": 128})
    # 4 start on the free cores; 32 are left: a quarter of 32 / 4 cores = 2 behind each busy core, and
    # the other 24 wait in the daemon for whichever core frees first.
    assert _orders_per_node(env, 36) == {"n0": 6, "n1": 6}
    assert len(env.core.book.queue) == 24


def test_a_deep_queue_fills_the_backlog_of_every_core() -> None:
    env = CoreEnv(nodes=2, cores=2, pilot={"backlog": 3})
    assert _orders_per_node(env, 100) == {"n0": 8, "n1": 8}  # 2 running + 2 x 3 behind, per node
    assert len(env.core.book.queue) == 100 - 16
