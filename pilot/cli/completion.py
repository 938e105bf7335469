"""``pilot completion bash|zsh``: a shell completion script, written from the parser itself by shtab, so it
never lags behind the commands. A static script: a TAB costs no Python start-up (argcomplete would run
``pilot`` on every TAB)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parsers(sub: Any) -> None:
    cp = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script. bash: pilot completion bash > ~/.local/share/bash-completion/"
        "completions/pilot; zsh: pilot completion zsh > ~/.zfunc/_pilot (with ~/.zfunc in fpath).",
    )
    cp.add_argument("shell", choices=["bash", "zsh"])
    cp.set_defaults(func=completion_cmd)


def completion_cmd(args: argparse.Namespace) -> None:
    import shtab

    from pilot.cli import parser

    print(shtab.complete(parser(), shell=args.shell))
