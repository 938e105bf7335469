"""The journal's own checks (pilot/journal_check.py, Store.check, Store.snapshot) on real SQLite files:
what SQLite would silently drop is found before it opens them, and a torn last commit is not damage."""

from __future__ import annotations

import io
import os
import shutil
import struct
from pathlib import Path

import pytest

from pilot.journal_check import wal_damage
from pilot.logs import _Unfailing
from pilot.store import JournalDamaged, Store

pytestmark = pytest.mark.timeout(60)


def _desc(i: int) -> dict[str, object]:
    return {"executable": "/bin/true", "arguments": [str(i), "x" * 300]}


def _journal_as_left_by_a_kill(tmp_path: Path, *, commits: int = 20, last: int = 1) -> Path:
    """A journal whose newest commits are only in its WAL, as a SIGKILLed daemon leaves it (the files are
    copied while the store is still open: a close would checkpoint the WAL away). One job per commit, but
    ``last`` jobs in the last one."""
    src = tmp_path / "src" / "journal.db"
    src.parent.mkdir()
    store = Store.open(src, auto_checkpoint=False)
    for i in range(1, commits):
        with store.batch() as tx:
            tx.job_accepted(str(i), i, _desc(i), float(i))
    with store.batch() as tx:
        for i in range(commits, commits + last):
            tx.job_accepted(str(i), i, _desc(i), float(i))
    dst = tmp_path / "journal.db"
    shutil.copyfile(src, dst)
    shutil.copyfile(f"{src}-wal", f"{dst}-wal")
    store.close()
    return dst


def _frames(journal: Path) -> tuple[bytearray, int, int]:
    data = bytearray(Path(f"{journal}-wal").read_bytes())
    size = 24 + struct.unpack(">I", data[8:12])[0]
    return data, size, (len(data) - 32) // size


def _loaded(journal: Path) -> int:
    with Store.open(journal) as store:
        return len(store.load().jobs)


def test_a_whole_wal_verifies_and_every_commit_loads(tmp_path: Path) -> None:
    journal = _journal_as_left_by_a_kill(tmp_path)
    assert wal_damage(journal) is None
    assert _loaded(journal) == 20


def test_garbage_in_the_middle_of_the_wal_is_found(tmp_path: Path) -> None:
    journal = _journal_as_left_by_a_kill(tmp_path)
    data, size, frames = _frames(journal)
    at = 32 + (frames // 2) * size + 24 + 10
    data[at : at + 32] = b"\xa5" * 32
    Path(f"{journal}-wal").write_bytes(bytes(data))
    damage = wal_damage(journal)
    assert damage is not None and "does not verify" in damage and "committed transaction" in damage, damage
    with pytest.raises(JournalDamaged, match="does not verify"):
        Store.open(journal)
    assert Path(f"{journal}-wal").read_bytes() == data, "the evidence is left as it was"


def test_a_wal_header_that_does_not_verify_is_found(tmp_path: Path) -> None:
    journal = _journal_as_left_by_a_kill(tmp_path)
    data, _, _ = _frames(journal)
    data[16] ^= 0xFF  # its first salt
    Path(f"{journal}-wal").write_bytes(bytes(data))
    damage = wal_damage(journal)
    assert damage is not None and "header" in damage, damage


def test_a_journal_truncated_to_nothing_beside_its_wal_is_found(tmp_path: Path) -> None:
    journal = _journal_as_left_by_a_kill(tmp_path)
    os.truncate(journal, 0)
    damage = wal_damage(journal)
    assert damage is not None and "is empty (0 bytes)" in damage, damage


def test_a_torn_last_commit_is_not_damage(tmp_path: Path) -> None:
    """A daemon killed while it wrote a commit leaves that commit's first frames without its commit frame:
    SQLite ignores them, rightly (the commit was never acknowledged), and so does the check."""
    journal = _journal_as_left_by_a_kill(tmp_path, last=200)  # the last commit spans many pages
    assert _loaded(tmp_path / "src" / "journal.db") == 219
    data, size, frames = _frames(journal)
    Path(f"{journal}-wal").write_bytes(bytes(data[: 32 + (frames - 2) * size]))  # its commit frame torn off
    assert wal_damage(journal) is None
    assert _loaded(journal) == 19


def test_a_wal_shorter_than_its_header_is_found(tmp_path: Path) -> None:
    journal = _journal_as_left_by_a_kill(tmp_path)
    Path(f"{journal}-wal").write_bytes(b"\x37\x7f\x06")
    assert "shorter than a WAL header" in (wal_damage(journal) or "")


def test_quick_check_finds_a_corrupt_page(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    with Store.open(journal) as store:
        with store.batch() as tx:
            for i in range(1, 300):
                tx.job_accepted(str(i), i, _desc(i), 1.0)
        store.check()  # whole
    with open(journal, "r+b") as f:  # closed: every page is in the file now
        f.seek(5 * 4096)
        f.write(b"\x5a" * 4096)
    with pytest.raises(JournalDamaged, match="integrity check"), Store.open(journal) as store:
        store.check()


def test_snapshot_is_a_whole_journal_of_the_last_commit(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    snapshot = tmp_path / "journal.snapshot.db"
    with Store.open(journal, auto_checkpoint=False) as store:
        for i in range(1, 6):
            with store.batch() as tx:
                tx.job_accepted(str(i), i, _desc(i), 1.0)
        store.snapshot(snapshot)
        with store.batch() as tx:
            tx.job_accepted("6", 6, _desc(6), 1.0)
        assert oct(snapshot.stat().st_mode & 0o777) == oct(0o600)
    with Store.open(snapshot) as copy:
        copy.check()
        assert [j.id for j in copy.load().jobs] == ["1", "2", "3", "4", "5"]


def test_a_log_line_that_cannot_be_written_is_dropped() -> None:
    """A full disk must not raise out of a log call (/dev/full answers every write with ENOSPC)."""
    with open("/dev/full", "w") as full:
        out = _Unfailing(full)
        print("lost", file=out, flush=True)  # what structlog's PrintLogger does with each line
        assert out.dropped == 1
    buffer = io.StringIO()
    out = _Unfailing(buffer)  # no file descriptor: written through the stream
    print("kept", file=out, flush=True)
    assert buffer.getvalue() == "kept\n"
