"""The states a client synthesises for statuses it never got (client/job.py): a job's callbacks see its
states in order, and their times never go backwards."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

import client as psij
from client import JobState, JobStatus

pytestmark = pytest.mark.timeout(60)


def seen(first: list[JobStatus]) -> list[JobStatus]:
    job = psij.Job(psij.JobSpec(executable="/bin/true"))
    got: list[JobStatus] = []
    job.set_job_status_callback(lambda _job, status: got.append(status))
    for status in first:
        job._set_status(status)
    return got


def test_an_instant_job_reported_by_its_end_alone_is_queued_no_later_than_it_started() -> None:
    """The race CI found: a job's first status is its COMPLETED (its QUEUED and ACTIVE never came); its
    process started 0.9 ms before it ended. QUEUED was timed at the end, after ACTIVE's start time."""
    done = JobStatus(JobState.COMPLETED, time=1000.0009, exit_code=0, metadata={"started": 1000.0})
    got = seen([done])
    assert [s.state for s in got] == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert [s.time for s in got] == [1000.0, 1000.0, 1000.0009]


def test_a_start_timed_before_the_client_saw_it_queued_is_not_before_that() -> None:
    """The agent's clock may be behind the client's: ACTIVE synthesised from a start time earlier than
    the job's QUEUED is timed at QUEUED, not before it."""
    got = seen(
        [
            JobStatus(JobState.QUEUED, time=10.0),
            JobStatus(JobState.COMPLETED, time=12.0, exit_code=0, metadata={"started": 9.5}),
        ]
    )
    assert [(s.state, s.time) for s in got] == [
        (JobState.QUEUED, 10.0),
        (JobState.ACTIVE, 10.0),
        (JobState.COMPLETED, 12.0),
    ]


times = st.floats(min_value=0, max_value=100, allow_nan=False)


@given(
    queued=st.one_of(st.none(), times),
    started=st.one_of(st.none(), times),
    ended=times,
    final=st.sampled_from([JobState.COMPLETED, JobState.FAILED, JobState.CANCELED]),
)
def test_synthesised_times_never_go_backwards(
    queued: float | None, started: float | None, ended: float, final: JobState
) -> None:
    first = [] if queued is None or queued > ended else [JobStatus(JobState.QUEUED, time=queued)]
    metadata = {} if started is None else {"started": started}
    got = seen([*first, JobStatus(final, time=ended, metadata=metadata)])
    assert got[0].state is JobState.QUEUED and got[-1].state is final
    assert all(b.state.is_greater_than(a.state) for a, b in itertools.pairwise(got))
    stamps = [s.time for s in got]
    assert stamps == sorted(stamps), stamps  # type: ignore[type-var]
    assert got[-1].time == ended, "the status the pilot sent keeps its own time"
