"""bench/relay.py, the floor e2e.py measures the tunnel against: bytes both ways, end with the upstream."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import trio
import trustme

RELAY = Path(__file__).resolve().parent.parent / "bench" / "relay.py"


async def test_the_relay_carries_bytes_both_ways_and_ends_with_the_upstream(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "both.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    upstream_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(upstream_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    async def echo_twice_then_close(stream: trio.SSLStream[trio.SocketStream]) -> None:
        for _ in range(2):
            data = await stream.receive_some()
            await stream.send_all(data.upper())
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_ssl_over_tcp, echo_twice_then_close, 0, upstream_ctx)
        upstream_port = listeners[0].transport_listener.socket.getsockname()[1]
        relay = await trio.lowlevel.open_process(
            [sys.executable, str(RELAY), "--cert", str(tmp_path / "both.pem"), "--key", str(tmp_path / "both.pem"),
             "--upstream", f"127.0.0.1:{upstream_port}", "--upstream-ca", str(tmp_path / "ca.pem")],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            with trio.fail_after(20):
                assert relay.stdout is not None
                line = b""
                while not line.endswith(b"\n"):
                    line += await relay.stdout.receive_some()
                assert line.startswith(b"listening on 127.0.0.1:")
                tcp = await trio.open_tcp_stream("127.0.0.1", int(line.rsplit(b":", 1)[1]))
                client = trio.SSLStream(tcp, client_ctx, server_hostname="localhost")
                for word in (b"hello", b"again"):
                    await client.send_all(word)
                    assert await client.receive_some() == word.upper()
                assert await client.receive_some() == b""  # the upstream closed: so does the relay
        finally:
            relay.terminate()
            with trio.move_on_after(10):
                await relay.wait()
        nursery.cancel_scope.cancel()
