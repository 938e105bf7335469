"""``pilot``: the operator's command line, one module per family of commands -- the pilot itself
(:mod:`.lifecycle`), jobs (:mod:`.jobs`), submission (:mod:`.submit`), streamed output (:mod:`.logs`),
``run`` (:mod:`.run`), the live view (:mod:`.top`), the run report (:mod:`.report`) and shell
completion (:mod:`.completion`). The only package that prints.

Whatever goes wrong reaches the user as one line that says what to change, never a traceback: a
command fails with :class:`~pilot.cli.common.CliError`, and :func:`main` turns the rest (a closed pipe, an
interrupt, an exception group out of a client thread, the client's exceptions, even a bug: PILOT_DEBUG=1
then shows its traceback) into a line and an exit status too."""

from __future__ import annotations

import argparse
import os
import sys

import pilot
from pilot import config as config_mod
from pilot.cli import completion, jobs, lifecycle, logs, report, run, submit, top
from pilot.cli.common import CliError
from pilot.history import HistoryError
from pilot.security import SecurityError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pilot", description="pilot-job execution manager")
    p.add_argument("--version", action="version", version=f"pilot {pilot.__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in (lifecycle, jobs, submit, logs, run, top, report, completion):
        family.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    words = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(words)
    args.argv = words  # 'pilot submit' tells a command after '--' from a document file
    command = f"pilot {args.command}"
    try:
        args.func(args)
        sys.stdout.flush()
    except CliError as exc:
        _say(f"{command}: {exc}", exc.code)
    except config_mod.ConfigError as exc:
        _say(f"pilot: config error: {exc}", 2)
    except (SecurityError, HistoryError) as exc:
        _say(f"{command}: {exc}", 1)
    except KeyboardInterrupt:
        _say(f"\n{command}: interrupted", 130)
    except BrokenPipeError:
        # The reader went away (pilot jobs | head): stop quietly, as other tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)
    except BaseExceptionGroup as group:
        _say(f"{command}: {_first_leaf(group)}", 1)
    except OSError as exc:
        _say(f"{command}: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), 1)
    except Exception as exc:
        if os.environ.get("PILOT_DEBUG"):
            raise
        from client.exceptions import InvalidJobException, InvalidStateException, SubmitException

        if isinstance(exc, SubmitException | InvalidJobException | InvalidStateException):
            _say(f"{command}: {exc}", 1)  # the client's messages say what happened and what to do
        # Anything else is a bug of ours: one line still, and how to see the traceback.
        _say(f"{command}: {type(exc).__name__}: {exc} (PILOT_DEBUG=1 shows where; please report it)", 1)


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> str:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    more = f" (and {_leaves(group) - 1} more)" if _leaves(group) > 1 else ""
    return f"{type(exc).__name__}: {exc}{more}"


def _leaves(group: BaseExceptionGroup[BaseException]) -> int:
    return sum(_leaves(e) if isinstance(e, BaseExceptionGroup) else 1 for e in group.exceptions)


def _say(line: str, code: int) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (BrokenPipeError, OSError):
        pass
    sys.exit(code)
