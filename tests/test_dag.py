"""Job dependencies: OnSuccess / OnFailure / OnExit (code=) by JobId or JobName, cycles refused at
submit, dependencies that can no longer be met, and the PSI/J ``depends_on`` attribute."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.formats import read_job
from pilot.model.job_state import JobState
from pilot.model.sss import Dependency, JobGroup, SssError, effective_jobs
from pilot.scheduler.dag import JobGraph, NewJob, Outcome, Verdict, dependencies_from_custom, satisfied

OK = Outcome(JobState.COMPLETED, 0)
FAIL3 = Outcome(JobState.FAILED, 3)
FAIL1 = Outcome(JobState.FAILED, 1)
CANCELED_QUEUED = Outcome(JobState.CANCELED, None, started=False)
CANCELED_RUNNING = Outcome(JobState.CANCELED, None, started=True)


@pytest.mark.parametrize(
    ("dep", "outcome", "ok"),
    [
        (Dependency("a"), OK, True),
        (Dependency("a"), FAIL1, False),
        (Dependency("a"), CANCELED_QUEUED, False),
        (Dependency("a", "OnFailure"), FAIL1, True),
        (Dependency("a", "OnFailure"), OK, False),
        (Dependency("a", "OnFailure"), CANCELED_RUNNING, False),
        (Dependency("a", "OnExit"), OK, True),
        (Dependency("a", "OnExit"), FAIL1, True),
        (Dependency("a", "OnExit"), CANCELED_RUNNING, True),
        (Dependency("a", "OnExit"), CANCELED_QUEUED, False),
        (Dependency("a", "OnExit", 3), FAIL3, True),
        (Dependency("a", "OnExit", 3), FAIL1, False),
        (Dependency("a", "OnExit", 0), OK, True),
    ],
)
def test_conditions(dep: Dependency, outcome: Outcome, ok: bool) -> None:
    assert satisfied(dep, outcome) is ok


DAG_XML = """<JobGroup>
  <Id>dag</Id>
  <JobDefaults><Executable>/bin/true</Executable></JobDefaults>
  <Job><Id>a</Id><Name>prepare</Name></Job>
  <Job><Id>b</Id><Dependency>a</Dependency></Job>
  <Job><Id>c</Id><Dependency condition="OnFailure">a</Dependency></Job>
  <Job><Id>d</Id><Dependency condition="OnExit" code="3" designator="JobName">prepare</Dependency></Job>
  <Job><Id>e</Id><Dependency>b</Dependency><Dependency condition="OnExit">c</Dependency></Job>
</JobGroup>"""


def graph_of(xml: str) -> tuple[JobGraph, dict[str, str]]:
    group = read_job(xml).value
    assert isinstance(group, JobGroup)
    g = JobGraph()
    ids = {}
    batch = []
    for i, j in enumerate(effective_jobs(group)):
        ids[j.id or str(i)] = str(100 + i)
        batch.append(NewJob(str(100 + i), j.name, j.id, tuple(j.properties.dependencies), j.where))
    g.add(batch)
    return g, ids


def test_dag_of_five_with_the_right_branches() -> None:
    g, ids = graph_of(DAG_XML)
    a, b, c, d, e = (ids[k] for k in "abcde")
    assert g.verdict(a) == (Verdict.READY, [])
    v, why = g.verdict(b)
    assert v is Verdict.WAIT and "waits for job 100 ('prepare')" in why[0]
    settled = dict((j, (v, r)) for j, v, r in g.finish(a, FAIL3))
    assert (
        settled[b][0] is Verdict.NEVER and "OnSuccess on job 100 ('prepare') can no longer be met" in settled[b][1][0]
    )
    assert "FAILED with exit code 3" in settled[b][1][0]
    assert settled[c][0] is Verdict.READY
    assert settled[d][0] is Verdict.READY  # OnExit code=3 by JobName
    # b never runs: the caller ends it FAILED and reports that too; e needs b's success
    later = dict((j, (v, r)) for j, v, r in g.finish(b, Outcome(JobState.FAILED, None, started=False)))
    assert later[e][0] is Verdict.NEVER and "job 101" in later[e][1][0]


def test_success_branch() -> None:
    g, ids = graph_of(DAG_XML)
    settled = {j: v for j, v, _ in g.finish(ids["a"], OK)}
    assert settled == {ids["b"]: Verdict.READY, ids["c"]: Verdict.NEVER, ids["d"]: Verdict.NEVER}
    # c never ran (its OnFailure could not be met): e's OnExit on c can no longer hold, b or not
    (settled_e,) = g.finish(ids["c"], Outcome(JobState.FAILED, None, started=False))
    assert settled_e[:2] == (ids["e"], Verdict.NEVER) and "OnExit on job 102" in settled_e[2][0]
    assert "before it started" in settled_e[2][0]


def test_cycles_are_refused_naming_the_cycle() -> None:
    xml = """<JobGroup><Id>g</Id>
  <Job><Id>x</Id><Name>first</Name><Executable>a</Executable><Dependency>z</Dependency></Job>
  <Job><Id>y</Id><Executable>a</Executable><Dependency>x</Dependency></Job>
  <Job><Id>z</Id><Executable>a</Executable><Dependency>y</Dependency></Job>
</JobGroup>"""
    with pytest.raises(SssError) as e:
        graph_of(xml)
    assert "dependency cycle: job x ('first') -> job z -> job y -> job x" in str(e.value)
    with pytest.raises(SssError, match="cycle"):
        graph_of(
            "<JobGroup><Id>g</Id><Job><Id>s</Id><Executable>a</Executable><Dependency>s</Dependency></Job></JobGroup>"
        )


def test_unknown_targets_are_refused_and_nothing_is_added() -> None:
    g = JobGraph()
    g.add([NewJob("1", "prep")])
    with pytest.raises(SssError, match="names no job"):
        g.add([NewJob("2", dependencies=(Dependency("1"),)), NewJob("3", dependencies=(Dependency("nope"),))])
    assert "2" not in g.jobs  # all or none
    g.add([NewJob("4", dependencies=(Dependency("prep", designator="JobName"), Dependency("1")))])
    g.add([NewJob("5", dependencies=(Dependency("99"),))], known=lambda j: j == "99")


def test_dependencies_on_jobs_already_finished() -> None:
    g = JobGraph()
    g.add([NewJob("1")])
    g.finish("1", OK)
    g.add([NewJob("2", dependencies=(Dependency("1"),)), NewJob("3", dependencies=(Dependency("1", "OnFailure"),))])
    assert g.verdict("2")[0] is Verdict.READY and g.verdict("3")[0] is Verdict.NEVER


def test_job_name_designator_means_every_job_of_that_name() -> None:
    g = JobGraph()
    g.add([NewJob("1", "w"), NewJob("2", "w"), NewJob("3", dependencies=(Dependency("w", designator="JobName"),))])
    assert g.finish("1", OK) == []  # job 2 still runs
    assert g.finish("2", OK) == [("3", Verdict.READY, [])]


def test_forget_keeps_what_others_wait_for() -> None:
    g = JobGraph()
    g.add([NewJob("1"), NewJob("2", dependencies=(Dependency("1"),))])
    g.finish("1", OK)
    g.forget(["1"])
    assert "1" in g.jobs
    g.finish("2", OK)
    g.forget(["1", "2"])
    assert not g.jobs


@pytest.mark.parametrize(
    ("text", "deps"),
    [
        ("12", [Dependency("12")]),
        ("OnFailure:12, OnExit=3:13", [Dependency("12", "OnFailure"), Dependency("13", "OnExit", 3)]),
        ("OnSuccess:name=prep", [Dependency("prep", designator="JobName")]),
        (["7", "OnExit:8"], [Dependency("7"), Dependency("8", "OnExit")]),
    ],
)
def test_depends_on_custom_attribute(text: str | list[str], deps: list[Dependency]) -> None:
    assert dependencies_from_custom({"depends_on": text}) == deps


@pytest.mark.parametrize("bad", ["OnFailure=2:12", "OnExit:", 12])
def test_bad_depends_on_is_refused(bad: object) -> None:
    with pytest.raises(SssError, match="depends_on"):
        dependencies_from_custom({"depends_on": bad})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 7), max_size=3), min_size=1, max_size=8))
def test_acyclic_graphs_are_accepted_and_cyclic_refused(edges: list[list[int]]) -> None:
    n = len(edges)
    deps = [[t for t in targets if t < n] for targets in edges]
    batch = [NewJob(str(i), dependencies=tuple(Dependency(str(t)) for t in deps[i])) for i in range(n)]
    # a cycle exists iff a depth-first search finds a back edge
    state: dict[int, int] = {}

    def cyclic(v: int) -> bool:
        state[v] = 1
        for t in deps[v]:
            if state.get(t) == 1 or (state.get(t) is None and cyclic(t)):
                return True
        state[v] = 2
        return False

    has_cycle = any(state.get(v) is None and cyclic(v) for v in range(n))
    g = JobGraph()
    if has_cycle:
        with pytest.raises(SssError, match="cycle"):
            g.add(batch)
    else:
        g.add(batch)
        assert len(g.jobs) == n
