"""``http`` and ``https`` URLs, fetched by the agent on the job's node (stage-in only: a web server
takes no uploads). Streamed to a file beside the target and renamed: a failed fetch leaves nothing."""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import ClassVar, Final

from agent.transfers.base import Transfer, TransferError

#: Seconds without a byte from the server before a fetch fails (not the whole fetch's time).
TIMEOUT: Final = 60.0


class HttpTransfer(Transfer):
    schemes: ClassVar[tuple[str, ...]] = ("http", "https")
    cached: ClassVar[bool] = True

    def fetch(self, url: str, target: Path, *, mode: str) -> None:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=TIMEOUT) as response:
                shutil.copyfileobj(response, out, 1 << 20)
            os.replace(tmp, target)
        except urllib.error.HTTPError as exc:
            raise TransferError(f"the server answered HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            raise TransferError(f"cannot reach the server: {exc.reason}") from None
        except OSError as exc:
            raise TransferError(str(exc)) from None
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)

    def put(self, source: Path, url: str, *, mode: str) -> None:
        raise TransferError(f"{url!r}: an http(s) URL cannot be a stage-out target")
