"""Agents over TCP with CURVE: only this pilot's agent key gets in, secrets never show in ps or tasks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import zmq
from pilot_waits import agents_active, wait_for

import client as psij
from pilot import wire

TCP = '[pilot]\nagent_transport = "tcp"\n[allocation]\nlrm = "local"\nnodes = 2\n'


def _secret(pilot: Any) -> str:
    text = (pilot.rundir.path / "keys" / "agent.key_secret").read_text()
    return next(line.split('"')[1] for line in text.splitlines() if "secret-key" in line)


def _fake_agent(url: str, *, curve: tuple[bytes, bytes, bytes] | None) -> tuple[zmq.Context[Any], zmq.Socket[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"local-0")
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        server, public, secret = curve
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server, public, secret
    sock.connect(url)
    node = {
        "name": "local-0",
        "hostname": "x",
        "processors": list(range(64)),
        "memory": 1 << 40,
        "gpus": [],
        "os": "x",
        "architecture": "x",
        "features": [],
    }
    sock.send(wire.encode(wire.Kind.REGISTER, {"node": node, "running": []}))
    return ctx, sock


def test_tcp_agents_run_jobs_and_keep_their_keys_private(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot(TCP)
    info = pilot.info
    assert str(info["agent_url"]).startswith("tcp://127.0.0.1:")
    ex = pilot.executor()
    agents_active(ex, 2)
    out = tmp_path / "env.json"
    job = psij.Job(
        psij.JobSpec("python3", ["-c", f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"])
    )
    ex.submit(job)
    status = job.wait(timeout=30)
    assert status is not None and status.state is psij.JobState.COMPLETED, status
    assert not [k for k in json.loads(out.read_text()) if k.startswith("PILOT_CURVE")]
    secret = _secret(pilot)
    daemon = psutil.Process(pilot.pid)
    for proc in [daemon, *daemon.children(recursive=True)]:
        seen = " ".join(proc.cmdline()) + " " + " ".join(f"{k}={v}" for k, v in proc.environ().items())
        assert secret not in seen, f"the agent secret shows in {proc.pid} ({proc.name()})"
    for f in (pilot.rundir.path / "keys").iterdir():
        if f.is_file():
            assert f.stat().st_mode & 0o077 == 0, f


def test_agents_without_the_key_are_refused_at_the_handshake(start_pilot: Any) -> None:
    pilot = start_pilot(TCP)
    ex = pilot.executor()
    before = agents_active(ex, 2)
    url = str(pilot.info["agent_url"])
    server = (pilot.rundir.path / "keys" / "daemon.key").read_text().split('public-key = "')[1].split('"')[0].encode()
    public, secret = zmq.curve_keypair()
    fakes = [_fake_agent(url, curve=None), _fake_agent(url, curve=(server, public, secret))]
    try:
        for _, sock in fakes:
            assert sock.poll(1500) == 0, "a peer without the agent key got an answer"
        log = wait_for(
            lambda: (t := pilot.rundir.log_file.read_text()) and "connection refused" in t and t,
            what="the ZAP refusal in the daemon log",
        )
        refusals = [json.loads(line) for line in log.splitlines() if '"connection refused"' in line]
        assert any(r.get("address") == "127.0.0.1" and r.get("domain") == "pilot.agents" for r in refusals), refusals
        after = ex.pilot_status()
        assert [(n["name"], n["cores"]) for n in after["nodes"]] == [(n["name"], n["cores"]) for n in before["nodes"]]
        job = psij.Job(psij.JobSpec("/bin/true"))
        ex.submit(job)
        status = job.wait(timeout=30)
        assert status is not None and status.state is psij.JobState.COMPLETED
    finally:
        for ctx, sock in fakes:
            sock.close(linger=0)
            ctx.term()
