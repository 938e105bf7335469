"""Journaled submissions per second (pilot/store.py), in batches of 1, 100 and 1000, from the wire map
and from a JobDescription, and a whole short job's lifecycle. Issue 7's target is >= 20,000/s.

    python bench/journal_cost.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pilot.core.phase import Phase
from pilot.jobs import JobRecord, ProcessResult
from pilot.launchers.base import PlannedProcess
from pilot.model.job_description import JobDescription, ResourceRequest
from pilot.model.job_state import JobState
from pilot.model.process_order import ProcessOrder
from pilot.scheduler.placement import RankPlacement
from pilot.store import Store


def _desc() -> JobDescription:
    return JobDescription(
        executable="/bin/echo",
        arguments=["hello", "0"],
        environment={"A": "1"},
        resources=ResourceRequest(process_count=2),
        duration=30.0,
    )


def _order(job_id: str, slot: int) -> ProcessOrder:
    return ProcessOrder(job_id=job_id, slot=slot, role="rank", executable="/bin/echo", cores=[slot], directory="/tmp")


def main(tmp_path: Path) -> None:
    """Journaled submissions per second in batches of 1, 100 and 1000 (printed; the product target is
    >= 20,000/s). The client's wire map is journaled as is, as the daemon would."""
    raw = _desc().to_wire()
    lines = []
    for per, total in ((1, 2000), (100, 20000), (1000, 50000)):
        with Store.open(tmp_path / f"bench{per}.db") as store:
            seq = 0
            t0 = time.perf_counter()
            while seq < total:
                with store.batch() as tx:
                    for _ in range(per):
                        seq += 1
                        tx.job_accepted(str(seq), seq, raw, 1.0)
            dt = time.perf_counter() - t0
        lines.append(
            f"journal: batches of {per:4d}: {total / dt:10,.0f} submissions/s ({dt / total * 1e6:.1f} us each)"
        )
    # From a JobDescription (to_wire is dataclasses.asdict), and a whole short job's lifecycle.
    desc, total = _desc(), 20000
    with Store.open(tmp_path / "bench_desc.db") as store:
        t0 = time.perf_counter()
        for b in range(total // 1000):
            with store.batch() as tx:
                for i in range(b * 1000 + 1, b * 1000 + 1001):
                    tx.job_accepted(str(i), i, desc, 1.0)
        dt = time.perf_counter() - t0
    lines.append(f"journal: batches of 1000 from JobDescription: {total / dt:10,.0f} submissions/s")
    with Store.open(tmp_path / "bench_life.db") as store:
        t0 = time.perf_counter()
        for b in range(total // 1000):
            ids = [str(i) for i in range(b * 1000 + 1, b * 1000 + 1001)]
            with store.batch() as tx:
                for i, jid in enumerate(ids):
                    tx.job_accepted(jid, b * 1000 + i + 1, raw, 1.0)
            with store.batch() as tx:
                jobs = [JobRecord(id=jid, description=_desc(), submitted=1.0) for jid in ids]
                for job in jobs:
                    job.state, job.state_time, job.phase, job.run.started = JobState.ACTIVE, 2.0, Phase.RANKS, 2.0
                    job.run.ranks = [RankPlacement("n0", [0], [], 0)]
                    tx.job_update(job, placed=True)
                    tx.process_dispatched(job.id, PlannedProcess("n0", _order(job.id, 0), [0]))
            with store.batch() as tx:
                for job in jobs:
                    tx.process_result(job.id, 0, ProcessResult("n0", "rank", exit_code=0, data={"max_rss": 1}))
                    job.state, job.state_time, job.phase, job.run.ended = JobState.COMPLETED, 3.0, Phase.DONE, 3.0
                    job.exit_code, job.metadata = 0, {"wall_duration": 1.0}
                    tx.job_update(job)
        dt = time.perf_counter() - t0
    lines.append(f"journal: whole job lifecycle (accept..COMPLETED), batches of 1000: {total / dt:10,.0f} jobs/s")
    print("\n".join(lines))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        main(Path(d))
