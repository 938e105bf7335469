"""A streamed job's output read back (jobs with ``pilot.stream_output``): from the stream files in the
pilot's run directory, never through the daemon, also after the job ended.

``job_output`` returns everything written so far; ``OutputReader`` reads what came since its last read
(``pilot logs -f`` calls it until the job is final). Records of several ranks come in the order each
node's agent wrote them; each carries its rank (slot) and stream.
"""

from __future__ import annotations

from pathlib import Path

from pilot.model.output_stream import Reader
from pilot.rundir import RunDir


class OutputReader:
    def __init__(self, native_id: str, *, rundir: str | Path | None = None, submitted: float | None = None) -> None:
        """``submitted``: the job is of an earlier life of the pilot (ids start again at 1 in each),
        submitted at this Unix time; its life's output is read."""
        run = RunDir(Path(rundir)) if rundir is not None else RunDir.named()
        self._reader = Reader(run.agents_dir, str(native_id), submitted=submitted)

    def read(self) -> list[tuple[int, str, bytes]]:
        """(rank, "out" or "err", bytes) records appended since the last read."""
        return self._reader.read()


def job_output(native_id: str, *, rundir: str | Path | None = None) -> tuple[bytes, bytes]:
    """The job's streamed stdout and stderr so far, every rank's (each in the order written)."""
    out: list[bytes] = []
    err: list[bytes] = []
    for _, stream, data in OutputReader(native_id, rundir=rundir).read():
        (out if stream == "out" else err).append(data)
    return b"".join(out), b"".join(err)


__all__ = ["OutputReader", "job_output"]
