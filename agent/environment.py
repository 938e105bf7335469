"""A process's environment: inherited or empty, the job's variables with ``${VAR}`` substituted.

PSI/J requires Bash brace substitution in environment values and arguments; an unset variable
expands to the empty string, as in Bash. Only ``${NAME}`` is special: ``$NAME`` and ``$$`` stay literal.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
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
) -> dict[str, str]:
    """``base`` (when inheriting), then the job's variables in order, each substituted against
    what is set so far, then ``extra`` (rank, node file, GPUs), which the job cannot override."""
    env = dict(base) if inherit else {}
    for key, value in job.items():
        env[key] = substitute(value, env)
    env.update(extra)
    return env


def gpu_environment(gpus: list[int], *, node_has_gpus: bool) -> dict[str, str]:
    """A process asking for GPUs sees exactly its own; one asking for none on a GPU node sees none."""
    if not gpus and not node_has_gpus:
        return {}
    ids = ",".join(str(g) for g in gpus)
    return dict.fromkeys(GPU_VARIABLES, ids)
