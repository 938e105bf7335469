"""Lines written many at once (:func:`pilot.logs.info_lines`, a job's end) read as structlog's own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pilot.security import MASK

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import sys, structlog
    from pilot.logs import configure, info_lines
    configure(level=sys.argv[1], json=sys.argv[2] == "json", stream=sys.stdout)
    log = structlog.get_logger("t")
    def row(i):
        return dict(job=str(i), name="/bin/app API_TOKEN=t0k3n \\u00fc", state="COMPLETED", exit_code=0,
                    nodes=["local-0", "pw=x PASSWORD=hunter2"], processors=1, wall=0.25, run=None,
                    message=None, ok=False)
    log.info("job ended", **row(1))
    info_lines(log, "job ended", [row(2), row(3)])
    info_lines(log, "job ended", [])
    log.warning("after")
    odd = dict(job="4", wall=float("inf"), env={"A": "1"}, deep={"x": ["API_KEY=k3y"]},
               environment=["HOME=/home/u"], db_password="s3cr3t")
    log.info("odd", **odd)
    info_lines(log, "odd", [dict(odd, job="5"), {}])
    """
)


def run(level: str, form: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, level, form], capture_output=True, text=True, timeout=30, cwd=ROOT, check=True
    )
    return proc.stdout.splitlines()


@pytest.mark.parametrize("level", ["info", "debug"])
def test_lines_written_at_once_read_as_one_log_call_each(level: str) -> None:
    lines = run(level, "json")
    assert len(lines) == 7, lines
    parsed: list[dict[str, Any]] = [json.loads(t) for t in lines]
    assert [p["event"] for p in parsed] == ["job ended"] * 3 + ["after"] + ["odd"] * 3
    stamp = re.compile(r'"timestamp": "[^"]*"')

    def text(i: int) -> str:  # a line as structlog wrote line 0 (or 4), its job and timestamp aside
        return stamp.sub("", lines[i]).replace(f'"job": "{parsed[i]["job"]}"', '"job": ""')

    assert text(1) == text(2) == text(0), "byte for byte the line structlog renders"
    assert text(5) == text(4), "a row with other than plain fields: through RedactSecrets and json"
    assert parsed[6] == {"event": "odd", "level": "info", "timestamp": parsed[6]["timestamp"]}
    assert "k3y" not in lines[5] and "s3cr3t" not in lines[5] and parsed[5]["db_password"] == MASK
    if level == "info":
        assert "/home/u" not in lines[5] and "hidden" in parsed[5]["environment"]
    first = parsed[0]
    for i, p in enumerate(parsed[1:3], start=2):
        assert list(p) == list(first), "the same fields in the same order"
        assert p["job"] == str(i) and p["level"] == "info" and p["timestamp"].endswith("Z")
        assert {k: v for k, v in p.items() if k not in ("job", "timestamp")} == {
            k: v for k, v in first.items() if k not in ("job", "timestamp")
        }
    assert "t0k3n" not in lines[1] and "hunter2" not in lines[1]
    assert parsed[1]["nodes"] == ["local-0", f"pw=x PASSWORD={MASK}"] and parsed[1]["ok"] is False


def test_above_info_no_line_and_console_lines_go_through_structlog() -> None:
    assert [json.loads(t)["event"] for t in run("warning", "json")] == ["after"]
    console = run("info", "console")
    assert len(console) == 7 and all("job ended" in t for t in console[:3]), console
    assert "t0k3n" not in "".join(console) and "hunter2" not in "".join(console)


BOUND = textwrap.dedent(
    """
    import sys, structlog
    from pilot.logs import configure, info_lines
    configure(level="info", json=True, stream=sys.stdout)
    log = structlog.get_logger("t")
    info_lines(log, "job ended", [dict(job="1")])
    structlog.contextvars.bind_contextvars(request="r7")
    info_lines(log, "job ended", [dict(job="2")])
    structlog.contextvars.unbind_contextvars("request")
    info_lines(log, "job ended", [dict(job="3")])
    """
)


def test_lines_carry_the_context_bound_while_they_are_written() -> None:
    # Written at once unless structlog's context holds something: then through structlog, which adds it.
    proc = subprocess.run(
        [sys.executable, "-c", BOUND], capture_output=True, text=True, timeout=30, cwd=ROOT, check=True
    )
    parsed = [json.loads(t) for t in proc.stdout.splitlines()]
    assert [(p["job"], p.get("request")) for p in parsed] == [("1", None), ("2", "r7"), ("3", None)]


def test_only_short_values_are_kept_rendered_and_a_long_one_renders_the_same() -> None:
    """The rendered-text cache holds short strings only: a user's long job name or message is rendered
    each time (masked, quoted as json would) and never kept."""
    from pilot import logs

    long_value = "x" * 10_000 + ' "quoted"'
    assert json.loads(logs.json_string(long_value)) == long_value
    assert long_value not in logs._texts
    assert json.loads(logs.json_string("COMPLETED")) == "COMPLETED"
    assert "COMPLETED" in logs._texts


ENDED = textwrap.dedent(
    """
    import json, sys, structlog
    from pilot import job_log
    from pilot.jobs import JobRecord
    from pilot.logs import configure
    from pilot.model.job_description import RUN_TAG, JobDescription
    from pilot.model.job_state import JobState
    configure(level="info", json=True, stream=sys.stdout)
    log = structlog.get_logger("t")
    for case in json.loads(sys.argv[1]):
        d = JobDescription(executable="/bin/true", name=case["name"])
        if case["run"] is not None:
            d.custom_attributes[RUN_TAG] = case["run"]
        job = JobRecord(id=case["id"], description=d, state=JobState(case["state"]), exit_code=case["code"],
                        message=case["message"], metadata=case["metadata"])
        log.info("job ended", **job_log.fields(job))
        job_log.log_ended(log, [job])
        print(json.dumps(job_log.body(job) is not None))
    """
)


def test_a_job_end_renders_as_structlog_renders_its_fields() -> None:
    """The 'job ended' line of a job, written by its own renderer (or, for fields of unusual types, by
    the general path), is byte for byte the line structlog writes from the same fields."""

    def case(job_id: str, metadata: dict[str, Any] | None, **other: Any) -> dict[str, Any]:
        return dict(
            dict(id=job_id, name=None, state="COMPLETED", code=0, message=None, run=None), metadata=metadata, **other
        )

    cases = [
        case("1", {"nodes": ["local-0"], "processors": 1, "wall_duration": 0.0012345678}),
        case(
            "22",
            {"nodes": ["n-1", "pw=x PASSWORD=hunter2"], "processors": 64, "wall_duration": 3},
            name='/bin/app API_TOKEN=t0k3n \u00fc "q"',
            state="FAILED",
            code=-9,
            message="killed: PASSWORD=hunter2",
            run="r\u00e9 1",
        ),
        case("333", None, name="x", state="CANCELED", code=None, message="canceled"),
        case("4", {"nodes": ["a"], "processors": 1, "wall_duration": 1e300 * 1e300}),
        case("5", {"nodes": ["a", 7], "processors": 2.5, "wall_duration": 0.5}),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", ENDED, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 * len(cases), lines
    stamp = re.compile(r'"timestamp": "[^"]*"')
    for i, case in enumerate(cases):
        by_structlog, at_once, rendered_here = lines[3 * i : 3 * i + 3]
        assert stamp.sub("", at_once) == stamp.sub("", by_structlog), case
        assert json.loads(rendered_here) is (i < 3), "the renderer of its own for the usual types only"
    assert "t0k3n" not in proc.stdout and "hunter2" not in proc.stdout
    first = json.loads(lines[1])
    assert first["job"] == "1" and first["wall"] == 0.001235 and first["nodes"] == ["local-0"]
