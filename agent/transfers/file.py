"""``file`` URLs and plain paths: a filesystem the job's node sees (copy, symbolic link or move; a
directory recursively, its symbolic links kept as links).

Every file lands whole or not at all (written beside its target, then renamed over it; a link made
beside and renamed likewise): the agents of a job's nodes stage into one directory at once when it is
on a shared filesystem, and each of them leaves a complete file. A copy goes in chunks, checking its
stop between them."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import ClassVar, Final
from urllib.parse import unquote, urlsplit

from agent.transfers.base import Stop, Transfer, TransferError

#: Bytes copied between two looks at the order's stop.
CHUNK: Final = 8 << 20


def local_path(url: str) -> Path:
    """The path a ``file`` URL (or a plain absolute path) names."""
    parts = urlsplit(url)
    if parts.scheme and parts.netloc not in ("", "localhost"):
        raise TransferError(f"file URL {url!r} names host {parts.netloc!r}; only this node's files are reachable")
    return Path(unquote(parts.path) if parts.scheme else url)


def place(source: Path, target: Path, *, mode: str, stop: Stop) -> None:
    """``source`` to ``target``, replacing what is there (a file, a link; a directory is merged into)."""
    if not os.path.lexists(source):
        raise TransferError(f"{source} does not exist")
    stop.check()
    if mode == "link":
        link(source, target)
    elif mode == "move":
        _clear(target)
        shutil.move(source, target)
    elif source.is_dir():
        _copy_tree(source, target, stop=stop)
    else:
        copy(source, target, stop=stop)


def copy(source: str | Path, target: str | Path, *, stop: Stop) -> None:
    """One file, with its mode and times (as ``shutil.copy2``), beside the target then renamed over it:
    a failed or stopped copy leaves nothing half-written, and a copy replaces a link there, never
    writes through it."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with open(source, "rb") as src, os.fdopen(fd, "wb") as out:
            while True:
                stop.check()
                try:
                    sent = os.sendfile(out.fileno(), src.fileno(), None, CHUNK)
                except OSError:  # (a filesystem without sendfile between files)
                    chunk = src.read(CHUNK)
                    sent = len(chunk)
                    out.write(chunk)
                if not sent:
                    break
        shutil.copystat(source, tmp)
        os.replace(tmp, target)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _copy_tree(source: Path, target: Path, *, stop: Stop) -> None:
    """A directory merged into ``target``, its links kept as links; each entry replaced whole (not
    ``shutil.copytree``: a link another node made there already would be an error)."""
    if target.is_symlink() or target.is_file():
        target.unlink(missing_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    with os.scandir(source) as entries:
        for entry in entries:
            stop.check()
            inner = Path(entry.path)
            if entry.is_symlink():
                link(Path(os.readlink(inner)), target / entry.name)
            elif entry.is_dir():
                _copy_tree(inner, target / entry.name, stop=stop)
            else:
                copy(inner, target / entry.name, stop=stop)
    shutil.copystat(source, target)


def link(source: Path, target: Path) -> None:
    """A symbolic link to ``source`` at ``target``, made beside it and renamed over what is there."""
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target, ignore_errors=True)
    tmp = target.parent / f".{target.name}.{os.getpid()}.{os.urandom(6).hex()}"
    os.symlink(source, tmp)
    try:
        os.replace(tmp, target)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _clear(target: Path) -> None:
    if target.is_symlink() or target.is_file():
        target.unlink(missing_ok=True)
    elif target.is_dir():
        shutil.rmtree(target)


class FileTransfer(Transfer):
    schemes: ClassVar[tuple[str, ...]] = ("file",)

    def fetch(self, url: str, target: Path, *, mode: str, stop: Stop) -> None:
        place(local_path(url), target, mode=mode, stop=stop)

    def put(self, source: Path, url: str, *, mode: str, stop: Stop) -> None:
        target = local_path(url)
        target.parent.mkdir(parents=True, exist_ok=True)
        place(source, target, mode=mode, stop=stop)
