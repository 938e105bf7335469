"""Staging and output streaming throughput (issue 21): what the stage-in cache and the stream files save.

    python bench/staging.py [--jobs 2000] [--staged 1000] [--mib 10] [--json FILE]

Two pairs of runs, each on a fresh embedded local pilot (1 node, ``--cores`` cores):

- ``--jobs`` ``/bin/true`` jobs with output streaming on (``[pilot] stream_output``, no output paths)
  against the same jobs writing two files each (``stdout_path``/``stderr_path`` per task);
- ``--staged`` jobs that each stage in one ``--mib`` MiB file from a local HTTP server (``http.server`` on
  127.0.0.1) through the node's cache (one URL: one download per node) against the same file under a
  distinct URL per job (a query string: every stage-in downloads it).

Each figure is jobs per second from the first submit to the last final state; the ratios are
streamed / per-task files and cached / uncached. The server's GET count is reported with the staging runs.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _pilot(home: Path, name: str, *, cores: int, stream: bool) -> Any:
    import client as psij

    cfg = home / f"{name}.toml"
    cfg.write_text(
        f"[pilot]\nstream_output = {'true' if stream else 'false'}\n"
        f'[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = {cores}\n'
    )
    os.environ["PILOT_HOME"] = str(home / name)
    os.environ["PILOT_CONFIG"] = str(cfg)
    return psij.JobExecutor.get_instance("pilot")


def _run(ex: Any, specs: list[Any]) -> float:
    """Jobs per second, first submit to last final state (every job must complete)."""
    import client as psij

    jobs = [psij.Job(s) for s in specs]
    t0 = time.monotonic()
    ex.submit_all(jobs)
    for job in jobs:
        status = job.wait(timeout=3600)
        if status is None or status.state is not psij.JobState.COMPLETED:
            raise SystemExit(f"bench/staging.py: job {job.native_id} ended {status}")
    return len(jobs) / (time.monotonic() - t0)


class _Counting(http.server.SimpleHTTPRequestHandler):
    gets = 0
    lock = threading.Lock()

    def do_GET(self) -> None:
        with _Counting.lock:
            _Counting.gets += 1
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--staged", type=int, default=1000)
    ap.add_argument("--mib", type=int, default=10)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import client as psij
    from client.staging import URI, StageIn

    result: dict[str, object] = {"jobs": args.jobs, "staged": args.staged, "mib": args.mib, "cores": args.cores}
    with tempfile.TemporaryDirectory(prefix="pilot-staging-bench-") as tmp:
        home = Path(tmp)
        files = home / "files"
        files.mkdir()
        with _pilot(home, "streamed", cores=args.cores, stream=True) as ex:
            result["streamed_jobs_per_s"] = _run(ex, [psij.JobSpec("/bin/true") for _ in range(args.jobs)])
        with _pilot(home, "files", cores=args.cores, stream=False) as ex:
            specs = [
                psij.JobSpec("/bin/true", stdout_path=files / f"{i}.out", stderr_path=files / f"{i}.err")
                for i in range(args.jobs)
            ]
            result["per_task_files_jobs_per_s"] = _run(ex, specs)

        www = home / "www"
        www.mkdir()
        (www / "data.bin").write_bytes(os.urandom(args.mib << 20))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Counting(*a, directory=str(www)))
        url = f"http://127.0.0.1:{server.server_address[1]}/data.bin"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            for name, query in (("cached", ""), ("uncached", "?job={}")):
                _Counting.gets = 0
                work = home / name
                with _pilot(home, name, cores=args.cores, stream=False) as ex:
                    specs = []
                    for i in range(args.staged):
                        d = work / str(i)
                        d.mkdir(parents=True)
                        source = StageIn(URI(url + query.format(i)), "data.bin")
                        specs.append(psij.JobSpec("/bin/true", directory=d, stage_in={source}))
                    result[f"{name}_jobs_per_s"] = _run(ex, specs)
                result[f"{name}_downloads"] = _Counting.gets
        finally:
            server.shutdown()
            server.server_close()
    result["streamed_over_files"] = result["streamed_jobs_per_s"] / result["per_task_files_jobs_per_s"]  # type: ignore[operator]
    result["cached_over_uncached"] = result["cached_jobs_per_s"] / result["uncached_jobs_per_s"]  # type: ignore[operator]
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
