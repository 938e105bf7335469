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


def test_a_short_queue_spreads_over_every_node_not_the_first() -> None:
    env = CoreEnv(nodes=2, cores=2, pilot={"backlog": 128})
    # 4 start on the free cores; 32 are left: their share, 32 / 4 cores = 8 behind each busy core (the
    # backlog of 128 would have stacked them all on n0's two cores).
    assert _orders_per_node(env, 36) == {"n0": 18, "n1": 18}
    assert len(env.core.book.queue) == 0


def test_the_share_rounds_up_and_the_last_node_gets_what_is_left() -> None:
    env = CoreEnv(nodes=2, cores=2, pilot={"backlog": 128})
    # 30 left over 4 cores: at most 8 behind each, filled in turn (8 + 8 on n0, 8 + 6 on n1).
    assert _orders_per_node(env, 34) == {"n0": 18, "n1": 16}


def test_a_deep_queue_fills_the_backlog_of_every_core() -> None:
    env = CoreEnv(nodes=2, cores=2, pilot={"backlog": 3})
    assert _orders_per_node(env, 100) == {"n0": 8, "n1": 8}  # 2 running + 2 x 3 behind, per node
    assert len(env.core.book.queue) == 100 - 16
