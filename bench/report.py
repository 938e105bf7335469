"""What every benchmark script does with its figures at the end."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def saved(out: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``out`` stamped with the date and the command's arguments, and written as JSON to ``args.json``
    when one was given (the ``--json FILE`` option)."""
    out.update({"date": time.strftime("%Y-%m-%d"), "args": {k: str(v) for k, v in vars(args).items()}})
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


def repeated(
    measure: Callable[[], dict[str, Any]], *, repeat: int, whose: str, each: Callable[[dict[str, Any]], str]
) -> dict[str, Any]:
    """``repeat`` runs of ``measure`` (each a dict with ``us_per_task``), each described by ``each`` on
    stderr, then ``whose`` CPU per task, their median: the runs and the median, for :func:`saved`."""
    runs = []
    for i in range(repeat):
        r = measure()
        runs.append(r)
        print(f"  run {i + 1}: {each(r)}", file=sys.stderr)
    median = statistics.median(r["us_per_task"] for r in runs)
    print(f"{whose} CPU per task: {median:.1f} µs (median of {repeat})")
    return {"runs": runs, "median_us_per_task": median}
