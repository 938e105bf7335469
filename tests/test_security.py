"""Security building blocks against real sockets and processes: CURVE + ZAP refusals, key pinning,
private run directories and key files, credentials through the environment, secret-free logs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq
import zmq.asyncio
import zmq.auth
from structlog.testing import capture_logs

from pilot.rundir import RunDir
from pilot.security import (
    AGENT_DOMAIN,
    CLIENT_DOMAIN,
    ENV_FILE,
    ENV_SECRET_KEY,
    ENV_SERVER_KEY,
    MASK,
    Credentials,
    KeyPair,
    KeyStore,
    RedactSecrets,
    SecurityError,
    check_private_dir,
    credentials_env,
    credentials_from_env,
    mask_environment,
    read_client_credentials,
    read_credentials,
    write_credentials,
)
from pilot.wire.addresses import bind_host, tcp_endpoint
from pilot.wire.curve import ZapAuthenticator, secure_client, secure_server, wait_readable, watch_handshakes

pytestmark = pytest.mark.timeout(60)

PYTHON = sys.executable
ROOT = Path(__file__).resolve().parent.parent


def run(scenario: Callable[[], Awaitable[None]], timeout: float = 20) -> None:
    async def main() -> None:
        with anyio.fail_after(timeout):
            await scenario()

    anyio.run(main)


async def recv(sock: zmq.Socket[bytes]) -> list[bytes]:
    """One message from a plain socket (the daemon's kind) without blocking the event loop."""
    while True:
        await wait_readable(sock)
        try:
            return sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            continue


async def echo(sock: zmq.Socket[bytes], received: list[bytes]) -> None:
    """A ROUTER that records every payload it gets and sends it back: what 'reaches the daemon' means."""
    while True:
        ident, payload = await recv(sock)
        received.append(payload)
        sock.send_multipart([ident, payload])


async def silent(sock: zmq.Socket[bytes], seconds: float) -> bool:
    """Nothing arrived on ``sock`` within ``seconds``."""
    await anyio.sleep(seconds)
    return not sock.poll(0)


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` (captured log lines have no push channel) for up to 10 s."""
    with anyio.fail_after(10, reason=f"waiting for {what}"):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.02)


def dealer(ctx: zmq.asyncio.Context, url: str, creds: Credentials | None) -> zmq.asyncio.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if creds is not None:
        secure_client(s, creds)
    s.connect(url)
    return s


def close_all(*socks: zmq.Socket[Any]) -> None:
    for s in socks:
        s.close(linger=0)


# -- CURVE + ZAP -------------------------------------------------------------------------------------


def test_unauthorized_peers_are_refused_at_the_handshake_while_an_authorized_client_keeps_working(
    tmp_path: Path,
) -> None:
    ours = KeyStore.open(tmp_path / "ours")
    theirs = KeyStore.open(tmp_path / "theirs")  # another pilot, same user or not
    wrong = KeyPair.generate()
    received: list[bytes] = []
    queued: dict[str, int] = {}

    async def scenario() -> None:
        # The daemon's context is a plain one; peers stand for other processes (the agent uses zmq.asyncio).
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        peers = zmq.asyncio.Context()
        intruder_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        auth = ZapAuthenticator(ctx, ours.policy())
        auth.start()
        server = ctx.socket(zmq.ROUTER)
        socks: list[zmq.Socket[bytes]] = []
        try:
            with capture_logs() as logs:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(auth.serve)
                    await tg.start(partial(watch_handshakes, server, server=True))
                    secure_server(server, ours.daemon, domain=CLIENT_DOMAIN)
                    url = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"
                    tg.start_soon(echo, server, received)
                    intruders = {
                        "no key": None,
                        "wrong key": Credentials(ours.daemon.public, wrong),
                        "other pilot's key": Credentials(ours.daemon.public, theirs.client),
                        "other pilot's client": theirs.client_credentials(),  # pins the other daemon
                        "our agent key on the client socket": ours.agent_credentials(),
                    }
                    bad: dict[str, zmq.Socket[bytes]] = {}
                    for name, creds in intruders.items():
                        bad[name] = s = intruder_ctx.socket(zmq.DEALER)
                        s.setsockopt(zmq.LINGER, 0)
                        if creds is not None:
                            secure_client(s, creds)
                        s.connect(url)
                        socks.append(s)
                    good = dealer(peers, url, ours.client_credentials())
                    for i in range(200):
                        for name, s in bad.items():
                            # Queued until the handshake completes, which it never does. (After a ZAP
                            # refusal libzmq drops the connection for good, so later sends would block.)
                            with contextlib.suppress(zmq.Again):
                                s.send(f"intruder {name} {i}".encode(), zmq.NOBLOCK)
                                queued[name] = queued.get(name, 0) + 1
                        await good.send(b"good %d" % i)
                        assert await good.recv() == b"good %d" % i

                    def refused_all() -> bool:
                        keys = {e["peer_public"] for e in logs if e["event"] == "connection refused"}
                        reasons = [e["reason"] for e in logs if e["event"] == "handshake refused"]
                        return len(keys) == 3 and len(reasons) >= 2 and any("decrypt" in r for r in reasons)

                    await until(refused_all, "every intruder to be refused")
                    await anyio.sleep(0.3)  # a last chance for anything to slip through
                    good.close(linger=0)
                    tg.cancel_scope.cancel()
        finally:
            for sock in (server, *socks):
                sock.close(linger=0)
            auth.close()
            ctx.term()
            peers.term()
            intruder_ctx.term()
        refusals = [e for e in logs if e["event"] == "connection refused"]
        handshakes = [e for e in logs if e["event"] == "handshake refused"]
        assert received == [b"good %d" % i for i in range(200)], "only the authorized client reached the daemon"
        assert set(queued) == set(intruders), "every intruder had a message waiting to go"
        assert auth.accepted >= 1 and auth.refused >= 3
        assert {e["address"] for e in refusals} == {"127.0.0.1"}
        assert {e["peer_public"] for e in refusals} == {
            wrong.public.decode(),
            theirs.client.public.decode(),
            ours.agent.public.decode(),
        }
        assert {e["domain"] for e in refusals} == {CLIENT_DOMAIN}
        reasons = [e["reason"] for e in handshakes]
        assert any("does not use this daemon's public key" in r for r in reasons)  # pinned to the other daemon
        # no key: whichever side notices the mismatch first, the server logs the failed handshake
        assert any(r == "one side speaks CURVE, the other does not" or "closed during" in r for r in reasons)

    run(scenario)


def test_a_peer_pinning_the_daemon_key_refuses_an_impostor_that_steals_the_port(tmp_path: Path) -> None:
    ours = KeyStore.open(tmp_path / "keys")

    async def bind_when_free(sock: zmq.Socket[bytes], url: str) -> None:
        with anyio.fail_after(5):
            while True:
                try:
                    sock.bind(url)
                    return
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EADDRINUSE:
                        raise
                    await anyio.sleep(0.02)

    async def scenario() -> None:
        daemon_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        thief_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        agent_ctx = zmq.asyncio.Context()  # as the agent has it
        auth = ZapAuthenticator(daemon_ctx, ours.policy())
        auth.start()
        daemon = daemon_ctx.socket(zmq.ROUTER)
        agent = agent_ctx.socket(zmq.DEALER)
        agent.setsockopt(zmq.LINGER, 0)
        thieves: list[zmq.Socket[bytes]] = []
        try:
            with capture_logs() as logs:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(auth.serve)
                    secure_server(daemon, ours.daemon, domain=AGENT_DOMAIN)
                    port = daemon.bind_to_random_port("tcp://127.0.0.1")
                    url = f"tcp://127.0.0.1:{port}"
                    await tg.start(partial(watch_handshakes, agent, server=False))
                    received: list[bytes] = []
                    async with anyio.create_task_group() as real:
                        real.start_soon(echo, daemon, received)
                        secure_client(agent, ours.agent_credentials())
                        agent.connect(url)
                        await agent.send(b"register")
                        assert await agent.recv() == b"register"
                        real.cancel_scope.cancel()
                    daemon.close(linger=0)

                    # A CURVE server with its own key (admitting any client) takes the port...
                    thief = thief_ctx.socket(zmq.ROUTER)
                    thieves.append(thief)
                    thief.setsockopt(zmq.CURVE_SERVER, 1)
                    thief.setsockopt(zmq.CURVE_SECRETKEY, KeyPair.generate().secret)
                    await bind_when_free(thief, url)
                    await agent.send(b"task events with secrets")
                    await until(
                        lambda: any("hold the daemon's key" in e.get("reason", "") for e in logs),
                        "the agent to notice the impostor",
                    )
                    assert await silent(thief, 0.3), "the impostor received the agent's message"
                    thief.close(linger=0)

                    # ... then one without any security at all.
                    thief = thief_ctx.socket(zmq.ROUTER)
                    thieves.append(thief)
                    await bind_when_free(thief, url)
                    await until(
                        lambda: any(e.get("reason") == "one side speaks CURVE, the other does not" for e in logs),
                        "the agent to notice the plain impostor",
                    )
                    assert await silent(thief, 0.3), "the plain impostor received the agent's message"
                    tg.cancel_scope.cancel()
        finally:
            close_all(daemon, agent, *thieves)
            auth.close()
            for c in (daemon_ctx, agent_ctx, thief_ctx):
                c.term()
        failures = [e for e in logs if e["event"] == "handshake with the daemon failed"]
        assert failures and all(e["endpoint"] == url for e in failures)

    run(scenario)


def test_ipc_bound_before_secure_server_stays_plain_and_tcp_after_it_is_curve(tmp_path: Path) -> None:
    """The wiring the daemon's client socket uses: local clients over ipc, remote ones over CURVE tcp.
    (Here the daemon side is a zmq.asyncio context: the authenticator serves either kind.)"""
    ours = KeyStore.open(tmp_path / "keys")

    async def async_echo(sock: zmq.asyncio.Socket, received: list[bytes]) -> None:
        while True:
            ident, payload = await sock.recv_multipart()
            received.append(payload)
            await sock.send_multipart([ident, payload])

    async def scenario() -> None:
        ctx, peers = zmq.asyncio.Context(), zmq.asyncio.Context()
        auth = ZapAuthenticator(ctx, ours.policy())
        auth.start()
        server = ctx.socket(zmq.ROUTER)
        received: list[bytes] = []
        socks: list[zmq.asyncio.Socket] = []
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(auth.serve)
                ipc = f"ipc://{tmp_path / 'client.sock'}"
                server.bind(ipc)
                secure_server(server, ours.daemon, domain=CLIENT_DOMAIN)
                tcp = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"
                tg.start_soon(async_echo, server, received)
                local, remote = dealer(peers, ipc, None), dealer(peers, tcp, ours.client_credentials())
                plain_tcp = dealer(peers, tcp, None)
                socks += [local, remote, plain_tcp]
                await plain_tcp.send(b"plain over tcp")
                for s, msg in ((local, b"local over ipc"), (remote, b"remote over curve")):
                    await s.send(msg)
                    assert await s.recv() == msg
                assert not await plain_tcp.poll(300)
                tg.cancel_scope.cancel()
        finally:
            close_all(server, *socks)
            auth.close()
            ctx.term()
            peers.term()
        assert sorted(received) == [b"local over ipc", b"remote over curve"]

    run(scenario)


def test_a_secured_socket_without_a_running_authenticator_refuses_everyone(tmp_path: Path) -> None:
    """ZAP_ENFORCE_DOMAIN: forgetting the authenticator fails closed (plain libzmq would admit any key)."""
    ours = KeyStore.open(tmp_path / "keys")

    async def scenario() -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        peers = zmq.asyncio.Context()
        server = ctx.socket(zmq.ROUTER)
        secure_server(server, ours.daemon, domain=CLIENT_DOMAIN)
        url = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"
        client = dealer(peers, url, ours.client_credentials())
        try:
            await client.send(b"hello")
            assert await silent(server, 0.5)
        finally:
            close_all(server, client)
            ctx.term()
            peers.term()

    run(scenario)


def test_zap_decisions_per_domain_mechanism_and_key() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    agent, client = KeyPair.generate(), KeyPair.generate()
    auth = ZapAuthenticator(ctx, {AGENT_DOMAIN: {agent.public: "agent"}})
    raw = zmq.utils.z85.decode(agent.public)

    def ask(domain: str, mechanism: bytes, *creds: bytes) -> tuple[bytes, bytes]:
        reply = auth.decide([b"1.0", b"7", domain.encode(), b"10.0.0.9", b"", mechanism, *creds])
        assert reply[:2] == [b"1.0", b"7"]
        return reply[2], reply[4]

    try:
        with capture_logs() as logs:
            assert ask(AGENT_DOMAIN, b"CURVE", raw) == (b"200", b"agent")
            assert ask(CLIENT_DOMAIN, b"CURVE", raw)[0] == b"400"  # right key, wrong socket
            assert ask(AGENT_DOMAIN, b"NULL")[0] == b"400"
            assert ask(AGENT_DOMAIN, b"PLAIN", b"user", b"pass")[0] == b"400"
            assert ask(AGENT_DOMAIN, b"CURVE", zmq.utils.z85.decode(client.public))[0] == b"400"
            auth.allow(CLIENT_DOMAIN, client.public, "authorized/alice")
            assert ask(CLIENT_DOMAIN, b"CURVE", zmq.utils.z85.decode(client.public)) == (b"200", b"authorized/alice")
            auth.revoke(AGENT_DOMAIN, agent.public)
            assert ask(AGENT_DOMAIN, b"CURVE", raw)[0] == b"400"
            assert auth.decide([b"1.0", b"8"])[2] == b"500"
        auth.start()
        with pytest.raises(SecurityError, match="already has one"):
            ZapAuthenticator(ctx, {}).start()
    finally:
        auth.close()
        ctx.term()
    refused = [e for e in logs if e["event"] == "connection refused"]
    assert len(refused) == 5 and all(e["address"] == "10.0.0.9" for e in refused)
    assert any("PLAIN" in e["reason"] for e in refused)


# -- keys and directories ----------------------------------------------------------------------------


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_key_files_are_private_reloaded_on_restart_and_readable_by_zmq_auth(tmp_path: Path) -> None:
    store = KeyStore.open(tmp_path / "keys")
    assert mode(store.path) == 0o700 and mode(store.path / "authorized") == 0o700
    files = sorted(p.name for p in store.path.iterdir() if p.is_file())
    assert files == [f"{r}.{s}" for r in ("agent", "client", "daemon") for s in ("key", "key_secret")]
    assert all(mode(store.path / f) == 0o600 for f in files)
    assert len({store.daemon.public, store.agent.public, store.client.public}) == 3
    assert zmq.auth.load_certificate(store.path / "daemon.key_secret") == (store.daemon.public, store.daemon.secret)
    assert zmq.auth.load_certificate(store.path / "agent.key") == (store.agent.public, None)
    assert store.daemon.secret.decode() not in repr(store)  # secrets stay out of reprs, hence of logs

    again = KeyStore.open(tmp_path / "keys")
    assert (again.daemon, again.agent, again.client) == (store.daemon, store.agent, store.client)

    alice = KeyPair.generate()
    (store.path / "authorized" / "alice.key").write_text(f'curve\n    public-key = "{alice.public.decode()}"\n')
    os.chmod(store.path / "authorized" / "alice.key", 0o600)
    policy = KeyStore.open(tmp_path / "keys").policy()
    assert policy[CLIENT_DOMAIN] == {store.client.public: "client", alice.public: "authorized/alice"}
    assert policy[AGENT_DOMAIN] == {store.agent.public: "agent"}

    for role, creds in (("agent", store.agent_credentials()), ("client", store.client_credentials())):
        path = store.write_credentials_file(role)
        assert path == store.path / f"{role}.credentials" and mode(path) == 0o600
        assert read_credentials(path) == creds
    assert read_client_credentials(store.path) == store.client_credentials()


def test_a_key_file_readable_by_others_is_refused_with_the_fix(tmp_path: Path) -> None:
    store = KeyStore.open(tmp_path / "keys")
    secret = store.path / "client.key_secret"
    os.chmod(secret, 0o644)
    with pytest.raises(SecurityError) as err:
        KeyStore.open(tmp_path / "keys")
    assert str(secret) in str(err.value) and f"chmod 600 {secret}" in str(err.value)
    os.chmod(secret, 0o600)
    os.chmod(store.path, 0o750)
    with pytest.raises(SecurityError, match=re.escape(f"chmod 700 {store.path}")):
        KeyStore.open(tmp_path / "keys")


def test_a_world_readable_run_dir_is_refused_with_the_fix(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    os.chmod(rd.path, 0o755)
    with pytest.raises(SecurityError) as err:
        rd.create()
    message = str(err.value)
    assert str(rd.path) in message and f"chmod 700 {rd.path}" in message and "0755" in message
    assert mode(rd.path) == 0o755, "the directory is reported, not silently repaired"
    os.chmod(rd.path, 0o700)
    rd.create()
    rd.check()
    assert mode(rd.agents_dir) == 0o700
    store = rd.keys()
    assert store.path == rd.keys_dir and mode(rd.keys_dir) == 0o700


def test_a_run_dir_others_could_replace_or_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # group/world writable, no sticky bit
    (shared / "run").mkdir(mode=0o700)
    with pytest.raises(SecurityError, match=re.escape(f"chmod go-w {shared}")):
        check_private_dir(shared / "run")
    os.chmod(shared, 0o1777)  # like /tmp: others cannot rename what is ours
    check_private_dir(shared / "run")
    if os.getuid() == 0:
        os.chown(shared / "run", 65534, 65534)
        with pytest.raises(SecurityError, match=r"belongs to .*uid 65534"):
            check_private_dir(shared / "run")


def test_pilot_up_on_a_world_readable_run_dir_fails_with_the_fix(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[allocation]\nlrm = "local"\nnodes = 1\n')
    rd = RunDir(tmp_path / "home" / "open")
    rd.path.mkdir(parents=True)
    os.chmod(rd.path, 0o755)
    env = {**os.environ, "PILOT_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [PYTHON, "-m", "pilot", "up", "--config", str(cfg), "--rundir", str(rd.path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert proc.returncode != 0
    assert f"chmod 700 {rd.path}" in proc.stderr
    assert rd.read_info() is None and not rd.info_file.exists()


# -- credentials to agents --------------------------------------------------------------------------

AGENT_SCRIPT = textwrap.dedent(
    """
    import json, subprocess, sys, zmq
    from agent.environment import inherited
    from pilot.security import credentials_from_env
    from pilot.wire.curve import secure_client
    creds = credentials_from_env()  # takes them out of os.environ too
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    secure_client(s, creds)
    s.connect(sys.argv[1])
    s.send(b"register")
    assert s.poll(10000), "no answer from the daemon"
    assert s.recv() == b"register"
    s.send(b"wait")
    assert s.poll(10000) and s.recv() == b"wait"  # the test looked at 'ps' in between
    task = subprocess.run(["env"], env=inherited(), capture_output=True, text=True, check=True).stdout
    child = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    print(json.dumps({"task": task, "child": child}))
    """
)


def test_an_agent_gets_credentials_from_its_environment_and_no_task_or_ps_line_sees_them(tmp_path: Path) -> None:
    store = KeyStore.open(tmp_path / "keys")
    creds_env = credentials_env(store.agent_credentials())
    assert set(creds_env) >= {ENV_SERVER_KEY, ENV_SECRET_KEY}
    secret = store.agent.secret.decode()
    out: dict[str, Any] = {}

    async def scenario() -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        auth = ZapAuthenticator(ctx, store.policy())
        auth.start()
        server = ctx.socket(zmq.ROUTER)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(auth.serve)
                secure_server(server, store.daemon, domain=AGENT_DOMAIN)
                url = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"
                async with await anyio.open_process(
                    [PYTHON, "-c", AGENT_SCRIPT, url],
                    env={**os.environ, **creds_env, "PYTHONPATH": str(ROOT)},
                    cwd=ROOT,
                ) as proc:
                    ident, msg = await recv(server)
                    server.send_multipart([ident, msg])
                    ident, msg = await recv(server)
                    assert msg == b"wait"
                    ps = await anyio.run_process(["ps", "-eww", "-o", "pid,args"])
                    out["ps"] = ps.stdout.decode()
                    server.send_multipart([ident, msg])
                    assert proc.stdout is not None
                    text = b""
                    async for chunk in proc.stdout:
                        text += chunk
                    assert await proc.wait() == 0
                    out.update(json.loads(text))
                tg.cancel_scope.cancel()
        finally:
            server.close(linger=0)
            auth.close()
            ctx.term()

    run(scenario)
    assert "-c" in out["ps"] and secret not in out["ps"] and "PILOT_CURVE" not in out["ps"]
    for env in (out["task"], out["child"]):
        assert env and secret not in env and "PILOT_CURVE" not in env


def test_credentials_through_a_private_file_or_refused_with_the_fix(tmp_path: Path) -> None:
    store = KeyStore.open(tmp_path / "keys")
    path = tmp_path / "agent.credentials"
    write_credentials(path, store.agent_credentials())
    assert mode(path) == 0o600
    environ = {ENV_FILE: str(path), "HOME": "/home/x"}
    assert credentials_from_env(environ) == store.agent_credentials()
    assert environ == {"HOME": "/home/x"}, "the variable left the environment"
    os.chmod(path, 0o640)
    with pytest.raises(SecurityError, match=re.escape(f"chmod 600 {path}")):
        credentials_from_env({ENV_FILE: str(path)})
    assert credentials_from_env({"HOME": "/h"}) is None
    with pytest.raises(SecurityError, match=ENV_SERVER_KEY):
        credentials_from_env({ENV_SECRET_KEY: store.agent.secret.decode()})
    with pytest.raises(SecurityError, match="not a Z85"):
        credentials_from_env({ENV_SERVER_KEY: "short", ENV_SECRET_KEY: store.agent.secret.decode()})


# -- logs ---------------------------------------------------------------------------------------------


def test_the_log_processor_hides_environments_and_masks_secrets() -> None:
    def event() -> dict[str, Any]:
        return {
            "event": "launch API_TOKEN=t0k3n now",
            "environment": {"PATH": "/bin", "API_TOKEN": "t0k3n", "DB_Password": "hunter2"},
            "aws_secret_access_key": "AKIA-secret",
            "command": ["/bin/app", "--password=hunter2", "x"],
            "job": {"id": "7", "env": {"MY_SECRET": "s3cr3t"}, "note": "ok"},
            "node": "n1",
            "inherit_environment": True,
        }

    info = RedactSecrets(keep_environments=False)(None, "info", event())
    text = json.dumps(info)
    for secret in ("t0k3n", "hunter2", "AKIA-secret", "s3cr3t", '/bin"'):
        assert secret not in text
    assert info["aws_secret_access_key"] == MASK and info["node"] == "n1" and info["inherit_environment"] is True
    assert info["environment"].startswith("<3 variables hidden") and info["job"]["env"].startswith("<1 variables")
    assert info["command"] == ["/bin/app", f"--password={MASK}", "x"]
    assert info["event"] == f"launch API_TOKEN={MASK} now"

    debug = RedactSecrets(keep_environments=True)(None, "debug", event())
    assert debug["environment"] == {"PATH": "/bin", "API_TOKEN": MASK, "DB_Password": MASK}
    assert debug["job"] == {"id": "7", "env": {"MY_SECRET": MASK}, "note": "ok"}
    assert "t0k3n" not in json.dumps(debug) and "hunter2" not in json.dumps(debug)
    assert mask_environment({"X": "a SESSION_KEY=abc b"}) == {"X": f"a SESSION_KEY={MASK} b"}


LOG_SCRIPT = textwrap.dedent(
    """
    import sys, structlog
    from pilot.logs import configure
    configure(level=sys.argv[1], json=True)
    log = structlog.get_logger("t")
    log.info("task launched", environment={"HOME": "/home/u", "GITHUB_TOKEN": "ghp_leak"}, api_key="k3y")
    log.debug("debug line", environment={"HOME": "/home/u", "GITHUB_TOKEN": "ghp_leak"})
    try:
        raise RuntimeError("command failed: env PASSWORD=hunter2 ./run")
    except RuntimeError:
        log.exception("task failed")
    """
)


@pytest.mark.parametrize("level", ["info", "debug"])
def test_configured_logs_carry_no_secret(level: str) -> None:
    proc = subprocess.run(
        [PYTHON, "-c", LOG_SCRIPT, level], capture_output=True, text=True, timeout=30, cwd=ROOT, check=True
    )
    lines = [json.loads(line) for line in proc.stderr.splitlines() + proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == (3 if level == "debug" else 2)
    text = json.dumps(lines)
    assert "ghp_leak" not in text and "k3y" not in text and "hunter2" not in text
    launched = lines[0]
    assert launched["api_key"] == MASK
    if level == "debug":
        assert launched["environment"] == {"HOME": "/home/u", "GITHUB_TOKEN": MASK}
    else:
        assert "/home/u" not in text and "hidden" in launched["environment"]
    assert f"PASSWORD={MASK}" in lines[-1]["exception"]


# -- where to bind -------------------------------------------------------------------------------------


def test_bind_host_is_narrow_unless_asked() -> None:
    assert bind_host(None, local=True) == "127.0.0.1"
    assert bind_host("lo") == "127.0.0.1"
    assert bind_host("127.0.0.1") == "127.0.0.1"
    assert bind_host("localhost") == "127.0.0.1"
    assert bind_host("*") == "0.0.0.0"  # asked for explicitly
    assert bind_host(None) not in ("0.0.0.0", "*", "::")
    with pytest.raises(SecurityError, match="neither an IP address"):
        bind_host("no-such-interface-or-host.invalid")
    assert tcp_endpoint("10.1.2.3") == "tcp://10.1.2.3:*"
    assert tcp_endpoint("::1", 5555) == "tcp://[::1]:5555"
