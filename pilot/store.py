"""The journal: what the daemon has accepted and done, kept in SQLite so a restarted daemon loses nothing.

One file, ``journal.db`` in the run directory (mode 0600), in WAL mode. The daemon records the changes
of one flush into a :class:`Batch` and commits them in one transaction (``with store.batch() as tx:``),
then acknowledges submissions: a submit reply is only sent once the job is in the journal.

Durability choice: ``synchronous=NORMAL``. In WAL mode a commit is a ``write()`` of the frames into the
WAL file; NORMAL skips the ``fsync`` per commit (it syncs only at checkpoints). The data is then in the
kernel's page cache, so it survives the daemon being SIGKILLed, OOM-killed or crashing one instruction
after the commit -- the stated guarantee -- but not a power loss or kernel crash of the login node, which
may lose the last commits (never corrupt the file). FULL would add an fsync per flush: milliseconds on a
local disk and far worse on the NFS/Lustre home directories run directories often live on, which would cap
submissions at a few hundred batches a second. ``Store.open(path, durable=True)`` selects FULL for those
who want power-loss safety at that price.

Checkpoints (copying the WAL into ``journal.db``, with an ``fsync`` of both) are SQLite's own by default,
run inside whichever commit finds the WAL past 1,000 pages. The daemon turns that off
(``auto_checkpoint=False``) and, every few commits, asks :meth:`Store.checkpoint_due` and runs
:meth:`Store.checkpoint` in a worker thread, holding its commits while a checkpoint runs: on a network
home directory that ``fsync`` takes tens of milliseconds, which its event loop must not wait out (nor
the ``stat`` of the WAL, which there may write its dirty pages back first).

``locking_mode=EXCLUSIVE``: one daemon owns the journal (a second one gets a clear error), and WAL then
keeps its index in process memory instead of a shared-memory file, which does not work on network file
systems. The OS drops the lock when the owner dies, SIGKILL included.

Payloads (job descriptions, process orders, Delivered metadata, result data) are msgpack blobs: the wire
forms the daemon already has, cheap to write, and re-validated by their ``from_wire`` on load.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import msgpack

from pilot.journal_check import wal_damage
from pilot.model.job_state import FINAL_NAMES as _FINAL
from pilot.store_batch import Batch, pack_orders, unpack
from pilot.store_load import Recovered, read

JOURNAL_FILE: Final = "journal.db"
#: WAL size past which :meth:`Store.checkpoint_due` says so: SQLite's own threshold (1,000 pages of 4 KiB).
CHECKPOINT_BYTES: Final = 4 << 20
#: 2: several allocations (id = the n of its key a<n>), each with its site; 3: a job's submit id (its
#: client's own id for it: pipelined submits), indexed, so a submit sent again after a lost answer finds
#: the job it made the first time; 4: that column and its index renamed from key and jobs_key to
#: submit_id and jobs_submit_id; 5: how many times each job was placed (its processes' job id follows it);
#: 6: a job's id is the table's integer key (see _SCHEMA); 7: a job's outstanding process orders are a
#: column of its row (``orders``), written with the row and cleared when it ends, not a table's rows.
SCHEMA_VERSION: Final = 7
#: ``PRAGMA application_id`` of a pilot journal ("PJRN"): tells our file from any other SQLite database.
APPLICATION_ID: Final = 0x504A524E

#: A job's id (the pilot's sequence number, a decimal string in the code) is the jobs table's integer key:
#: a row is appended, found and rewritten in one b-tree, where a text key needed a second one (an index
#: in which each new id falls among the old, "10000" between "1000" and "1001") on every write.
_SCHEMA: Final = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    description BLOB NOT NULL,
    submitted REAL NOT NULL,
    state TEXT NOT NULL,
    state_time REAL NOT NULL,
    exit_code INTEGER,
    message TEXT,
    metadata BLOB,
    phase TEXT NOT NULL DEFAULT 'queued',
    started REAL,
    ended REAL,
    cancel_reason TEXT,
    closing INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0,
    ranks BLOB,
    environment BLOB,
    unset BLOB,
    submit_id TEXT,
    placements INTEGER NOT NULL DEFAULT -1,
    orders BLOB
);
CREATE INDEX jobs_submit_id ON jobs (submit_id) WHERE submit_id IS NOT NULL;
CREATE TABLE results (
    job_id TEXT NOT NULL,
    slot INTEGER NOT NULL,
    node TEXT NOT NULL,
    role TEXT NOT NULL,
    exit_code INTEGER,
    signal INTEGER,
    message TEXT,
    reason TEXT,
    data BLOB,
    PRIMARY KEY (job_id, slot)
) WITHOUT ROWID;
CREATE TABLE allocation (
    id INTEGER PRIMARY KEY,
    lrm TEXT NOT NULL,
    native_id TEXT NOT NULL,
    state TEXT NOT NULL,
    nodes INTEGER NOT NULL,
    submitted REAL NOT NULL,
    started REAL,
    walltime REAL,
    expected_nodes BLOB NOT NULL,
    hosts BLOB NOT NULL,
    message TEXT NOT NULL,
    detail BLOB,
    site TEXT NOT NULL DEFAULT 'main'
);
CREATE TABLE nodes (name TEXT PRIMARY KEY, config BLOB NOT NULL) WITHOUT ROWID;
"""


class JournalError(Exception):
    """The journal cannot be used; the message names the file and what to do about it."""


class JournalDamaged(JournalError):
    """The journal is damaged (not a database, a corrupt page, a WAL that does not verify, a record that
    cannot be read): ``damage`` says what was found, without advice (the daemon adds what to do)."""

    def __init__(self, message: str, *, damage: str) -> None:
        super().__init__(message)
        self.damage = damage


class Store:
    """The open journal. Not thread-safe: the daemon's I/O task owns it, like the job table (a
    checkpoint may run in another thread while nothing else uses the store)."""

    def __init__(self, path: Path, db: sqlite3.Connection, *, checkpoint_bytes: int = CHECKPOINT_BYTES) -> None:
        self.path = path
        self._db = db
        self._in_batch = False
        self._wal = f"{path}-wal"
        self._checkpoint_bytes = checkpoint_bytes
        #: Transactions committed since the journal was opened (what a caller may pace its checkpoints by).
        self.commits = 0

    @classmethod
    def in_run_dir(
        cls,
        run_dir: Path,
        *,
        durable: bool = False,
        auto_checkpoint: bool = True,
        checkpoint_bytes: int = CHECKPOINT_BYTES,
    ) -> Store:
        return cls.open(
            run_dir / JOURNAL_FILE,
            durable=durable,
            auto_checkpoint=auto_checkpoint,
            checkpoint_bytes=checkpoint_bytes,
        )

    @classmethod
    def open(
        cls,
        path: Path | str,
        *,
        durable: bool = False,
        auto_checkpoint: bool = True,
        checkpoint_bytes: int = CHECKPOINT_BYTES,
    ) -> Store:
        """Open or create the journal at ``path``; :class:`JournalError` when it is not a usable one.
        ``auto_checkpoint=False``: commits never checkpoint; the owner calls :meth:`checkpoint` (from any
        one thread at a time) when :meth:`checkpoint_due`."""
        path = Path(path)
        try:
            damage = wal_damage(path)  # before SQLite opens it: it would drop what does not verify, silently
        except OSError as exc:
            raise JournalError(f"cannot read the pilot journal's WAL {path}-wal: {exc.strerror}") from None
        if damage is not None:
            raise _damaged(path, damage)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise JournalError(f"cannot open the pilot journal {path}: {exc.strerror}") from None
        try:
            if os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, 0o600)  # job descriptions carry environments: the user's eyes only
        finally:
            os.close(fd)
        try:
            db = sqlite3.connect(path, isolation_level=None, timeout=0.5, check_same_thread=auto_checkpoint)
        except sqlite3.Error as exc:
            raise _error(path, exc) from None
        try:
            _setup(db, path, durable=durable)
            if not auto_checkpoint:
                db.execute("PRAGMA wal_autocheckpoint = 0")
        except UnicodeDecodeError:
            # SQLite's message quotes a damaged schema byte that Python cannot decode: a corrupt file.
            db.close()
            raise _damaged(path, "it is corrupt (its schema is damaged)") from None
        except BaseException:
            db.close()
            raise
        return cls(path, db, checkpoint_bytes=checkpoint_bytes)

    @contextmanager
    def batch(self) -> Iterator[Batch]:
        """Collect changes; on normal exit write them all in one transaction and commit (returning means
        committed), on an exception write nothing. Acknowledge to clients only after this returns."""
        if self._in_batch:
            raise RuntimeError("journal batches do not nest")
        self._in_batch = True
        try:
            tx = Batch()
            yield tx
            self.commit(tx)
        finally:
            self._in_batch = False

    def commit(self, tx: Batch) -> None:
        """Write ``tx`` in one transaction and commit; for a daemon that keeps a :class:`Batch` open while
        it handles a burst of messages and commits it at the start of its flush, before any reply goes out.
        All of it or none of it is written; :class:`JournalError` when the journal cannot be written."""
        if tx.empty:
            return
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                tx.write(db)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # SQLite rolls back by itself after some errors (a full disk)
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise _error(self.path, exc) from None
        self.commits += 1

    def check(self) -> None:
        """SQLite's ``quick_check`` of every page (b-tree structure, records, free list; not whether each
        index matches its table): :class:`JournalDamaged` when a page is corrupt. Reads the whole file."""
        try:
            rows = self._db.execute("PRAGMA quick_check(5)").fetchall()
        except sqlite3.Error as exc:
            error = _error(self.path, exc)
            if isinstance(error, JournalDamaged):  # too damaged for the check to finish
                raise _damaged(self.path, f"SQLite's integrity check finds: {exc}") from None
            raise error from None
        found = [str(r[0]) for r in rows]
        if found != ["ok"]:
            raise _damaged(self.path, "SQLite's integrity check finds: " + "; ".join(found))

    def snapshot(self, target: Path) -> None:
        """Copy the journal as of its last commit to ``target`` (SQLite's online backup), through a
        temporary file renamed into place, so ``target`` is always a whole snapshot. Blocking (reads the
        whole journal, writes the copy): run it in a worker thread, touching nothing else of the store
        until it returns. :class:`JournalError` when the copy cannot be written (the old one stays)."""
        tmp = target.with_name(target.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)  # job environments: private
            os.close(fd)
            dst = sqlite3.connect(tmp, isolation_level=None)
            try:
                dst.execute("PRAGMA journal_mode = OFF")  # a scratch copy until renamed: no journal of its own
                self._db.backup(dst)
            finally:
                dst.close()
            os.replace(tmp, target)
        except (OSError, sqlite3.Error) as exc:
            tmp.unlink(missing_ok=True)
            text = exc.strerror if isinstance(exc, OSError) else str(exc)
            raise JournalError(f"cannot write the journal snapshot {target}: {text}") from None

    def checkpoint_due(self) -> bool:
        """The WAL has outgrown ``checkpoint_bytes``. A ``stat`` of the WAL, which on NFS first writes
        its dirty pages back: call it off the event loop. Touches no SQLite state: commits may go on."""
        try:
            return os.stat(self._wal).st_size >= self._checkpoint_bytes
        except FileNotFoundError:
            return False

    def checkpoint(self) -> None:
        """Copy the WAL into the journal file and empty it. Blocking (two ``fsync``): run it in a worker
        thread, touching nothing else of the store until it returns."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            raise _error(self.path, exc) from None

    def load(self, *, ended: bool = True) -> Recovered:
        """What the journal holds, rebuilt into job records (``ended``: the ended jobs' too; a daemon
        that resumes counts them instead, see :mod:`pilot.store_load`); :class:`JournalError` if it is
        damaged."""
        try:
            return read(self._db, ended=ended)
        except sqlite3.Error as exc:
            raise _error(self.path, exc) from None
        except (
            ValueError,
            TypeError,
            KeyError,
            IndexError,
            OverflowError,
            UnicodeDecodeError,
            msgpack.UnpackException,
        ) as exc:
            raise _damaged(
                self.path, f"it holds a record this pilot cannot read ({type(exc).__name__}: {exc})"
            ) from None

    def jobs_by_submit_id(self, submit_ids: Sequence[str]) -> dict[str, list[str]]:
        """The jobs the journal holds under these submit ids: submit id -> job ids in the order they were
        accepted (several for a document's submit id: all its jobs share it). An indexed look-up, paid
        only by submits that carry submit ids."""
        found: dict[str, list[str]] = {}
        try:
            for start in range(0, len(submit_ids), _SUBMIT_IDS_PER_QUERY):
                chunk = submit_ids[start : start + _SUBMIT_IDS_PER_QUERY]
                rows = self._db.execute(
                    f"SELECT submit_id, id FROM jobs WHERE submit_id IN ({','.join('?' * len(chunk))}) ORDER BY seq",
                    chunk,
                )
                for submit_id, job_id in rows:
                    found.setdefault(submit_id, []).append(str(job_id))
        except sqlite3.Error as exc:
            raise _error(self.path, exc) from None
        return found

    def job_rows(
        self,
        *,
        states: Sequence[str] = (),
        since: float | None = None,
        newest_first: bool = False,
        by_end: bool = False,
    ) -> Iterator[tuple[Any, ...]]:
        """Job summary rows for 'pilot jobs' and the history, one at a time, in submission order (or
        newest first; ``by_end``: by the time of their last state instead, an ended job's end), narrowed
        by state and submit time: (id, description map, state, state_time,
        exit_code, message, metadata, submitted, started, ended). A map or metadata that cannot be read
        comes as {} (the row is still listed). Consume it (or close it) before the next commit."""
        where: list[str] = []
        params: list[Any] = []
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            params += list(states)
        if since is not None:
            where.append("submitted >= ?")
            params.append(since)
        sql = (
            "SELECT id, description, state, state_time, exit_code, message, metadata, submitted, started, ended "
            "FROM jobs"
            + (" WHERE " + " AND ".join(where) if where else "")
            + (" ORDER BY state_time" if by_end else " ORDER BY seq")
        ) + (" DESC" if newest_first else "")
        try:
            cursor = self._db.execute(sql, params)
        except sqlite3.Error as exc:
            raise _error(self.path, exc) from None
        try:
            while rows := cursor.fetchmany(1000):
                for job_id, desc, state, t, code, message, meta, submitted, started, ended in rows:
                    yield (str(job_id), _map(desc), state, t, code, message, _map(meta), submitted, started, ended)
        except sqlite3.Error as exc:
            raise _error(self.path, exc) from None
        finally:
            cursor.close()

    def job_status(self, job_id: str) -> tuple[list[Any], str | None] | None:
        """A job's status in its wire form and its name, from the journal (the daemon keeps only jobs
        that have not ended in memory); None when there is no such job."""
        found = self.job_record(job_id)
        if found is None:
            return None
        raw, status, _, _, _ = found
        name = raw.get("name")
        return status, name if isinstance(name, str) else None

    def job_record(self, job_id: str) -> tuple[dict[str, Any], list[Any], float, float | None, float | None] | None:
        """A job's description as accepted (the wire map, with its SSS document if it came as one), its
        status, and its submit, start and end times: what 'pilot show' needs of an ended job."""
        if not (job_id.isdigit() and job_id.isascii() and str(int(job_id)) == job_id):
            return None  # no job has it (SQLite would read "007" as job 7)
        try:
            row = self._db.execute(
                "SELECT description, state, state_time, exit_code, message, metadata, submitted, started, ended "
                "FROM jobs WHERE id = ?",
                (job_id,),
            ).fetchone()
        except sqlite3.Error as exc:
            raise _error(self.path, exc) from None
        if row is None:
            return None
        desc, state, t, code, message, meta, submitted, started, ended = row
        try:
            raw = unpack(desc)
        except (ValueError, TypeError, msgpack.UnpackException):
            raw = None
        try:
            metadata = unpack(meta) if meta is not None else None
        except (ValueError, TypeError, msgpack.UnpackException):
            metadata = None
        status = [job_id, state, t, code, message, metadata or None]
        return raw if isinstance(raw, dict) else {}, status, submitted, started, ended

    def close(self) -> None:
        """Checkpoint and close (a clean shutdown leaves just ``journal.db``)."""
        try:
            self._db.close()
        except sqlite3.Error as exc:
            raise _error(self.path, exc) from None

    def discard(self) -> None:
        """Close and delete the journal: the pilot stopped cleanly, so the next one on this run directory
        starts afresh instead of resuming."""
        try:
            self.close()
        finally:  # also when the close's checkpoint fails (a full disk): the next pilot must not resume
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(f"{self.path}{suffix}")
                except FileNotFoundError:
                    pass

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _map(blob: bytes | None) -> dict[str, Any]:
    """A journaled msgpack map, or {} when there is none or it cannot be read."""
    if blob is None:
        return {}
    try:
        value = unpack(blob)
    except (ValueError, TypeError, msgpack.UnpackException):
        return {}
    return value if isinstance(value, dict) else {}


#: Submit ids per look-up statement: under SQLite's oldest limit on bound parameters (999).
_SUBMIT_IDS_PER_QUERY: Final = 500

_FIX: Final = (
    "if it is damaged or not a pilot journal, move it aside (mv {path} {path}.bad) and start the pilot again -- "
    "the jobs recorded in it are then forgotten -- or use the run directory this journal belongs to"
)


def _migrate_v1(db: sqlite3.Connection) -> None:
    """Schema 1 held one allocation (id 1, no site): it becomes a1 of the main site."""
    db.execute("ALTER TABLE allocation RENAME TO allocation_v1")
    create = _SCHEMA[_SCHEMA.index("CREATE TABLE allocation") :]
    db.execute(create[: create.index(";")])
    db.execute("INSERT INTO allocation SELECT *, 'main' FROM allocation_v1")
    db.execute("DROP TABLE allocation_v1")


def _migrate_v2(db: sqlite3.Connection) -> None:
    """Schema 2 had no submit ids: every job it holds has none. The column gets schema 3's name (``key``);
    :func:`_migrate_v3`, which always follows, renames it and makes its index."""
    if {"key", "submit_id"}.isdisjoint(row[1] for row in db.execute("PRAGMA table_info(jobs)")):
        db.execute("ALTER TABLE jobs ADD COLUMN key TEXT")


def _migrate_v3(db: sqlite3.Connection) -> None:
    """Schema 3 called a job's submit id ``key``, indexed as ``jobs_key``: both take their new names."""
    if "key" in {row[1] for row in db.execute("PRAGMA table_info(jobs)")}:
        db.execute("ALTER TABLE jobs RENAME COLUMN key TO submit_id")
    db.execute("DROP INDEX IF EXISTS jobs_key")
    index = _SCHEMA[_SCHEMA.index("CREATE INDEX jobs_submit_id") :]
    db.execute(index[: index.index(";")].replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS"))


def _migrate_v4(db: sqlite3.Connection) -> None:
    """Schema 4 did not count placements: -1 (unknown), read as the job's attempt plus one."""
    if "placements" not in {row[1] for row in db.execute("PRAGMA table_info(jobs)")}:
        db.execute("ALTER TABLE jobs ADD COLUMN placements INTEGER NOT NULL DEFAULT -1")


def _migrate_v5(db: sqlite3.Connection, path: Path) -> None:
    """Schema 5 kept a job's id as text: the table is rebuilt with it as the integer key (columns named,
    for journals whose older columns came in another order)."""
    odd = db.execute("SELECT id FROM jobs WHERE CAST(CAST(id AS INTEGER) AS TEXT) IS NOT id LIMIT 1").fetchone()
    if odd is not None:
        raise _damaged(path, f"it holds a job whose id {odd[0]!r} is not a job number")
    create = _SCHEMA[_SCHEMA.index("CREATE TABLE jobs") :]
    index = _SCHEMA[_SCHEMA.index("CREATE INDEX jobs_submit_id") :]
    columns = [row[1] for row in db.execute("PRAGMA table_info(jobs)")]
    values = ", ".join("CAST(id AS INTEGER)" if c == "id" else c for c in columns)
    db.execute("ALTER TABLE jobs RENAME TO jobs_v5")
    db.execute(create[: create.index(";")])
    db.execute(f"INSERT INTO jobs ({', '.join(columns)}) SELECT {values} FROM jobs_v5")
    db.execute("DROP TABLE jobs_v5")  # (its index with it)
    db.execute(index[: index.index(";")])


def _migrate_v6(db: sqlite3.Connection) -> None:
    """Schema 6 kept each dispatched process order as a row of a table of its own, also once its job had
    ended: the orders of unfinished jobs' processes without a result move into their job's row; the
    table goes."""
    if "orders" not in {row[1] for row in db.execute("PRAGMA table_info(jobs)")}:  # (5 -> 6 made it so)
        db.execute("ALTER TABLE jobs ADD COLUMN orders BLOB")
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'processes'").fetchone():
        return
    outstanding: dict[str, list[list[Any]]] = {}
    rows = db.execute(
        "SELECT p.job_id, p.slot, p.node, p.order_wire, p.holds FROM processes AS p"
        f" JOIN jobs AS j ON j.id = CAST(p.job_id AS INTEGER) WHERE j.state NOT IN ({', '.join('?' * len(_FINAL))})"
        " AND NOT EXISTS (SELECT 1 FROM results AS r WHERE r.job_id = p.job_id AND r.slot = p.slot)",
        _FINAL,
    )
    for job_id, slot, node, order, holds in rows:
        outstanding.setdefault(job_id, []).append([slot, node, bytes(order), unpack(holds)])
    moved = [(pack_orders(o), int(j)) for j, o in outstanding.items()]
    db.executemany("UPDATE jobs SET orders = ? WHERE id = ?", moved)
    db.execute("DROP TABLE processes")


def _damaged(path: Path, damage: str) -> JournalDamaged:
    return JournalDamaged(f"the pilot journal {path} is damaged: {damage}; {_FIX.format(path=path)}", damage=damage)


def _error(path: Path, exc: sqlite3.Error) -> JournalError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return JournalError(
            f"the pilot journal {path} is in use by another process (is a daemon already running on this run "
            "directory? 'pilot status' tells); stop it first"
        )
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return _damaged(path, f"it is corrupt ({text})")
    if "readonly" in text or "unable to open" in text or "disk I/O" in text or "full" in text:
        return JournalError(
            f"cannot write the pilot journal {path} ({text}): check the file system, its space and permissions"
        )
    return JournalError(
        f"the pilot journal {path} cannot be used ({type(exc).__name__}: {text}); {_FIX.format(path=path)}"
    )


def _setup(db: sqlite3.Connection, path: Path, *, durable: bool) -> None:
    """Pragmas, then check (or create) the schema. Refuses foreign, corrupt and newer-version files."""
    try:
        db.execute("PRAGMA locking_mode = EXCLUSIVE")
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise JournalError(
                f"the pilot journal {path} cannot use WAL mode (got {mode}); "
                "put the run directory on another file system"
            )
        db.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        db.execute("BEGIN IMMEDIATE")  # takes the exclusive lock now: a second daemon fails here, not later
        try:
            app_id = db.execute("PRAGMA application_id").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if app_id == 0 and version == 0 and tables == 0:
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        db.execute(stmt)
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif app_id != APPLICATION_ID:
                raise JournalError(
                    f"{path} is an SQLite database but not a pilot journal (application_id {app_id:#x}); "
                    f"{_FIX.format(path=path)}"
                )
            elif version > SCHEMA_VERSION:
                raise JournalError(
                    f"the pilot journal {path} was written by a newer pilot (journal schema {version}, this pilot "
                    f"reads up to {SCHEMA_VERSION}): run that newer pilot on this run directory, or upgrade this one"
                )
            elif version < 1:
                raise _damaged(path, "it has no schema version")
            else:
                if version == 1:
                    _migrate_v1(db)
                if version <= 2:
                    _migrate_v2(db)
                if version <= 3:
                    _migrate_v3(db)
                if version <= 4:
                    _migrate_v4(db)
                if version <= 5:
                    _migrate_v5(db, path)
                if version <= 6:
                    _migrate_v6(db)
                if version < SCHEMA_VERSION:
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise _error(path, exc) from None
