"""What CURVE costs on the wire, before it is wired into the daemon: NULL vs CURVE in the same run.

    python bench/security_cost.py [--repeat 9] [--round-trips 5000] [--messages 50000] [--json FILE]

A server process shaped like the daemon (zmq.asyncio ROUTER on anyio, bursts drained with NOBLOCK,
the ZAP authenticator of pilot.security running on the same loop) binds two tcp loopback endpoints on
one socket: one NULL, one CURVE (the per-endpoint security the daemon's client socket will use). A
client process measures, against each endpoint in turn (alternating, so machine noise hits both):

- round trips/s: one small request, wait for the reply (latency-bound: the agent's heartbeat, a submit);
- messages/s: a stream of 200-byte and 16 KiB messages, one reply at the end (throughput-bound: event
  batches);
- handshakes/s: new socket, connect, first round trip (a client or agent (re)connecting).

Each round measures NULL and CURVE back to back (alternating which goes first); printed are the
median rates, the median of the per-round CURVE/NULL ratios with their range (how noisy the machine
was), and CPU microseconds per message of client + server, all threads: the cost itself, which other
load on the machine hardly moves.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import zmq  # noqa: E402

from pilot.logs import configure  # noqa: E402
from pilot.security import CLIENT_DOMAIN, Credentials, KeyStore  # noqa: E402
from pilot.wire.curve import secure_client  # noqa: E402

_DRAIN = 2048

Work = Callable[["zmq.Socket[bytes]", "zmq.Context[zmq.Socket[bytes]]", str, "Credentials | None"], int]


def serve(keys_dir: str, conn: Connection) -> None:
    """The daemon-shaped server: b'e…' is echoed, b's…' counted, b'c' answered with the count."""
    import anyio

    from pilot.logs import configure
    from pilot.wire.curve import ZapAuthenticator, secure_server, wait_readable

    configure(level="warning")

    async def main() -> None:
        store = KeyStore.open(Path(keys_dir))
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        auth = ZapAuthenticator(ctx, store.policy())
        auth.start()
        sock = ctx.socket(zmq.ROUTER)
        null_port = sock.bind_to_random_port("tcp://127.0.0.1")
        secure_server(sock, store.daemon, domain=CLIENT_DOMAIN)
        curve_port = sock.bind_to_random_port("tcp://127.0.0.1")
        conn.send((null_port, curve_port))
        counted = 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(auth.serve)
            while True:  # like the daemon's I/O task: drain a burst with NOBLOCK, then wait
                await wait_readable(sock)
                for _ in range(_DRAIN):
                    try:
                        ident, payload = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    kind = payload[:1]
                    if kind == b"e":
                        sock.send_multipart([ident, payload])
                    elif kind == b"s":
                        counted += 1
                    elif kind == b"c":
                        sock.send_multipart([ident, str(counted).encode()])
                        counted = 0
                    elif kind == b"q":
                        tg.cancel_scope.cancel()
                await anyio.lowlevel.checkpoint()
        sock.close(linger=0)
        auth.close()
        ctx.term()

    anyio.run(main)


def _dealer(ctx: zmq.Context[zmq.Socket[bytes]], url: str, creds: Credentials | None) -> zmq.Socket[bytes]:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVTIMEO, 30_000)
    if creds is not None:
        secure_client(s, creds)
    s.connect(url)
    return s


def round_trips(s: zmq.Socket[bytes], n: int) -> int:
    msg = b"e" + b"x" * 99
    for _ in range(n):
        s.send(msg)
        s.recv()
    return n


def stream(s: zmq.Socket[bytes], n: int, size: int) -> int:
    msg = b"s" + b"x" * (size - 1)
    for _ in range(n):
        s.send(msg)
    s.send(b"c")
    got = int(s.recv())
    assert got == n, f"server counted {got} of {n} messages"
    return n


def handshakes(ctx: zmq.Context[zmq.Socket[bytes]], url: str, creds: Credentials | None, n: int) -> int:
    for _ in range(n):
        s = _dealer(ctx, url, creds)
        s.send(b"e")
        s.recv()
        s.close(linger=0)
    return n


def _cpu(server: psutil.Process) -> float:
    """CPU seconds used so far by this process and the server, all threads (libzmq's I/O threads, where
    CURVE encrypts, included): unlike wall-clock rates, hardly moved by other load on the machine."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    t = server.cpu_times()
    return float(own.ru_utime + own.ru_stime + t.user + t.system)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--round-trips", type=int, default=5000)
    ap.add_argument("--messages", type=int, default=50_000, help="200 B messages per stream (16 KiB: a tenth)")
    ap.add_argument("--handshakes", type=int, default=200)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    configure(level="warning")

    with tempfile.TemporaryDirectory() as tmp:
        keys_dir = Path(tmp) / "keys"
        store = KeyStore.open(keys_dir)
        mp = multiprocessing.get_context("spawn")
        parent, child = mp.Pipe()
        server = mp.Process(target=serve, args=(str(keys_dir), child), daemon=True)
        server.start()
        if not parent.poll(30):
            raise SystemExit("the server did not start")
        null_port, curve_port = parent.recv()
        assert server.pid is not None
        server_proc = psutil.Process(server.pid)
        modes: dict[str, tuple[str, Credentials | None]] = {
            "NULL": (f"tcp://127.0.0.1:{null_port}", None),
            "CURVE": (f"tcp://127.0.0.1:{curve_port}", store.client_credentials()),
        }
        workloads: dict[str, Work] = {
            "round trips/s (100 B)": lambda s, ctx, url, c: round_trips(s, args.round_trips),
            "messages/s (200 B)": lambda s, ctx, url, c: stream(s, args.messages, 200),
            "messages/s (16 KiB)": lambda s, ctx, url, c: stream(s, max(1, args.messages // 10), 16384),
            "handshakes/s (connect + 1st reply)": lambda s, ctx, url, c: handshakes(ctx, url, c, args.handshakes),
        }
        rates: dict[str, dict[str, list[float]]] = {w: {m: [] for m in modes} for w in workloads}
        cpu: dict[str, dict[str, list[float]]] = {w: {m: [] for m in modes} for w in workloads}
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            for r in range(args.repeat):
                for name, work in workloads.items():
                    # Back to back, alternating which goes first: a round's pair sees the same machine.
                    for mode in list(modes) if r % 2 == 0 else list(reversed(modes)):
                        url, creds = modes[mode]
                        s = _dealer(ctx, url, creds)
                        try:
                            s.send(b"e")
                            s.recv()  # connected, handshake done (except for the handshake workload)
                            c0, t0 = _cpu(server_proc), time.perf_counter()
                            n = work(s, ctx, url, creds)
                            elapsed, used = time.perf_counter() - t0, _cpu(server_proc) - c0
                        finally:
                            s.close(linger=0)
                        rates[name][mode].append(n / elapsed)
                        cpu[name][mode].append(used / n * 1e6)
            q = _dealer(ctx, modes["NULL"][0], None)
            q.send(b"q")
            q.close(linger=100)
        finally:
            ctx.term()
            server.join(5)
            if server.is_alive():
                server.kill()

    result: dict[str, Any] = {"repeat": args.repeat, "workloads": {}}
    print(
        f"{'workload':<36}{'NULL':>10}{'CURVE':>10}{'ratio':>7}{'(min-max)':>12}"
        f"{'CPU us/msg NULL':>17}{'CURVE':>8}{'ratio':>7}"
    )
    for name in workloads:
        r_null, r_curve = rates[name]["NULL"], rates[name]["CURVE"]
        ratios = [c / n for n, c in zip(r_null, r_curve, strict=True)]  # paired by round
        c_null, c_curve = statistics.median(cpu[name]["NULL"]), statistics.median(cpu[name]["CURVE"])
        result["workloads"][name] = {
            "rate": rates[name],
            "cpu_us_per_msg": cpu[name],
            "rate_ratio_median": statistics.median(ratios),
            "cpu_ratio_median": c_curve / c_null,
        }
        print(
            f"{name:<36}{statistics.median(r_null):>10,.0f}{statistics.median(r_curve):>10,.0f}"
            f"{statistics.median(ratios):>7.2f}{f'({min(ratios):.2f}-{max(ratios):.2f})':>12}"
            f"{c_null:>17.1f}{c_curve:>8.1f}{c_curve / c_null:>7.2f}"
        )
    print(f"rates: medians of {args.repeat} rounds; ratio = CURVE/NULL, median of the per-round pairs")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
