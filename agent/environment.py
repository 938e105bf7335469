"""A process's environment: inherited or empty, the job's variables with ``${VAR}`` substituted.

PSI/J requires Bash brace substitution in environment values and arguments; an unset variable
expands to the empty string, as in Bash. Only ``${NAME}`` is special: ``$NAME`` and ``$$`` stay literal.
"""

from __future__ import annotations

import os
import re
from collections import ChainMap
from collections.abc import Mapping
from pathlib import Path
from typing import Final

_BRACE: Final = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

#: Variables of the agent that never reach a task (credentials and the agent's own wiring).
PRIVATE_PREFIXES: Final = ("PILOT_AGENT_", "PILOT_NODE_SPEC", "PILOT_CURVE_", "PILOT_SECRET")

#: The variables that expose GPUs to a process, for NVIDIA, AMD and Intel runtimes.
GPU_VARIABLES: Final = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


def substitute(value: str, env: Mapping[str, str]) -> str:
    if "${" not in value:
        return value
    return _BRACE.sub(lambda m: env.get(m.group(1), ""), value)


def inherited() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(PRIVATE_PREFIXES)}


def build(
    *,
    inherit: bool,
    base: Mapping[str, str],
    job: Mapping[str, str],
    extra: Mapping[str, str],
    pre: Mapping[str, str] | None = None,
    pre_unset: list[str] | None = None,
) -> dict[str, str]:
    """``base`` (when inheriting), then the job's variables in order, each substituted against
    what is set so far, then what the job's pre_launch script changed, then ``extra`` (the rank's
    variables), which neither can override (the agent sets the node's own after: node file, GPUs)."""
    env = dict(base) if inherit else {}
    for key, value in job.items():
        env[key] = substitute(value, env)
    if pre:
        env.update(pre)
    for key in pre_unset or ():
        env.pop(key, None)
    env.update(extra)
    return env


def over_base(*, base: dict[str, str], job: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """What :func:`build` (inheriting, no pre_launch changes) sets over ``base``: the task's environment
    is ``base`` with these over it, so a caller that has ``base`` encoded once need not copy it per task."""
    env: dict[str, str] = {}
    if job:
        seen = ChainMap(env, base)  # (each value substituted against what is set so far, as in build)
        for key, value in job.items():
            env[key] = substitute(value, seen)
    env.update(extra)
    return env


#: Variables a shell sets for itself; a pre_launch script does not mean to hand them to the ranks.
_SHELL_OWN = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})


def changes(before: Mapping[str, str], after: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """What a sourced script set (new or changed values) and unset."""
    setv = {k: v for k, v in after.items() if before.get(k) != v and k not in _SHELL_OWN}
    unset = [k for k in before if k not in after and k not in _SHELL_OWN]
    return setv, unset


def take_file(path: str) -> dict[str, str] | None:
    """The environment ``env -0`` wrote to ``path`` (a pre process's, after its script), and the file
    removed; None if it cannot be read."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def gpu_environment(gpus: list[int], *, node_has_gpus: bool) -> dict[str, str]:
    """A process asking for GPUs sees exactly its own; one asking for none on a GPU node sees none."""
    if not gpus and not node_has_gpus:
        return {}
    ids = ",".join(str(g) for g in gpus)
    return dict.fromkeys(GPU_VARIABLES, ids)
