"""What every benchmark script does with its figures at the end."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def saved(out: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``out`` stamped with the date and the command's arguments, and written as JSON to ``args.json``
    when one was given (the ``--json FILE`` option)."""
    out.update({"date": time.strftime("%Y-%m-%d"), "args": {k: str(v) for k, v in vars(args).items()}})
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out
