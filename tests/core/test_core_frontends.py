"""One job shape: every language compiles to one Request, and the core, the scheduler and the launchers
plan from it. A new language is one front-end module; task groups are planned from their placement."""

from __future__ import annotations

from typing import Any

import pytest
from core_env import CLIENT, CoreEnv, true

from pilot import frontends
from pilot.frontends import FrontEnd
from pilot.model.job_description import DescriptionError, JobDescription, ResourceRequest
from pilot.model.job_state import JobState
from pilot.request import Request, Submission
from pilot.scheduler.cluster import Cluster

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


def test_a_document_carries_no_submit_id_and_a_plain_job_does() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (refused,) = env.core.on_submit(CLIENT, [{"sss": GROUPS}], ["k1"])
    assert "carries no submit id" in refused["error"]
    (accepted,) = env.core.on_submit(CLIENT, [true().to_wire()], ["k2"])
    (again,) = env.core.on_submit(CLIENT, [true().to_wire()], ["k2"])
    assert accepted["id"] == again["id"]  # the same submit id is the same job: it never runs twice


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
