"""The daemon's young-collection threshold follows its unfinished jobs (pilot/collector.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from pilot import collector
from pilot.collector import PER_JOB, THRESHOLDS, YoungThreshold


@pytest.fixture
def tuned(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    before = gc.get_threshold()
    monkeypatch.setattr(collector, "_tuned", True)
    try:
        yield
    finally:
        gc.set_threshold(*before)


@pytest.mark.timeout(10)
def test_threshold_stays_between_one_and_two_per_job_allowances(tuned: None) -> None:
    young = YoungThreshold()
    for jobs in (0, 1, 100, 2083, 2084, 5000, 100_000, 1_000_000, 3, 0):
        young.fit(jobs)
        threshold = gc.get_threshold()
        assert threshold[1:] == THRESHOLDS[1:]
        assert threshold[0] >= max(THRESHOLDS[0], PER_JOB * jobs)
        assert threshold[0] <= max(THRESHOLDS[0], 2 * PER_JOB * jobs)


@pytest.mark.timeout(10)
def test_refits_only_when_the_band_changes(tuned: None) -> None:
    young = YoungThreshold()
    young.fit(1)
    gc.set_threshold(1234, *THRESHOLDS[1:])
    for jobs in (0, 2, 1, 2000, 0):  # a lone job's turns, and up to what the base threshold covers
        young.fit(jobs)
    assert gc.get_threshold()[0] == 1234
    young.fit(10_000)
    gc.set_threshold(1234, *THRESHOLDS[1:])  # (a mark: a refit would overwrite it)
    young.fit(9_000)
    young.fit(16_383)
    assert gc.get_threshold()[0] == 1234
    young.fit(16_384)
    assert gc.get_threshold()[0] == PER_JOB * 32_768


@pytest.mark.timeout(10)
def test_leaves_an_untuned_process_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collector, "_tuned", False)  # (a process that never called collect_rarely)
    before = gc.get_threshold()
    YoungThreshold().fit(1_000_000)
    assert gc.get_threshold() == before
