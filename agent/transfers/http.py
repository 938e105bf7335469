"""``http`` and ``https`` URLs, fetched by the agent on the job's node (stage-in only: a web server
takes no uploads). Streamed to a file beside the target and renamed: a failed or stopped fetch leaves
nothing. A stop shuts the connection's socket down, so a fetch blocked on a slow server ends at once."""

from __future__ import annotations

import http.client
import os
import socket
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, ClassVar, Final

from agent.transfers.base import Interrupted, Stop, Transfer, TransferError

#: Seconds without a byte from the server before a fetch fails (not the whole fetch's time).
TIMEOUT: Final = 60.0
#: Bytes written between two looks at the order's stop.
CHUNK: Final = 1 << 20


def _breakable(stop: Stop, base: type[http.client.HTTPConnection]) -> Any:
    """A connection class like ``base`` whose socket ``stop`` shuts down (its blocked reads then end)."""

    class Connection(base):  # type: ignore[valid-type,misc]
        def connect(self) -> None:
            stop.check()
            super().connect()
            sock = self.sock

            def shut() -> None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # (already closed)

            stop.on_set(shut)

    return Connection


class _Http(urllib.request.HTTPHandler):
    def __init__(self, stop: Stop) -> None:
        super().__init__()
        self._connection = _breakable(stop, http.client.HTTPConnection)

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection, req)


class _Https(urllib.request.HTTPSHandler):
    def __init__(self, stop: Stop) -> None:
        super().__init__()
        self._connection = _breakable(stop, http.client.HTTPSConnection)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection, req, context=self._context)  # type: ignore[attr-defined]


class HttpTransfer(Transfer):
    schemes: ClassVar[tuple[str, ...]] = ("http", "https")
    cached: ClassVar[bool] = True

    def fetch(self, url: str, target: Path, *, mode: str, stop: Stop) -> None:
        opener = urllib.request.build_opener(_Http(stop), _Https(stop))  # (proxies from the environment kept)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "wb") as out, opener.open(url, timeout=TIMEOUT) as response:
                while chunk := response.read1(CHUNK):
                    stop.check()
                    out.write(chunk)
            stop.check()  # (a shut socket reads as the end: it is not the whole file)
            os.replace(tmp, target)
        except Interrupted:
            raise
        except Exception as exc:
            stop.check()  # stopped: whatever the broken connection raised is not the cause
            if isinstance(exc, urllib.error.HTTPError):
                raise TransferError(f"the server answered HTTP {exc.code} {exc.reason}") from None
            if isinstance(exc, urllib.error.URLError):
                raise TransferError(f"cannot reach the server: {exc.reason}") from None
            if isinstance(exc, OSError | http.client.HTTPException):
                raise TransferError(f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)) from None
            raise
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)

    def put(self, source: Path, url: str, *, mode: str, stop: Stop) -> None:
        raise TransferError(f"{url!r}: an http(s) URL cannot be a stage-out target")
