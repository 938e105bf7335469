"""PSI/J through the pilot: code written for psij-python runs by changing only the import.

    python examples/psij_basics.py

Starts an embedded local pilot if none is running (``pilot up`` starts a shared one).
"""

from __future__ import annotations

from datetime import timedelta

import client as psij  # instead of: import psij


def main() -> None:
    with psij.JobExecutor.get_instance("pilot") as ex:
        # One task, with a ${VAR} reference resolved on the node and its output in a file.
        hello = psij.Job(
            psij.JobSpec(
                executable="/bin/sh",
                arguments=["-c", "echo hello from $PILOT_RANK on $(hostname) in ${GREETING_DIR}"],
                environment={"GREETING_DIR": "${HOME}/greetings"},
                stdout_path="/tmp/pilot-example-hello.out",
            )
        )
        # Two ranks with the multiple launcher: each gets PILOT_RANK and the node file PSIJ_NODEFILE.
        ranks = psij.Job(
            psij.JobSpec(
                executable="/bin/sh",
                arguments=["-c", "echo rank $PILOT_RANK of $PILOT_SIZE; wc -l < $PSIJ_NODEFILE"],
                launcher="multiple",
                resources=psij.ResourceSpecV1(process_count=2),
                attributes=psij.JobAttributes(duration=timedelta(minutes=1)),
                stdout_path="/tmp/pilot-example-ranks.out",
            )
        )
        ex.set_job_status_callback(lambda job, status: print(f"  {job.native_id}: {status.state}"))
        for job in (hello, ranks):
            ex.submit(job)
        for job in (hello, ranks):
            status = job.wait(timeout=timedelta(seconds=60))
            assert status is not None
            md = status.metadata or {}
            print(
                f"job {job.native_id} {status.state} exit {status.exit_code}: "
                f"wall {md.get('wall_duration', 0):.3f} s, cpu {md.get('user_cpu_time', 0):.3f} s, "
                f"max RSS {md.get('max_rss', 0) / 2**20:.1f} MiB on {md.get('nodes')}"
            )
        print(open("/tmp/pilot-example-hello.out").read().strip())
        print(open("/tmp/pilot-example-ranks.out").read().strip())


if __name__ == "__main__":
    main()
