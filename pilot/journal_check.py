"""Is the journal whole? Checked before SQLite reads it, because SQLite itself does not say.

SQLite keeps the newest commits in the WAL (``journal.db-wal``) and, when it opens a database, replays
the frames whose checksums verify and silently drops the rest -- with everything after the first bad
frame, and all of the WAL when the database file is empty. A journal whose WAL holds garbage would then
resume without its newest jobs, and one truncated to 0 bytes would start afresh, both without a word.
:func:`wal_damage` reads the WAL as SQLite would (format: https://sqlite.org/fileformat2.html#walformat)
and says what it would drop:

- a WAL shorter than its header, or whose header does not verify: all of it;
- a committed transaction (a frame with the header's salts and a commit mark) after the frame where
  the checksum chain breaks: that transaction and everything before it back to the break.

Frames after the last commit that belong to no committed transaction are not damage: a daemon killed
while it wrote a commit leaves them, and it never acknowledged that commit. Frames with other salts are
the leftovers of a WAL that was restarted, also not damage.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Final

_MAGIC: Final = (0x377F0682, 0x377F0683)  # checksums in little- / big-endian words
_VERSION: Final = 3007000
_HEADER: Final = 32
_FRAME_HEADER: Final = 24
_MASK: Final = 0xFFFFFFFF


def wal_damage(journal: Path) -> str | None:
    """What SQLite would silently drop of ``journal``'s WAL (``<journal>-wal``), or None when it would
    replay all of it. Reads the WAL once, a frame at a time; no SQLite connection is opened."""
    wal = Path(f"{journal}-wal")
    try:
        f = open(wal, "rb")  # closed by the with below
    except FileNotFoundError:
        return None
    with f:
        length = os.fstat(f.fileno()).st_size
        if not length:
            return None
        where = f"its WAL {wal} ({length} bytes)"
        header = f.read(_HEADER)
        if len(header) < _HEADER:
            return f"{where} is shorter than a WAL header"
        magic, version, page_size, _, salt1, salt2, c1, c2 = struct.unpack(">8I", header)
        if magic not in _MAGIC or version != _VERSION or page_size < 512 or page_size & (page_size - 1):
            return f"{where} does not start with a WAL header: none of it would be replayed"
        big = magic & 1 == 1
        s = _checksum(header[:24], 0, 0, big=big)
        if s != (c1, c2):
            return f"{where} has a header whose checksum does not verify: none of it would be replayed"
        frames = (length - _HEADER) // (_FRAME_HEADER + page_size)
        last_commit = -1
        broken: int | None = None
        lost = 0
        for i in range(frames):
            frame = f.read(_FRAME_HEADER + page_size)
            _, commit, f1, f2, k1, k2 = struct.unpack(">6I", frame[:_FRAME_HEADER])
            if broken is None:
                if (f1, f2) == (salt1, salt2):
                    s = _checksum(frame[:8], *s, big=big)
                    s = _checksum(frame[_FRAME_HEADER:], *s, big=big)
                if (f1, f2) != (salt1, salt2) or s != (k1, k2):
                    broken = i
                elif commit:
                    last_commit = i
            if broken is not None and commit and (f1, f2) == (salt1, salt2):
                lost += 1  # a committed transaction SQLite would not replay
    if lost:
        assert broken is not None
        return (
            f"{where} does not verify from frame {broken + 1} of {frames}: {lost} committed transaction(s) after "
            "it would be dropped"
        )
    if last_commit >= 0 and _size(journal) == 0:
        state = "is empty (0 bytes)" if journal.exists() else "is missing"
        return (
            f"{journal} {state} while {where} holds {last_commit + 1} frame(s) of committed transactions: "
            "the journal file was truncated or removed, and opening it would discard the WAL"
        )
    return None


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _checksum(data: bytes, s0: int, s1: int, *, big: bool) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), continuing from ``(s0, s1)``."""
    words = struct.unpack(f"{'>' if big else '<'}{len(data) // 4}I", data)
    it = iter(words)
    for a, b in zip(it, it, strict=True):
        s0 = (s0 + a + s1) & _MASK
        s1 = (s1 + b + s0) & _MASK
    return s0, s1
