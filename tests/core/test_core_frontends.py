"""One job shape: every language compiles to one Request, and the core, the scheduler and the launchers
plan from it. A new language is one front-end module; task groups are planned from their placement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from core_env import CLIENT, CoreEnv, true

from pilot import frontends
from pilot.core.admission import ABANDONED
from pilot.frontends import FrontEnd
from pilot.model.job_description import DescriptionError, JobDescription, ResourceRequest
from pilot.model.job_state import JobState
from pilot.request import Request, Submission
from pilot.scheduler.cluster import Cluster
from pilot.store import Store

pytestmark = pytest.mark.timeout(10)


class Lines:
    """A toy language: one command per line, each a job (the sort of thing JRDL adds for real)."""

    def compile_entry(self, entry: Any, *, cluster: Cluster) -> Submission:
        text = entry["lines"]
        if not isinstance(text, str) or not text.strip():
            raise DescriptionError("a lines document holds one command per line; it is empty")
        requests, entries = [], []
        for line in text.splitlines():
            executable, *arguments = line.split()
            d = JobDescription(executable=executable, arguments=arguments)
            requests.append(Request.of_description(d))
            entries.append({**d.to_wire(), "lines": line})
        return Submission(requests, entries, document=True)

    def rebuild(self, description: JobDescription, extra: dict[str, Any], *, cluster: Cluster) -> Request:
        return Request.of_description(description)


def test_a_new_language_is_one_frontend(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: FrontEnd = Lines()
    monkeypatch.setitem(frontends.DOCUMENTS, "lines", lines)
    env = CoreEnv(cores=2)
    env.register("n0")
    (result,) = env.core.on_submit(CLIENT, [{"lines": "/bin/echo a\n/bin/echo b c"}], None)
    a, b = result["ids"]
    (refused,) = env.core.on_submit(CLIENT, [{"lines": ""}], None)
    assert "it is empty" in refused["error"]
    step = env.step()
    orders = {o["job_id"]: o for o in step.orders("n0")}
    assert (orders[a]["executable"], orders[a]["arguments"]) == ("/bin/echo", ["a"])
    assert (orders[b]["executable"], orders[b]["arguments"]) == ("/bin/echo", ["b", "c"])
    env.exited("n0", a)
    env.exited("n0", b, code=3)
    env.step()
    assert env.state(a) is JobState.COMPLETED and env.state(b) is JobState.FAILED


GROUPS = """
<Job>
  <Executable>/bin/true</Executable>
  <TaskGroup><Name>master</Name><TaskCount>1</TaskCount></TaskGroup>
  <TaskGroup>
    <Name>workers</Name><TaskCount>3</TaskCount>
    <Task><Executable>/bin/echo</Executable><Arguments>second</Arguments></Task>
  </TaskGroup>
</Job>
"""


def test_task_groups_are_planned_from_their_placement() -> None:
    env = CoreEnv(cores=4)
    env.register("n0")
    (result,) = env.core.on_submit(CLIENT, [{"sss": GROUPS}], None)
    (jid,) = result["ids"]
    step = env.step()
    orders = sorted(step.orders("n0"), key=lambda o: o["slot"])
    assert [o["slot"] for o in orders] == [0, 1, 2, 3]
    labels = [(o["rank_environment"]["PILOT_TASK_GROUP"], o["rank_environment"]["PILOT_TASK_ID"]) for o in orders]
    assert labels == [("0", "0"), ("1", "0"), ("1", "1"), ("1", "2")]
    assert [o["rank_environment"]["PILOT_RANK"] for o in orders] == ["0", "1", "2", "3"]  # the job's rank numbers
    assert sorted(c for o in orders for c in o["cores"]) == [0, 1, 2, 3]  # each task on its own core
    # The worker group's first Task element runs its own executable; the others run the template.
    assert [o["executable"] for o in orders] == ["/bin/true", "/bin/echo", "/bin/true", "/bin/true"]
    assert not any(o["truncate_output"] for o in orders)  # four processes share the job's files
    for o in orders:
        env.exited("n0", jid, o["slot"])
    env.step()
    status = env.told(jid)
    assert status[1] == "COMPLETED"
    assert [t[:2] for t in status[5]["tasks"]] == [[0, 0], [1, 0], [1, 1], [1, 2]]


def test_a_document_and_a_plain_job_each_travel_under_one_submit_id() -> None:
    """A document's jobs all share its submit id: sent again (its answer lost), it is the same jobs,
    followed again with their statuses and warnings, not a second set (issue 19)."""
    env = CoreEnv(cores=4)
    env.register("n0")
    (first,) = env.core.on_submit(CLIENT, [{"sss": GROUPS}], ["k1"])
    (again,) = env.core.on_submit(b"other-client", [{"sss": GROUPS}], ["k1"])
    assert again["ids"] == first["ids"] and again["warnings"] == first["warnings"]
    assert [s[1] for s in again["statuses"]] == ["QUEUED"]
    assert b"other-client" in env.job(first["ids"][0]).subscribers
    (accepted,) = env.core.on_submit(CLIENT, [true().to_wire()], ["k2"])
    (plain_again,) = env.core.on_submit(CLIENT, [true().to_wire()], ["k2"])
    assert accepted["id"] == plain_again["id"]  # the same submit id is the same job: it never runs twice
    assert sorted(env.core.book.jobs) == sorted([*first["ids"], accepted["id"]])


JOB_GROUP = """<JobGroup><Id>g</Id>
  <Job><Id>a</Id><Executable>/bin/true</Executable></Job>
  <Job><Id>b</Id><Executable>/bin/true</Executable><Dependency>a</Dependency></Job>
  <Job><Id>c</Id><Executable>/bin/true</Executable></Job>
</JobGroup>"""


def test_a_job_groups_submit_id_finds_all_its_jobs_in_the_journal_after_a_restart(tmp_path: Path) -> None:
    env = CoreEnv(cores=1, store=Store.open(tmp_path / "journal.db"))
    env.register("n0")
    (made,) = env.core.on_submit(CLIENT, [{"sss": JOB_GROUP}], ["doc-1"])
    assert len(made["ids"]) == 3
    env.step()  # committed: from now on only the journal knows the submit id
    assert not env.core.book.fresh_by_submit_id
    again = env.restarted(tmp_path / "journal.db")
    (answer,) = again.core.on_submit(CLIENT, [{"sss": JOB_GROUP}], ["doc-1"])
    assert answer["ids"] == made["ids"] and len(answer["statuses"]) == 3
    assert sorted(again.core.book.jobs) == sorted(made["ids"])  # nothing made twice


def test_giving_up_a_documents_submit_id_cancels_every_job_it_made(tmp_path: Path) -> None:
    env = CoreEnv(cores=1, store=Store.open(tmp_path / "journal.db"))
    env.register("n0")
    (made,) = env.core.on_submit(CLIENT, [{"sss": JOB_GROUP}], ["doc-1"])
    env.step()
    results = env.core.on_abandon(["doc-1"])
    assert results == [{"submit_id": "doc-1", "ids": made["ids"]}]
    env.step()
    for job_id in made["ids"]:
        if env.core.book.jobs.get(job_id) is not None and env.job(job_id).run.processes:
            env.exited("n0", job_id, code=-15)
    env.step()
    assert {env.state(job_id) for job_id in made["ids"]} == {JobState.CANCELED}
    (late,) = env.core.on_submit(CLIENT, [{"sss": JOB_GROUP}], ["doc-1"])
    assert late == {"error": ABANDONED}


def test_both_shapes_share_one_queue_and_one_never_fits() -> None:
    env = CoreEnv(cores=2)
    env.register("n0")
    (too_big,) = env.core.on_submit(CLIENT, [true(resources=ResourceRequest(cpu_cores_per_process=3)).to_wire()], None)
    assert too_big["error"].startswith("the job can never run in this allocation: it ")
    (too_wide,) = env.core.on_submit(
        CLIENT,
        [{"sss": "<Job><Executable>/bin/true</Executable><TaskGroup><TaskCount>3</TaskCount></TaskGroup></Job>"}],
        None,
    )
    assert "can never run in this allocation" in too_wide["error"] and too_wide["error"].startswith("Job (line 1) ")
    (plain,) = env.submit(true())
    (result,) = env.core.on_submit(CLIENT, [{"sss": "<Job><Executable>/bin/true</Executable></Job>"}], None)
    (grouped,) = result["ids"]
    step = env.step()
    assert sorted(o["job_id"] for o in step.orders("n0")) == sorted([plain, grouped])
    assert env.job(plain).run.placement is None and env.job(grouped).run.placement is not None
