"""Connection caps on every kasd listener: beyond ``max_connections`` (or ``max_connections_per_source``
from one address) a connection is closed at once, unread; another source, or a freed slot, is served
again; each refusal is counted, and the log says so in a few lines however many there are.

127.0.0.2 is another source than 127.0.0.1 (the whole 127/8 is loopback on Linux)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

from kasd.config import Config
from kasd.server import Runtime
from tests.kasd.helpers import (
    AGENT1_TOKEN,
    CI_TOKEN,
    bearer,
    fake_agent,
    http_request,
    make_config,
    read_until_closed,
    running_kasd,
)
from wire.h2carrier import open_h2_session

pytestmark = pytest.mark.timeout(20)

OTHER_SOURCE = "127.0.0.2"
#: a refused connection is closed at once; a served one stays open far longer (its header timeout)
REFUSED_WITHIN = 1.0


def _config(listener: str, **caps: Any) -> Config:
    listeners: dict[str, dict[str, Any]] = {
        "agent": {"address": "127.0.0.1:0"},
        "observability": {"address": "127.0.0.1:0"},
        "kubernetes_api": {"address": "127.0.0.1:0"},
    }
    listeners[listener].update(caps)
    return make_config({"listeners": listeners})


async def _wait_open(kasd: Runtime, listener: str, count: int) -> None:
    """Until kasd holds ``count`` connections on ``listener`` (accepting is asynchronous)."""
    admission = kasd.admissions[listener]
    with trio.fail_after(5):
        while admission.statistics().connections != count:
            await admission.wait_changed()


async def _hold(kasd: Runtime, listener: str, count: int, *, source: str | None = None) -> list[trio.SocketStream]:
    """``count`` idle connections to ``listener``, each accepted by kasd before the next."""
    held = []
    for _ in range(count):
        before = kasd.admissions[listener].statistics().connections
        held.append(await trio.open_tcp_stream("127.0.0.1", kasd.port(listener), local_address=source))
        await _wait_open(kasd, listener, before + 1)
    return held


async def _assert_refused(port: int, *, source: str | None = None) -> None:
    """The connection is reset (or closed) at once, with nothing said on it."""
    with trio.fail_after(REFUSED_WITHIN):
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
        except OSError as exc:  # the reset can overtake the client's own view of its connect
            assert "Connection reset by peer" in str(exc.__cause__.exceptions[0]), exc  # type: ignore[union-attr]
            return
        assert await read_until_closed(stream) == b""
    await stream.aclose()


def _refused_count(kasd: Runtime, listener: str, reason: str) -> float:
    value = kasd.metrics.registry.get_sample_value(
        "kasd_connections_refused_total", {"listener": listener, "reason": reason}
    )
    return value or 0.0


async def test_proxy_port_refuses_a_source_over_its_share_and_serves_others_and_freed_slots() -> None:
    config = _config("kubernetes_api", max_connections=10, max_connections_per_source=2)
    async with running_kasd(config) as kasd, fake_agent(kasd):
        port = kasd.port("kubernetes_api")
        held = await _hold(kasd, "kubernetes_api", 2)

        await _assert_refused(port)
        assert _refused_count(kasd, "kubernetes_api", "max_connections_per_source") == 1
        # another source is served
        assert (await http_request(port, "GET", "/api", [bearer(CI_TOKEN)], source=OTHER_SOURCE)).status == 200

        # a slot freed by the client leaving is taken again
        await held.pop().aclose()
        await _wait_open(kasd, "kubernetes_api", 1)
        assert (await http_request(port, "GET", "/api", [bearer(CI_TOKEN)])).status == 200

        for stream in held:
            await stream.aclose()
        await _wait_open(kasd, "kubernetes_api", 0)
        assert kasd.admissions["kubernetes_api"].statistics().sources == 0  # forgotten once empty
        metrics = (await http_request(kasd.port("observability"), "GET", "/metrics")).body.decode()
        assert 'kasd_connections_refused_total{listener="kubernetes_api",reason="max_connections_per_source"} 1.0' in metrics


async def test_a_full_listener_refuses_every_source() -> None:
    config = _config("kubernetes_api", max_connections=2, max_connections_per_source=2)
    async with running_kasd(config) as kasd, fake_agent(kasd):
        port = kasd.port("kubernetes_api")
        held = await _hold(kasd, "kubernetes_api", 2)
        await _assert_refused(port, source=OTHER_SOURCE)
        assert _refused_count(kasd, "kubernetes_api", "max_connections") == 1
        await held.pop().aclose()
        await _wait_open(kasd, "kubernetes_api", 1)
        assert (await http_request(port, "GET", "/api", [bearer(CI_TOKEN)], source=OTHER_SOURCE)).status == 200
        await held.pop().aclose()


async def test_a_flood_of_refusals_writes_a_few_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    config = _config("kubernetes_api", max_connections_per_source=1)
    async with running_kasd(config) as kasd:
        port = kasd.port("kubernetes_api")
        held = await _hold(kasd, "kubernetes_api", 1)
        with caplog.at_level(logging.WARNING, logger="kasd.listeners"):
            for _ in range(30):
                await _assert_refused(port)
        assert _refused_count(kasd, "kubernetes_api", "max_connections_per_source") == 30
        lines = [r.getMessage() for r in caplog.records if r.name == "kasd.listeners"]
        assert 1 <= len(lines) <= 2, lines
        assert "connection refused listener=kubernetes_api peer=127.0.0.1:" in lines[0]
        assert "reason=max_connections_per_source limit=1" in lines[0]
        await held[0].aclose()


async def test_agent_port_refuses_beyond_its_caps_while_the_connected_agent_keeps_working() -> None:
    config = _config("agent", max_connections_per_source=1)
    async with running_kasd(config) as kasd, fake_agent(kasd):
        await _wait_open(kasd, "agent", 1)
        await _assert_refused(kasd.port("agent"))
        assert _refused_count(kasd, "agent", "max_connections_per_source") == 1
        # another source is served (an HTTP/1.1 request there is a WebSocket tunnel's, without a token)
        other = await trio.open_tcp_stream("127.0.0.1", kasd.port("agent"), local_address=OTHER_SOURCE)
        await other.send_all(b"GET /tunnel HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await read_until_closed(other)).startswith(b"HTTP/1.1 401")
        assert (await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(CI_TOKEN)])).status == 200


async def test_a_second_agent_session_from_a_full_source_is_refused() -> None:
    config = _config("agent", max_connections_per_source=1)
    async with running_kasd(config) as kasd, fake_agent(kasd):
        # reset at connect, or while sending the preface: either way, refused
        with pytest.raises((trio.BrokenResourceError, OSError), match=r"reset|all attempts to connect"):
            async with open_h2_session(kasd.agent_url, token=AGENT1_TOKEN, metadata={"agent_id": 1}):
                pass
        assert _refused_count(kasd, "agent", "max_connections_per_source") == 1
        assert kasd.registry.statistics().sessions == 1


async def test_observability_port_refuses_beyond_its_caps_and_serves_another_source() -> None:
    config = _config("observability", max_connections=4, max_connections_per_source=1)
    async with running_kasd(config) as kasd:
        port = kasd.port("observability")
        held = await _hold(kasd, "observability", 1)
        await _assert_refused(port)
        assert (await http_request(port, "GET", "/liveness", source=OTHER_SOURCE)).status == 200
        assert _refused_count(kasd, "observability", "max_connections_per_source") == 1
        await held[0].aclose()
        await _wait_open(kasd, "observability", 0)
        assert (await http_request(port, "GET", "/liveness")).status == 200


def test_defaults_fit_each_port() -> None:
    config = make_config()
    assert (config.agent.max_connections, config.agent.max_connections_per_source) == (4096, 256)
    assert (config.kubernetes_api.max_connections, config.kubernetes_api.max_connections_per_source) == (4096, 512)
    assert (config.observability.max_connections, config.observability.max_connections_per_source) == (64, 32)
