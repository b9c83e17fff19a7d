"""The observability port: liveness, readiness (down while draining) and the metrics counters."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.kasd.helpers import (
    CI_TOKEN,
    bearer,
    fake_agent,
    http_request,
    make_config,
    read_until_closed,
    running_kasd,
)
from tests.tlsprobe import ServerFiles, https_get, plain_get

pytestmark = pytest.mark.timeout(20)


async def test_liveness_readiness_and_metrics() -> None:
    async with running_kasd() as kasd, fake_agent(kasd):
        obs = kasd.port("observability")
        assert (await http_request(obs, "GET", "/liveness")).status == 200
        assert (await http_request(obs, "GET", "/readiness")).status == 200
        assert (await http_request(obs, "GET", "/nope")).status == 404
        api = kasd.port("kubernetes_api")
        assert (await http_request(api, "GET", "/api", [bearer(CI_TOKEN)], b"")).status == 200
        assert (await http_request(api, "POST", "/api/v1/namespaces", [bearer(CI_TOKEN)], b"x" * 1000)).status == 200
        assert (await http_request(api, "GET", "/api", [bearer("ci:1:bad")])).status == 401
        metrics = await http_request(obs, "GET", "/metrics")
        assert metrics.status == 200
        text = metrics.body.decode()
        for line in (
            "kasd_connected_agents 1.0",
            "kasd_agent_sessions 1.0",
            'kasd_proxy_requests_total{code="200"} 2.0',
            'kasd_proxy_requests_total{code="401"} 1.0',
            "kasd_proxy_active_streams 0.0",
            'kasd_tunnel_bytes_total{direction="to_agent"} 1000.0',
        ):
            assert line in text, line
        assert 'kasd_tunnel_bytes_total{direction="from_agent"}' in text


async def test_readiness_fails_while_draining_and_shutdown_finishes_in_flight_requests() -> None:
    release = trio.Event()
    arrived = trio.Event()

    async def slow(stream, head, session) -> None:  # type: ignore[no-untyped-def]
        from tests.kasd.helpers import json_handler

        arrived.set()
        await release.wait()
        await json_handler(stream, head, session)

    async with trio.open_nursery() as nursery:
        from kasd.server import serve_kasd
        from tests.kasd.helpers import make_config

        kasd = await nursery.start(serve_kasd, make_config())
        async with fake_agent(kasd, slow):
            results: list[int] = []
            done = trio.Event()

            async def call() -> None:
                results.append((await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(CI_TOKEN)])).status)
                done.set()

            nursery.start_soon(call)
            await arrived.wait()
            kasd.request_shutdown()
            await kasd.health.drain_started.wait()
            assert (await http_request(kasd.port("observability"), "GET", "/readiness")).status == 503
            # New connections are no longer accepted on the proxy port.
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
            release.set()
            await done.wait()
            assert results == [200]


async def test_a_bad_request_gets_400_or_431_not_a_bare_close() -> None:
    async with running_kasd() as kasd:
        port = kasd.port("observability")
        for request, status, text in (
            (b"\x16\x03\x01\x00\xa5garbage\r\n\r\n", 400, b"malformed HTTP/1.1 request\n"),
            (b"GET /metrics HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 16384 + b"\r\n\r\n", 431, b"request head too large\n"),
        ):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(request)
            answer = await read_until_closed(stream)
            assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:100]
            assert b"connection: close" in answer and answer.endswith(text)
            await stream.aclose()


async def test_with_tls_the_observability_port_serves_https_only_and_a_rotated_certificate_at_once(
        tmp_path: Path) -> None:
    """listeners.observability.tls: probes and scrapes over HTTPS (the stack's CA verifies it), plain
    HTTP gets no answer; a certificate written over the files is served on the next connection (SIGHUP)."""
    files = ServerFiles(tmp_path)
    first = files.serial
    config = make_config({"listeners": {
        "agent": {"address": "127.0.0.1:0"},
        "kubernetes_api": {"address": "127.0.0.1:0"},
        "observability": {"address": "127.0.0.1:0", "tls": {"cert": str(files.cert), "key": str(files.key)}},
    }})
    async with running_kasd(config) as kasd:
        obs = kasd.port("observability")
        with trio.fail_after(10):
            ready = await https_get(obs, "/readiness", files.ca_file)
            assert (ready.status, ready.body, ready.serial) == (200, b"ready\n", first)
            metrics = await https_get(obs, "/metrics", files.ca_file)
            assert metrics.status == 200 and b"kasd_connected_agents" in metrics.body
            assert not (await plain_get(obs, "/readiness")).startswith(b"HTTP/")
            rotated = files.rotate()
            kasd.reload_tls()  # what SIGHUP does
            scraped = await https_get(obs, "/metrics", files.ca_file)
            assert scraped.serial == rotated != first
            # and the reload is counted, as is one of files that do not load (the old pair stays)
            assert b'kasd_tls_reloads_total{name="listeners.observability",result="ok"} 1.0' in scraped.body
            files.cert.write_bytes(b"-----BEGIN CERT")  # half written
            kasd.reload_tls()
            scraped = await https_get(obs, "/metrics", files.ca_file)
            assert scraped.serial == rotated
            assert b'kasd_tls_reloads_total{name="listeners.observability",result="failed"} 1.0' in scraped.body
