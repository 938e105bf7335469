"""The client's own objects, no pilot needed: the job description sent for a JobSpec, and Job ids."""

from __future__ import annotations

import enum
import os
import threading
import uuid
from datetime import datetime, timedelta

import pytest

import client as psij
from client._translate import spec_to_wire
from pilot.model.job_description import JobDescription


@pytest.mark.timeout(10)
def test_a_bare_spec_sends_only_what_differs_from_the_defaults() -> None:
    """Defaults are left out (every key is encoded, decoded, checked and journaled), and the pilot reads
    the short form as it read the long one."""
    description = spec_to_wire(psij.JobSpec(executable="/bin/true"))
    # A JobSpec is named after its executable and JobAttributes' duration defaults to 10 minutes.
    assert description == {
        "executable": "/bin/true",
        "name": "/bin/true",
        "duration": 600.0,
        "submit_directory": os.getcwd(),
    }
    long_form = {
        "executable": "/bin/true",
        "arguments": [],
        "directory": None,
        "name": "/bin/true",
        "inherit_environment": True,
        "environment": {},
        "stdin_path": None,
        "stdout_path": None,
        "stderr_path": None,
        "pre_launch": None,
        "post_launch": None,
        "launcher": None,
        "resources": None,
        "duration": 600.0,
        "queue_name": None,
        "project_name": None,
        "reservation_id": None,
        "custom_attributes": {},
        "submit_directory": os.getcwd(),
    }
    assert JobDescription.from_wire(description) == JobDescription.from_wire(long_form)


@pytest.mark.timeout(10)
def test_a_full_spec_sends_every_field() -> None:
    spec = psij.JobSpec(
        executable="/bin/echo",
        arguments=["a", 2],
        directory="/tmp",
        name="n",
        inherit_environment=False,
        environment={"A": 1},
        stdin_path="/dev/null",
        stdout_path="/tmp/o",
        stderr_path="/tmp/e",
        pre_launch="/tmp/pre.sh",
        post_launch="/tmp/post.sh",
        launcher="single",
        resources=psij.ResourceSpecV1(process_count=2, cpu_cores_per_process=1),
        attributes=psij.JobAttributes(
            duration=timedelta(seconds=30),
            queue_name="q",
            project_name="p",
            reservation_id="r",
            custom_attributes={"pilot.retries": 2, "x": timedelta(seconds=1)},
        ),
    )
    description = spec_to_wire(spec)
    assert description["arguments"] == ["a", "2"] and description["environment"] == {"A": "1"}
    assert description["inherit_environment"] is False
    assert description["duration"] == 30.0
    assert description["custom_attributes"] == {"pilot.retries": 2, "x": "0:00:01"}
    assert {k: description[k] for k in ("queue_name", "project_name", "reservation_id")} == {
        "queue_name": "q",
        "project_name": "p",
        "reservation_id": "r",
    }
    parsed = JobDescription.from_wire(description)
    assert parsed.resources.process_count == 2 and parsed.launcher == "single" and parsed.name == "n"
    assert (parsed.directory, parsed.stdin_path, parsed.stdout_path, parsed.stderr_path) == (
        "/tmp",
        "/dev/null",
        "/tmp/o",
        "/tmp/e",
    )
    assert (parsed.pre_launch, parsed.post_launch) == ("/tmp/pre.sh", "/tmp/post.sh")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("queue_name", datetime(2026, 1, 1)),
        ("project_name", uuid.UUID(int=1)),
        ("reservation_id", 7),
        ("queue_name", {"q"}),
    ],
)
def test_attributes_the_pilot_takes_as_text_are_refused_when_they_are_not(field: str, value: object) -> None:
    """The encoder would write a date, a UUID or a set as a value of its own making: refused at submit,
    naming the attribute, instead."""
    attributes = psij.JobAttributes()
    setattr(attributes, field, value)
    spec = psij.JobSpec(executable="/bin/true", attributes=attributes)
    with pytest.raises(psij.InvalidJobException, match=f"JobAttributes.{field} must be a string, not "):
        spec_to_wire(spec)


@pytest.mark.timeout(10)
def test_a_str_subclass_attribute_is_sent_as_its_text() -> None:
    class Queue(str, enum.Enum):  # noqa: UP042 (not StrEnum: its str() is its name, not its text)
        DEBUG = "debug"

    spec = psij.JobSpec(executable="/bin/true", attributes=psij.JobAttributes(queue_name=Queue.DEBUG))
    description = spec_to_wire(spec)
    assert description["queue_name"] == "debug" and type(description["queue_name"]) is str


@pytest.mark.timeout(10)
def test_a_job_id_is_made_once_even_when_threads_race_for_it() -> None:
    """The id is made on first use (most jobs are never asked for it): one id per job, whoever asks."""
    job = psij.Job()
    barrier = threading.Barrier(8)
    ids: list[str] = []

    def ask() -> None:
        barrier.wait()
        ids.append(job.id)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and str(uuid.UUID(ids[0])) == ids[0]
    assert job.id == ids[0] and ids[0] in repr(job)
    assert psij.Job().id != job.id
