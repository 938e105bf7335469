"""What every command shares: which pilot it talks to (one rule for all), the request to it, failing with
one clear line, and how times, sizes and durations print."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from pilot import config as config_mod
from pilot.rundir import RunDir

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class CliError(Exception):
    """A command cannot go on: its message is the one line the user reads; ``code`` the exit status
    (2: the command line or an input file is wrong, 1: anything else)."""

    def __init__(self, message: str, *, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, *, code: int = 1) -> NoReturn:
    raise CliError(message, code=code)


def add_target(p: argparse.ArgumentParser) -> None:
    """--name and --rundir: the same on every command that talks to a pilot."""
    p.add_argument(
        "--name",
        type=pilot_name_arg,
        help="the pilot to talk to (run dir $PILOT_HOME/NAME); default: $PILOT_NAME, else the config's "
        "pilot.name ($PILOT_CONFIG, or up's --config), else 'default'",
    )
    p.add_argument("--rundir", type=Path, help="the pilot's run directory, given explicitly (over --name)")


def pilot_name_arg(text: str) -> str:
    if not _NAME_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a pilot name: use letters, digits, '.', '_' or '-'")
    return text


def pilot_name(args: argparse.Namespace, *, config: Path | None = None) -> tuple[str, str]:
    """The one rule that picks the pilot of every command: ``--name``, else ``$PILOT_NAME``, else the
    ``pilot.name`` of the config (``config``: up's --config; else ``$PILOT_CONFIG``; else the default
    config), else 'default'. Returns the name and what decided it (for messages)."""
    if getattr(args, "name", None):
        return str(args.name), "--name"
    env = os.environ.get("PILOT_NAME")
    if env:
        if not _NAME_RE.fullmatch(env):
            fail(f"PILOT_NAME={env!r} is not a pilot name: use letters, digits, '.', '_' or '-'", code=2)
        return env, "PILOT_NAME"
    if config is None and os.environ.get("PILOT_CONFIG"):
        config = Path(os.environ["PILOT_CONFIG"])
    cfg = config_mod.load(config.resolve() if config is not None else None)
    return cfg.pilot.name, f"pilot.name in {cfg.source}"


def whole_number(text: str, *, minimum: int) -> int:
    """An option's whole number, at least ``minimum``, or argparse's error saying what to give."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < minimum:
        raise argparse.ArgumentTypeError(f"{text} must be at least {minimum}")
    return n


def positive_int(text: str) -> int:
    return whole_number(text, minimum=1)


def non_negative_int(text: str) -> int:
    return whole_number(text, minimum=0)


def duration_arg(text: str) -> float:
    """Seconds from '90', '90s', '10m', '2h' or 'HH:MM:SS', for --duration."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            return config_mod.parse_duration(text, key="duration", source="the command line")
        except config_mod.ConfigError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a duration: give seconds (90), a number with s/m/h/d (10m) or HH:MM:SS"
            ) from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be more than 0 seconds")
    return seconds


def rundir_of(args: argparse.Namespace, *, config: Path | None = None) -> RunDir:
    if getattr(args, "rundir", None):
        return RunDir(args.rundir.expanduser().resolve())
    return RunDir.named(pilot_name(args, config=config)[0])


def running_info(rundir: RunDir) -> dict[str, Any]:
    info = rundir.read_info()
    if info is None:
        fail(f"no pilot is running in {rundir.path} ('pilot ls' lists yours; 'pilot up' starts one)")
    return info


def request(rundir: RunDir, kind: str, body: dict[str, Any] | None = None, *, timeout: float = 10.0) -> dict[str, Any]:
    """One request to the pilot of ``rundir``; its reply. No pilot there, or no answer: one clear line."""
    from client._connection import Connection
    from client.exceptions import SubmitException

    info = running_info(rundir)
    conn = Connection(str(info["client_url"]))
    try:
        reply = conn.request(kind, body or {}, timeout=timeout)
    except SubmitException as exc:
        fail(str(exc))
    finally:
        conn.close()
    if "error" in reply and len(reply) <= 2:  # the whole request was refused (rid and error only)
        fail(str(reply["error"]))
    reply.pop("rid", None)
    return reply


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def warn(command: str, message: str) -> None:
    print(f"pilot {command}: warning: {message}", file=sys.stderr)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def local(t: float | None) -> str:
    """A time in the user's time zone, as people read it: '2026-11-26 09:14:03 CET'."""
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


def clock(t: float | None) -> str:
    """A local time of day, for tables: '09:14:03' (with the date when not today)."""
    if t is None:
        return "-"
    lt = time.localtime(t)
    today = time.localtime()
    fmt = "%H:%M:%S" if lt[:3] == today[:3] else "%m-%d %H:%M"
    return time.strftime(fmt, lt)


def dur(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def gib(n: int) -> str:
    return f"{n / 2**30:.1f}G"


def table(header: list[str], rows: list[list[str]], *, right: set[int] | None = None) -> list[str]:
    """Rows under a header, each column as wide as its widest cell (those in ``right`` aligned right)."""
    right = right or set()
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(out).rstrip()

    return [line(header), *(line(r) for r in rows)]
