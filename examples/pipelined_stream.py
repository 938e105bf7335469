"""A workflow engine's loop: one ``submit()`` per task, pipelined, the results taken from callbacks.

    python examples/pipelined_stream.py [TASKS]

With ``pipelined=True`` each ``submit()`` returns once the job is handed to the pilot's connection; the
job's QUEUED (or FAILED, with the pilot's reason) follows as a status, like every later change. Starts
an embedded local pilot if none is running.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter

import client as psij


def main(tasks: int = 5000) -> None:
    ended: Counter[str] = Counter()
    lock = threading.Lock()
    all_done = threading.Event()

    def on_status(job: psij.Job, status: psij.JobStatus) -> None:
        if status.final:
            with lock:
                ended[str(status.state)] += 1
                if sum(ended.values()) == tasks:
                    all_done.set()

    with psij.JobExecutor.get_instance("pilot", pipelined=True) as ex:
        ex.set_job_status_callback(on_status)
        t0 = time.monotonic()
        for i in range(tasks):
            ex.submit(psij.Job(psij.JobSpec(executable="/bin/echo", arguments=[f"task {i}"])))
        submitted = time.monotonic() - t0
        if not all_done.wait(timeout=600):
            sys.exit(f"not every task ended within 10 minutes: {dict(ended)}")
        took = time.monotonic() - t0
    print(f"{tasks} tasks: submit() loop {submitted:.2f} s, all ended in {took:.2f} s ({tasks / took:.0f} tasks/s)")
    print(f"final states: {dict(ended)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
