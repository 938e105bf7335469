"""Agents over TCP with CURVE: only this pilot's agent key gets in, secrets never show in ps or tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq
from pilot_waits import agents_active, wait_for

import client as psij
from pilot import wire
from pilot.security import KeyPair, KeyStore, credentials_file_env

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parent.parent

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


def _start_agent(url: str, creds_file: Path, tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    """A real agent process, credentials through a 0600 file as the daemon hands them; gives up after 4 s."""
    log = tmp_path / f"{name}.log"
    env = {
        **os.environ,
        "PILOT_AGENT_URL": url,
        "PILOT_AGENT_NODE": name,
        "PILOT_AGENT_DIR": str(tmp_path / name),
        "PILOT_AGENT_HEARTBEAT": "0.2",
        "PILOT_AGENT_ORPHAN_TIMEOUT": "4",
        **credentials_file_env(creds_file),
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "agent"], env=env, cwd=ROOT, stdout=out, stderr=out)
    return proc, log


def test_a_real_agent_sends_nothing_to_an_impostor_on_the_daemons_port(tmp_path: Path) -> None:
    """Another user's process holding the port (with its own CURVE key, or none) gets no REGISTER: the
    agent pins the daemon's key, so the handshake fails and nothing is sent; the agent gives up alone."""
    store = KeyStore.open(tmp_path / "keys")
    creds_file = store.write_credentials_file("agent")
    ctx: zmq.Context[Any] = zmq.Context()
    impostors: dict[str, zmq.Socket[Any]] = {}
    agents: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        curve = ctx.socket(zmq.ROUTER)
        curve.setsockopt(zmq.CURVE_SERVER, 1)  # no ZAP: it would admit any client key
        curve.setsockopt(zmq.CURVE_SECRETKEY, KeyPair.generate().secret)
        impostors["curve"] = curve
        impostors["plain"] = ctx.socket(zmq.ROUTER)
        for name, sock in impostors.items():
            sock.setsockopt(zmq.LINGER, 0)
            url = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
            agents.append(_start_agent(url, creds_file, tmp_path, f"agent-{name}"))
        for proc, _ in agents:
            proc.wait(timeout=30)  # the orphan timeout: it never heard from a daemon
        received = {name: sock.poll(0) for name, sock in impostors.items()}
    finally:
        for proc, _ in agents:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for sock in impostors.values():
            sock.close(linger=0)
        ctx.term()
    assert received == {"curve": 0, "plain": 0}, "an impostor received a frame from the agent"
    for _, log in agents:
        text = log.read_text()
        assert "agent started" in text and "daemon silent, stopping" in text, text
        assert '"event": "registered"' not in text, text
        assert store.agent.secret.decode() not in text


def test_a_real_agent_says_why_it_cannot_reach_an_impostor(tmp_path: Path) -> None:
    store = KeyStore.open(tmp_path / "keys")
    ctx: zmq.Context[Any] = zmq.Context()
    thief = ctx.socket(zmq.ROUTER)
    thief.setsockopt(zmq.LINGER, 0)
    thief.setsockopt(zmq.CURVE_SERVER, 1)
    thief.setsockopt(zmq.CURVE_SECRETKEY, KeyPair.generate().secret)
    url = f"tcp://127.0.0.1:{thief.bind_to_random_port('tcp://127.0.0.1')}"
    proc, log = _start_agent(url, store.write_credentials_file("agent"), tmp_path, "agent-why")
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        thief.close(linger=0)
        ctx.term()
    assert "handshake with the daemon failed" in log.read_text()
