"""The accounting record that outlives the daemon: ``history.db`` in the run directory, one row per job
of every pilot life that stopped cleanly, for 'pilot history' and 'pilot show' after 'pilot down' (as
``sacct`` after a Slurm job). The journal is deleted at a clean stop so the next pilot starts afresh;
just before, its jobs are copied here. A job is (id, submit time): ids start again at 1 in each life.

Read by the CLI without a daemon; what it reads is treated as hostile (a damaged file is one clear error).
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT NOT NULL, submitted REAL NOT NULL, name TEXT, run TEXT, state TEXT NOT NULL, exit_code INTEGER,
    message TEXT, started REAL, ended REAL, row TEXT NOT NULL,
    PRIMARY KEY (id, submitted)
);
CREATE INDEX IF NOT EXISTS jobs_submitted ON jobs (submitted);
"""


class HistoryError(RuntimeError):
    """The history file cannot be read or written; the message names it."""


def keep(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """Add ``rows`` (views' job rows, with their Delivered) to the history at ``path`` (made 0600), one
    at a time: a journal of many jobs is never all in memory. No rows: no file."""
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return
    rows = itertools.chain([first], rows)
    try:
        path.touch(mode=0o600, exist_ok=True)
        with sqlite3.connect(path) as db:
            db.executescript(_SCHEMA)
            db.executemany(
                "INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (  # (a generator: executemany takes one row at a time)
                    (
                        r["id"],
                        r["submitted"],
                        r.get("name"),
                        r.get("run"),
                        r["state"],
                        r.get("exit_code"),
                        r.get("message"),
                        r.get("started"),
                        r.get("ended"),
                        json.dumps(r, default=str),
                    )
                    for r in rows
                ),
            )
        db.close()
    except (sqlite3.Error, OSError) as exc:
        raise HistoryError(f"cannot write the job history {path}: {exc}") from None


def read(
    path: Path,
    *,
    states: Sequence[str] = (),
    name: str | None = None,
    run: str | None = None,
    since: float | None = None,
    job_id: str | None = None,
) -> list[dict[str, Any]]:
    """The rows that match every filter given, oldest first; [] when there is no history yet."""
    if not path.exists():
        return []
    where: list[str] = []
    params: list[Any] = []
    if states:
        where.append(f"state IN ({','.join('?' * len(states))})")
        params += list(states)
    if name is not None:
        where.append("name GLOB ?")
        params.append(name)
    if run is not None:
        where.append("run = ?")
        params.append(run)
    if since is not None:
        where.append("submitted >= ?")
        params.append(since)
    if job_id is not None:
        where.append("id = ?")
        params.append(job_id)
    sql = "SELECT row FROM jobs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY submitted, id"
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            found = [row for (row,) in db.execute(sql, params)]
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise HistoryError(f"cannot read the job history {path}: {exc}") from None
    out = []
    for text in found:
        try:
            row = json.loads(text)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("id"), str):
            out.append(row)
    return out
