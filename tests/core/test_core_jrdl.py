"""JRDL through the core in process (issue 22): what a document compiles to (orders), what is refused and
how (every job of a document or none), start times and start-before bounds on a passed-in clock,
resource attributes against the nodes' facts, and a document's jobs surviving a daemon restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from core_env import CLIENT, CoreEnv

from pilot import views
from pilot.core.phase import Phase
from pilot.model.job_state import JobState
from pilot.store import Store
from pilot.wire.messages import Heartbeat

pytestmark = pytest.mark.timeout(10)

SUBMITTER = {"HOME": "/home/u", "LOGNAME": "u", "CUR_DIRL": "/work/here"}


def s(value: str) -> str:
    return f'<stringElement value="{value}"/>'


def job(*parts: str, executable: str = "/bin/true") -> str:
    exe = f"<executable><path>{s(executable)}</path></executable>" if executable else ""
    return f"<job>{exe}{''.join(parts)}</job>"


def doc(*jobs: str, defs: str = "") -> str:
    return f"<jrdl>{defs}{''.join(jobs)}</jrdl>"


def submit(env: CoreEnv, document: str, submitter: dict[str, str] | None = None) -> dict[str, Any]:
    who = SUBMITTER if submitter is None else submitter
    (result,) = env.core.on_submit(CLIENT, [{"jrdl": document, "submitter": who}], None)
    return result


def ids(env: CoreEnv, document: str) -> list[str]:
    result = submit(env, document)
    assert "ids" in result, result
    return [str(i) for i in result["ids"]]


def later(env: CoreEnv, seconds: float, *nodes: str) -> None:
    """``seconds`` pass (the agents keep beating) and the daemon's tick comes."""
    env.advance(seconds)
    env.heartbeat(*(nodes or ("n0",)))
    env.core.on_tick()


def ranks(env: CoreEnv, node: str = "n0") -> list[dict[str, Any]]:
    return [o for o in env.step().orders(node) if o["role"] == "rank"]


REFUSED = [
    # (document, what the error says)
    ("<jrdl", "JRDL document is not well-formed"),
    ('<!DOCTYPE jrdl [<!ENTITY x "y">]><jrdl/>', "may not contain a DTD, entity declarations"),
    ("<Job/>", "line 1, <Job>: is not a JRDL document: its root element must be <jrdl>"),
    ("<jrdl/>", "<jrdl>: holds no <job>: nothing to run"),
    (doc(job(executable="")), "names no <executable>: give one in the job or in the subjob"),
    (doc(job("<arguments/>")), "<arguments>: takes exactly one <stringArray>, not 0"),
    (doc(job("<walltime/>")), "<walltime>: is not a JRDL element inside <job>; allowed: executable,"),
    (
        doc(job(f"<executable><path>{s('x')}</path></executable>")),
        "<executable>: appears twice in <job> (first on line 1); keep one",
    ),
    (doc(job('<count><integer value="0"/></count>')), '<integer>: value="0" must be a whole number of at least 1'),
    (
        doc(job("<jobType><enumeration><enumerationValue><mpi/></enumerationValue></enumeration></jobType>")),
        "<mpi/> is not known here: use one of <single/>, <xmpi/>, <htc/>",
    ),
    (
        doc(job('<arguments><stringArray><string><substitutionRef name="NOPE"/></string></stringArray></arguments>')),
        'substitutionRef name="NOPE" is not defined: add <substitutionDef name="NOPE"> before it',
    ),
    (
        doc(job('<directory><path><substitutionRef name="GLOBUS_LOCATION"/></path></directory>')),
        'substitutionRef name="GLOBUS_LOCATION" names a Globus installation, which this pilot does not use',
    ),
    (
        doc(job('<directory><path><substitutionRef name="X509_CERT_DIR"/></path></directory>')),
        "names a Globus certificate directory",
    ),
    (
        doc(job('<stdin><path><substitutionRef name="GLOBUSRUN_GASS_URL"/></path></stdin>')),
        "names a GASS server started by globusrun",
    ),
    (
        doc(job('<stdin><path><substitutionRef name="GLOBUS_RMS_JOB_CONTACT"/></path></stdin>')),
        "names a Globus resource manager's contact",
    ),
    (
        doc(job('<directory><path><substitutionRef name="JOBID"/></path></directory>')),
        "<directory> uses JOBID, which is known only once the job runs",
    ),
    (
        doc(job(f"<stdin><path>{s('gsiftp://ip/path/file')}</path></stdin>")),
        "'gsiftp://ip/path/file' is a remote URL; give a path on the nodes (<fileStageIn> brings a file there first)",
    ),
    (
        doc(job("<jobStartTime>2004-10-21T01:10:00Z</jobStartTime><jobStartBefore>PT10H3M</jobStartBefore>")),
        "<jobStartBefore>: and <jobStartTime> (line 1) are mutually exclusive (the spec says so); keep one",
    ),
    (doc(job("<jobStartTime>2004-10-21T01:10:00</jobStartTime>")), "has no time zone; add Z (UTC)"),
    (doc(job("<jobStartTime>tomorrow</jobStartTime>")), "'tomorrow' is not a dateTime"),
    (doc(job("<jobDuration>P1M</jobDuration>")), "counts years or months, which have no fixed length"),
    (doc(job("<jobDuration>10 hours</jobDuration>")), "'10 hours' is not an ISO 8601 duration"),
    (doc(job("<fileStageIn/>")), "<fileStageIn>: takes exactly one <fileInputArray>, not 0"),
    (doc(job("<fileStageOut/>")), "<fileStageOut>: takes exactly one <fileOutputArray>, not 0"),
    (doc(job("<fileCleanUp/>")), "<fileCleanUp>: takes exactly one <pathArray>, not 0"),
    (
        doc(
            job(
                '<fileStageIn><fileInputArray><fileInput><url><urlElement value="gsiftp://ip/f"/></url>'
                f"<path>{s('f')}</path></fileInput></fileInputArray></fileStageIn>"
            )
        ),
        "<fileStageIn>: 'gsiftp://ip/f' uses the URL scheme 'gsiftp', which this pilot cannot transfer; use one of "
        "file, http, https",
    ),
    (
        doc(
            job(
                "<fileStageOut><fileOutputArray><fileOutput>"
                f'<path>{s("../out")}</path><url><urlElement value="/tmp/x"/></url>'
                "</fileOutput></fileOutputArray></fileStageOut>"
            )
        ),
        "<fileStageOut>: '../out' leaves the job's directory",
    ),
    (
        doc(
            job(
                f"<fileStageIn><fileInputArray><fileInput><path>{s('f')}</path></fileInput>"
                "</fileInputArray></fileStageIn>"
            )
        ),
        "<fileInput>: needs both a <url> and a <path>",
    ),
    (doc(job("<subjob><resourceManagerContact/></subjob>")), "<resourceManagerContact>: takes exactly one <string>"),
    (doc(job("<subjob><jobManagerType/></subjob>")), "<jobManagerType>: takes exactly one <enumeration>"),
    (
        doc(
            job(
                f"<subjob><resourceManagerContact><string>{s('http://eros01:8080')}</string></resourceManagerContact>"
                "</subjob>"
            )
        ),
        "<resourceManagerContact> 'http://eros01:8080' names no site or allocation of this pilot; known: main, main/a1",
    ),
    (
        doc(
            job(
                "<subjob><jobManagerType><enumeration><enumerationValue><pbs/></enumerationValue></enumeration>"
                "</jobManagerType></subjob>"
            )
        ),
        "<jobManagerType> pbs: no site of this pilot is a pbs site; its sites: main (fork)",
    ),
    (
        doc(
            job(
                "<subjob><jobManagerType><enumeration><enumerationValue><lsf/></enumerationValue></enumeration>"
                "</jobManagerType></subjob>"
            )
        ),
        "<lsf/> is not known here: use one of <fork/>, <pbs/>",
    ),
    (  # the node reports no clock (as in a container without cpufreq): it cannot meet a clock minimum
        doc(job('<resource><processor><clockSpeed><integer value="1000"/></clockSpeed></processor></resource>')),
        "1 of 1 node(s) excluded because clock_mhz>=1000 cannot be checked: the node reports no clock_mhz",
    ),
    (
        doc(job(f"<resource><schedulingPlugin><string>{s('Fancy')}</string></schedulingPlugin></resource>")),
        "'Fancy' is not a scheduling plug-in of this pilot; its plug-ins: Default",
    ),
    (
        doc(job(f"<resource><schedulingType><string>{s('fork')}</string></schedulingType></resource>")),
        "this pilot places every job with its scheduler",
    ),
    (
        doc(job('<count><integer value="2"/></count><resource><count><integer value="3"/></count></resource>')),
        "<count> 2 contradicts <resource><count> 3",
    ),
    (
        doc(job("<subjob/><subjob/>", '<resource><count><integer value="1"/></count></resource>')),
        "its subjobs ask for 2 CPUs, more than the job's count of 1",
    ),
    (
        doc(job('<count><integer value="5"/></count>')),  # a single process of 5 cores; nodes have 4
        "(line 1) can never run in this allocation: <job> #2 (line 1): 1 of 1 node(s) excluded",
    ),
    (
        doc(job('<environment><hashtable><entry name="1A">' + s("x") + "</entry></hashtable></environment>")),
        'name="1A" is not a valid environment variable name',
    ),
    (doc(job("<directory><path>text</path></directory>")), "holds text 'text'; write it as <stringElement"),
]


@pytest.mark.parametrize(("document", "error"), REFUSED)
def test_refused_documents_name_the_element_and_nothing_is_accepted(document: str, error: str) -> None:
    env = CoreEnv(cores=4)
    env.register("n0")
    good = job('<arguments><stringArray><string><stringElement value="ok"/></string></stringArray></arguments>')
    two = document.replace("<jrdl>", "<jrdl>" + good, 1) if document.startswith("<jrdl>") else document
    result = submit(env, two)
    assert "error" in result and error in result["error"], result
    assert env.core.book.seq == 0 and not env.core.book.jobs  # the good first job was not accepted either


def test_a_relative_directory_is_the_submitters_and_one_without_a_directory_runs_there() -> None:
    env = CoreEnv(cores=4)
    env.register("n0")
    ids(env, doc(job("<directory><path>" + s("sub/../rel") + "</path></directory>"), job()))
    orders = ranks(env)
    assert sorted(o["directory"] for o in orders) == ["/work/here", "/work/here/rel"]
    refused = submit(env, doc(job("<directory><path>" + s("rel") + "</path></directory>")), {})
    assert "is relative and the submission does not say the submitter's directory" in refused["error"]


def test_host_facts_need_nodes_that_agree() -> None:
    env = CoreEnv(cores=1)
    ref = '<string><substitutionRef name="GLOBUS_HOST_OSNAME"/></string>'
    ref = f"<arguments><stringArray>{ref}</stringArray></arguments>"
    refused = submit(env, doc(job(ref)))
    assert "cannot be resolved: no node has registered yet" in refused["error"]
    env.register("n0")  # this env's nodes report no architecture
    assert "the nodes do not report their architecture and operating system" in submit(env, doc(job(ref)))["error"]
    cluster = env.core.nodes.cluster
    cluster.nodes["n0"].values.report_load(cluster.registry, {"opsys": "Linux 6.1", "arch": "x86_64"})
    ids(env, doc(job(ref)))
    assert [o["arguments"] for o in ranks(env)] == [["Linux"]]


def test_job_start_time_waits_and_explain_says_until_when() -> None:
    env = CoreEnv(cores=2)
    env.register("n0")
    # The env's clock reads 1_000_000 s: 1970-01-12T13:46:40Z. The job may start 100 s later.
    (jid,) = ids(env, doc(job("<jobStartTime>1970-01-12T13:48:20.000Z</jobStartTime>")))
    assert ranks(env) == []
    assert env.job(jid).phase is Phase.BLOCKED
    (reason,) = views.explain(env.core, jid)["reasons"]
    assert reason == "it does not start before its start time (JRDL jobStartTime) 1970-01-12T13:48:20Z, in 100 s"
    later(env, 99)
    assert ranks(env) == []
    later(env, 1)
    assert [o["job_id"] for o in ranks(env)] == [jid]
    (y2004,) = ids(env, doc(job("<jobStartTime>2004-10-21T01:10:00.000+09:00</jobStartTime>")))
    assert env.core.clock.wall < 1098288600  # 2004 is still to come for this clock: it waits
    assert env.job(y2004).phase is Phase.BLOCKED


def test_job_start_before_fails_a_job_not_started_in_time_and_duration_is_its_walltime() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (busy,) = ids(env, doc(job("<jobDuration>PT1H</jobDuration>")))
    (late,) = ids(env, doc(job("<jobStartBefore>PT10S</jobStartBefore>")))
    (order,) = ranks(env)
    assert order["job_id"] == busy and order["walltime"] == 3600.0
    reasons = views.explain(env.core, late)["reasons"]
    assert reasons[0] == "it ends FAILED if not started by 1970-01-12T13:46:50Z (JRDL jobStartBefore), in 10 s"
    env.started("n0", busy)
    later(env, 9)
    env.step()
    assert env.job(late).state is JobState.QUEUED
    later(env, 1)
    env.step()
    status = env.told(late)
    assert status[1] == "FAILED"
    assert status[4] == (
        "not started: it had to start within 10 s of its submission (JRDL jobStartBefore), and it could not"
    )
    env.exited("n0", busy)
    (soon,) = ids(env, doc(job("<jobStartBefore>PT10H3M</jobStartBefore>")))
    assert [o["job_id"] for o in ranks(env)] == [soon]  # room now: it starts, and the bound is behind it
    later(env, 3)
    later(env, 36180)
    assert env.job(soon).state is not JobState.FAILED


def test_resource_attributes_are_node_requirements_on_the_nodes_facts() -> None:
    env = CoreEnv(nodes=2, cores=4)
    env.register("n0")
    env.register("n1")
    cluster = env.core.nodes.cluster
    for name, load, free in (("n0", 0.95, "8G"), ("n1", 0.2, "100M")):
        values = {"np_load_long": load, "np_load_short": 0.0, "mem_free": free, "opsys": "Linux 6.1"}
        values["disk_free"] = "50G"
        cluster.nodes[name].report_load(cluster.registry, values)
        env.core.on_agent(name, Heartbeat())
    light = '<resource><processorLoad><last15Min><integer value="10"/></last15Min></processorLoad></resource>'
    (a,) = ids(env, doc(job(light)))
    assert [o["job_id"] for o in ranks(env, "n1")] == [a]  # n0 is 95 % busy: under 10 % available
    roomy = '<resource><minMainMemory><minRAMAvailable><integer value="1000"/></minRAMAvailable></minMainMemory>'
    roomy += '<minFreeCPU><integer value="4"/></minFreeCPU>'
    roomy += f"<operatingSystem><name><string>{s('Linux')}</string></name></operatingSystem></resource>"
    (b,) = ids(env, doc(job(roomy)))
    assert [o["job_id"] for o in ranks(env, "n0")] == [b]  # only n0 has 1000 MB free
    bsd = f"<resource><operatingSystem><name><string>{s('FreeBSD')}</string></name></operatingSystem></resource>"
    refused = submit(env, doc(job(bsd)))
    assert "can never run in this allocation" in refused["error"] and "opsys=FreeBSD" in refused["error"]


def test_a_document_survives_a_daemon_restart(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=2, store=Store.open(path))
    env.register("n0")
    soon = "<jobStartTime>1970-01-12T13:46:42Z</jobStartTime>"  # 2 s after the env's clock
    streams = "<stdout><pathArray><path>" + s("o1") + "</path><path>" + s("o2") + "</path></pathArray></stdout>"
    (jid,) = ids(env, doc(job(soon, streams, executable="/bin/echo")))
    env.step()
    again = env.restarted(path)  # one second later
    assert again.job(jid).phase is Phase.BLOCKED
    again.register("n0")
    later(again, 1)
    (order,) = ranks(again)
    assert order["executable"] == "/bin/sh" and order["arguments"][3] == "/bin/echo"  # the tee wrapper
    assert "tee o2" in order["arguments"][1] and order["stdout_path"] == "o1"
    assert order["directory"] == "/work/here"


def test_host_facts_of_nodes_that_differ_are_refused() -> None:
    env = CoreEnv(nodes=2, cores=1)
    env.register("n0")
    env.register("n1")
    cluster = env.core.nodes.cluster
    for name, arch in (("n0", "x86_64"), ("n1", "aarch64")):
        cluster.nodes[name].values.report_load(cluster.registry, {"opsys": "Linux 6.1", "arch": arch})
    ref = '<arguments><stringArray><string><substitutionRef name="GLOBUS_HOST_CPUTYPE"/></string></stringArray>'
    refused = submit(env, doc(job(ref + "</arguments>")))
    assert "cannot be resolved: the nodes differ (x86_64 Linux 6.1 on n0; aarch64 Linux 6.1 on n1)" in refused["error"]
    defined = '<substitutionDef name="GLOBUS_HOST_CPUTYPE"><stringElement value="any"/></substitutionDef>'
    assert "ids" in submit(env, doc(job(ref + "</arguments>"), defs=defined))  # the document's own wins


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ({"jrdl": 5}, "carries its XML document as text under 'jrdl'"),
        ({"jrdl": doc(job()), "submitter": {"PATH": "/x"}}, "maps HOME, LOGNAME and CUR_DIRL to text"),
        ({"jrdl": doc(job()), "submitter": {"HOME": 1}}, "maps HOME, LOGNAME and CUR_DIRL to text"),
        ({"jrdl": doc(job()), "submitter": ["HOME"]}, "maps HOME, LOGNAME and CUR_DIRL to text"),
    ],
)
def test_malformed_submissions_are_refused(entry: dict[str, Any], error: str) -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (result,) = env.core.on_submit(CLIENT, [entry], None)
    assert error in result["error"] and not env.core.book.jobs


def test_a_start_before_bound_counts_from_the_submission_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=1, store=Store.open(path))
    env.register("n0")
    (busy,) = ids(env, doc(job()))
    (late,) = ids(env, doc(job("<jobStartBefore>PT5S</jobStartBefore>")))
    env.step()
    env.started("n0", busy)
    env.step()
    again = env.restarted(path)  # one second later
    again.register("n0", running=[[busy, 0]])
    later(again, 3)
    assert again.job(late).state is JobState.QUEUED
    later(again, 1)  # five seconds after its submission, not after the restart
    again.step()
    assert again.told(late)[1] == "FAILED" and "(JRDL jobStartBefore)" in again.told(late)[4]
