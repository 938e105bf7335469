"""Many virtual nodes in one agent process (null launches): REGISTERs in batches, one HEARTBEAT that
speaks for every node of the process, and liveness still judged per node, from a deadline heap."""

from __future__ import annotations

import pytest
from core_env import CoreEnv, true

from pilot.model.job_state import JobState
from pilot.model.node import NodeConfigured
from pilot.wire.messages import Heartbeat, HeartbeatReply, Register, Registered

pytestmark = pytest.mark.timeout(30)


def node(name: str, cores: int = 2) -> NodeConfigured:
    return NodeConfigured(name=name, hostname=name, processors=list(range(cores)), memory=1 << 30)


def register_batch(env: CoreEnv, names: list[str]) -> None:
    first, *rest = names
    c = env.cores
    env.core.on_agent(first, Register(node(first, c), more=tuple(Register(node(n, c)) for n in rest)))


def replies(env: CoreEnv) -> dict[str, list[object]]:
    out: dict[str, list[object]] = {}
    for name, msg in env.step().out.to_agents:
        out.setdefault(name, []).append(msg)
    return out


def test_one_register_carries_many_nodes_each_answered_on_its_own_socket() -> None:
    env = CoreEnv(nodes=5)
    names = [f"n{i}" for i in range(5)]
    register_batch(env, names)
    sent = replies(env)
    assert sorted(sent) == names
    assert all(isinstance(msgs[0], Registered) for msgs in sent.values())
    assert all(env.core.agents.registered(n) for n in names)
    # Orders are still per node: five one-core jobs on five two-core nodes spread as before.
    ids = env.submit(*(true() for _ in range(10)))
    step = env.step()
    assert sum(len(step.orders(n)) for n in names) == len(ids)


def test_a_refused_node_of_a_batch_does_not_refuse_the_others() -> None:
    env = CoreEnv(nodes=3)
    env.core.on_agent(
        "n0", Register(node("n0"), more=(Register(node("n1")), Register(node("x@a9")), Register(node("n2"))))
    )
    sent = replies(env)
    assert sorted(sent) == ["n0", "n1", "n2"]
    assert "x@a9" not in env.core.nodes.agents


def test_a_combined_heartbeat_keeps_only_the_nodes_it_names_alive() -> None:
    env = CoreEnv(nodes=4, cores=1)
    names = ["n0", "n1", "n2", "n3"]
    register_batch(env, names)
    env.step()
    ids = env.submit(*(true() for _ in names))
    step = env.step()
    on = {step.orders(n)[0]["job_id"]: n for n in names}
    assert sorted(on.values()) == names  # one job per one-core node
    for jid, n in on.items():
        env.started(n, jid)
    env.step()
    for _ in range(4):
        env.advance(2.0)
        # n0 speaks for the others of its process but n2: n2's beats stopped.
        env.core.on_agent("n0", Heartbeat((0.5,), nodes=("n1", "n3")))
        env.core.on_tick()
        env.step()
    agents = env.core.nodes.agents
    assert [n for n in names if agents[n].state == "lost"] == ["n2"]
    assert all(agents[n].load == [0.5] for n in ("n0", "n1", "n3"))
    for jid in ids:
        if on[jid] == "n2":
            assert env.state(jid) is JobState.FAILED and "node n2 lost" in env.told(jid)[4]
        else:
            assert env.job(jid).state is JobState.ACTIVE


def test_the_reply_acknowledges_each_named_node_and_names_the_unknown_ones() -> None:
    env = CoreEnv(nodes=3, cores=1)
    register_batch(env, ["n0", "n1"])
    env.step()
    (jid,) = env.submit(true())
    step = env.step()
    (where,) = [n for n in ("n0", "n1") if step.orders(n)]
    env.started(where, jid)  # batch 1 of that node's events
    env.step()
    env.core.on_agent("n0", Heartbeat(nodes=("n1", "n2", "ghost")))
    (reply,) = [m for m in replies(env)["n0"] if isinstance(m, HeartbeatReply)]
    assert reply.known and reply.unknown == ("n2", "ghost")
    assert reply.acks == {"n1": 1 if where == "n1" else 0}
    assert reply.acked == (1 if where == "n0" else 0)


def test_a_plain_heartbeat_is_answered_as_before() -> None:
    env = CoreEnv(nodes=1)
    env.register("n0")
    env.core.on_agent("n0", Heartbeat())
    (reply,) = replies(env)["n0"]
    assert reply == HeartbeatReply(known=True, acked=0)


def test_liveness_looks_only_at_agents_due_and_watches_a_node_registered_again() -> None:
    env = CoreEnv(nodes=50)
    names = [f"n{i}" for i in range(50)]
    register_batch(env, names)
    env.step()
    agents = env.core.agents
    for _ in range(20):  # every node beats: each stays in the heap once, however many ticks pass
        env.advance(1.0)
        env.core.on_agent("n0", Heartbeat(nodes=tuple(names[1:])))
        env.core.on_tick()
        assert len(agents._due) == len(names)
    env.advance(6.0)  # everyone silent past agent_timeout (5 s): each lost, by name
    env.core.on_tick()
    assert all(env.core.nodes.agents[n].state == "lost" for n in names)
    assert not agents._due
    env.core.on_agent("n7", Register(node("n7")))  # back: a new record, watched again
    env.step()
    assert env.core.nodes.agents["n7"].state == "active" and len(agents._due) == 1
    env.advance(5.5)
    env.core.on_tick()
    assert env.core.nodes.agents["n7"].state == "lost"


def test_a_combined_heartbeat_gives_each_node_its_load_and_a_new_version_only_on_change() -> None:
    env = CoreEnv(nodes=4, cores=2)
    names = ["n0", "n1", "n2", "n3"]
    register_batch(env, names)
    env.step()
    measured = {n: env.core.nodes.cluster.nodes[n].values for n in names}

    def beat(sender: str, free: float, *, hosted: tuple[str, ...]) -> dict[str, int]:
        before = {n: measured[n].version for n in names}
        env.core.on_agent(sender, Heartbeat((0.5,), {"mem_free": free, "load_avg": 0.25}, nodes=hosted))
        env.step()
        return {n: measured[n].version - before[n] for n in names}

    assert beat("n0", 1e9, hosted=("n1", "n2")) == {"n0": 1, "n1": 1, "n2": 1, "n3": 0}
    assert all(measured[n].load["mem_free"] == 1e9 for n in ("n0", "n1", "n2"))
    # The same values again: no node's values change, none gets a new version.
    assert beat("n0", 1e9, hosted=("n1", "n2")) == {"n0": 0, "n1": 0, "n2": 0, "n3": 0}
    # n2 beats on its own meanwhile with other values; then the combined heartbeat changes them all.
    assert beat("n2", 5e8, hosted=()) == {"n0": 0, "n1": 0, "n2": 1, "n3": 0}
    assert beat("n0", 2e9, hosted=("n1", "n2")) == {"n0": 1, "n1": 1, "n2": 1, "n3": 0}
    assert all(measured[n].load["mem_free"] == 2e9 for n in ("n0", "n1", "n2"))
    # n2 again alone with the combined heartbeat's values: equal, so no new version; then n1 leaves it.
    assert beat("n2", 2e9, hosted=()) == {"n0": 0, "n1": 0, "n2": 0, "n3": 0}
    assert beat("n0", 2e9, hosted=("n2",)) == {"n0": 0, "n1": 0, "n2": 0, "n3": 0}
    assert beat("n0", 3e9, hosted=("n1", "n2", "n3")) == {"n0": 1, "n1": 1, "n2": 1, "n3": 1}
    assert {measured[n].load["mem_free"] for n in names} == {3e9}
    # n3 alone reaches the values the next combined heartbeat brings: it alone keeps its version.
    assert beat("n3", 4e9, hosted=()) == {"n0": 0, "n1": 0, "n2": 0, "n3": 1}
    assert beat("n0", 4e9, hosted=("n1", "n2", "n3")) == {"n0": 1, "n1": 1, "n2": 1, "n3": 0}
    assert {measured[n].load["mem_free"] for n in names} == {4e9}
