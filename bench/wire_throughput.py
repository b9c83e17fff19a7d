#!/usr/bin/env python3
"""Tunnel wire throughput and idle-session memory, with baselines measured in the same run.

    python bench/wire_throughput.py            # full run (~1 minute on 2 cores)
    python bench/wire_throughput.py --mib 64   # quicker, noisier
    python bench/wire_throughput.py --only tcp,h2,mux/h2c,mux/tls --sessions 0   # some rows, no memory

Each throughput figure moves ``--mib`` MiB from this process to a sink in a second process (so the
two ends use both cores, as agentd and kasd would), over 127.0.0.1:

  tcp        plain trio TCP, 64 KiB writes                        (baseline: the socket itself)
  h2         one HTTP/2 stream, no mux (our h2 carrier alone)     (baseline: bare h2 on trio)
  mux/tcp    a mux session straight over TCP
  mux/h2c    a mux session over one h2c stream, 1 and 64 streams
  mux/tls    a mux session over one TLS (ALPN h2) stream, 1 and 64 streams
  mux/ws     a mux session over one WebSocket (ws://, binary messages), 1 and 64 streams
  mux/wss    a mux session over one WebSocket over TLS (wss://, ALPN http/1.1), 1 and 64 streams

Each row also gives the least CPU per MiB each end spent (/proc, 10 ms ticks: use ``--mib`` 256 or
more), a steadier figure than MB/s on a shared machine.

Memory: tracemalloc over 1,000 idle sessions (handshake done, nothing open): the mux session alone
(over in-memory streams) and whole h2c and ws tunnels on loopback (client and server ends).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import ssl
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wire.h2carrier import dial_h2_tunnel, serve_h2_tunnels, server_ssl_context
from wire.session import Session, connect_session
from wire.wscarrier import dial_ws_tunnel

WRITE = 64 * 1024
TOKEN = "bench-token"


# ----------------------------------------------------------------------------- sink (server side)


async def _count_until_eof(stream: trio.abc.ReceiveStream) -> int:
    total = 0
    while chunk := await stream.receive_some():
        total += len(chunk)
    return total


async def _sink_stream(stream: trio.abc.Stream) -> None:
    total = await _count_until_eof(stream)
    await stream.send_all(str(total).encode())


async def _sink_session(session: Session) -> None:
    async def one(stream: Any) -> None:
        total = await _count_until_eof(stream)
        await stream.send_all(str(total).encode())
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        while True:
            try:
                stream = await session.accept_stream()
            except trio.BrokenResourceError:
                return
            nursery.start_soon(one, stream)


async def serve(mode: str, port_file: str, cert_dir: str | None) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def auth(token: str, headers: dict[str, str]) -> Any:
        return "bench" if token == TOKEN else None

    async def on_session(session: Session, principal: Any) -> None:
        await _sink_session(session)

    async with trio.open_nursery() as nursery:
        if mode == "tcp":
            await nursery.start(trio.serve_listeners, _sink_stream, listeners)
        elif mode == "mux-tcp":

            async def handler(stream: trio.SocketStream) -> None:
                async with trio.open_nursery() as inner:
                    session = await connect_session(inner, stream, client=False)
                    await _sink_session(session)

            await nursery.start(trio.serve_listeners, handler, listeners)
        elif mode == "h2":
            # Bare h2: accept the tunnel request, then use the HTTP/2 stream directly, no mux.
            from wire import h2carrier

            async def bare(stream: trio.SocketStream) -> None:
                accepted = await h2carrier._accept_tunnel(stream, authenticate=auth, path="/tunnel", peer="bench")
                if accepted is None:
                    return
                transport, _ = accepted
                await _sink_stream(transport)
                with trio.move_on_after(1):
                    await trio.sleep_forever()

            await nursery.start(trio.serve_listeners, bare, listeners)
        else:
            ctx = None
            websocket = mode in ("mux-ws", "mux-wss")  # kasd's agent port: both carriers
            if mode in ("mux-tls", "mux-wss"):
                assert cert_dir
                ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                ctx.load_cert_chain(os.path.join(cert_dir, "server.pem"))
                server_ssl_context(ctx, websocket=websocket)
            await nursery.start(
                lambda task_status: serve_h2_tunnels(
                    on_session, listeners, authenticate=auth, ssl_context=ctx, websocket=websocket,
                    task_status=task_status,
                )
            )
        await trio.Path(port_file).write_text(str(port))


# ----------------------------------------------------------------------------- client side


class Sink:
    """A sink server in a child process."""

    def __init__(self, mode: str, cert_dir: str | None) -> None:
        self.mode = mode
        self.port_file = tempfile.mktemp(prefix="wirebench-port-")
        args = [sys.executable, __file__, "--serve", mode, "--port-file", self.port_file]
        if cert_dir:
            args += ["--cert-dir", cert_dir]
        self.proc = subprocess.Popen(args)
        deadline = time.monotonic() + 20
        while not (os.path.exists(self.port_file) and Path(self.port_file).read_text()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"sink for {mode} did not start")
            time.sleep(0.02)
        self.port = int(Path(self.port_file).read_text())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        os.unlink(self.port_file)


async def _send_and_confirm(stream: trio.abc.HalfCloseableStream | Any, nbytes: int, eof: Any) -> None:
    block = b"\x5a" * WRITE
    sent = 0
    while sent < nbytes:
        await stream.send_all(block)
        sent += len(block)
    await eof()
    reply = b""
    while chunk := await stream.receive_some():
        reply += chunk
        if len(reply) >= len(str(nbytes)):
            break
    if int(reply) != nbytes:
        raise RuntimeError(f"sink counted {reply!r}, sent {nbytes}")


async def run_tcp(port: int, nbytes: int) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await _send_and_confirm(stream, nbytes, stream.send_eof)
    await stream.aclose()


async def run_h2(port: int, nbytes: int) -> None:
    transport = await dial_h2_tunnel(f"http://127.0.0.1:{port}/tunnel", token=TOKEN)
    await _send_and_confirm(transport, nbytes, transport.send_eof)
    await transport.aclose()


async def _mux_streams(session: Session, nbytes: int, streams: int) -> None:
    async def one(share: int) -> None:
        stream = await session.open_stream({})
        await _send_and_confirm(stream, share, stream.send_eof)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(one, nbytes // streams)


async def run_mux_tcp(port: int, nbytes: int, streams: int) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with trio.open_nursery() as nursery:
        session = await connect_session(nursery, stream, client=True)
        await _mux_streams(session, nbytes, streams)
        await session.aclose()
        nursery.cancel_scope.cancel()


async def run_mux_h2(port: int, nbytes: int, streams: int, ctx: ssl.SSLContext | None) -> None:
    scheme = "https" if ctx else "http"
    host = "localhost" if ctx else "127.0.0.1"
    transport = await dial_h2_tunnel(f"{scheme}://{host}:{port}/tunnel", token=TOKEN, ssl_context=ctx)
    async with trio.open_nursery() as nursery:
        session = await connect_session(nursery, transport, client=True)
        await _mux_streams(session, nbytes, streams)
        await session.aclose()
        nursery.cancel_scope.cancel()


async def run_mux_ws(port: int, nbytes: int, streams: int, ctx: ssl.SSLContext | None) -> None:
    url = f"wss://localhost:{port}/tunnel" if ctx else f"ws://127.0.0.1:{port}/tunnel"
    transport = await dial_ws_tunnel(url, token=TOKEN, ssl_context=ctx)
    async with trio.open_nursery() as nursery:
        session = await connect_session(nursery, transport, client=True)
        await _mux_streams(session, nbytes, streams)
        await session.aclose()
        nursery.cancel_scope.cancel()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far (/proc; 0 where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(label: str, fn: Any, nbytes: int, repeat: int, sink_pid: int) -> float:
    """Best MB/s of ``repeat`` runs; also the least CPU per MiB each end spent (this process sends,
    the sink receives): on a shared machine a steadier figure than MB/s, and the throughput of one
    stream is bounded by the busier end's."""
    best = 0.0
    send_cpu = receive_cpu = math.inf
    mib = nbytes / 2**20
    for _ in range(repeat):
        sink_before, before = _cpu_seconds(sink_pid), time.process_time()
        start = time.perf_counter()
        trio.run(fn)
        elapsed = time.perf_counter() - start
        send_cpu = min(send_cpu, (time.process_time() - before) * 1000 / mib)
        receive_cpu = min(receive_cpu, (_cpu_seconds(sink_pid) - sink_before) * 1000 / mib)
        best = max(best, nbytes / elapsed / 1e6)
    print(f"  {label:<22} {best:8.1f} MB/s   CPU ms/MiB: sender {send_cpu:5.2f}  receiver {receive_cpu:5.2f}", flush=True)
    return best


# ----------------------------------------------------------------------------- memory


@asynccontextmanager
async def _traced() -> AsyncIterator[list[int]]:
    """Bytes the block left allocated once every task it started is idle (tracemalloc)."""
    grown = [0]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    try:
        yield grown
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        grown[0] = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


async def _start_session(nursery: trio.Nursery, transport: trio.abc.Stream, client: bool) -> None:
    await connect_session(nursery, transport, client=client)


async def _idle_mux_sessions(count: int) -> tuple[int, int]:
    """Bytes per session for the mux session alone (one end), over in-memory streams."""
    async with trio.open_nursery() as nursery:
        async with _traced() as grown:
            for _ in range(count):
                left, right = trio.testing.memory_stream_pair()
                async with trio.open_nursery() as pair:
                    pair.start_soon(_start_session, nursery, left, True)
                    pair.start_soon(_start_session, nursery, right, False)
        nursery.cancel_scope.cancel()
    return grown[0], grown[0] // (2 * count)


async def _idle_tunnels(count: int, carrier: str = "h2c") -> tuple[int, int]:
    """Bytes per tunnel end for whole h2c (or ws) tunnels on loopback (client and server in this process)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1", backlog=count)
    port = listeners[0].socket.getsockname()[1]
    ready = trio.Semaphore(0)

    async def auth(token: str, headers: dict[str, str]) -> Any:
        return "bench"

    async def on_session(session: Session, principal: Any) -> None:
        ready.release()
        await session.wait_closed()

    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: serve_h2_tunnels(on_session, listeners, authenticate=auth, websocket=True,
                                                 task_status=task_status)
        )
        async with _traced() as grown:
            for _ in range(count):
                transport: trio.abc.Stream
                if carrier == "ws":
                    transport = await dial_ws_tunnel(f"ws://127.0.0.1:{port}/tunnel", token=TOKEN)
                else:
                    transport = await dial_h2_tunnel(f"http://127.0.0.1:{port}/tunnel", token=TOKEN)
                await connect_session(nursery, transport, client=True)
                await ready.acquire()
        nursery.cancel_scope.cancel()
    return grown[0], grown[0] // (2 * count)


# ----------------------------------------------------------------------------- main


def describe_machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import h2
    import msgpack

    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, trio {trio.__version__}, "
        f"h2 {h2.__version__}, msgpack {'.'.join(map(str, msgpack.version))}, {platform.system()} {platform.release()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256, help="MiB moved per throughput run (default 256)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per figure; the best is reported (default 2)")
    parser.add_argument("--sessions", type=int, default=1000, help="idle sessions for the memory figure (0: none)")
    parser.add_argument("--only", help="comma-separated rows to run, each a row's label or its start "
                        "(tcp,h2,mux/h2c runs those five rows); ratios are printed for the rows run")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    parser.add_argument("--cert-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        trio.run(serve, args.serve, args.port_file, args.cert_dir)
        return

    import trustme

    nbytes = args.mib * 1024 * 1024
    print(f"machine: {describe_machine()}")
    print(f"throughput, {args.mib} MiB per run, {WRITE // 1024} KiB writes, best of {args.repeat}:")
    cert_dir = tempfile.mkdtemp(prefix="wirebench-tls-")
    ca = trustme.CA()
    ca.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(os.path.join(cert_dir, "server.pem"))
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    results: dict[str, float] = {}
    plan: list[tuple[str, str, Any]] = [
        ("tcp", "tcp", lambda p: lambda: run_tcp(p, nbytes)),
        ("h2", "h2", lambda p: lambda: run_h2(p, nbytes)),
        ("mux/tcp 1 stream", "mux-tcp", lambda p: lambda: run_mux_tcp(p, nbytes, 1)),
        ("mux/h2c 1 stream", "mux-h2c", lambda p: lambda: run_mux_h2(p, nbytes, 1, None)),
        ("mux/h2c 64 streams", "mux-h2c", lambda p: lambda: run_mux_h2(p, nbytes, 64, None)),
        ("mux/tls 1 stream", "mux-tls", lambda p: lambda: run_mux_h2(p, nbytes, 1, client_ctx)),
        ("mux/tls 64 streams", "mux-tls", lambda p: lambda: run_mux_h2(p, nbytes, 64, client_ctx)),
        ("mux/ws 1 stream", "mux-ws", lambda p: lambda: run_mux_ws(p, nbytes, 1, None)),
        ("mux/ws 64 streams", "mux-ws", lambda p: lambda: run_mux_ws(p, nbytes, 64, None)),
        ("mux/wss 1 stream", "mux-wss", lambda p: lambda: run_mux_ws(p, nbytes, 1, client_ctx)),
        ("mux/wss 64 streams", "mux-wss", lambda p: lambda: run_mux_ws(p, nbytes, 64, client_ctx)),
    ]
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        plan = [row for row in plan if any(row[0] == w or row[0].startswith(w + " ") for w in wanted)]
    for label, mode, make in plan:
        sink = Sink(mode, cert_dir)
        try:
            results[label] = measure(label, make(sink.port), nbytes, args.repeat, sink.proc.pid)
        finally:
            sink.close()

    print("ratios:")

    def ratio(label: str, base: str) -> str:
        return f"{results[label] / results[base]:.2f} x {base}" if label in results and base in results else ""

    for label in ("mux/h2c 1 stream", "mux/h2c 64 streams"):
        if label in results:
            print(f"  {label:<22} {ratio(label, 'h2').replace('x h2', 'x bare h2'):<18}  {ratio(label, 'tcp').replace('tcp', 'TCP')}".rstrip())
    for label in ("mux/tls 1 stream", "mux/tls 64 streams"):
        if label in results:
            print(f"  {label:<22} {ratio(label, 'mux/h2c 1 stream')}")
    for label in ("mux/ws 1 stream", "mux/ws 64 streams", "mux/wss 1 stream", "mux/wss 64 streams"):
        h2_label = label.replace("mux/wss", "mux/tls").replace("mux/ws", "mux/h2c")
        if label in results:
            print(f"  {label:<22} {ratio(label, h2_label)}")
    if "mux/tcp 1 stream" in results:
        print(f"  {'mux/tcp 1 stream':<22} {ratio('mux/tcp 1 stream', 'tcp').replace('tcp', 'TCP')}")
    if not args.sessions or "mux/h2c 1 stream" not in results or "mux/h2c 64 streams" not in results:
        return

    total, per = trio.run(_idle_mux_sessions, args.sessions)
    print(f"memory, {args.sessions} idle sessions (tracemalloc):")
    print(f"  mux session alone      {per / 1024:8.1f} KiB per session end ({total / 2**20:.1f} MiB for {2 * args.sessions} ends)")
    for carrier in ("h2c", "ws"):
        total, per = trio.run(_idle_tunnels, args.sessions, carrier)
        print(f"  whole {carrier} tunnel {'':<{6 - len(carrier)}}{per / 1024:8.1f} KiB per tunnel end "
              f"({total / 2**20:.1f} MiB for {2 * args.sessions} ends)")
    targets_ok = results["mux/h2c 1 stream"] >= 150 and results["mux/h2c 64 streams"] >= 150
    print(f"targets: h2c >= 150 MB/s for 1 and 64 streams: {'met' if targets_ok else 'NOT met'}")


if __name__ == "__main__":
    main()
