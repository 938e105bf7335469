"""SSS job and node XML: the spec's three examples (as written and repaired), round trips, the
awareness policy, hostile XML, and errors that name the element and the line."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.formats import read_job, read_nodes, write_job, write_nodes
from pilot.formats.xml import MAX_DEPTH
from pilot.model.node import NodeConfigured
from pilot.model.sss import Job, JobGroup, Properties, Property, SssError, TaskGroup, effective_jobs, node_object

DATA = Path(__file__).parent / "data"


def load(name: str) -> str:
    return (DATA / name).read_text()


def roundtrip(obj: JobGroup | Job) -> JobGroup | Job:
    return read_job(write_job(obj)).value


# -- the spec's examples --------------------------------------------------------------------------------


def test_simple_example() -> None:
    r = read_job(load("sss_simple.xml"))
    assert r.warnings == ()
    job = r.value
    assert isinstance(job, Job)
    p = job.properties
    assert (p.id, p.state, p.executable) == ("PBS.1234.0", "Idle", "/bin/hostname")
    assert p.text("User") == "scottmo"
    assert p.integer("Processors") == 16 and p.duration == 3600
    assert roundtrip(job) == job


def test_moderate_example() -> None:
    job = read_job(load("sss_moderate.xml")).value
    assert isinstance(job, Job)
    p = job.properties
    assert p.name == "Heavy Water"
    assert p.arguments == ["-input", "basis.in"]
    assert p.initial_working_directory == "/home/peterk"
    assert p.environment == {"PATH": "/usr/bin:/home/peterk"}
    req = {q.name: q for q in p.requested or []}
    assert req["Processors"].get("op") == "GE" and req["Processors"].value == "12"
    assert req["Memory"].get("units") == "GB"
    assert p.duration == 3600
    dlv = {q.name: q for q in p.delivered or []}
    assert dlv["Memory"].get("metric") == "Average" and dlv["Memory"].value == "1.89"
    assert roundtrip(job) == job


def test_elaborate_example_as_written_names_line_and_tag() -> None:
    with pytest.raises(SssError) as e:
        read_job(load("sss_elaborate_as_written.xml"))
    err = e.value
    assert err.line == 16
    msg = str(err)
    assert "line 16" in msg and "</JobDefaults>" in msg
    assert "<Environment>" in msg and "line 15" in msg and "write </Environment>" in msg


def test_elaborate_example_second_malformation_is_found_too() -> None:
    text = load("sss_elaborate_as_written.xml").splitlines()
    text[14] = "    </Environment>"  # repair only the first mistake
    with pytest.raises(SssError) as e:
        read_job("\n".join(text))
    msg = str(e.value)
    assert "line 70" in msg and "</TaskGroup>" in msg and "<Memory>" in msg and "line 67" in msg


def test_elaborate_example_repaired() -> None:
    r = read_job(load("sss_elaborate.xml"))
    assert r.warnings == ()
    group = r.value
    assert isinstance(group, JobGroup)
    assert group.properties.id == "workflow1" and group.properties.name == "ShuttleTakeoff"
    assert group.job_defaults is not None and len(group.jobs) == 2
    first, second = effective_jobs(group)
    # JobDefaults are inherited: the Environment, User and Project of the defaults
    assert first.properties.environment == {"LD_LIBRARY_PATH": "/usr/lib", "PATH": "/usr/bin:~/bin:"}
    assert first.properties.text("User") == "keith" and second.properties.text("Project") == "GrandChallenge18"
    assert first.task_groups[0].properties.environment == first.properties.environment
    tg = first.task_groups[0]
    assert tg.properties.task_count == 2 and len(tg.tasks) == 2
    assert [t.properties.text("Node") for t in tg.tasks] == ["node1", "node12"]
    assert second.properties.holds == ["System"]
    master, slave = second.task_groups
    assert master.name == "Master" and slave.name == "Slave"
    assert master.properties.executable == "/usr/local/bin/stage-coordinator"
    res = master.properties.first("Resource")
    assert res is not None and (res.get("name"), res.get("type"), res.value) == ("License", "ESSL2", "1")
    assert slave.properties.task_distribution is not None and slave.properties.task_distribution.value == "RoundRobin"
    assert [p.get("group") for p in slave.properties.requested_all("Processors")] == ["1", "-1"]
    assert roundtrip(group) == group


def test_repaired_examples_write_and_read_back_identically() -> None:
    for name in ("sss_simple.xml", "sss_moderate.xml", "sss_elaborate.xml"):
        obj = read_job(load(name)).value
        text = write_job(obj)
        assert write_job(read_job(text).value) == text


# -- awareness policy -------------------------------------------------------------------------------------


def test_unknown_element_is_rejected_by_default_naming_it() -> None:
    xml = "<Job>\n  <Executable>/bin/true</Executable>\n  <Teleport>yes</Teleport>\n</Job>"
    with pytest.raises(SssError) as e:
        read_job(xml)
    assert e.value.line == 3 and "<Teleport>" in str(e.value) and 'awarenessPolicy="Warn"' in str(e.value)


def test_warn_and_ignore_accept_without_the_element() -> None:
    warn = read_job('<Job><Executable>/bin/true</Executable><Teleport awarenessPolicy="Warn">x</Teleport></Job>')
    assert len(warn.warnings) == 1 and "Teleport" in warn.warnings[0]
    assert isinstance(warn.value, Job) and warn.value.properties.first("Teleport") is None
    ignore = read_job('<Job awarenessPolicy="Ignore"><Executable>/bin/true</Executable><Teleport/></Job>')
    assert ignore.warnings == ()


def test_policy_is_inherited_and_overridden_per_element() -> None:
    xml = """<Job awarenessPolicy="Ignore">
  <Executable>/bin/true</Executable>
  <TaskGroup awarenessPolicy="Reject"><Frobnicate>1</Frobnicate></TaskGroup>
</Job>"""
    with pytest.raises(SssError, match="Frobnicate"):
        read_job(xml)
    ok = read_job(xml.replace('<TaskGroup awarenessPolicy="Reject">', "<TaskGroup>"))
    assert ok.warnings == ()


def test_unsupported_value_and_attribute_follow_the_policy() -> None:
    with pytest.raises(SssError, match="interactive"):
        read_job("<Job><Executable>/bin/true</Executable><Interactive>true</Interactive></Job>")
    read_job("<Job><Executable>/bin/true</Executable><Interactive>false</Interactive></Job>")
    with pytest.raises(SssError, match="colour="):
        read_job('<Job><Executable colour="red">/bin/true</Executable></Job>')
    r = read_job('<Job><Executable colour="red" awarenessPolicy="Warn">/bin/true</Executable></Job>')
    assert r.warnings and isinstance(r.value, Job) and r.value.properties.executable == "/bin/true"
    with pytest.raises(SssError, match="dynamic"):
        read_job('<Job><Executable>x</Executable><Processors dynamic="true">4</Processors></Job>')


def test_invalid_policy_value_is_an_error() -> None:
    with pytest.raises(SssError, match="Reject, Warn or Ignore"):
        read_job('<Job awarenessPolicy="Maybe"><Executable>x</Executable></Job>')


def test_job_only_property_in_a_task_group_is_not_understood() -> None:
    with pytest.raises(SssError, match="move it to the Job"):
        read_job("<Job><Executable>x</Executable><TaskGroup><Hold>User</Hold></TaskGroup></Job>")


# -- malformed input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("xml", "fragment"),
    [
        ("<Job><Executable>x</Executable><Processors>many</Processors></Job>", "not an integer"),
        ("<Job><Executable>x</Executable><Executable>y</Executable></Job>", "more than once"),
        ("<Job><Executable>x</Executable><Resource>1</Resource></Job>", "name="),
        ("<Job><Executable>x</Executable><Environment><Variable>v</Variable></Environment></Job>", "name="),
        ("<Job><Executable>x<Arguments>a</Arguments></Executable></Job>", "holds only text"),
        ("<Task><Id>1</Id></Task>", "root element"),
        ("<JobGroup><Id>g</Id></JobGroup>", "holds no <Job>"),
        ('<Job><Executable>x</Executable><Requested><Processors op="ABOUT">4</Processors></Requested></Job>', "op="),
        ("<Job><Executable>x</Executable><Requested><Executable>y</Executable></Requested></Job>", "Requested"),
        ("<Job><Executable>x</Executable><StartTime>-5</StartTime></Job>", "negative"),
        ("", "empty"),
    ],
)
def test_malformed_inputs_name_the_element(xml: str, fragment: str) -> None:
    with pytest.raises(SssError) as e:
        read_job(xml)
    assert fragment in str(e.value)


def test_errors_carry_element_path_and_line() -> None:
    xml = "<JobGroup>\n<Id>g</Id>\n<Job>\n<Executable>x</Executable>\n<Duration>soon</Duration>\n</Job>\n</JobGroup>"
    with pytest.raises(SssError) as e:
        read_job(xml)
    assert e.value.line == 5 and e.value.element == "<JobGroup>/<Job>[1]/<Duration>"


# -- hostile XML ------------------------------------------------------------------------------------------

BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
]>
<Job><Executable>&lol3;</Executable></Job>"""

XXE = """<?xml version="1.0"?>
<!DOCTYPE job [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<Job><Executable>&secret;</Executable></Job>"""


@pytest.mark.parametrize("xml", [BILLION_LAUGHS, XXE, '<!DOCTYPE Job SYSTEM "http://x/y.dtd"><Job/>'])
def test_entities_dtds_and_external_references_are_refused(xml: str) -> None:
    with pytest.raises(SssError, match="DTD"):
        read_job(xml)


def test_deep_nesting_and_size_are_bounded() -> None:
    deep = "<Job>" + "<TaskGroup>" * (MAX_DEPTH + 1) + "</TaskGroup>" * (MAX_DEPTH + 1) + "</Job>"
    with pytest.raises(SssError, match="nested"):
        read_job(deep)
    with pytest.raises(SssError, match="limit"):
        read_job("<Job>" + " " * (17 * 1024 * 1024) + "</Job>")


# -- writing -----------------------------------------------------------------------------------------------


def test_writer_escapes_what_xml_would_otherwise_alter() -> None:
    env = Property.of("Environment", "", Property.of("Variable", "a\r\nb<&>\t 'q' \"", name="X"))
    job = Job(Properties.of(Property.of("Executable", " /bin/echo "), env, Property.of("Name", 'a"b\nc')))
    back = roundtrip(job)
    assert back == job
    assert isinstance(back, Job)
    assert back.properties.environment == {"X": "a\r\nb<&>\t 'q' \""}


def test_writer_refuses_characters_xml_cannot_carry() -> None:
    job = Job(Properties.of(Property.of("Executable", "/bin/a\x01b")))
    with pytest.raises(SssError, match="U\\+0001"):
        write_job(job)


_xml_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00\ufffe\uffff", min_codepoint=9),
    max_size=30,
).filter(lambda s: all(c in "\t\n\r" or ord(c) >= 32 for c in s))


@settings(max_examples=60, deadline=None)
@given(
    name=_xml_text,
    executable=_xml_text.filter(lambda s: not s.startswith("#")),
    env=st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), _xml_text, max_size=4),
)
def test_round_trip_property(name: str, executable: str, env: dict[str, str]) -> None:
    variables = tuple(Property.of("Variable", v, name=k) for k, v in env.items())
    tg = TaskGroup(Properties.of(Property.of("TaskCount", 3), Property.of("Name", name)))
    job = Job(
        Properties.of(
            Property.of("Executable", executable),
            Property.of("Environment", "", *variables, export=True),
            requested=[Property.of("Memory", 512, op="GE", units="MB")],
        ),
        [tg],
    )
    assert roundtrip(job) == job


# -- node XML ----------------------------------------------------------------------------------------------

NODE_SIMPLE = """<Node>
  <Id>Node64</Id>
  <Configured>
    <Processors>2</Processors>
    <Memory>512</Memory>
  </Configured>
</Node>"""

NODE_ELABORATE = """<Node>
  <Id>64</Id>
  <Name>Netpipe2</Name>
  <Feature>BigMem</Feature>
  <Feature>NetOC12</Feature>
  <Opsys>AIX</Opsys>
  <Arch>Power4</Arch>
  <Configured>
    <Processors>16</Processors>
    <Memory units="MB">512</Memory>
    <Swap>512</Swap>
  </Configured>
  <Available>
    <Processors>7</Processors>
    <Memory metric="Instantaneous">143</Memory>
  </Available>
  <Utilized>
    <Processors wallDuration="3576">8</Processors>
    <Memory metric="Average" wallDuration="3576">400</Memory>
  </Utilized>
</Node>"""


def test_node_spec_examples() -> None:
    (simple,) = read_nodes(NODE_SIMPLE)
    assert simple.id == "Node64" and simple.amount("Configured", "Memory") == 512 * 2**20
    (node,) = read_nodes(NODE_ELABORATE)
    assert node.features == ["BigMem", "NetOC12"]
    assert node.amount("Available", "Processors") == 7
    assert node.amount("Utilized", "Memory") == 400 * 2**20
    assert read_nodes(write_nodes([node])) == [node]


def test_node_object_from_an_agent_report_round_trips() -> None:
    nc = NodeConfigured(
        name="n1",
        hostname="host1",
        processors=[0, 1, 2, 3],
        memory=8 * 2**30,
        gpus=[0, 1],
        os="Linux",
        architecture="x86_64",
        features=["ib"],
    )
    obj = node_object(
        nc,
        state="Busy",
        free_processors=1,
        free_gpus=0,
        free_memory=3 * 2**30,
        utilized={"processors": 2.5, "memory": 1.5 * 2**30, "wall_duration": 10},
        resources={"scratch": (100.0, 40.0)},
        attributes={"load_avg": 0.5},
    )
    assert obj.amount("Configured", "Processors") == 4
    assert obj.amount("Available", "Memory") == 3 * 2**30
    assert obj.amount("Configured", "Resource", "GPU") == 2
    assert obj.amount("Available", "Resource", "scratch") == 40
    assert obj.amount("Utilized", "Memory") == 1.5 * 2**30
    text = write_nodes([obj, obj])
    assert text.startswith("<Data>")
    assert read_nodes(text) == [obj, obj]


def test_node_xml_errors_name_the_element() -> None:
    with pytest.raises(SssError, match="no <Id>"):
        read_nodes("<Node><Configured><Processors>2</Processors></Configured></Node>")
    with pytest.raises(SssError, match="not a number"):
        read_nodes("<Node><Id>a</Id><Available><Memory>lots</Memory></Available></Node>")
