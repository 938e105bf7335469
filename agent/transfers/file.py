"""``file`` URLs and plain paths: a filesystem the job's node sees (copy, symbolic link or move; a
directory recursively, its symbolic links kept as links)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote, urlsplit

from agent.transfers.base import Transfer, TransferError


def local_path(url: str) -> Path:
    """The path a ``file`` URL (or a plain absolute path) names."""
    parts = urlsplit(url)
    if parts.scheme and parts.netloc not in ("", "localhost"):
        raise TransferError(f"file URL {url!r} names host {parts.netloc!r}; only this node's files are reachable")
    return Path(unquote(parts.path) if parts.scheme else url)


def place(source: Path, target: Path, *, mode: str) -> None:
    """``source`` to ``target``, replacing what is there (a file, a link; a directory is merged into)."""
    if not os.path.lexists(source):
        raise TransferError(f"{source} does not exist")
    if mode == "link":
        _clear(target)
        os.symlink(source, target)
    elif mode == "move":
        _clear(target)
        shutil.move(source, target)
    elif source.is_dir():
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
    else:  # beside the target, then renamed over it: a failed copy leaves nothing half-written (and a
        # copy replaces a link there, never writes through it)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        os.close(fd)
        try:
            shutil.copy2(source, tmp)
            os.replace(tmp, target)
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)


def _clear(target: Path) -> None:
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)


class FileTransfer(Transfer):
    schemes: ClassVar[tuple[str, ...]] = ("file",)

    def fetch(self, url: str, target: Path, *, mode: str) -> None:
        place(local_path(url), target, mode=mode)

    def put(self, source: Path, url: str, *, mode: str) -> None:
        target = local_path(url)
        target.parent.mkdir(parents=True, exist_ok=True)
        place(source, target, mode=mode)
