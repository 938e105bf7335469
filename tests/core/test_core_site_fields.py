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


def test_the_jobs_own_user_and_machine_are_checked_and_the_awareness_policy_decides() -> None:
    """Uncategorized <User>, <Group>, <GlobalUser>, <Machine> (issue 20: they were ignored): honoured when
    they are this pilot's, else refused -- or accepted with a warning, or silently, as the element's
    awarenessPolicy says."""
    import getpass
    import socket

    env = CoreEnv(cores=1)
    env.register("n0")

    def submit(inner: str) -> dict[str, object]:
        (result,) = env.core.on_submit(CLIENT, [{"sss": f"<Job><Executable>/bin/true</Executable>{inner}</Job>"}], None)
        return result

    me, host = getpass.getuser(), socket.gethostname()
    assert "ids" in submit(f"<User>{me}</User><Machine>{host}</Machine>")
    refused = submit("<User>somebody-else</User>")
    assert refused["error"].startswith(
        f"line 1, <Job>/<User>: this pilot runs every job as user {me!r}; it cannot run one as 'somebody-else'; "
        'remove it, or mark it (or an enclosing element) awarenessPolicy="Warn" or "Ignore"'
    ), refused
    assert "this pilot runs on" in submit("<Machine>elsewhere.example.org</Machine>")["error"]
    assert "cannot check a global identity" in submit("<GlobalUser>CN=Someone</GlobalUser>")["error"]
    assert "is not one" in submit("<Group>no-such-group-4711</Group>")["error"]
    assert "is not checked by this pilot; put it in <Requested>" in submit("<Account>chem</Account>")["error"]
    warned = submit('<User awarenessPolicy="Warn">somebody-else</User>')
    assert "ids" in warned and len(warned["warnings"]) == 1 and "somebody-else" in warned["warnings"][0], warned
    ignored = submit('<User awarenessPolicy="Ignore">somebody-else</User>')
    assert "ids" in ignored and ignored["warnings"] == [], ignored
