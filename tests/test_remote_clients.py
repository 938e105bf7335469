"""Remote clients over TCP with CURVE, against real daemons started with ``pilot up``: only the client key
of this pilot gets past the handshake, a remote client keeps working meanwhile, nothing secret shows in
``ps``, ``pilot status`` or the logs, and a pilot is closed to TCP clients unless its config opens it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
from pilot_waits import agents_active, list_when_back, wait_for

import client as psij
from pilot.security import ClientAccess, Credentials, KeyPair, read_client_access, read_key_pair, write_client_access

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
REMOTE = '[pilot]\nclient_transport = "tcp"\nclient_bind = "127.0.0.1"\n[allocation]\nlrm = "local"\nnodes = 1\n'

#: A client on "another machine": no run directory it could find (PILOT_HOME is empty), no config for an
#: embedded pilot; only the access file named by PILOT_CREDENTIALS. Submits rounds of jobs until told to stop.
REMOTE_CLIENT = textwrap.dedent(
    """
    import json, os, sys
    import client as psij
    stop = sys.argv[1]
    ex = psij.JobExecutor.get_instance("pilot")
    states, ids, rounds = [], [], 0
    while rounds < 2 or not os.path.exists(stop):
        jobs = [psij.Job(psij.JobSpec("/bin/true")) for _ in range(10)]
        for j in jobs:
            ex.submit(j)
        for j in jobs:
            s = j.wait(timeout=60)
            states.append(s.state.name if s else "TIMEOUT")
        ids += [j.native_id for j in jobs]
        rounds += 1
        print(f"round {rounds}", flush=True)
    ex.close()
    print(json.dumps({"states": states, "ids": ids}), flush=True)
    """
)


def secrets_of(pilot: Any) -> dict[str, str]:
    """Every secret key of a pilot, by role, from its key files."""
    keys = pilot.rundir.path / "keys"
    return {role: read_key_pair(keys / f"{role}.key_secret").secret.decode() for role in ("daemon", "agent", "client")}


def access_file(pilot: Any, path: Path) -> ClientAccess:
    proc = pilot.cli("credentials", "--client", str(path))
    assert f"wrote {path} (mode 0600)" in proc.stdout, proc.stdout
    return read_client_access(path)


def log_events(pilot: Any, event: str) -> list[dict[str, Any]]:
    lines = pilot.rundir.log_file.read_text().splitlines()
    return [e for line in lines if line.startswith("{") and (e := json.loads(line)).get("event") == event]


def test_only_this_pilots_client_key_gets_in_while_a_remote_client_keeps_working(
    start_pilot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = start_pilot(REMOTE, name="ours"), start_pilot(REMOTE, name="theirs")
    access = access_file(ours, tmp_path / "ours.access")
    their_access = access_file(theirs, tmp_path / "theirs.access")
    endpoint = access.endpoint
    assert endpoint == ours.info["client_tcp_url"] and endpoint.startswith("tcp://127.0.0.1:")
    assert access.credentials.server_public.decode() == ours.info["server_public"]
    wrong = KeyPair.generate()
    intruders: dict[str, str] = {"no key": endpoint}  # a bare tcp:// url: a client without credentials
    for name, creds in {
        "wrong key": Credentials(access.credentials.server_public, wrong),
        "other pilot's client key": Credentials(access.credentials.server_public, their_access.credentials.keys),
        "other pilot's access file": their_access.credentials,  # pins the other daemon's key
    }.items():
        path = tmp_path / f"{name.replace(' ', '-').replace(chr(39), '')}.access"
        write_client_access(path, ClientAccess(endpoint, creds))
        intruders[name] = str(path)
    monkeypatch.delenv("PILOT_CREDENTIALS", raising=False)

    empty_home = tmp_path / "elsewhere"
    empty_home.mkdir(mode=0o700)
    env = {
        **os.environ,
        "PILOT_HOME": str(empty_home),
        "PILOT_CONFIG": str(tmp_path / "no-such-config.toml"),  # an embedded pilot could not start
        "PILOT_CREDENTIALS": str(tmp_path / "ours.access"),
    }
    stop = tmp_path / "stop"
    with open(tmp_path / "remote.err", "w") as err:
        remote = subprocess.Popen(
            [sys.executable, "-c", REMOTE_CLIENT, str(stop)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    lines: list[str] = []

    def read() -> None:
        assert remote.stdout is not None
        for line in remote.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: "round 1\n" in lines, 60, "the remote client's first jobs")
        rounds_before = sum(line.startswith("round") for line in lines)
        errors: dict[str, list[BaseException]] = {name: [] for name in intruders}

        def intrude(name: str, url: str) -> None:
            ex = psij.JobExecutor.get_instance("pilot", url=url, request_timeout=2)
            try:
                for _ in range(2):
                    try:
                        ex.submit(psij.Job(psij.JobSpec("/bin/echo", ["intruder"])))
                    except psij.SubmitException as exc:
                        errors[name].append(exc)
            finally:
                ex.close()

        threads = [threading.Thread(target=intrude, args=item) for item in intruders.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        # ps while the remote client, the intruders' sockets and the daemon are up: no key in any command line.
        ps = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True, check=True).stdout
        client_env = " ".join(f"{k}={v}" for k, v in psutil.Process(remote.pid).environ().items())
        rounds_during = sum(line.startswith("round") for line in lines) - rounds_before
        stop.touch()
        remote.wait(timeout=60)
    finally:
        if remote.poll() is None:
            remote.kill()
            remote.wait()
    reader.join(5)
    assert remote.stdout is not None
    remote.stdout.close()
    result = json.loads(lines[-1])

    assert remote.returncode == 0, (tmp_path / "remote.err").read_text()
    assert rounds_during >= 1, "the remote client made no progress while the intruders knocked"
    assert result["states"] and set(result["states"]) == {"COMPLETED"}
    for name, errs in errors.items():
        assert len(errs) == 2, f"{name}: {errs}"
        for exc in errs:
            assert isinstance(exc, psij.SubmitException) and exc.transient, (name, exc)
            assert "was not sent" in str(exc) and "The handshake failed" in str(exc), (name, str(exc))
    # Nothing of the intruders reached the daemon's logic: it knows the remote client's jobs, no others.
    ex = ours.executor()
    assert sorted(ex.list(), key=int) == sorted(result["ids"], key=int)
    assert ex.pilot_status()["jobs"] == {"COMPLETED": len(result["ids"])}
    assert not any("intruder" in line for line in ours.rundir.log_file.read_text().splitlines())
    # Refusals are in the daemon's log: ZAP names the peer's address and key ...
    refused = log_events(ours, "connection refused")
    assert {e["address"] for e in refused} == {"127.0.0.1"} and {e["domain"] for e in refused} == {"pilot.clients"}
    assert {e["peer_public"] for e in refused} == {wrong.public.decode(), their_access.credentials.keys.public.decode()}
    # ... and handshakes that never reach ZAP (no CURVE at all, another daemon's key) are logged too.
    reasons = [e["reason"] for e in log_events(ours, "handshake refused")]
    assert any("does not use this daemon's public key" in r for r in reasons), reasons
    assert any("CURVE, the other does not" in r or "closed during the handshake" in r for r in reasons), reasons
    assert log_events(theirs, "connection refused") == []  # the other pilot never heard of any of it
    # No secret key of either pilot in ps or in the remote client's environment (it holds only a path).
    for pilot in (ours, theirs):
        for role, secret in secrets_of(pilot).items():
            assert secret not in ps, f"{role} secret in ps"
            assert secret not in client_env, f"{role} secret in the remote client's environment"


def test_closed_by_default_and_the_access_file_stays_private(start_pilot: Any, tmp_path: Path) -> None:
    closed = start_pilot(name="closed")
    assert "client_tcp_url" not in closed.info and "server_public" not in closed.info
    listening = [c for c in psutil.Process(closed.pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening == [], f"a default pilot listens on {listening}"
    proc = closed.cli("credentials", "--client", str(tmp_path / "x.access"), check=False)
    assert proc.returncode == 1 and 'client_transport = "tcp"' in proc.stderr, proc.stderr
    assert not (tmp_path / "x.access").exists()

    pilot = start_pilot(REMOTE, name="open")
    path = tmp_path / "open.access"
    access = access_file(pilot, path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert access.credentials.keys.public == read_key_pair(pilot.rundir.path / "keys" / "client.key_secret").public
    host, port = access.endpoint.removeprefix("tcp://").rsplit(":", 1)
    listening = [c for c in psutil.Process(pilot.pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert [(c.laddr.ip, c.laddr.port) for c in listening] == [(host, int(port))], "bound narrowly, once"

    # The access file given as the url works; a copy others can read is refused, with the fix.
    ex = psij.JobExecutor.get_instance("pilot", url=str(path))
    try:
        job = psij.Job(psij.JobSpec("/bin/true"))
        ex.submit(job)
        status = job.wait(timeout=30)
        assert status is not None and status.state is psij.JobState.COMPLETED
    finally:
        ex.close()
    leaked = tmp_path / "leaked.access"
    leaked.write_text(path.read_text())
    os.chmod(leaked, 0o644)
    ex = psij.JobExecutor.get_instance("pilot", url=str(leaked))
    try:
        with pytest.raises(psij.SubmitException, match=re.escape(f"chmod 600 {leaked}")) as info:
            ex.submit(psij.Job(psij.JobSpec("/bin/true")))
        assert not info.value.transient
    finally:
        ex.close()


def test_status_and_logs_show_no_secret(start_pilot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("API_TOKEN", "tok-in-the-daemons-environment")
    pilot = start_pilot(REMOTE.replace("[pilot]\n", '[pilot]\nagent_transport = "tcp"\n'), name="s")
    access = access_file(pilot, tmp_path / "s.access")
    remote = psij.JobExecutor.get_instance("pilot", url=str(tmp_path / "s.access"))
    try:
        agents_active(remote, 1)
        spec = psij.JobSpec(
            "/bin/sh",
            ["-c", "echo $DB_PASSWORD > /dev/null; sleep 30"],
            environment={"DB_PASSWORD": "hunter2", "SERVICE_KEY": "k3y-value", "PLAIN": "visible"},
        )
        job = psij.Job(spec)
        remote.submit(job)
        job.wait(timeout=30, target_states=[psij.JobState.ACTIVE])
        text = pilot.cli("status").stdout
        as_json = pilot.cli("status", "--json").stdout
        st = json.loads(as_json)
        over_tcp = json.dumps(remote.pilot_status())
        assert st["pilot"]["client_tcp_url"] == access.endpoint and st["jobs"] == {"ACTIVE": 1}
        assert "1 node" in text or "node(s)" in text
        remote.cancel(job)
        job.wait(timeout=30)
    finally:
        remote.close()
    logs = pilot.rundir.log_file.read_text() + "".join(
        f.read_text() for f in (pilot.rundir.path / "agents").glob("*.log")
    )
    for where, seen in (("status", text), ("status --json", as_json), ("status over tcp", over_tcp), ("logs", logs)):
        for role, secret in secrets_of(pilot).items():
            assert secret not in seen, f"the {role} secret key shows in {where}"
        for value in ("hunter2", "k3y-value", "tok-in-the-daemons-environment"):
            assert value not in seen, f"{value} shows in {where}"


def test_a_remote_client_follows_a_daemon_restarted_after_a_crash(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot(REMOTE, name="r")
    access = access_file(pilot, tmp_path / "r.access")
    ex = psij.JobExecutor.get_instance("pilot", url=str(tmp_path / "r.access"))
    try:
        job = psij.Job(psij.JobSpec("/bin/sleep", ["3"]))
        ex.submit(job)
        job.wait(timeout=30, target_states=[psij.JobState.ACTIVE])
        pilot.kill9()
        pilot.up_again()
        assert pilot.info["client_tcp_url"] == access.endpoint, "the resumed daemon listens where clients expect it"
        status = job.wait(timeout=60)
        assert status is not None and status.state is psij.JobState.COMPLETED, status
        assert job.native_id in list_when_back(ex)  # the connection may still be coming back
    finally:
        ex.close()


def test_client_transport_keys_are_checked_at_pilot_up() -> None:
    from pilot.config import ConfigError, parse

    assert parse({}).pilot.client_transport == "ipc", "closed by default"
    cfg = parse({"pilot": {"client_transport": "tcp", "client_bind": "ib0", "client_port": 5555}})
    assert (cfg.pilot.client_transport, cfg.pilot.client_bind, cfg.pilot.client_port) == ("tcp", "ib0", 5555)
    with pytest.raises(ConfigError, match=re.escape("pilot.client_transport = 'curve'; allowed: 'ipc'")):
        parse({"pilot": {"client_transport": "curve"}})
    with pytest.raises(ConfigError, match=re.escape("pilot.client_port = 70000")):
        parse({"pilot": {"client_port": 70000}})
