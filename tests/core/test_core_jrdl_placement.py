"""JRDL resource attributes through the core in process (issue 22, item 8): a requirement on a load value
(processorLoad, minFreeCPU) waits while a node is busy and is refused at submit only when no node could meet
it even idle; among the nodes that meet the minimums placement prefers the fastest clock, then the most
processors the load leaves free, then the most free memory; a node with no clock does not meet clockSpeed."""

from __future__ import annotations

from typing import Any

import pytest
from core_env import CLIENT, CoreEnv

from pilot import views
from pilot.wire.messages import Heartbeat

pytestmark = pytest.mark.timeout(10)

SUBMITTER = {"HOME": "/home/u", "LOGNAME": "u", "CUR_DIRL": "/work/here"}


def jrdl(resource: str = "", *, jobs: int = 1) -> str:
    exe = '<executable><path><stringElement value="/bin/true"/></path></executable>'
    body = f"<resource>{resource}</resource>" if resource else ""
    return "<jrdl>" + f"<job>{exe}{body}</job>" * jobs + "</jrdl>"


def submit(env: CoreEnv, document: str) -> dict[str, Any]:
    (result,) = env.core.on_submit(CLIENT, [{"jrdl": document, "submitter": SUBMITTER}], None)
    return result


def ids(env: CoreEnv, document: str) -> list[str]:
    result = submit(env, document)
    assert "ids" in result, result
    return [str(i) for i in result["ids"]]


def beat(env: CoreEnv, node: str, *, load: float, mem_free: str = "500M") -> None:
    """A heartbeat of measured load values: ``load`` per processor over every window."""
    values = {"np_load_short": load, "np_load_medium": load, "np_load_long": load, "mem_free": mem_free}
    env.core.on_agent(node, Heartbeat(values=values))


def started(env: CoreEnv) -> dict[str, list[str]]:
    """One scheduling step: the jobs whose processes were ordered, per node."""
    out = env.step().out.orders
    return {n: [o["job_id"] for o in orders if o["role"] == "rank"] for n, orders in out.items() if orders}


def reasons(env: CoreEnv, job_id: str) -> str:
    return " | ".join(views.explain(env.core, job_id)["reasons"])


def free_cpu(n: int) -> str:
    return f'<minFreeCPU><integer value="{n}"/></minFreeCPU>'


def clock(mhz: int) -> str:
    return f'<processor><clockSpeed><integer value="{mhz}"/></clockSpeed></processor>'


LIGHT = '<processorLoad><last1Min><integer value="50"/></last1Min></processorLoad>'  # at least 50 % available


def test_a_load_requirement_waits_while_the_node_is_busy_and_starts_when_the_load_falls() -> None:
    env = CoreEnv(cores=4)
    env.register("n0")
    beat(env, "n0", load=0.9)  # 90 % busy: 0.4 of its 4 processors free
    (a,) = ids(env, jrdl(free_cpu(2)))  # accepted: an idle node has 4 free
    (b,) = ids(env, jrdl(LIGHT))
    assert started(env) == {}
    why = reasons(env, a)
    assert "free_proc>=2 does not hold: its free_proc is 0.4 now (a load value: the job waits for the node's load)" in (
        why
    )
    assert "np_load_short" in reasons(env, b) and "the job waits for the node's load" in reasons(env, b)
    beat(env, "n0", load=0.1)
    assert started(env) == {"n0": [a, b]}


def test_a_load_requirement_no_node_could_meet_even_idle_is_refused_and_nothing_accepted() -> None:
    env = CoreEnv(nodes=2, cores=4)
    env.register("n0")
    env.register("n1")
    for n in ("n0", "n1"):
        beat(env, n, load=0.0)  # idle now: the refusal is not about the moment's load
    document = jrdl(jobs=1)[: -len("</jrdl>")] + jrdl(free_cpu(5))[len("<jrdl>") :]
    refused = submit(env, document)
    assert "can never run in this allocation" in refused["error"], refused
    assert "free_proc>=5 does not hold: its free_proc is 4 even idle: n0, n1" in refused["error"]
    assert not env.core.book.jobs  # the first job of the document was not accepted either


def test_a_momentary_load_is_not_a_refusal_and_a_later_one_is_not_cached_as_one() -> None:
    env = CoreEnv(cores=4)
    env.register("n0")
    beat(env, "n0", load=1.0)
    first = ids(env, jrdl(free_cpu(4)))
    second = ids(env, jrdl(free_cpu(4)))  # the same category, judged once: still a wait, not a refusal
    assert started(env) == {}
    beat(env, "n0", load=0.0)
    assert started(env) == {"n0": first + second}


def test_placement_prefers_the_fastest_clock_and_goes_elsewhere_when_it_is_full() -> None:
    env = CoreEnv(nodes=3, cores=2)
    env.register("slow", clock_mhz=2000)
    env.register("fast", clock_mhz=3000)
    env.register("unknown")  # no clock reported (no cpufreq): ranks last, meets no clockSpeed minimum
    for n in ("slow", "fast", "unknown"):
        beat(env, n, load=0.0)
    jobs = ids(env, jrdl(jobs=6))
    assert started(env) == {"fast": jobs[:2], "slow": jobs[2:4], "unknown": jobs[4:]}


def test_a_clock_minimum_runs_only_where_the_clock_is_known_and_fast_enough() -> None:
    env = CoreEnv(nodes=3, cores=1)
    env.register("slow", clock_mhz=2000)
    env.register("fast", clock_mhz=3000)
    env.register("unknown")
    for n in ("slow", "fast", "unknown"):
        beat(env, n, load=0.0)
    first, second = ids(env, jrdl(clock(2500), jobs=2))
    assert started(env) == {"fast": [first]}  # the second waits for the fast node: the others do not qualify
    why = reasons(env, second)
    assert "clock_mhz>=2500 does not hold: its clock_mhz is 2000: slow" in why, why
    assert "clock_mhz>=2500 cannot be checked: the node reports no clock_mhz: unknown" in why, why
    refused = submit(env, jrdl(clock(4000)))
    assert "can never run in this allocation" in refused["error"] and "its clock_mhz is 3000" in refused["error"]


def test_equal_clocks_prefer_the_least_loaded_then_the_most_free_memory() -> None:
    env = CoreEnv(nodes=3, cores=2)
    for n in ("a", "b", "c"):
        env.register(n, clock_mhz=2600)
    beat(env, "a", load=0.5, mem_free="900M")
    beat(env, "b", load=0.0, mem_free="100M")
    beat(env, "c", load=0.0, mem_free="800M")
    (first,) = ids(env, jrdl())
    assert started(env) == {"c": [first]}  # b and c are idle; c has more memory free
    beat(env, "c", load=1.0, mem_free="800M")
    (second,) = ids(env, jrdl())
    assert started(env) == {"b": [second]}  # c is busy now: b leaves the most processors free
