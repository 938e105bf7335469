"""What the fuzzing modules share: how many examples each kind of test gets, and the hostile values they
are built from (anything msgpack can carry)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from pilot import wire
from pilot.model.job_description import JobDescription
from pilot.model.node import NodeConfigured

Strategy = st.SearchStrategy

#: PILOT_FUZZ_SCALE=10 runs ten times the examples (a longer hunt than CI's bounded one).
SCALE = float(os.environ.get("PILOT_FUZZ_SCALE", "1"))
STRETCH = max(SCALE, 1.0)  # timeouts grow with the examples, never shrink
#: For the readers: many cheap examples.
UNIT = settings(max_examples=int(300 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: For the live daemon: each example is a few socket round trips.
LIVE = settings(
    max_examples=int(150 * SCALE),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- generic values ------------------------------------------------------------------------------------------

_text = st.text(max_size=12)  # no lone surrogates: msgpack and TOML cannot carry them (XML gets its own)
_ints = st.one_of(
    st.integers(-3, 10),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([2**31, 2**32, 2**40, 2**63 - 1, 2**64 - 1, -(2**63)]),
)
_scalars = st.one_of(st.none(), st.booleans(), _ints, st.floats(), _text, st.binary(max_size=12))
_exts = st.one_of(
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12)),
    st.builds(msgpack.Timestamp, st.integers(0, 2**33), st.integers(0, 999_999_999)),
)
#: Anything msgpack can carry, also what the readers never expect (ext types, bytes, huge ints).
_values: Strategy[Any] = st.recursive(
    _scalars | _exts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=10,
)
#: A wrong value that is never a string (strings in some fields would name programs or paths).
_nonstr = _values.filter(lambda v: not isinstance(v, str))


def _or_wrong(valid: Strategy[Any], wrong: Strategy[Any] = _values) -> Strategy[Any]:
    """Mostly valid-looking values, sometimes any value at all: deep validation gets reached."""
    return st.one_of(valid, valid, wrong)


def raw(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


# -- frames: every way a frame can be wrong ----------------------------------------------------------------

_BAD_VERSIONS = [0, 2, -1, True, False, 1.0, "1", None, 2**64 - 1, [1]]
_HUGE_HEADERS = [
    b"\xdd\xff\xff\xff\xff",  # array32 of 4G items
    b"\xdf\xff\xff\xff\xff",  # map32 of 4G pairs
    b"\xdb\xff\xff\xff\xff",  # str32 of 4 GiB
    b"\xc6\xff\xff\xff\xff",  # bin32 of 4 GiB
    b"\xc9\xff\xff\xff\xff\x05",  # ext32 of 4 GiB
]


def _frames(
    kinds: list[str], bodies: Strategy[dict[str, Any]], requests: Strategy[bytes] | None = None
) -> Strategy[list[bytes]]:
    """One multipart message: usually one frame, sometimes several (the protocol allows exactly one).
    ``requests`` are well-formed frames whose kind and body go together (so that many are acted on)."""
    valid = st.tuples(st.sampled_from(kinds), bodies).map(lambda kb: wire.encode(kb[0], kb[1]))

    @st.composite
    def damaged(draw: st.DrawFn) -> bytes:
        frame = bytearray(draw(valid))
        for _ in range(draw(st.integers(1, 3))):
            op = draw(st.sampled_from(["flip", "cut", "insert"]))
            pos = draw(st.integers(0, max(0, len(frame) - 1)))
            if op == "flip" and frame:
                frame[pos] = draw(st.integers(0, 255))
            elif op == "cut":
                del frame[pos:]
            else:
                frame[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        return bytes(frame)

    any_kind = st.sampled_from(
        sorted(wire.CLIENT_KINDS | wire.AGENT_KINDS | wire.TO_AGENT_KINDS | wire.TO_CLIENT_KINDS)
    )
    envelope = st.tuples(
        st.sampled_from(_BAD_VERSIONS) | st.just(wire.PROTOCOL_VERSION) | _ints,
        any_kind | st.sampled_from(["", "HELLO", "frobnicate"]) | _values,
        bodies | _values,
    ).map(lambda t: raw(list(t)))
    wrong_arity = st.lists(_values, max_size=5).map(raw) | st.dictionaries(_text, _values, max_size=3).map(raw)
    non_string_keys = st.tuples(st.sampled_from(kinds), st.dictionaries(_ints | st.binary(max_size=3), _values)).map(
        lambda kb: raw([wire.PROTOCOL_VERSION, kb[0], kb[1]])
    )
    huge = st.one_of(
        st.tuples(st.sampled_from(kinds), st.sampled_from(_HUGE_HEADERS), st.binary(max_size=16)).map(
            lambda t: b"\x93" + raw(wire.PROTOCOL_VERSION) + raw(t[0]) + t[1] + t[2]
        ),
        st.sampled_from([b"\x91" * 1000, b"\x91" * 100_000, b"\x81\xa1a" * 50_000]),
        st.integers(1, 3 << 20).map(lambda n: raw([wire.PROTOCOL_VERSION, kinds[0], {"rid": 1, "pad": "x" * n}])),
    )
    coherent = valid if requests is None else requests
    one = st.one_of(
        st.binary(max_size=300),
        valid,
        coherent,
        coherent,
        coherent,
        valid.flatmap(lambda f: st.integers(0, len(f) - 1).map(lambda n: f[:n])),  # truncated
        damaged(),
        envelope,
        wrong_arity,
        non_string_keys,
        huge,
    )
    return st.one_of(one.map(lambda f: [f]), one.map(lambda f: [f]), st.lists(one, min_size=2, max_size=3))


# -- job maps: near-valid, mixing valid and invalid field types ------------------------------------------------

SAFE_EXECUTABLES = ("/bin/true", "/bin/false", "true", "/nonexistent-fuzz/x", "")
SAFE_SCRIPTS = (None, "/nonexistent-fuzz/hook.sh")
_ENV_NAMES = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True),
    st.tuples(st.sampled_from(["A", "_x", "PATH"]), st.sampled_from(["\n", "=", " ", "-", "\x00", "é"])).map("".join),
    _text,
)
_counts = st.one_of(
    st.integers(-2, 5), st.sampled_from([2**20, 2**31, 2**40, 2**63 - 1, 2**64 - 1, -(2**63)]), st.none()
)
_RESOURCES_VALID: dict[str, Strategy[Any]] = {
    "node_count": st.integers(1, 2),
    "process_count": st.integers(1, 4),
    "processes_per_node": st.integers(1, 2),
    "cpu_cores_per_process": st.integers(1, 2),
    "gpu_cores_per_process": st.just(0),
    "memory_per_process": st.integers(0, 2**20),
    "exclusive_node_use": st.booleans(),
}
_resources = st.fixed_dictionaries(
    {},
    optional={k: _or_wrong(_counts) for k in _RESOURCES_VALID if k != "exclusive_node_use"}
    | {"exclusive_node_use": _or_wrong(st.booleans()), "cores": _values},  # "cores" is not a field
)


def _job_maps(tmp: Path) -> Strategy[Any]:
    """Job maps as a client sends them: some clean (they run), most with a few wrong fields, some not a map."""
    valid: dict[str, Strategy[Any]] = {
        "arguments": st.lists(_text, max_size=4),
        "directory": st.sampled_from([None, str(tmp), "/nonexistent-fuzz", "~/nonexistent-fuzz"]),
        "submit_directory": st.sampled_from([None, str(tmp), "relative-fuzz"]),
        "name": _text,
        "inherit_environment": st.booleans(),
        "environment": st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True), _text, max_size=3),
        "stdin_path": st.sampled_from([None, "/dev/null", "/nonexistent-fuzz/in"]),
        "stdout_path": st.sampled_from([None, str(tmp / "out"), "/nonexistent-fuzz/out", "nonexistent-fuzz/out"]),
        "stderr_path": st.sampled_from([None, str(tmp / "out"), "/nonexistent-fuzz/out"]),
        "pre_launch": st.sampled_from(SAFE_SCRIPTS),
        "post_launch": st.sampled_from(SAFE_SCRIPTS),
        "launcher": st.sampled_from(["single", "multiple"]),
        "resources": st.fixed_dictionaries({}, optional=_RESOURCES_VALID),
        "duration": st.sampled_from([None, 0.001, 0.5, 60, 1e9]),
        "queue_name": _text,
        "project_name": _text,
        "reservation_id": _text,
        "custom_attributes": st.dictionaries(_text, _values, max_size=3),
    }
    wrong: dict[str, Strategy[Any]] = {
        "directory": st.sampled_from(["relative-fuzz", ""]) | _nonstr,
        "submit_directory": _nonstr,
        "environment": st.dictionaries(_ENV_NAMES, _text, max_size=3) | _values,
        "stdin_path": _nonstr,
        "stdout_path": _nonstr,
        "stderr_path": _nonstr,
        "pre_launch": _nonstr,
        "post_launch": _nonstr,
        "launcher": st.sampled_from(["srun", "mpi", ""]) | _nonstr,
        "resources": _resources | _values,
        "duration": st.floats() | st.integers(-1, 0) | st.sampled_from([2**64 - 1]) | _values,
    }
    executable = st.sampled_from(SAFE_EXECUTABLES)
    clean = st.fixed_dictionaries({"executable": executable}, optional=valid)
    noisy = st.fixed_dictionaries(
        {"executable": _or_wrong(executable, _nonstr)},
        optional={k: _or_wrong(v, wrong.get(k, _values)) for k, v in valid.items()} | {"rm": _values},
    )
    return st.one_of(clean, clean, noisy, noisy, _values)


def _runs_safely(d: JobDescription, tmp: Path) -> bool:
    """A job the barrage may really run: harmless programs, no paths outside ``tmp`` that could exist."""
    safe_paths = {None, str(tmp / "out"), "/nonexistent-fuzz/out", "nonexistent-fuzz/out", "/dev/null"}
    safe_paths |= {"/nonexistent-fuzz/in"}
    safe_dirs = {None, str(tmp), "/nonexistent-fuzz", "relative-fuzz", "~/nonexistent-fuzz"}
    return (
        d.executable in SAFE_EXECUTABLES
        and d.launcher != "mpirun"
        and d.pre_launch in SAFE_SCRIPTS
        and d.post_launch in SAFE_SCRIPTS
        and {d.stdin_path, d.stdout_path, d.stderr_path} <= safe_paths
        and {d.directory, d.submit_directory} <= safe_dirs
    )


_VALID_NODE = NodeConfigured(
    name="n1", hostname="h1", processors=[0, 1], memory=1 << 30, gpus=[0], os="Linux", architecture="x86_64"
).to_wire()


@st.composite
def _node_maps(draw: st.DrawFn, name: Strategy[Any] = _text) -> dict[str, Any]:
    node: dict[str, Any] = dict(_VALID_NODE, name=draw(name))
    edge = {
        "processors": st.lists(st.integers(-2, 70), max_size=6) | st.just(list(range(64))),
        "gpus": st.lists(st.integers(-2, 4), max_size=4),
        "memory": _ints,
        "features": st.lists(_text, max_size=3),
        "name": st.sampled_from(["", "x" * 256, "local-0"]),
    }
    for key in draw(st.lists(st.sampled_from(sorted(node)), max_size=4, unique=True)):
        choice = draw(st.integers(0, 2))
        if choice == 0:
            del node[key]
        elif choice == 1:
            node[key] = draw(_values)
        else:
            node[key] = draw(edge.get(key, _text))
    return node


def _check_description(d: JobDescription) -> None:
    """What every accepted description must satisfy (the daemon relies on it without checking again)."""
    r = d.resources
    assert d.executable and isinstance(d.executable, str)
    assert r.process_count >= 1 and r.cpu_cores_per_process >= 1
    assert r.gpu_cores_per_process >= 0 and r.memory_per_process >= 0
    assert r.node_count is None or 1 <= r.node_count <= r.process_count
    assert r.processes_per_node is None or r.processes_per_node >= 1
    assert d.duration is None or (math.isfinite(d.duration) and d.duration > 0), d.duration
    for name in d.environment:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), f"accepted variable name {name!r}"
    assert JobDescription.from_wire(d.to_wire()) == d
