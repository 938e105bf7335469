"""The SSS job model: Defaults inheritance as the spec says, typed views, the lossless PSI/J
mapping, streams (redirectList), resource limits and states."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.formats import read_job, write_job
from pilot.model.job_description import JobDescription, ResourceRequest
from pilot.model.job_state import JobState
from pilot.model.sss import (
    Job,
    JobGroup,
    Properties,
    Property,
    SssError,
    Task,
    TaskGroup,
    effective_jobs,
    job_state,
    sss_state,
)
from pilot.model.sss.execution import UNLIMITED, rlimit_settings, streams
from pilot.model.sss.psij import description, from_sss, to_sss

P = Property.of


def props(*items: Property, requested: list[Property] | None = None) -> Properties:
    return Properties.of(*items, requested=requested)


# -- inheritance ------------------------------------------------------------------------------------------


def test_job_properties_override_job_defaults_per_property() -> None:
    group = JobGroup(
        props(P("Id", "g")),
        jobs=[
            Job(props(P("Name", "a"), P("Queue", "fast"))),
            Job(props(P("Name", "b"))),
        ],
        job_defaults=Job(props(P("Queue", "batch"), P("Project", "p1"), P("Executable", "/bin/x"))),
    )
    a, b = effective_jobs(group)
    assert (a.properties.text("Queue"), b.properties.text("Queue")) == ("fast", "batch")
    assert a.properties.text("Project") == b.properties.text("Project") == "p1"
    assert a.task_groups[0].properties.executable == "/bin/x"  # the implicit TaskGroup inherits the job's


def test_environment_is_one_property_replaced_whole() -> None:
    defaults = Job(props(P("Environment", "", P("Variable", "1", name="A"), P("Variable", "2", name="B"))))
    own = Job(props(P("Executable", "x"), P("Environment", "", P("Variable", "3", name="B"))))
    (j,) = effective_jobs(JobGroup(props(P("Id", "g")), [own], defaults))
    assert j.properties.environment == {"B": "3"}


def test_repeated_properties_are_overridden_by_identity() -> None:
    defaults = Job(
        props(
            P("Resource", 1, name="License", type="MATLAB"),
            P("Resource", 2, name="License", type="ESSL2"),
            P("Hold", "User"),
            P("Hold", "System"),
        )
    )
    own = Job(props(P("Executable", "x"), P("Resource", 5, name="License", type="ESSL2")))
    (j,) = effective_jobs(JobGroup(props(P("Id", "g")), [own], defaults))
    res = {(p.get("type"), p.value) for p in j.properties.all("Resource")}
    assert res == {("MATLAB", "1"), ("ESSL2", "5")}
    assert j.properties.holds == ["User", "System"]


def test_task_group_defaults_and_task_defaults() -> None:
    job = Job(
        props(P("Executable", "/bin/job"), P("Name", "J")),
        task_groups=[
            TaskGroup(props(P("Name", "A"), P("TaskCount", 2))),
            TaskGroup(
                props(P("Name", "B"), P("Executable", "/bin/b")),
                tasks=[Task(props(P("Arguments", "--first"))), Task(props(P("Id", "t2")))],
                task_defaults=Task(props(P("Arguments", "--default"))),
            ),
        ],
        task_group_defaults=TaskGroup(props(P("Memory", 512), P("Executable", "/bin/tgd"))),
    )
    (j,) = effective_jobs(job)
    a, b = j.task_groups
    assert a.properties.executable == "/bin/tgd"  # TaskGroupDefaults over the Job's
    assert b.properties.executable == "/bin/b"  # the TaskGroup's own over both
    assert a.properties.text("Memory") == b.properties.text("Memory") == "512"
    assert a.name == "A" and j.name == "J"  # names are not inherited downwards
    assert b.task_template.arguments == ["--default"]
    assert [t.properties.arguments for t in b.tasks] == [["--first"], ["--default"]]
    assert b.tasks[0].properties.executable == "/bin/b"
    assert 'TaskGroup "B"' in b.where and "Task[1]" in b.tasks[0].where


def test_job_defaults_task_group_defaults_are_merged_under_the_jobs() -> None:
    group = JobGroup(
        props(P("Id", "g")),
        jobs=[Job(props(P("Executable", "x")), task_group_defaults=TaskGroup(props(P("Disk", 5))))],
        job_defaults=Job(task_group_defaults=TaskGroup(props(P("Disk", 1), P("Swap", 2)))),
    )
    (j,) = effective_jobs(group)
    tg = j.task_groups[0].properties
    assert (tg.text("Disk"), tg.text("Swap")) == ("5", "2")


def test_scope_totals_are_not_inherited_by_several_groups() -> None:
    job = Job(
        props(P("Executable", "x"), P("Processors", 8), P("Memory", 100)),
        task_groups=[TaskGroup(props(P("TaskCount", 1))), TaskGroup(props(P("TaskCount", 2)))],
    )
    (j,) = effective_jobs(job)
    assert all(tg.properties.first("Processors") is None for tg in j.task_groups)
    assert all(tg.properties.text("Memory") == "100" for tg in j.task_groups)
    (single,) = effective_jobs(Job(props(P("Executable", "x"), P("Processors", 8))))
    assert single.task_groups[0].properties.integer("Processors") == 8


def test_requested_properties_are_inherited_by_identity() -> None:
    job = Job(
        props(P("Executable", "x"), requested=[P("Memory", 1, op="GE"), P("Feature", "ib")]),
        task_groups=[TaskGroup(Properties.of(requested=[P("Memory", 4, op="GE")]))],
    )
    (j,) = effective_jobs(job)
    req = j.task_groups[0].properties.requested or []
    assert sorted((p.name, p.value) for p in req) == [("Feature", "ib"), ("Memory", "4")]


# -- typed views --------------------------------------------------------------------------------------------


def test_typed_views() -> None:
    p = props(
        P("Arguments", "-a 'b c' \"d\""),
        P("Dependency", "12", condition="OnExit", code=3),
        P("Dependency", "prep", designator="JobName"),
        P("ResourceLimit", 100, name="CPUTime"),
        P("ResourceLimit", "unlimited", name="OpenFiles", type="Hard"),
        P("TaskDistribution", "{1}{2}", type="Geometry"),
        P("Extension", '{"a": [1, 2]}', name="k", type="CustomAttribute"),
    )
    assert p.arguments == ["-a", "b c", "d"]
    deps = p.dependencies
    assert (deps[0].condition, deps[0].code, deps[1].designator) == ("OnExit", 3, "JobName")
    lims = p.resource_limits
    assert (lims[0].resource, lims[0].value, lims[1].value, lims[1].kind) == ("RLIMIT_CPU", 100, -1, "Hard")
    assert p.task_distribution is not None and p.task_distribution.type == "Geometry"
    assert p.custom_attributes == {"k": {"a": [1, 2]}}
    with pytest.raises(SssError, match="quotes"):
        _ = props(P("Arguments", "'unbalanced")).arguments


def test_states_map_both_ways() -> None:
    assert sss_state(JobState.QUEUED) == "Idle" and sss_state(JobState.QUEUED, held=True) == "Hold"
    assert [sss_state(s) for s in (JobState.ACTIVE, JobState.COMPLETED, JobState.FAILED)] == [
        "Running",
        "Completed",
        "Failed",
    ]
    for s in JobState:
        assert job_state(sss_state(s)) is s
    assert job_state("Suspended") is None


# -- streams and limits ---------------------------------------------------------------------------------------


def test_streams_follow_redirect_lists() -> None:
    s = streams(
        props(
            P("OutputFile", "~/job.out", redirectList="Append,Flush"),
            P("ErrorFile", "", redirectList="Merge"),
            P("InputFile", "", redirectList="Close"),
        )
    )
    assert (s.stdout, s.stdout_append, s.merge, s.stdin_closed, s.stderr) == ("~/job.out", True, "stdout", True, None)
    with pytest.raises(SssError, match="each would go into the other"):
        streams(props(P("OutputFile", "", redirectList="Merge"), P("ErrorFile", "", redirectList="Merge")))
    with pytest.raises(SssError, match="discards"):
        streams(props(P("OutputFile", "/tmp/x", redirectList="Close")))


def test_rlimit_settings() -> None:
    p = props(
        P("ResourceLimit", 100, name="CPUTime"),
        P("ResourceLimit", 10, name="OpenFiles", type="Soft"),
        P("ResourceLimit", 20, name="OpenFiles", type="Hard"),
        P("ResourceLimit", "unlimited", name="CoreFileSize", type="Hard"),
    )
    got = {s.resource: (s.soft, s.hard) for s in rlimit_settings(p.resource_limits)}
    assert got == {"RLIMIT_CPU": (100, 100), "RLIMIT_NOFILE": (10, 20), "RLIMIT_CORE": (None, UNLIMITED)}
    bad = props(
        P("ResourceLimit", 30, name="OpenFiles", type="Soft"), P("ResourceLimit", 20, name="OpenFiles", type="Hard")
    )
    with pytest.raises(SssError, match="above the hard"):
        rlimit_settings(bad.resource_limits)


# -- PSI/J <-> SSS ------------------------------------------------------------------------------------------------

_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00\ufffe\uffff", min_codepoint=9),
    max_size=20,
).filter(lambda s: all(c in "\t\n\r" or ord(c) >= 32 for c in s))
_opt = st.none() | _text
_scalar: st.SearchStrategy[Any] = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text


@st.composite
def descriptions(draw: st.DrawFn) -> JobDescription:
    nodes = draw(st.none() | st.integers(1, 4))
    ppn = draw(st.none() | st.integers(1, 4))
    if nodes is not None and ppn is not None:
        count = nodes * ppn
    else:
        count = draw(st.integers(max(nodes or 1, 1), 16))
        if ppn is not None:
            count = ppn * draw(st.integers(1, 4))
    res = ResourceRequest(
        process_count=count,
        node_count=nodes,
        processes_per_node=ppn,
        cpu_cores_per_process=draw(st.integers(1, 8)),
        gpu_cores_per_process=draw(st.integers(0, 2)),
        memory_per_process=draw(st.integers(0, 2**40)),
        exclusive_node_use=draw(st.booleans()),
    )
    return JobDescription(
        executable=draw(_text.filter(lambda s: bool(s) and not s.startswith("#"))),
        arguments=draw(st.lists(_text, max_size=4)),
        directory=draw(st.none() | st.just("/tmp/x y")),
        name=draw(_opt),
        inherit_environment=draw(st.booleans()),
        environment=draw(
            st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True), _text, max_size=3)
        ),
        stdin_path=draw(_opt),
        stdout_path=draw(_opt),
        stderr_path=draw(_opt),
        pre_launch=draw(_opt),
        post_launch=draw(_opt),
        launcher=draw(st.sampled_from(["single", "multiple", "mpirun", "srun"])),
        resources=res,
        duration=draw(st.none() | st.floats(0.001, 1e7)),
        queue_name=draw(_opt),
        project_name=draw(_opt),
        reservation_id=draw(_opt),
        custom_attributes=draw(st.dictionaries(_text, _scalar, max_size=3)),
        submit_directory=draw(_opt),
    )


@settings(max_examples=150, deadline=None)
@given(descriptions())
def test_psij_maps_to_sss_and_back_without_loss(d: JobDescription) -> None:
    job = to_sss(d)
    assert len(job.task_groups) == 1
    assert from_sss(job) == d
    # ... and through SSS XML too
    back = read_job(write_job(job)).value
    assert isinstance(back, Job)
    assert from_sss(back) == d


def test_psij_mapping_uses_the_spec_names() -> None:
    d = JobDescription(
        executable="/bin/app",
        arguments=["-n", "3"],
        environment={"A": "1"},
        resources=ResourceRequest(process_count=4, node_count=2, cpu_cores_per_process=2, memory_per_process=2**20),
        duration=60.0,
        queue_name="q",
    )
    xml = write_job(to_sss(d))
    for fragment in (
        "<Executable>/bin/app</Executable>",
        "<Arguments>-n 3</Arguments>",
        '<Variable name="A">1</Variable>',
        "<TaskCount>4</TaskCount>",
        "<Processors>8</Processors>",
        "<NodeCount>2</NodeCount>",
        '<Memory units="B">1048576</Memory>',
        "<Duration>60</Duration>",
        "<Queue>q</Queue>",
    ):
        assert fragment in xml


def test_from_sss_refuses_what_psij_cannot_hold() -> None:
    job = read_job("<Job><Executable>x</Executable><TaskGroup><Feature>ib</Feature></TaskGroup></Job>").value
    assert isinstance(job, Job)
    with pytest.raises(SssError, match="Feature"):
        from_sss(job)
    two = Job(props(P("Executable", "x")), [TaskGroup(), TaskGroup()])
    with pytest.raises(SssError, match="several TaskGroups"):
        from_sss(two)


def test_description_of_a_task_group_for_the_launchers() -> None:
    group = read_job((Path(__file__).parent / "data" / "sss_elaborate.xml").read_text()).value
    assert isinstance(group, JobGroup)
    _, second = effective_jobs(group)
    master = second.task_groups[0]
    d = description(second, master)
    assert d.executable == "/usr/local/bin/stage-coordinator"
    assert d.environment == {"LD_LIBRARY_PATH": "/usr/lib", "PATH": "/usr/bin:~/bin:"}
    assert d.duration == 43200 and d.name == "3-Phase Ascension"
    assert d.resources.memory_per_process == 2048 * 2**20


# -- status for `pilot show --xml` ------------------------------------------------------------------------------


def test_job_with_status_shows_state_delivered_and_placed_tasks() -> None:
    from pilot.model.sss.status import JobStatus, TaskStatus, job_with_status

    group = read_job((Path(__file__).parent / "data" / "sss_elaborate.xml").read_text()).value
    assert isinstance(group, JobGroup)
    job = group.jobs[1]
    status = JobStatus(
        id="42",
        state=JobState.FAILED,
        exit_code=3,
        message="rank 2 exited with code 3 on node n2",
        start_time=1000.5,
        end_time=1010.0,
        delivered={
            "wall_duration": 9.5,
            "user_cpu_time": 1.25,
            "system_cpu_time": 0.5,
            "processors": 13,
            "consumption_rate": 0.0141,
            "max_rss": 5 * 2**20,
            "nodes": ["n1", "n2"],
        },
        tasks=[TaskStatus(0, 0, "n1", [0], process=999)]
        + [TaskStatus(1, i, f"n{1 + i % 2}", [i], exit_code=3 if i == 2 else 0) for i in range(12)],
    )
    shown = job_with_status(job, status)
    xml = write_job(shown)
    back = read_job(xml)
    assert back.warnings == () and back.value == shown
    p = shown.properties
    assert (p.id, p.state, p.text("ExitCode"), p.text("StartTime")) == ("42", "Failed", "3", "1000")
    dlv = {d.name: d for d in p.delivered or []}
    assert dlv["Processors"].value == "13" and dlv["Processors"].get("consumptionRate") == "0.0141"
    assert dlv["Memory"].value == str(5 * 2**20) and dlv["NodeCount"].value == "2"
    assert dlv["CpuDuration"].value == "1.75"
    master, slave = shown.task_groups
    assert [t.properties.text("Node") for t in master.tasks] == ["n1"]
    assert master.tasks[0].properties.text("Process") == "999"
    assert len(slave.tasks) == 12 and slave.tasks[2].properties.text("ExitCode") == "3"
    assert slave.tasks[3].properties.extension("Cores") == "3"
    assert "<Task>" in xml and "<Node>n2</Node>" in xml
    assert sss_state(JobState.QUEUED, held=True) == "Hold"
