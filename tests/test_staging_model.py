"""The staging and output-stream formats on their own (in process): hostile descriptions refused naming
the fix, what an outcome selects, and stream files read back whole, torn or damaged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pilot.model.job_description import DescriptionError, JobDescription
from pilot.model.output_stream import Reader, pack
from pilot.model.staging import ALWAYS, IF_PRESENT, ON_CANCEL, ON_ERROR, ON_SUCCESS, Staging, Transfer

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"stage_in": "x"}, "stage_in must be a list"),
        ({"stage_in": [["/a"]]}, "items are [source, target, mode"),
        ({"stage_in": [["/a", "b", "teleport"]]}, "mode 'teleport' is not one of copy, link, move"),
        ({"stage_in": [["gsiftp://h/a", "b", "copy"]]}, "use one of file, http, https"),
        ({"stage_in": [["a", "b", "copy"]]}, "is not an absolute path"),
        ({"stage_in": [["/a", "../b", "copy"]]}, "leaves the job's directory"),
        ({"stage_out": [["o", "https://h/o", "copy", 2]]}, "use one of file (a plain"),
        ({"stage_out": [["o", "/o", "copy", 99]]}, "must be StageOutFlags"),
        ({"stage_out": [["o", "/o", "copy", True]]}, "must be StageOutFlags"),
        ({"cleanup": ["."]}, "names a whole directory tree"),
        ({"cleanup": [""]}, "holds paths"),
        ({"cleanup_flags": -1}, "must be StageOutFlags"),
    ],
)
def test_a_bad_staging_description_is_refused_naming_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(DescriptionError) as info:
        JobDescription.from_wire({"executable": "/bin/true", **fields})
    assert message in str(info.value)
    assert "JobSpec." in str(info.value)


def test_a_description_keeps_its_staging_through_the_wire_and_the_outcome_selects() -> None:
    raw = {
        "executable": "/bin/true",
        "stage_in": [["http://h/a", "in/./a", "link"]],
        "stage_out": [["o", "/r/o", "copy", IF_PRESENT], ["e", "file:///r/e", "move", ON_ERROR | ON_CANCEL]],
        "cleanup": ["tmp/"],
        "cleanup_flags": ON_SUCCESS,
    }
    d = JobDescription.from_wire(raw)
    s = d.staging
    assert s.stage_in == (Transfer("http://h/a", "in/a", "link"),)
    assert s.stage_out[0].flags == IF_PRESENT | ALWAYS  # no outcome named: every outcome
    assert [t.source for t in s.outgoing("COMPLETED")] == ["o"]
    assert [t.source for t in s.outgoing("CANCELED")] == ["o", "e"]
    assert s.cleans_up("COMPLETED") and not s.cleans_up("FAILED")
    assert JobDescription.from_wire(d.to_wire()) == d
    assert not Staging() and JobDescription.from_wire({"executable": "/bin/true"}).to_wire().keys().isdisjoint(
        {"stage_in", "stage_out", "cleanup", "cleanup_flags"}
    )


def test_a_stream_file_reads_back_per_job_incrementally_and_stops_at_damage(tmp_path: Path) -> None:
    node = tmp_path / "a1" / "streams" / "n0.stream"
    node.parent.mkdir(parents=True)
    first = pack("7", 0, "out", b"a") + pack("8", 0, "out", b"x") + pack("7~1", 1, "err", b"b")
    last = pack("7", 0, "out", b"c")
    node.write_bytes(first + last[:3])  # the last record is still being written
    reader = Reader(tmp_path, "7")
    assert reader.read() == [(0, "out", b"a"), (1, "err", b"b")]
    with node.open("ab") as f:
        f.write(last[3:])
    assert reader.read() == [(0, "out", b"c")]  # the torn record, whole now; nothing twice
    assert reader.read() == []
    with node.open("ab") as f:
        f.write(b"\x93\xa17\x00\xa3bad" + pack("7", 0, "out", b"d"))  # a record that is not one
    assert reader.read() == []  # the damage ends the read of that file; nothing false is returned


def test_a_stream_file_claiming_a_huge_record_is_damage_not_memory(tmp_path: Path) -> None:
    node = tmp_path / "n0.stream"
    # A record whose bytes claim 2 GiB: the reader stops there instead of buffering the file.
    node.write_bytes(pack("7", 0, "out", b"a") + b"\x94\xa17\x00\xa3out\xc6\x80\x00\x00\x00" + b"z" * (9 << 20))
    reader = Reader(tmp_path, "7")
    assert reader.read() == [(0, "out", b"a")]
    assert reader.read() == []
