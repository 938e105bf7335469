"""File staging (PSI/J's stage_in, stage_out, cleanup) on real pilots: real agents, real processes, a
real HTTP server on 127.0.0.1."""

from __future__ import annotations

import http.server
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Pilot
from pilot_waits import agents_active, list_when_back, wait_for

import client as psij
from client.staging import URI, StageIn, StageOut, StageOutFlags, StagingMode

pytestmark = pytest.mark.timeout(180)

WAIT = 60


class _Files(http.server.SimpleHTTPRequestHandler):
    """Serves the test's directory; counts each GET per path (what the stage-in cache saves)."""

    gets: dict[str, int]
    gone: list[str]
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            self.gets[self.path] = self.gets.get(self.path, 0) + 1
        if self.path.startswith("/slow/"):  # a 5-second transfer: the headers only after 5 s
            time.sleep(5)
            self.path = self.path[len("/slow") :]
        if self.path.startswith("/trickle/"):  # a byte every 0.1 s of a megabyte: a minute-long stall at most
            self._trickle()
            return
        if self.path.startswith("/once/"):  # served to the first GET only; later ones fail
            if self.gets[self.path] > 1:
                self.send_error(503, "served once already")
                return
            self.path = self.path[len("/once") :]
        super().do_GET()

    def _trickle(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 20))
        self.end_headers()
        try:
            for _ in range(600):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:  # the client hung up
            with self.lock:
                self.gone.append(self.path)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Server:
    def __init__(self, root: Path) -> None:
        gets: dict[str, int] = {}
        gone: list[str] = []
        handler = type("Handler", (_Files,), {"gets": gets, "gone": gone})
        self.gets = gets
        #: Paths whose trickled answer the client broke off.
        self.gone = gone
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    root = tmp_path / "www"
    root.mkdir()
    server = Server(root)
    try:
        yield server, root
    finally:
        server.close()


def run(ex: psij.JobExecutor, spec: psij.JobSpec) -> tuple[psij.Job, psij.JobStatus, list[psij.JobState]]:
    job = psij.Job(spec)
    seen: list[psij.JobState] = []
    job.set_job_status_callback(lambda j, s: seen.append(s.state))
    ex.submit(job)
    status = job.wait(timeout=WAIT)
    assert status is not None and status.final, f"job {job.native_id} did not end: {job.status}"
    return job, status, seen


@pytest.mark.parametrize("mode", list(StagingMode))
def test_stage_in_files_and_a_directory_then_stage_out_and_clean_up(
    start_pilot: Callable[..., Any], tmp_path: Path, mode: StagingMode
) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    src = tmp_path / "src"
    (src / "dir" / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("AB")
    (src / "dir" / "sub" / "c.txt").write_text("CD")
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "out" / "result.txt"
    spec = psij.JobSpec(
        "/bin/sh",
        ["-c", "cat in/a.txt tree/sub/c.txt > result.txt; echo scratch > scratch.txt"],
        directory=work,
        stage_in={StageIn(src / "a.txt", "in/a.txt", mode), StageIn(URI(f"file://{src / 'dir'}"), "tree", mode)},
        stage_out={
            StageOut("result.txt", out, mode=mode),
            StageOut("never.txt", tmp_path / "n", StageOutFlags.IF_PRESENT),
        },
        cleanup={"scratch.txt", "in"},
    )
    _, status, seen = run(ex, spec)
    assert status.state is psij.JobState.COMPLETED, status
    assert seen == [
        psij.JobState.QUEUED,
        psij.JobState.STAGE_IN,
        psij.JobState.ACTIVE,
        psij.JobState.STAGE_OUT,
        psij.JobState.CLEANUP,
        psij.JobState.COMPLETED,
    ]
    assert out.read_text() == "ABCD"
    assert not (tmp_path / "n").exists()
    assert not (work / "scratch.txt").exists() and not (work / "in").exists()
    assert (work / "tree" / "sub" / "c.txt").read_text() == "CD"
    if mode is StagingMode.LINK:
        assert (work / "tree").is_symlink()
    if mode is StagingMode.MOVE:
        assert not (src / "a.txt").exists() and not (work / "result.txt").exists()
    else:
        assert (src / "a.txt").read_text() == "AB" and (work / "result.txt").exists()


def test_stage_out_follows_the_outcome_flags_and_cleanup_flags(start_pilot: Callable[..., Any], tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    work = tmp_path / "work"
    work.mkdir()
    t = {name: tmp_path / name for name in ("ok", "err", "always", "cancel")}
    spec = psij.JobSpec(
        "/bin/sh",
        ["-c", "echo x > f; exit 3"],
        directory=work,
        stage_out={
            StageOut("f", t["ok"], StageOutFlags.ON_SUCCESS),
            StageOut("f", t["err"], StageOutFlags.ON_ERROR),
            StageOut("f", t["always"]),
            StageOut("f", t["cancel"], StageOutFlags.ON_CANCEL),
        },
        cleanup={"f"},
        cleanup_flags=StageOutFlags.ON_SUCCESS,
    )
    _, status, seen = run(ex, spec)
    assert status.state is psij.JobState.FAILED and status.exit_code == 3, status
    assert psij.JobState.STAGE_OUT in seen and psij.JobState.CLEANUP not in seen
    assert [n for n, p in t.items() if p.exists()] == ["err", "always"]
    assert (work / "f").exists()  # cleanup was for success only


def test_a_missing_stage_out_source_fails_the_job_naming_it(start_pilot: Callable[..., Any], tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    spec = psij.JobSpec("/bin/true", directory=tmp_path, stage_out={StageOut("nothing.txt", tmp_path / "x")})
    _, status, _ = run(ex, spec)
    assert status.state is psij.JobState.FAILED, status
    assert "nothing.txt" in (status.message or "") and "does not exist" in (status.message or ""), status.message


def test_a_404_fails_the_job_before_its_process_starts(
    start_pilot: Callable[..., Any], tmp_path: Path, web: tuple[Server, Path]
) -> None:
    server, _ = web
    pilot = start_pilot()
    ex = pilot.executor()
    marker = tmp_path / "ran"
    spec = psij.JobSpec(
        "/bin/touch", [str(marker)], directory=tmp_path, stage_in={StageIn(URI(f"{server.url}/missing.dat"), "in.dat")}
    )
    _, status, seen = run(ex, spec)
    assert status.state is psij.JobState.FAILED, status
    message = status.message or ""
    assert "missing.dat" in message and "404" in message and "local-0" in message, message
    assert psij.JobState.ACTIVE not in seen
    assert not marker.exists(), "the job's process ran although its stage-in failed"
    assert server.gets == {"/missing.dat": 1}


def test_an_unsupported_scheme_is_refused_at_submit_naming_the_supported_ones(
    start_pilot: Callable[..., Any], tmp_path: Path
) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    for spec, supported in (
        (psij.JobSpec("/bin/true", stage_in={StageIn(URI("gsiftp://host/path/file"), "f")}), "file, http, https"),
        (psij.JobSpec("/bin/true", stage_out={StageOut("f", URI("http://host/up"))}), "file (a plain"),
    ):
        job = psij.Job(spec)
        with pytest.raises(psij.InvalidJobException, match="scheme") as info:
            ex.submit(job)
        assert f"use one of {supported}" in str(info.value), info.value
        assert job.status.state is psij.JobState.NEW
    job = psij.Job(psij.JobSpec("/bin/true", stage_in={StageIn(tmp_path / "a", "../../etc/a")}))
    with pytest.raises(psij.InvalidJobException, match="leaves the job's directory"):
        ex.submit(job)


def test_the_transfer_modules_are_the_schemes_the_daemon_accepts() -> None:
    from agent.transfers import TRANSFERS
    from pilot.model.staging import SCHEMES_IN, SCHEMES_OUT

    assert sorted(TRANSFERS) == sorted(SCHEMES_IN)
    assert set(SCHEMES_OUT) <= set(TRANSFERS)


THREE_NODES = """
[pilot]
heartbeat_interval = 0.5

[allocation]
lrm = "local"
nodes = 3
cores_per_node = 2
"""


def test_three_nodes_each_task_stages_on_its_own_node_through_one_cache_per_node(
    start_pilot: Callable[..., Pilot], tmp_path: Path, web: tuple[Server, Path]
) -> None:
    server, root = web
    (root / "data.bin").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    pilot = start_pilot(THREE_NODES, name="three")
    ex = pilot.executor()
    agents_active(ex, 3)
    jobs = []
    for i in range(24):
        work = tmp_path / f"w{i}"
        work.mkdir()
        spec = psij.JobSpec(
            "/bin/sh",
            [
                "-c",
                'echo "$PILOT_NODE $(readlink data.bin || echo writable=$(test -w data.bin && echo y)) '
                '$(cksum < data.bin)"; sleep 0.3',
            ],
            directory=work,
            stdout_path=work / "out",
            stage_in={
                StageIn(URI(f"{server.url}/data.bin"), "data.bin", StagingMode.LINK if i % 2 else StagingMode.COPY)
            },
        )
        job = psij.Job(spec)
        ex.submit(job)
        jobs.append((job, work, i % 2 == 1))
    nodes: dict[str, int] = {}
    hits = fetched = 0
    cksum = subprocess.run(["cksum"], input=(root / "data.bin").read_bytes(), capture_output=True, check=True).stdout
    for job, work, linked in jobs:
        status = job.wait(timeout=WAIT)
        assert status is not None and status.state is psij.JobState.COMPLETED, status
        node, link, *rest = (work / "out").read_text().split()
        if linked:  # staged by the agent of the node the task ran on: the link points into that node's cache
            assert f"/stage-cache/{node}/" in link, (node, link)
        else:  # COPY: a file of its own, writable (not a link to the read-only cache entry)
            assert link == "writable=y", (node, link)
        assert " ".join(rest) == cksum.decode().strip()
        assert (status.metadata or {})["nodes"] == [node]
        nodes[node] = nodes.get(node, 0) + 1
        hits += (status.metadata or {})["stage_in_cache_hits"]
        fetched += (status.metadata or {})["stage_in_transfers"]
    assert len(nodes) == 3, f"the 24 tasks ran on {nodes}, not on all three nodes"
    # One transfer per node: every other stage-in of the same source on a node is a cache hit.
    assert server.gets == {"/data.bin": 3}, server.gets
    assert fetched == 3 and hits == 21, (fetched, hits)


#: Each task, on whichever node it runs, checks that its node's own agent staged its file in before it
#: started: that node's stage-in cache (each virtual node's agent has its own directory) holds the
#: fetched file, and the task's copy is a regular, writable file with the same bytes.
ON_ITS_NODE = """
test -f data.bin && test ! -L data.bin && test -w data.bin || exit 11
for entry in $(find "$RUNDIR" -path "*/stage-cache/$PILOT_NODE/*" -type f); do cmp -s data.bin "$entry" && found=1; done
test -n "$found" || exit 12
echo "$PILOT_NODE $PILOT_RANK" > "seen.$PILOT_RANK"
"""


def test_a_job_on_two_of_three_nodes_stages_in_on_each_of_its_nodes_before_any_process_starts(
    start_pilot: Callable[..., Pilot], tmp_path: Path, web: tuple[Server, Path]
) -> None:
    server, root = web
    (root / "data.bin").write_bytes(bytes(range(256)) * 4096)
    (tmp_path / "local.txt").write_text("L")
    pilot = start_pilot(THREE_NODES, name="three")
    ex = pilot.executor()
    agents_active(ex, 3)
    work = tmp_path / "work"
    work.mkdir()
    spec = psij.JobSpec(
        "/bin/sh",
        ["-c", ON_ITS_NODE],
        directory=work,
        environment={"RUNDIR": str(pilot.rundir.path)},
        launcher="multiple",
        resources=psij.ResourceSpecV1(node_count=2, processes_per_node=2),
        stage_in={
            StageIn(URI(f"{server.url}/data.bin"), "data.bin", StagingMode.COPY),
            StageIn(tmp_path / "local.txt", "moved.txt", StagingMode.MOVE),
        },
        stage_out={StageOut("seen.0", tmp_path / "out" / "seen.0")},
        cleanup={"data.bin"},
    )
    _, status, seen = run(ex, spec)
    assert status.state is psij.JobState.COMPLETED, status
    assert psij.JobState.STAGE_IN in seen and psij.JobState.CLEANUP in seen, seen
    ranks = dict(sorted((w.read_text().split()[1], w.read_text().split()[0]) for w in work.glob("seen.*")))
    assert sorted(ranks) == ["0", "1", "2", "3"], ranks
    nodes = set(ranks.values())
    assert len(nodes) == 2, f"the job's 4 processes ran on {ranks}, not on two nodes"
    # One fetch by each of its two nodes (the third node, which runs nothing of it, fetched nothing).
    assert server.gets == {"/data.bin": 2}, server.gets
    for node in nodes:  # (the fetched file, and on the node that copied local.txt: that too)
        assert 1 <= len(list(pilot.rundir.path.glob(f"**/stage-cache/{node}/*"))) <= 2, node
    # The MOVE went once (the other node copied first), the stage-out once, the cleanup on both nodes.
    assert (work / "moved.txt").read_text() == "L" and not (tmp_path / "local.txt").exists()
    assert (tmp_path / "out" / "seen.0").read_text().split()[1] == "0"
    assert not (work / "data.bin").exists()
    assert (status.metadata or {})["stage_in_transfers"] == 2 + 2, status.metadata  # (the file: copied, moved)


def test_a_stage_in_failing_on_one_node_of_a_job_fails_it_naming_the_node_and_nothing_starts(
    start_pilot: Callable[..., Pilot], tmp_path: Path, web: tuple[Server, Path]
) -> None:
    server, root = web
    (root / "data.bin").write_text("D")
    pilot = start_pilot(THREE_NODES, name="three")
    ex = pilot.executor()
    agents_active(ex, 3)
    spec = psij.JobSpec(
        "/bin/sh",
        ["-c", f"touch {tmp_path}/ran.$PILOT_RANK"],
        directory=tmp_path,
        launcher="multiple",
        resources=psij.ResourceSpecV1(node_count=2, processes_per_node=2),
        stage_in={StageIn(URI(f"{server.url}/once/data.bin"), "data.bin")},
    )
    _, status, seen = run(ex, spec)
    assert status.state is psij.JobState.FAILED, status
    message = status.message or ""
    assert "once/data.bin" in message and "503" in message, message
    assert any(f"on node local-{i} " in message for i in range(3)), message
    assert psij.JobState.ACTIVE not in seen
    assert not list(tmp_path.glob("ran.*")), "a process started although a node's stage-in failed"
    assert server.gets == {"/once/data.bin": 2}, server.gets


def test_a_shared_file_copied_in_by_many_tasks_is_read_once_per_node_and_each_task_gets_its_own_copy(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    """A file:// source staged in COPY by many tasks (a file on a shared filesystem) is read once per node
    into its cache; each task then gets a local, writable copy of its own. A source changed since is a new
    entry (read again)."""
    shared = tmp_path / "shared" / "table.dat"
    shared.parent.mkdir()
    shared.write_bytes(b"x" * 100_000)
    pilot = start_pilot()
    ex = pilot.executor()

    def stage(n: int) -> tuple[int, int]:
        hits = transfers = 0
        for i in range(n):
            work = tmp_path / f"w{n}-{i}"
            work.mkdir()
            spec = psij.JobSpec(
                "/bin/sh",
                ["-c", "test ! -L table.dat && echo mine >> table.dat && wc -c < table.dat > size"],
                directory=work,
                stage_in={StageIn(shared, "table.dat", StagingMode.COPY)},
            )
            _, status, _ = run(ex, spec)
            assert status.state is psij.JobState.COMPLETED, status
            assert (work / "size").read_text().strip() == "100005"  # its own copy, written to
            hits += (status.metadata or {})["stage_in_cache_hits"]
            transfers += (status.metadata or {})["stage_in_transfers"]
        return transfers, hits

    assert stage(5) == (1, 4)
    assert shared.read_bytes() == b"x" * 100_000  # no task wrote through to the source or the cache
    shared.write_bytes(b"y" * 100_000)  # changed: a new version, read once again
    assert stage(2) == (1, 1)


RESTART = """
[pilot]
heartbeat_interval = 0.5
agent_timeout = 4

[allocation]
lrm = "local"
nodes = 1
cores_per_node = 1
"""


def test_a_daemon_killed_during_a_5_second_stage_in_resumes_it_and_stages_nothing_twice(
    start_pilot: Callable[..., Pilot], tmp_path: Path, web: tuple[Server, Path]
) -> None:
    server, root = web
    (root / "slow.dat").write_text("SLOW")
    pilot = start_pilot(RESTART, name="restart")
    ex = pilot.executor()
    agents_active(ex, 1)
    work = tmp_path / "work"
    work.mkdir()
    spec = psij.JobSpec(
        "/bin/sh",
        ["-c", "cat in.dat >> ran.txt; echo >> ran.txt"],
        directory=work,
        stage_in={StageIn(URI(f"{server.url}/slow/slow.dat"), "in.dat")},
        stage_out={StageOut("ran.txt", tmp_path / "out.txt")},
    )
    job = psij.Job(spec)
    ex.submit(job)
    assert job.wait(timeout=WAIT, target_states=[psij.JobState.STAGE_IN]) is not None
    wait_for(lambda: server.gets.get("/slow/slow.dat") == 1, 20, "the agent to begin the 5-second fetch")
    native_id = job.native_id
    assert native_id is not None
    ex.close()
    pilot.kill9()
    pilot.up_again()

    ex2 = pilot.executor()
    assert native_id in list_when_back(ex2)
    again = psij.Job()
    ex2.attach(again, native_id)
    status = again.wait(timeout=WAIT)
    assert status is not None and status.state is psij.JobState.COMPLETED, status
    assert (tmp_path / "out.txt").read_text() == "SLOW\n", "the job ran once, on its staged file"
    assert server.gets == {"/slow/slow.dat": 1}, f"staged more than once: {server.gets}"


def test_a_job_canceled_while_staging_in_ends_canceled_and_never_runs(
    start_pilot: Callable[..., Pilot], tmp_path: Path, web: tuple[Server, Path]
) -> None:
    server, root = web
    (root / "slow.dat").write_text("SLOW")
    pilot = start_pilot()
    ex = pilot.executor()
    marker = tmp_path / "ran"
    spec = psij.JobSpec(
        "/bin/touch", [str(marker)], directory=tmp_path, stage_in={StageIn(URI(f"{server.url}/slow/slow.dat"), "in")}
    )
    job = psij.Job(spec)
    ex.submit(job)
    assert job.wait(timeout=WAIT, target_states=[psij.JobState.STAGE_IN]) is not None
    wait_for(lambda: server.gets.get("/slow/slow.dat") == 1, 20, "the agent to begin the 5-second fetch")
    job.cancel()
    status = job.wait(timeout=WAIT)
    assert status is not None and status.state is psij.JobState.CANCELED, status
    assert not marker.exists(), "a job canceled while staging in ran"


def test_canceling_a_job_breaks_off_its_slow_download_and_leaves_nothing_in_the_cache(
    start_pilot: Callable[..., Pilot], tmp_path: Path, web: tuple[Server, Path]
) -> None:
    """A server that trickles a byte every 0.1 s would hold a stage-in for a minute: cancel stops the
    transfer itself (the server sees the connection closed), the job ends CANCELED, no partial file is
    left in the node's cache, and a later job staging the same URL fetches it afresh."""
    server, root = web
    (root / "whole.dat").write_text("W")
    pilot = start_pilot()
    ex = pilot.executor()
    spec = psij.JobSpec(
        "/bin/true", directory=tmp_path, stage_in={StageIn(URI(f"{server.url}/trickle/whole.dat"), "in.dat")}
    )
    job = psij.Job(spec)
    ex.submit(job)
    assert job.wait(timeout=WAIT, target_states=[psij.JobState.STAGE_IN]) is not None
    wait_for(lambda: server.gets.get("/trickle/whole.dat") == 1, 20, "the agent to begin the download")
    caches = list(pilot.rundir.path.glob("**/stage-cache/*"))
    wait_for(lambda: any(p.name.startswith(".") for c in caches for p in c.iterdir()), 20, "its partial file")
    job.cancel()
    status = job.wait(timeout=30)  # (not broken off, the download would go on for a minute)
    assert status is not None and status.state is psij.JobState.CANCELED, status
    wait_for(lambda: server.gone == ["/trickle/whole.dat"], 20, "the agent to hang up")
    assert [p for c in caches for p in c.iterdir()] == [], "a partial download stayed in the cache"
    assert not (tmp_path / "in.dat").exists()


def test_pilot_down_during_a_slow_download_breaks_it_off_and_leaves_nothing_in_the_cache(
    start_pilot: Callable[..., Pilot], tmp_path: Path, web: tuple[Server, Path]
) -> None:
    server, root = web
    (root / "whole.dat").write_text("W")
    pilot = start_pilot()
    ex = pilot.executor()
    spec = psij.JobSpec(
        "/bin/true", directory=tmp_path, stage_in={StageIn(URI(f"{server.url}/trickle/whole.dat"), "in.dat")}
    )
    job = psij.Job(spec)
    ex.submit(job)
    wait_for(lambda: server.gets.get("/trickle/whole.dat") == 1, 30, "the agent to begin the download")
    caches = list(pilot.rundir.path.glob("**/stage-cache/*"))
    ex.close()
    down = pilot.cli("down", timeout=30)  # (not broken off, the agent would wait a minute for the download)
    assert down.returncode == 0, down.stderr
    wait_for(lambda: server.gone == ["/trickle/whole.dat"], 20, "the agent to hang up")
    assert caches and [p for c in caches for p in c.iterdir()] == [], "a partial download stayed in the cache"
    assert not (tmp_path / "in.dat").exists()


def test_http_copy_gives_each_task_a_writable_file_of_its_own(
    start_pilot: Callable[..., Pilot], tmp_path: Path, web: tuple[Server, Path]
) -> None:
    server, root = web
    (root / "table.dat").write_text("T")
    pilot = start_pilot()
    ex = pilot.executor()
    for i in range(2):
        work = tmp_path / f"w{i}"
        work.mkdir()
        spec = psij.JobSpec(
            "/bin/sh",
            ["-c", "test ! -L t.dat && echo mine >> t.dat"],
            directory=work,
            stage_in={StageIn(URI(f"{server.url}/table.dat"), "t.dat", StagingMode.COPY)},
        )
        _, status, _ = run(ex, spec)
        assert status.state is psij.JobState.COMPLETED, status
        assert (work / "t.dat").read_text() == "Tmine\n", "each task wrote to a pristine copy of its own"
        assert (status.metadata or {})["stage_in_cache_hits"] == i  # (the second from the node's cache)
    assert server.gets == {"/table.dat": 1}


def test_pre_launch_sees_the_staged_files_and_stage_out_follows_post_launch(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    (tmp_path / "src.txt").write_text("IN")
    work = tmp_path / "work"
    work.mkdir()
    pre = tmp_path / "pre.sh"
    pre.write_text("cat in.txt > pre.txt\n")
    post = tmp_path / "post.sh"
    post.write_text("cat pre.txt main.txt > post.txt\n")
    spec = psij.JobSpec(
        "/bin/sh",
        ["-c", "echo MAIN > main.txt"],
        directory=work,
        pre_launch=pre,
        post_launch=post,
        stage_in={StageIn(tmp_path / "src.txt", "in.txt")},
        stage_out={StageOut("post.txt", tmp_path / "out.txt")},
    )
    _, status, _ = run(ex, spec)
    assert status.state is psij.JobState.COMPLETED, status
    assert (tmp_path / "out.txt").read_text() == "INMAIN\n"
