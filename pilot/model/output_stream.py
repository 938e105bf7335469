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

from collections.abc import Iterable, Iterator
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


class Reader:
    """One job's records from a set of stream files, read incrementally: each :meth:`read` returns what
    was appended since the last (``follow`` by calling it again). ``job_id`` also matches the job's
    later placements (``<id>~<n>``)."""

    def __init__(self, root: Path, job_id: str) -> None:
        self._root = root
        self._job = job_id
        self._prefix = f"{job_id}~"
        self._offsets: dict[Path, int] = {}

    def read(self) -> list[tuple[int, str, bytes]]:
        """(slot, stream, data) records of the job appended since the last call, file by file."""
        out: list[tuple[int, str, bytes]] = []
        for path in stream_files(self._root):
            out += self._read_file(path)
        return out

    def _read_file(self, path: Path) -> Iterable[tuple[int, str, bytes]]:
        offset = self._offsets.get(path, 0)
        found = []
        unpacker = msgpack.Unpacker(use_list=True, raw=False, max_buffer_size=_CHUNK + 2 * MAX_RECORD)
        try:
            with path.open("rb") as f:
                f.seek(offset)
                while chunk := f.read(_CHUNK):
                    unpacker.feed(chunk)
                    for job_id, slot, stream, data in _records(unpacker):
                        if job_id == self._job or job_id.startswith(self._prefix):  # type: ignore[attr-defined]
                            found.append((slot, stream, data))
        except OSError:
            pass
        self._offsets[path] = offset + unpacker.tell()
        return found  # type: ignore[return-value]


_CHUNK: Final = 4 << 20


def _records(unpacker: msgpack.Unpacker) -> Iterator[list[object]]:
    """Whole, well-formed records (the file is hostile input: anything else ends the read of it)."""
    while True:
        try:
            record = next(unpacker)
        except (StopIteration, msgpack.OutOfData):
            return
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            return
        if not (
            isinstance(record, list)
            and len(record) == 4
            and isinstance(record[0], str)
            and type(record[1]) is int
            and record[2] in STREAMS
            and isinstance(record[3], bytes)
            and len(record[3]) <= MAX_RECORD
        ):
            return
        yield record


__all__ = ["MAX_RECORD", "STREAM_OUTPUT", "SUFFIX", "Reader", "pack", "stream_files"]
