"""File staging (PSI/J's stage_in, stage_out, cleanup) on real pilots: real agents, real processes, a
real HTTP server on 127.0.0.1."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import client as psij
from client.staging import URI, StageIn, StageOut, StageOutFlags, StagingMode

WAIT = 60


class _Files(http.server.SimpleHTTPRequestHandler):
    """Serves the test's directory; counts each GET per path (what the stage-in cache saves)."""

    gets: dict[str, int]
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            self.gets[self.path] = self.gets.get(self.path, 0) + 1
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Server:
    def __init__(self, root: Path) -> None:
        gets: dict[str, int] = {}
        handler = type("Handler", (_Files,), {"gets": gets})
        self.gets = gets
        self.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root))
        )
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
        stage_out={StageOut("result.txt", out, mode=mode), StageOut("never.txt", tmp_path / "n", StageOutFlags.IF_PRESENT)},
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
    for spec in (
        psij.JobSpec("/bin/true", stage_in={StageIn(URI("gsiftp://host/path/file"), "f")}),
        psij.JobSpec("/bin/true", stage_out={StageOut("f", URI("http://host/up"))}),
    ):
        job = psij.Job(spec)
        with pytest.raises(psij.InvalidJobException, match="file, http, https|use one of file") as info:
            ex.submit(job)
        assert "scheme" in str(info.value)
        assert job.status.state is psij.JobState.NEW
    job = psij.Job(psij.JobSpec("/bin/true", stage_in={StageIn(tmp_path / "a", "../../etc/a")}))
    with pytest.raises(psij.InvalidJobException, match="leaves the job's directory"):
        ex.submit(job)


def test_the_transfer_modules_are_the_schemes_the_daemon_accepts() -> None:
    from agent.transfers import TRANSFERS
    from pilot.model.staging import SCHEMES_IN, SCHEMES_OUT

    assert sorted(TRANSFERS) == sorted(SCHEMES_IN)
    assert set(SCHEMES_OUT) <= set(TRANSFERS)
