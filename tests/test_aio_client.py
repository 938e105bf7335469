"""The async client (``client.aio``) against a real local pilot, under both anyio backends.

Each test is a plain function that runs its scenario with ``anyio.run(..., backend=...)``: the project
runs pytest-asyncio in auto mode, which takes over every ``async def`` test (an ``@pytest.mark.anyio``
test parametrized with trio would silently run under asyncio), so the backend is chosen here instead.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import psutil
import pytest
from conftest import Pilot
from pilot_waits import agents_active

import client as psij
from client.aio import AsyncBatchSubmitException, AsyncJob, AsyncJobExecutor, JobEvent, JobEvents
from pilot.model.job_state import JobState

pytestmark = pytest.mark.timeout(180)

CONFIG = '[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n'


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pilot(start_pilot: Callable[..., Pilot]) -> Pilot:
    p = start_pilot(CONFIG)
    agents_active(p.executor(), 1)
    return p


def run(backend: str, scenario: Callable[[], Awaitable[None]]) -> None:
    anyio.run(scenario, backend=backend)


def job(*argv: str, **resources: int) -> AsyncJob:
    spec = psij.JobSpec(executable=argv[0], arguments=list(argv[1:]))
    if resources:
        spec.resources = psij.ResourceSpecV1(**resources)
    return AsyncJob(spec)


def test_200_jobs_submitted_from_200_tasks_complete_and_every_state_is_an_event(
    pilot: Pilot, anyio_backend: str
) -> None:
    seen: dict[str, list[JobState]] = defaultdict(list)
    most_threads = 0

    async def main() -> None:
        nonlocal most_threads
        async with AsyncJobExecutor(str(pilot.rundir.path)) as ex:
            jobs = [job("/bin/true") for _ in range(200)]
            events = ex.events()
            async with anyio.create_task_group() as tg:
                for j in jobs:
                    tg.start_soon(ex.submit, j)
            assert all(j.native_id is not None and j.status.state is not JobState.NEW for j in jobs)
            assert len({j.native_id for j in jobs}) == 200

            async def wait(j: AsyncJob) -> None:
                nonlocal most_threads
                status = await j.wait(timeout=120)
                most_threads = max(most_threads, threading.active_count())
                assert status is not None and status.state is JobState.COMPLETED, (j, status)

            async with anyio.create_task_group() as tg:
                for j in jobs:
                    tg.start_soon(wait, j)
            done = 0
            async for event in events:
                assert isinstance(event, JobEvent)
                seen[event.job.id].append(event.status.state)
                done += event.status.final
                if done == len(jobs):
                    break
            await events.aclose()
            assert await ex.list()  # the pilot knows them
        assert set(seen) == {j.id for j in jobs}

    run(anyio_backend, main)
    for states in seen.values():
        assert states[0] is JobState.QUEUED and states[-1] is JobState.COMPLETED, states
        assert JobState.ACTIVE in states, states
        assert all(b.is_greater_than(a) for a, b in itertools.pairwise(states)), states
    # 200 jobs waited for at once cost no thread each: the client's two, anyio's idle workers, pytest's.
    assert most_threads < 20, most_threads


def test_failing_job_reports_exit_code_and_wait_times_out_with_none(pilot: Pilot, anyio_backend: str) -> None:
    async def main() -> None:
        ex = await AsyncJobExecutor.connect(str(pilot.rundir.path))
        events = ex.events()
        try:
            bad = job("/bin/sh", "-c", "exit 3")
            slow = job("/bin/sleep", "30")
            await ex.submit(bad)
            await ex.submit(slow)
            status = await bad.wait(timeout=60)
            assert status is not None and status.state is JobState.FAILED and status.exit_code == 3, status
            assert bad.status is status
            async with AsyncJobExecutor(str(pilot.rundir.path)) as other:
                seen = AsyncJob()
                await other.attach(seen, str(bad.native_id))  # another executor follows the same job
                assert seen.status.state is JobState.FAILED and seen.status.exit_code == 3, seen
                lost = AsyncJob()
                await other.attach(lost, "123456")
                assert lost.status.state is JobState.FAILED and "cannot attach" in str(lost.status.message)
            assert await slow.wait(timeout=0.2, target_states=[JobState.COMPLETED]) is None
            await slow.cancel()
            status = await slow.wait(timeout=60)
            assert status is not None and status.state is JobState.CANCELED, status
        finally:
            await ex.close()
        ended = [(e.job, e.status.state) async for e in events if e.status.final]  # it ends with the executor
        assert sorted(ended, key=lambda e: e[1].value) == [(slow, JobState.CANCELED), (bad, JobState.FAILED)]

    run(anyio_backend, main)


def test_cancel_a_running_job_ends_it_canceled_and_events_say_so(
    pilot: Pilot, anyio_backend: str, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"

    async def main() -> None:
        async with AsyncJobExecutor(str(pilot.rundir.path)) as ex, ex.events() as events:
            sleeper = job("/bin/sh", "-c", f"echo $$ > {pid_file}; exec sleep 30")
            await ex.submit(sleeper)
            status = await sleeper.wait(timeout=60, target_states=JobState.ACTIVE)
            assert status is not None and status.state is JobState.ACTIVE, status
            await ex.cancel(sleeper)
            status = await sleeper.wait(timeout=60)
            assert status is not None and status.state is JobState.CANCELED, status
            states = []
            async for event in events:
                assert event.job is sleeper
                states.append(event.status.state)
                if event.status.final:
                    break
            assert states == [JobState.QUEUED, JobState.ACTIVE, JobState.CANCELED]
            await ex.cancel(sleeper)  # final already: nothing to do, no error

    run(anyio_backend, main)
    pid = int(pid_file.read_text())
    try:
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass  # the task's process is gone


def test_submit_all_submits_the_good_and_raises_for_the_others(pilot: Pilot, anyio_backend: str) -> None:
    async def main() -> None:
        async with AsyncJobExecutor(str(pilot.rundir.path)) as ex:
            first = job("/bin/true")
            await ex.submit(first)
            no_executable = AsyncJob(psij.JobSpec(arguments=["x"]))
            good = [job("/bin/true") for _ in range(40)]
            with pytest.raises(AsyncBatchSubmitException) as err:
                await ex.submit_all([good[0], first, *good[1:], no_executable])
            assert err.value.jobs == [first, no_executable]
            assert isinstance(err.value.failed[0][1], psij.InvalidStateException)
            assert isinstance(err.value.failed[1][1], psij.InvalidJobException)
            assert no_executable.status.state is JobState.NEW and no_executable.executor is None
            assert all(
                j.status.state is JobState.QUEUED or j.status.state.is_greater_than(JobState.QUEUED) for j in good
            )
            for j in good:
                status = await j.wait(timeout=120)
                assert status is not None and status.state is JobState.COMPLETED, (j, status)
            no_executable.spec.executable = "/bin/true"  # type: ignore[union-attr]
            await ex.submit_all([no_executable])  # a refused job stays NEW and may be submitted again
            status = await no_executable.wait(timeout=60)
            assert status is not None and status.state is JobState.COMPLETED

    run(anyio_backend, main)


def test_a_submit_cancelled_before_it_is_sent_leaves_the_job_new_and_the_others_go(
    pilot: Pilot, anyio_backend: str
) -> None:
    async def main() -> None:
        async with AsyncJobExecutor(str(pilot.rundir.path)) as ex:
            withdrawn, kept = job("/bin/true"), job("/bin/true")

            async def cancelled_submit() -> None:
                with anyio.CancelScope() as scope:
                    scope.cancel()  # the submit's first checkpoint is before its worker thread starts
                    await ex.submit(withdrawn)

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancelled_submit)  # it leads, and the batch holds both jobs when it is cancelled
                tg.start_soon(ex.submit, kept)
            assert withdrawn.status.state is JobState.NEW and withdrawn.native_id is None
            assert withdrawn.executor is None
            status = await kept.wait(timeout=60)
            assert status is not None and status.state is JobState.COMPLETED, status
            await ex.submit(withdrawn)  # not submitted, so it may be again
            status = await withdrawn.wait(timeout=60)
            assert status is not None and status.state is JobState.COMPLETED, status
            assert sorted(await ex.list(), key=int) == sorted([str(kept.native_id), str(withdrawn.native_id)], key=int)

    run(anyio_backend, main)


def test_a_job_that_can_never_fit_is_refused_as_the_sync_client_refuses_it(pilot: Pilot, anyio_backend: str) -> None:
    async def main() -> None:
        async with AsyncJobExecutor(str(pilot.rundir.path)) as ex:
            too_big = job("/bin/true", process_count=64)
            with pytest.raises(psij.InvalidJobException, match="never"):
                await ex.submit(too_big)
            assert too_big.status.state is JobState.NEW and too_big.native_id is None
        async with AsyncJobExecutor(str(pilot.rundir.path), pipelined=True) as ex, ex.events() as events:
            too_big = job("/bin/true", process_count=64)
            await ex.submit(too_big)  # pipelined: the refusal comes as a status
            status = await too_big.wait(timeout=60)
            assert status is not None and status.state is JobState.FAILED, status
            assert "can never run in this allocation" in str(status.message), status
            assert [(e.job, e.status.state) async for e in _until_final(events)] == [
                (too_big, JobState.QUEUED),
                (too_big, JobState.FAILED),
            ]
            with pytest.raises(TypeError, match="AsyncJob"):
                await ex.submit(psij.Job(psij.JobSpec(executable="/bin/true")))  # type: ignore[arg-type]
        with pytest.raises(psij.SubmitException, match="closed"):
            await ex.submit(job("/bin/true"))

    run(anyio_backend, main)


async def _until_final(events: JobEvents) -> AsyncIterator[JobEvent]:
    """The events of ``events`` up to the first final state."""
    async for event in events:
        yield event
        if event.status.final:
            return


def test_jobs_awaited_across_a_daemon_killed_and_restarted_end_and_run_once(
    pilot: Pilot, anyio_backend: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with AsyncJobExecutor(str(pilot.rundir.path)) as ex, ex.events() as events:
            jobs = [job("/bin/sh", "-c", f"sleep 2; echo run >> {tmp_path}/mark-{i}") for i in range(4)]
            await ex.submit_all(jobs)
            status = await jobs[0].wait(timeout=60, target_states=JobState.ACTIVE)
            assert status is not None and status.state is JobState.ACTIVE, status
            await anyio.to_thread.run_sync(pilot.kill9)
            await anyio.to_thread.run_sync(pilot.up_again)
            for j in jobs:
                status = await j.wait(timeout=90)
                assert status is not None and status.state is JobState.COMPLETED, (j, status)
            finals = [e async for e in _until_count(events, len(jobs))]
            assert {e.job.id for e in finals} == {j.id for j in jobs}

    run(anyio_backend, main)
    for i in range(4):
        assert (tmp_path / f"mark-{i}").read_text() == "run\n", f"job {i} did not run exactly once"


async def _until_count(events: JobEvents, count: int) -> AsyncIterator[JobEvent]:
    """The final events of ``events`` until ``count`` jobs have ended."""
    async for event in events:
        if event.status.final:
            yield event
            count -= 1
            if count == 0:
                return
