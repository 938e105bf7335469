"""Co-allocation through the core in process (issue 22, item 5): a JRDL job divided into subjobs that
name where each runs (resourceManagerContact: a site, or site/allocation; jobManagerType: fork or pbs)
starts when every subjob can start, each inside an allocation of its target, and not before; it fails
as a whole; a contact naming nothing of the pilot is refused at submit listing what it may name."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from core_env import CLIENT, CoreEnv

from pilot import lrm, views
from pilot.allocations import PilotAllocation, Site
from pilot.formats.jrdl import read_jrdl, write_jrdl
from pilot.frontends.jrdl import targets
from pilot.lrm.base import Allocation, AllocationState
from pilot.model.job_state import JobState

pytestmark = pytest.mark.timeout(10)

SUBMITTER = {"HOME": "/home/u", "LOGNAME": "u", "CUR_DIRL": "/work/here"}


def two_sites(*, cores: int = 2) -> CoreEnv:
    """Site ``main`` (the local LRM: fork) holding a1 with node m0, and site ``batch`` (PBS) holding
    a2 with node p0@a2; both nodes registered."""
    env = CoreEnv(cores=cores)
    main = env.allocations.sites[0]
    settings = dataclasses.replace(main.settings, lrm="pbs", name="batch", options={})
    batch = Site(settings, lrm.create("pbs", options={}, source="<core test>"))
    env.allocations.sites.append(batch)
    allocation = Allocation(
        native_id="77.pbs",
        lrm="pbs",
        state=AllocationState.ACTIVE,
        nodes=1,
        submitted=env.clock.wall,
        started=env.clock.wall,
        walltime=None,
    )
    env.allocations.held["a2"] = PilotAllocation("a2", batch, allocation)
    env.register("m0")
    env.register("p0@a2")
    return env


def subjob(executable: str, *, contact: str | None = None, manager: str | None = None, count: int = 1) -> str:
    parts = [f'<executable><path><stringElement value="{executable}"/></path></executable>']
    if contact is not None:
        value = f'<string><stringElement value="{contact}"/></string>'
        parts.append(f"<resourceManagerContact>{value}</resourceManagerContact>")
    if manager is not None:
        value = f"<enumeration><enumerationValue><{manager}/></enumerationValue></enumeration>"
        parts.append(f"<jobManagerType>{value}</jobManagerType>")
    parts.append(f'<count><integer value="{count}"/></count>')
    return "<subjob>" + "".join(parts) + "</subjob>"


def document(*subjobs: str, before: str = "") -> str:
    """One job of these subjobs, after the jobs ``before``."""
    return f"<jrdl>{before}<job>{''.join(subjobs)}</job></jrdl>"


def submit(env: CoreEnv, doc: str) -> dict[str, Any]:
    (result,) = env.core.on_submit(CLIENT, [{"jrdl": doc, "submitter": SUBMITTER}], None)
    return result


def ids(env: CoreEnv, doc: str) -> list[str]:
    result = submit(env, doc)
    assert "ids" in result, result
    return [str(i) for i in result["ids"]]


def started(env: CoreEnv) -> dict[str, list[tuple[str, str]]]:
    """One scheduling step: per node, the (job, executable) of each process ordered there."""
    out = env.step().out.orders
    return {
        n: [(o["job_id"], o["executable"]) for o in orders if o["role"] == "rank"]
        for n, orders in out.items()
        if orders
    }


def test_subjobs_start_together_each_in_the_allocation_its_contact_names() -> None:
    env = two_sites()
    (job,) = ids(env, document(subjob("/bin/a", contact="main"), subjob("/bin/b", contact="batch", manager="pbs")))
    assert started(env) == {"m0": [(job, "/bin/a")], "p0@a2": [(job, "/bin/b")]}
    assert sorted(r.node for r in env.job(job).run.ranks) == ["m0", "p0@a2"]


def test_a_coallocated_job_waits_until_every_subjob_has_room_and_takes_nothing_meanwhile() -> None:
    env = two_sites()
    # Fill the PBS site's node (2 cores) with a job that runs there only: one process of 2 cores.
    (busy,) = ids(env, document(subjob("/bin/busy", manager="pbs", count=2)))
    assert started(env) == {"p0@a2": [(busy, "/bin/busy")]}
    env.started("p0@a2", busy)
    (co,) = ids(env, document(subjob("/bin/a", contact="main/a1", count=2), subjob("/bin/b", contact="batch/a2")))
    assert started(env) == {}  # main has room for its part; batch has none: neither starts
    assert env.core.nodes.slots["m0"].free_cores == [0, 1]  # and main's part gave its cores back
    why = " | ".join(views.explain(env.core, co)["reasons"])
    assert "has room now in main/a1; it starts when every part can" in why, why
    assert "<subjob> #2 (line 1): in batch/a2: " in why and "room for 0 such task(s) now" in why, why
    env.exited("p0@a2", busy)
    assert started(env) == {"m0": [(co, "/bin/a")], "p0@a2": [(co, "/bin/b")]}


def test_a_coallocated_job_fails_as_a_whole() -> None:
    env = two_sites()
    (job,) = ids(env, document(subjob("/bin/a", contact="main"), subjob("/bin/b", contact="batch")))
    started(env)
    env.started("m0", job, 0)
    env.started("p0@a2", job, 1)
    env.exited("p0@a2", job, 1, code=3)
    step = env.step()
    assert step.kills("m0") == {f"another process of job {job} failed": [[job, 0]]}  # the other part stops
    env.exited("m0", job, 0, code=-15, signal=15, reason="killed")
    env.step()
    assert env.state(job) is JobState.FAILED


@pytest.mark.parametrize(
    ("sub", "error"),
    [
        (
            subjob("/bin/a", contact="http://eros01.gridcenter.or.kr:8080"),
            "<resourceManagerContact> 'http://eros01.gridcenter.or.kr:8080' names no site or allocation of this "
            "pilot; known: main, main/a1, batch, batch/a2 (a site's name in the config, or site/allocation)",
        ),
        (subjob("/bin/a", contact="main/a2"), "'main/a2' names no allocation of this pilot that is alive"),
        (
            subjob("/bin/a", contact="batch", manager="fork"),
            "<resourceManagerContact> 'batch' with <jobManagerType> fork: no site of this pilot of that name is a fork "
            "site; its sites: "
            "main (fork), batch (pbs)",
        ),
        (subjob("/bin/a", contact="main", count=3), "can never run in this allocation"),  # 3 cores; m0 has 2
    ],
)
def test_a_contact_that_names_nothing_is_refused_with_the_whole_document(sub: str, error: str) -> None:
    env = two_sites()
    good = '<job><executable><path><stringElement value="/bin/true"/></path></executable></job>'
    result = submit(env, document(sub, subjob("/bin/b", contact="batch"), before=good))
    assert "error" in result and error in result["error"], result
    assert not env.core.book.jobs  # the good first job was not accepted either


def test_a_job_level_contact_places_the_whole_job_and_fork_means_the_local_site() -> None:
    env = two_sites()
    whole = subjob("/bin/x", contact="batch").removeprefix("<subjob>").removesuffix("</subjob>")
    (pbs,) = ids(env, f"<jrdl><job>{whole}</job></jrdl>")
    (fork,) = ids(env, document(subjob("/bin/f", manager="fork", count=2)))
    assert started(env) == {"p0@a2": [(pbs, "/bin/x")], "m0": [(fork, "/bin/f")]}


def test_the_journal_keeps_where_each_subjob_runs() -> None:
    """What the journal keeps of a job (its document written out resolved) rebuilds the same targets."""
    (job,) = read_jrdl(document(subjob("/bin/a", contact="main/a1", manager="fork"), subjob("/bin/b", manager="pbs")))
    (again,) = read_jrdl(write_jrdl(job))
    assert [(x.contact, x.manager) for x in again.subjobs] == [("main/a1", "fork"), (None, "pbs")]
    assert targets([(x, 1) for x in again.subjobs]) == targets([(x, 1) for x in job.subjobs])


def test_a_queued_coallocated_job_whose_allocation_ends_fails_saying_why() -> None:
    env = two_sites()
    (busy,) = ids(env, document(subjob("/bin/busy", contact="batch", count=2)))
    started(env)
    env.started("p0@a2", busy)
    (co,) = ids(env, document(subjob("/bin/a", contact="main"), subjob("/bin/b", contact="batch/a2")))
    assert started(env) == {}  # waits for room in a2
    held = env.allocations.held["a2"]
    held.allocation.state = AllocationState.FAILED
    held.allocation.message = "NODE_FAIL"
    env.core.on_allocation_ended(held)
    env.step()
    assert env.state(busy) is JobState.FAILED  # it ran there
    assert env.state(co) is JobState.FAILED  # it can never start: a2 is gone and main cannot stand in
    assert env.told(co)[4] == (
        "not started: <job> #1 (line 1)/<subjob> #2 (line 1): <resourceManagerContact> 'batch/a2': no allocation "
        "it may run in is left, and none can come"
    )
    assert env.core.nodes.slots["m0"].free_cores == [0, 1]
