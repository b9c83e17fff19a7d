"""Garbage, slowloris and oversized input on 8154 and 8150 get clear answers (or a close) while other
clients keep being served."""

from __future__ import annotations

import json

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

pytestmark = pytest.mark.timeout(20)


def _status_of(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


async def test_proxy_port_hostile_clients_get_clear_errors_while_good_ones_are_served() -> None:
    config = make_config(header_timeout=0.5, max_header_bytes=8192)
    async with running_kasd(config) as kasd, fake_agent(kasd):
        port = kasd.port("kubernetes_api")

        # A slowloris opens first and dribbles a partial head; it stays open while others are served.
        slow = await trio.open_tcp_stream("127.0.0.1", port)
        await slow.send_all(b"GET /api HTTP/1.1\r\nHost: x\r\n")

        garbage = await trio.open_tcp_stream("127.0.0.1", port)
        await garbage.send_all(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1garbage\r\n\r\n")
        status, body = _status_of(await read_until_closed(garbage))
        assert status == 400 and body["reason"] == "BadRequest"
        assert "malformed HTTP/1.1 request" in str(body["message"])

        big = await trio.open_tcp_stream("127.0.0.1", port)
        await big.send_all(b"GET /api HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
        status, body = _status_of(await read_until_closed(big))
        assert status == 431 and body["message"] == "request head larger than 8192 bytes"

        good = await http_request(port, "GET", "/api", [bearer(CI_TOKEN)])
        assert good.status == 200

        status, body = _status_of(await read_until_closed(slow))
        assert status == 408 and body["reason"] == "Timeout"
        assert body["message"] == "request head not received within 0.5s"

        # h2c prior knowledge that stops after the preface is closed at the same bound.
        h2_slow = await trio.open_tcp_stream("127.0.0.1", port)
        await h2_slow.send_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        await read_until_closed(h2_slow)

        # A connection that never says anything is closed too.
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        await read_until_closed(silent)

        good = await http_request(port, "GET", "/api", [bearer(CI_TOKEN)])
        assert good.status == 200
        metrics = kasd.metrics.render().decode()
        assert 'kasd_proxy_requests_total{code="400"} 1.0' in metrics
        assert 'kasd_proxy_requests_total{code="431"} 1.0' in metrics


async def test_agent_port_hostile_clients_are_closed_while_the_agent_keeps_working() -> None:
    config = make_config({"listeners": {
        "agent": {"address": "127.0.0.1:0", "handshake_timeout": 0.5},
        "observability": {"address": "127.0.0.1:0"},
        "kubernetes_api": {"address": "127.0.0.1:0"},
    }})
    async with running_kasd(config) as kasd, fake_agent(kasd):
        port = kasd.port("agent")
        slow = await trio.open_tcp_stream("127.0.0.1", port)
        await slow.send_all(b"PRI * HTTP/2.0\r\n")

        garbage = await trio.open_tcp_stream("127.0.0.1", port)
        await garbage.send_all(b"\x00\xff" * 64)
        await read_until_closed(garbage)

        http1 = await trio.open_tcp_stream("127.0.0.1", port)  # a WebSocket tunnel's request, no token
        await http1.send_all(b"GET /tunnel HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await read_until_closed(http1)).startswith(b"HTTP/1.1 401")

        slow_upgrade = await trio.open_tcp_stream("127.0.0.1", port)  # a head that never ends
        await slow_upgrade.send_all(b"GET /tunnel HTTP/1.1\r\nHost: x\r\n")

        good = await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(CI_TOKEN)])
        assert good.status == 200

        await read_until_closed(slow)  # the handshake timeout closes it
        assert await read_until_closed(slow_upgrade) == b""  # and this one, unanswered
        assert kasd.registry.statistics().sessions == 1
        good = await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(CI_TOKEN)])
        assert good.status == 200


async def test_malformed_requests_are_logged_in_bursts(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each malformed request still gets its 400, but a stranger sending one per connection writes
    one `rejected request` line per 10 s per source, not one each."""
    import logging

    from daemonkit.logs import BurstLimitedLog
    from kasd.k8sproxy import http1 as proxy_http1

    monkeypatch.setattr(proxy_http1, "_strangers", BurstLimitedLog(proxy_http1.log), raising=False)
    caplog.set_level(logging.INFO)
    async with running_kasd() as kasd:
        for _ in range(20):
            garbage = await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
            await garbage.send_all(b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n")
            status, _ = _status_of(await read_until_closed(garbage))
            assert status == 400
    rejected = [r for r in caplog.records if r.name == "kasd.k8sproxy" and "rejected request" in r.getMessage()]
    assert 1 <= len(rejected) <= 2, [r.getMessage() for r in rejected]
