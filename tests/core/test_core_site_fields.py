"""A job naming a queue, project or reservation (PSI/J ``queue_name``, ``project_name``,
``reservation_id``; SSS <Queue>, <Project>, <Reservation>) runs only in allocations of a site that has
it, and is refused at submit when no site does (issue 20, what to add 3: they were silently dropped)."""

from __future__ import annotations

import pytest
from core_env import CLIENT, CoreEnv, true

from pilot import lrm
from pilot.allocations import Site

pytestmark = pytest.mark.timeout(10)


def test_a_queue_no_site_has_is_refused_saying_what_each_site_has() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (refused,) = env.core.on_submit(CLIENT, [true(queue_name="debug", project_name="chem").to_wire()], None)
    assert refused["error"] == (
        "JobAttributes.queue_name = 'debug', JobAttributes.project_name = 'chem': no allocation of this pilot runs "
        "there (site 'main' (local): no queues, no projects); leave it unset (the pilot places the job in its "
        "own allocations) or give the pilot a site with it"
    )
    doc = "<Job><Executable>/bin/true</Executable><Reservation>r42</Reservation></Job>"
    (sss,) = env.core.on_submit(CLIENT, [{"sss": doc}], None)
    assert "JobAttributes.reservation_id = 'r42': no allocation of this pilot runs there" in sss["error"], sss


def test_a_job_naming_a_sites_partition_runs_only_in_that_sites_allocations() -> None:
    env = CoreEnv(cores=2)
    slurm = lrm.create("slurm", options={"partition": "debug", "account": "chem"}, source="<test>")
    env.allocations.sites.append(Site(env.allocations.sites[0].settings, slurm))  # a second site, no allocation yet
    env.register("n0")
    (wrong,) = env.core.on_submit(CLIENT, [true(queue_name="batch").to_wire()], None)
    assert "site 'main' (local): no queues; site 'main' (slurm): partition 'debug'" in wrong["error"], wrong
    (debug,) = env.submit(true(queue_name="debug", project_name="chem"))
    (plain,) = env.submit(true())
    step = env.step()
    # The local allocation has no partition: only the plain job starts there; the other waits for Slurm's.
    assert [o["job_id"] for o in step.orders("n0")] == [plain]
    assert env.job(debug).phase.journaled == "queued"
