"""Several allocations in one pilot (issue 4, item 5): from the start (``pilots``), and grown on demand
(``[autoscale]``) with idle release and no resubmission of pilots that fail. Real daemons, real local
allocations (agent processes), real tasks."""

from __future__ import annotations

import re
import sqlite3
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
from pilot_waits import agents_active, ends, gone, read_pid, wait_for
from test_client_resilience import Restartable, strays  # noqa: F401 -- fixture

import client as psij
from pilot import config as config_mod
from pilot import lrm
from pilot.store import JOURNAL_FILE, Store

pytestmark = pytest.mark.timeout(120)

TWO = '[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\npilots = 2\n'


def _where(out: Path, cmd: str = "", cores: int = 2) -> psij.Job:
    """A job that writes the node that ran it, and when it started and ended."""
    script = f'echo "$PILOT_NODE $(date +%s.%N)" > {out}; {cmd or "sleep 1"}; date +%s.%N >> {out}'
    return psij.Job(psij.JobSpec("/bin/sh", ["-c", script], resources=psij.ResourceSpecV1(cpu_cores_per_process=cores)))


def _ran(out: Path) -> tuple[str, float, float]:
    first, last = out.read_text().split("\n")[:2]
    node, start = first.split()
    return node, float(start), float(last)


def _agent_of(pilot_pid: int, node: str) -> psutil.Process:
    for p in psutil.Process(pilot_pid).children(recursive=True):
        try:
            if p.environ().get("PILOT_AGENT_NODE") == node:
                return p
        except psutil.Error:
            continue
    raise AssertionError(f"no agent process for node {node}")


def test_two_allocations_from_the_start_run_jobs_side_by_side_each_inside_one(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot(TWO)
    ex = pilot.executor()
    st = agents_active(ex, 2)
    assert sorted(n["name"] for n in st["nodes"]) == ["local-0", "local-0@a2"]
    assert [(a["name"], a["site"], a["state"]) for a in st["allocations"]] == [
        ("a1", "main", "active"),
        ("a2", "main", "active"),
    ]
    assert len({a["native_id"] for a in st["allocations"]}) == 2
    # Each job takes a whole node's 2 cores: two at once is only possible on two allocations.
    jobs = [(_where(tmp_path / f"{i}.out"), tmp_path / f"{i}.out") for i in range(2)]
    for job, _ in jobs:
        ex.submit(job)
    for job, _ in jobs:
        ends(job, psij.JobState.COMPLETED)
    (n0, s0, e0), (n1, s1, e1) = (_ran(out) for _, out in jobs)
    assert {n0, n1} == {"local-0", "local-0@a2"}
    assert max(s0, s1) < min(e0, e1), "the two jobs did not run at the same time"
    # A job runs inside one allocation: two nodes of one core each is more than either has.
    wide = psij.Job(psij.JobSpec("/bin/true", resources=psij.ResourceSpecV1(node_count=2, processes_per_node=1)))
    with pytest.raises(psij.InvalidJobException, match=r"can never run in this allocation.*2 nodes"):
        ex.submit(wide)
    text = pilot.cli("status").stdout
    assert "allocation a1 (site main) local" in text and "allocation a2 (site main) local" in text, text
    # kill -9 of the daemon: both allocations are re-attached from the journal, not requested again.
    natives = [a["native_id"] for a in st["allocations"]]
    pilot.kill9()
    pilot.up_again()
    ex2 = pilot.executor()
    st = agents_active(ex2, 2)
    assert [a["native_id"] for a in st["allocations"]] == natives
    again = [(_where(tmp_path / f"r{i}.out", "sleep 0.5"), tmp_path / f"r{i}.out") for i in range(2)]
    for job, _ in again:
        ex2.submit(job)
    for job, _ in again:
        ends(job, psij.JobState.COMPLETED)
    assert {_ran(out)[0] for _, out in again} == {"local-0", "local-0@a2"}


def test_an_sss_job_runs_inside_one_allocation_and_one_too_big_for_each_is_refused(
    start_pilot: Any, tmp_path: Path
) -> None:
    pilot = start_pilot(TWO)
    ex = pilot.executor()
    agents_active(ex, 2)
    three = "<Job><Executable>/bin/true</Executable><TaskGroup><TaskCount>3</TaskCount></TaskGroup></Job>"
    with pytest.raises(psij.InvalidJobException, match="can never run in this allocation"):
        ex.submit_sss(three)  # 3 cores: the two allocations have 4, but 2 each
    two = "<Job><Executable>/bin/sleep</Executable><Arguments>0.5</Arguments><TaskGroup><TaskCount>2</TaskCount>"
    jobs = [ex.submit_sss(two + "</TaskGroup></Job>")[0] for _ in range(2)]
    nodes = []
    for job in jobs:
        ends(job, psij.JobState.COMPLETED)
        nodes.append(set(re.findall(r"<Node>([^<]+)</Node>", ex.show_xml(job))))
    assert sorted(len(n) for n in nodes) == [1, 1] and nodes[0] != nodes[1], nodes  # one allocation each


def test_an_allocation_that_ends_fails_only_its_own_jobs(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot(TWO)
    ex = pilot.executor()
    agents_active(ex, 2)
    jobs = []
    for i in range(2):
        pid_file = tmp_path / f"{i}.pid"
        job = _where(tmp_path / f"{i}.out", f"echo $$ > {pid_file}; exec sleep 30")
        ex.submit(job)
        jobs.append((job, tmp_path / f"{i}.out", pid_file))
    tasks = [read_pid(pid_file) for _, _, pid_file in jobs]
    on_a2 = next(i for i, (_, out, _) in enumerate(jobs) if out.read_text().split()[0] == "local-0@a2")
    agent = _agent_of(pilot.pid, "local-0@a2")
    agent.kill()  # the whole allocation a2 is gone (its only agent)
    try:
        lost = ends(jobs[on_a2][0], psij.JobState.FAILED, timeout=30)
        assert "allocation" in (lost.message or "") and "ended" in (lost.message or ""), lost.message
        # Its task ran in its own session: the local batch system reaps what the dead agent left.
        assert "every agent exited" in (lost.message or "") and "1 task process(es)" in (lost.message or "")
        wait_for(lambda: gone(tasks[on_a2]), what="the dead agent's task to be killed")
        assert not gone(tasks[1 - on_a2])
        survivor = jobs[1 - on_a2][0]
        assert survivor.status.state is psij.JobState.ACTIVE
        st = ex.pilot_status()
        assert [a["state"] for a in st["allocations"]] == ["active", "failed"]
        ex.cancel(survivor)
        ends(survivor, psij.JobState.CANCELED)
        # The pilot goes on with the allocation it has left.
        later = _where(tmp_path / "later.out", "true")
        ex.submit(later)
        ends(later, psij.JobState.COMPLETED)
        assert _ran(tmp_path / "later.out")[0] == "local-0"
    finally:
        for t in tasks:
            if not gone(t):
                t.kill()


AUTOSCALE = """
[allocation]
lrm = "local"
nodes = 1
cores_per_node = 1
[autoscale]
max_pilots = 3
grow_after = 0.2
idle_timeout = 1.5
min_pilots = 1
"""


def test_autoscale_grows_for_waiting_work_within_its_limits_and_releases_idle_allocations(
    start_pilot: Any, tmp_path: Path
) -> None:
    pilot = start_pilot(AUTOSCALE)
    ex = pilot.executor()
    agents_active(ex, 1)
    jobs = [(_where(tmp_path / f"{i}.out", "sleep 3", cores=1), tmp_path / f"{i}.out") for i in range(4)]
    for job, _ in jobs:
        ex.submit(job)
    agents_active(ex, 3)
    agents = {n: _agent_of(pilot.pid, n) for n in ("local-0", "local-0@a2", "local-0@a3")}
    for job, _ in jobs:
        ends(job, psij.JobState.COMPLETED, timeout=60)
    ran = [_ran(out) for _, out in jobs]
    assert {node for node, _, _ in ran} == {"local-0", "local-0@a2", "local-0@a3"}
    assert sum(1 for _, s, e in ran if s < min(e for _, _, e in ran)) >= 2, "allocations grown did not run work"
    st = ex.pilot_status()
    assert [a["name"] for a in st["allocations"]] == ["a1", "a2", "a3"], "max_pilots = 3 was exceeded"
    assert st["autoscale"]["failures"] == 0 and st["autoscale"]["stopped"] is None
    # Nothing left to run: all but min_pilots = 1 are released after idle_timeout, their agents gone.

    def released() -> list[dict[str, Any]] | None:
        allocs: list[dict[str, Any]] = ex.pilot_status()["allocations"]
        return allocs if sum(a["state"] == "done" for a in allocs) == 2 else None

    allocs = wait_for(released, timeout=30, what="two idle allocations to be released")
    kept = [a for a in allocs if a["state"] == "active"]
    assert len(kept) == 1
    for a in allocs:
        if a["state"] == "done":
            assert "released" in a["message"], a
            node = "local-0" if a["name"] == "a1" else f"local-0@{a['name']}"
            wait_for(lambda node=node: gone(agents[node]), what=f"the agent of released {node} to exit")
    # New work runs on the allocation kept (a released one is never used again).
    kept_node = "local-0" if kept[0]["name"] == "a1" else f"local-0@{kept[0]['name']}"
    later = _where(tmp_path / "later.out", "true", cores=1)
    ex.submit(later)
    ends(later, psij.JobState.COMPLETED)
    assert _ran(tmp_path / "later.out")[0] == kept_node


def test_autoscale_gives_up_on_allocations_that_fail_and_fails_the_waiting_jobs_with_why(
    start_pilot: Any, tmp_path: Path
) -> None:
    # Every allocation's agent "starts" as /bin/false: the batch job runs, its agent exits at once.
    pilot = start_pilot(
        '[allocation]\nlrm = "local"\nnodes = 1\npilots = 0\nagent_python = "/bin/false"\n'
        "[autoscale]\nmax_pilots = 5\nmax_failures = 2\ngrow_after = 0\n"
    )
    ex = pilot.executor()
    assert ex.pilot_status()["allocations"] == []
    job = psij.Job(psij.JobSpec("/bin/true"))
    ex.submit(job)
    status = ends(job, psij.JobState.FAILED, timeout=30)
    assert "2 allocations in a row failed to start" in (status.message or ""), status.message
    assert "exited with 1" in (status.message or ""), status.message
    st = ex.pilot_status()
    assert [a["state"] for a in st["allocations"]] == ["failed", "failed"], "a third pilot was requested"
    assert st["autoscale"]["stopped"] and st["autoscale"]["failures"] == 2
    with pytest.raises(psij.SubmitException, match="last allocation has ended") as exc:
        ex.submit(psij.Job(psij.JobSpec("/bin/true")))
    assert exc.value.transient
    assert "auto-allocation stopped: 2 allocations in a row failed" in str(exc.value), exc.value
    assert "autoscale stopped: 2 allocations in a row failed" in pilot.cli("status").stdout


@pytest.mark.timeout(150)
def test_a_restarted_daemon_keeps_counting_failed_allocations(
    strays: list[psutil.Process],  # noqa: F811 -- the fixture imported above
    start_pilot: Any,
) -> None:
    """The count of allocations that failed in a row is journaled: a daemon killed after auto-allocation
    gave up does not start over and request max_failures more."""
    r = Restartable(
        start_pilot(
            '[allocation]\nlrm = "local"\nnodes = 1\npilots = 0\nagent_python = "/bin/false"\n'
            "[autoscale]\nmax_pilots = 5\nmax_failures = 2\ngrow_after = 0\n"
        ),
        strays,
    )
    ex = r.executor()
    job = psij.Job(psij.JobSpec("/bin/true"))
    ex.submit(job)
    ends(job, psij.JobState.FAILED, timeout=30)
    r.kill_daemon()
    r.up_again()
    ex = r.executor()
    st = ex.pilot_status()
    assert st["autoscale"]["failures"] == 2 and st["autoscale"]["stopped"], st["autoscale"]
    with pytest.raises(psij.SubmitException, match="last allocation has ended"):
        ex.submit(psij.Job(psij.JobSpec("/bin/true")))
    assert [a["state"] for a in ex.pilot_status()["allocations"]] == ["failed", "failed"]
    # A damaged record of it (the journal is input too) is reported and counted from 0, not fatal.
    r.kill_daemon()
    db = sqlite3.connect(r.pilot.rundir.path / JOURNAL_FILE)
    with db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'autoscale'", (msgpack.packb({"failures": "many"}),))
    db.close()
    r.up_again()
    st = r.executor().pilot_status()
    assert st["autoscale"]["failures"] == 0 and not st["autoscale"]["stopped"], st["autoscale"]
    assert "count of failed allocations is damaged" in r.pilot.rundir.log_file.read_text()


def test_autoscale_whose_requests_raise_stops_and_fails_the_waiting_jobs(start_pilot: Any, tmp_path: Path) -> None:
    """A request that cannot even be made (the agent's interpreter is missing) counts as a failure too."""
    missing = tmp_path / "no-such-python"
    pilot = start_pilot(
        f'[allocation]\nlrm = "local"\nnodes = 1\npilots = 0\nagent_python = "{missing}"\n'
        "[autoscale]\nmax_failures = 2\ngrow_after = 0\n"
    )
    ex = pilot.executor()
    job = psij.Job(psij.JobSpec("/bin/true"))
    ex.submit(job)
    status = ends(job, psij.JobState.FAILED, timeout=30)
    assert "2 allocations in a row failed to start" in (status.message or ""), status.message
    assert "site main" in (status.message or "") and "no-such-python" in (status.message or ""), status.message
    st = ex.pilot_status()
    assert st["allocations"] == [] and st["autoscale"]["failures"] == 2


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ('[sites.big]\nlrm = "nope"\n', ["sites.big.lrm", "known"]),
        ('[sites.big]\nlrm = "local"\ncores_per_node = 0\n', ["sites.big.cores_per_node"]),
        ('[sites.big]\nlrm = "local"\npilots = -1\n', ["sites.big.pilots"]),
        ('[sites.main]\nlrm = "local"\n', ["[sites.main]", "not 'main'"]),
        ("[sites]\nbig = 3\n", ["[sites.big] must be a table"]),
        ("[allocation]\npilots = 0\n", ["allocation.pilots = 0", "[autoscale]"]),
        ("[allocation]\npilots = 3\n[autoscale]\nmax_pilots = 2\n", ["autoscale.max_pilots = 2", "3 allocation"]),
        ("[allocation]\nnodes = 4\n[autoscale]\nmax_nodes = 2\n", ["autoscale.max_nodes = 2", "smallest"]),
        ("[autoscale]\nmax_failures = 0\n", ["autoscale.max_failures"]),
        ("[autoscale]\nidle_timeout = 'soon'\n", ["autoscale.idle_timeout"]),
        ("[autoscale]\nretry = 1\n", ["unknown key autoscale.retry", "max_failures"]),
        ("[allocation]\ncores_per_node = 1000000000\n", ["allocation.cores_per_node = 1000000000", "at most"]),
        ('[sites.x]\nlrm = "local"\ngpus_per_node = 5000\n', ["sites.x.gpus_per_node = 5000", "at most 1024"]),
        ("[allocation]\nnodes = 100000\ncores_per_node = 16384\n", ["allocation.nodes x cores_per_node", "10,000,000"]),
    ],
)
def test_bad_site_and_autoscale_keys_are_named(toml: str, words: list[str], tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    with pytest.raises(config_mod.ConfigError) as exc:
        c = config_mod.load(cfg)
        for s in c.sites:
            lrm.create(s.lrm, options=s.options, source=c.source, table=s.table).validate(nodes=s.nodes)
    for w in words:
        assert w in str(exc.value), (w, str(exc.value))


def test_sites_parse_in_order_and_autoscale_defaults() -> None:
    c = config_mod.parse(
        {
            "allocation": {"lrm": "local", "nodes": 1},
            "sites": {"big": {"lrm": "slurm", "nodes": 4, "walltime": "1h", "partition": "debug"}},
            "autoscale": {"max_nodes": 9, "idle_timeout": "5m"},
        }
    )
    assert [(s.name, s.table, s.lrm, s.nodes, s.pilots) for s in c.sites] == [
        ("main", "allocation", "local", 1, 1),
        ("big", "sites.big", "slurm", 4, 0),
    ]
    assert c.sites[1].options == {"partition": "debug"} and c.sites[1].walltime == 3600
    a = c.autoscale
    assert a.enabled and a.max_pilots == 2 and a.max_nodes == 9 and a.idle_timeout == 300
    assert not config_mod.parse({}).autoscale.enabled
    assert config_mod.parse({"allocation": {"nodes": 2}}).node_level("local-0@a2") == config_mod.parse(
        {"allocation": {"nodes": 2}}
    ).node_level("local-0")


def test_a_schema_1_journal_is_read_as_the_main_sites_first_allocation(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with Store.open(path):
        pass
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = DELETE")
    db.executescript(
        textwrap.dedent(
            """
            DROP TABLE allocation;
            CREATE TABLE allocation (id INTEGER PRIMARY KEY CHECK (id = 1), lrm TEXT NOT NULL,
                native_id TEXT NOT NULL, state TEXT NOT NULL, nodes INTEGER NOT NULL, submitted REAL NOT NULL,
                started REAL, walltime REAL, expected_nodes BLOB NOT NULL, hosts BLOB NOT NULL,
                message TEXT NOT NULL, detail BLOB);
            PRAGMA user_version = 1;
            """
        )
    )
    empty = msgpack.packb([])
    db.execute(
        "INSERT INTO allocation VALUES (1, 'slurm', '77', 'active', 2, 1.0, 2.0, 60.0, ?, ?, '', NULL)",
        (empty, msgpack.packb(["n1", "n2"])),
    )
    db.commit()
    db.close()
    with Store.open(path) as store:
        rec = store.load()
    assert [(k, s, a.native_id, a.hosts) for k, s, a in rec.allocations] == [("a1", "main", "77", ["n1", "n2"])]


def test_a_pilot_can_start_empty_and_explain_says_an_allocation_is_coming(start_pilot: Any, tmp_path: Path) -> None:
    slow = tmp_path / "python"  # agents that take 3 s to start: long enough to ask
    slow.write_text(f'#!/bin/sh\nsleep 3\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    pilot = start_pilot(
        f'[allocation]\nlrm = "local"\nnodes = 1\npilots = 0\nagent_python = "{slow}"\n'
        "[autoscale]\nmax_pilots = 1\ngrow_after = 0\n"
    )
    ex = pilot.executor()
    assert ex.pilot_status()["allocations"] == []
    assert "allocation: none yet" in pilot.cli("status").stdout
    job = psij.Job(psij.JobSpec("/bin/true"))
    ex.submit(job)
    reasons = wait_for(
        lambda: (r := ex.explain(job)) and any("allocation a1 (site main)" in x for x in r) and r,
        what="explain to name the allocation on its way",
    )
    assert "no node has registered yet" in reasons[0], reasons
    ends(job, psij.JobState.COMPLETED)
