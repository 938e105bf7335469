"""Output streaming: the stdout/stderr of many tasks in a few append-only files per node, not two per task.

A streamed task's output goes through a pipe to its agent, which appends it to its node's stream file
(``<agent workdir>/streams/<node>.stream``) as records, each framed with the job id, the rank (slot) and
the stream: a msgpack array ``[job_id, slot, "out"|"err", bytes]``. One writer per file, one write per
record: a reader sees whole records (a torn last one only while it is being written, and it is left for
the next read). Readers (``pilot logs``, the client) read the files, never the daemon, and never slow
the agent down: the agent does not know they are there.

A job asks for it with the custom attribute ``pilot.stream_output`` (true or false); a pilot makes it the
default with ``[pilot] stream_output = true``. Only the streams the job names no file for are streamed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Final

import msgpack

STREAM_OUTPUT: Final = "pilot.stream_output"
SUFFIX: Final = ".stream"
STREAMS: Final = ("out", "err")
#: The largest record an agent writes (it splits longer reads): a reader refuses anything longer.
MAX_RECORD: Final = 1 << 20


def pack(job_id: str, slot: int, stream: str, data: bytes) -> bytes:
    return msgpack.packb([job_id, slot, stream, data], use_bin_type=True)  # type: ignore[no-any-return]


def stream_files(root: Path) -> list[Path]:
    """Every node's stream file under ``root`` (a run directory's agents directory)."""
    return sorted(root.rglob(f"*{SUFFIX}")) if root.is_dir() else []


#: A retired stream file: ``<node>.stream.earlier-<ms>``, ``<ms>`` the Unix time (milliseconds) at which
#: the life after the one that wrote it began. (A bare ``.earlier`` is a retired file of older pilots.)
RETIRED: Final = SUFFIX + ".earlier"


def retire(root: Path, *, now: float) -> list[Path]:
    """At a pilot's fresh start (``now``), when job ids start again at 1: the earlier life's stream
    files become ``<node>.stream.earlier-<ms>``, so that a new job's output is never read back mixed
    with that of the earlier life's job of the same id, and the earlier job's is still found
    (:func:`files_of_life`). Returns the files renamed."""
    retired = []
    stamp = f"-{int(now * 1000)}"
    for path in stream_files(root):
        target = path.with_name(path.name + ".earlier" + stamp)
        try:
            path.replace(target)
        except OSError:
            continue  # not ours to move (or gone): readers then see it as before
        retired.append(target)
    return retired


def files_of_life(root: Path, submitted: float) -> list[Path]:
    """The stream files of the life in which a job submitted at ``submitted`` (Unix time) ran: those
    retired by the first fresh start after it, or, if none came since, the current ones."""
    lives: dict[float, list[Path]] = {}
    for path in root.rglob(f"*{RETIRED}*") if root.is_dir() else []:
        tail = path.name.rsplit(RETIRED, 1)[1]
        if tail == "":
            try:
                ended = path.stat().st_mtime  # an older pilot's: its last write is within its life
            except OSError:
                continue
        elif tail[0] == "-" and tail[1:].isdigit():
            ended = int(tail[1:]) / 1000
        else:
            continue  # not a name this module gives
        lives.setdefault(ended, []).append(path)
    after = [ended for ended in lives if ended > submitted]
    return sorted(lives[min(after)]) if after else stream_files(root)


class Reader:
    """One job's records from a set of stream files, read incrementally: each :meth:`read` returns what
    was appended since the last (``follow`` by calling it again). ``job_id`` also matches the job's
    later placements (``<id>~<n>``). ``submitted``: the job is of an earlier life of the pilot, submitted
    then (its history row says when): its life's files are read (:func:`files_of_life`)."""

    def __init__(self, root: Path, job_id: str, *, submitted: float | None = None) -> None:
        self._root = root
        self._submitted = submitted
        self._job = job_id
        self._prefix = f"{job_id}~"
        self._offsets: dict[Path, int] = {}

    def read(self) -> list[tuple[int, str, bytes]]:
        """(slot, stream, data) records of the job appended since the last call, file by file."""
        out: list[tuple[int, str, bytes]] = []
        paths = stream_files(self._root) if self._submitted is None else files_of_life(self._root, self._submitted)
        for path in paths:
            out += self._read_file(path)
        return out

    def _read_file(self, path: Path) -> Iterable[tuple[int, str, bytes]]:
        """Whole records after the last read. The file is hostile input: a record that is not one ends
        the read of this file there (for good: the agent never writes one)."""
        offset = self._offsets.get(path, 0)
        found: list[tuple[int, str, bytes]] = []
        unpacker = msgpack.Unpacker(use_list=True, raw=False, max_buffer_size=_CHUNK + 2 * MAX_RECORD)
        done = 0  # bytes of whole records read (tell() also counts a torn record's start)
        try:
            with path.open("rb") as f:
                f.seek(offset)
                while chunk := f.read(_CHUNK):
                    try:
                        unpacker.feed(chunk)
                    except msgpack.BufferFull:  # a "record" longer than any the agent writes
                        break
                    while (record := _next(unpacker)) is not None:
                        if record is _DAMAGED:
                            self._offsets[path] = offset + done
                            return found
                        done = unpacker.tell()
                        job_id, slot, stream, data = record
                        if job_id == self._job or job_id.startswith(self._prefix):
                            found.append((slot, stream, data))
        except OSError:
            pass
        self._offsets[path] = offset + done
        return found


_CHUNK: Final = 4 << 20


_DAMAGED: Final[tuple[str, int, str, bytes]] = ("", 0, "", b"")


def _next(unpacker: msgpack.Unpacker) -> tuple[str, int, str, bytes] | None:
    """The next whole record; None when the data read so far ends (maybe inside one); _DAMAGED for
    anything that is not a record."""
    try:
        record = next(unpacker)
    except (StopIteration, msgpack.OutOfData):
        return None
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return _DAMAGED
    if not (
        isinstance(record, list)
        and len(record) == 4
        and isinstance(record[0], str)
        and type(record[1]) is int
        and record[2] in STREAMS
        and isinstance(record[3], bytes)
        and len(record[3]) <= MAX_RECORD
    ):
        return _DAMAGED
    return (record[0], record[1], record[2], record[3])


__all__ = ["MAX_RECORD", "STREAM_OUTPUT", "SUFFIX", "Reader", "files_of_life", "pack", "retire", "stream_files"]
