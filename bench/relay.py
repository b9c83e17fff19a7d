#!/usr/bin/env python3
"""A bare TLS byte relay: the floor under what any two-process tunnel can add on this machine.

    python bench/relay.py --cert c.pem --key k.pem --upstream 127.0.0.1:6443 --upstream-ca ca.pem

Each connection it accepts (TLS) gets its own TLS connection upstream, and bytes are pumped both
ways, one task per direction: no HTTP, no h2, no mux, no authorization. It uses the same socket
and TLS streams as kasd and agentd (``netio.fastio``), so two of these in a chain — client → relay
→ relay → kubesim, like client → kasd → agentd → kubesim — cost what the tunnel's processes,
wake-ups and TLS cost before any protocol work. ``bench/e2e.py`` runs such a chain as its "bare
relay" row.
"""

from __future__ import annotations

import argparse
import ssl
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netio.fastio import FastSocketStream, FastTLSStream

_CHUNK = 256 * 1024


async def _pump(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
    try:
        while data := await source.receive_some(_CHUNK):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    await sink.aclose()  # the other direction ends too: a relay has no half-close to offer


async def _relay(client: trio.SocketStream, server_ctx: ssl.SSLContext, host: str, port: int,
                 upstream_ctx: ssl.SSLContext) -> None:
    downstream = FastTLSStream(FastSocketStream.from_trio(client), server_ctx, server_side=True)
    try:
        tcp = await trio.open_tcp_stream(host, port)
    except OSError as exc:
        print(f"relay: cannot reach upstream {host}:{port}: {exc}", file=sys.stderr)
        await downstream.aclose()
        return
    upstream = FastTLSStream(FastSocketStream.from_trio(tcp), upstream_ctx, server_hostname="localhost",
                             https_compatible=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_pump, downstream, upstream)
        nursery.start_soon(_pump, upstream, downstream)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", type=int, default=0,
                        help="port to listen on, on 127.0.0.1 (default: any free one; the first line printed names it)")
    parser.add_argument("--cert", required=True, help="PEM certificate chain to serve")
    parser.add_argument("--key", required=True, help="PEM private key of --cert")
    parser.add_argument("--upstream", required=True, help="host:port to relay to (TLS)")
    parser.add_argument("--upstream-ca", required=True, help="PEM CA that signed the upstream's certificate")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(args.cert, args.key)
    upstream_ctx = ssl.create_default_context(cafile=args.upstream_ca)
    upstream_ctx.check_hostname = False  # throwaway bench certificates; the CA is still checked

    async def serve() -> None:
        listeners = await trio.open_tcp_listeners(args.listen, host="127.0.0.1")
        print(f"listening on 127.0.0.1:{listeners[0].socket.getsockname()[1]}", flush=True)
        await trio.serve_listeners(lambda s: _relay(s, server_ctx, host, int(port), upstream_ctx), listeners)

    try:
        trio.run(serve)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
