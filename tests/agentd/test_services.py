"""agentd's handler of streams of kind ``service``: what kasd (and so its client) gets for each kind
of request — an allowed one streamed to the service with agentd's credential, a refused one with a
Status saying why, an unknown service, an unreachable one, one that never answers."""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import time
from pathlib import Path

import pytest
import trio

from agentd.kubeapi import KubeTarget
from agentd.services import ServiceSettings
from daemonkit.settings import HostPort
from tests.agentd.harness import agent_config, exchange, read_all, running_agent, start_fake_kasd
from tests.agentd.servicetunnel import answer_json, serve_upstream, service_head, service_tunnel
from tests.prometheus import needs_prometheus, query, start_prometheus, wait_for_series
from tunnelhttp.head import ResponseHead, TunnelCode
from wire.session import StreamRefusedError

pytestmark = pytest.mark.timeout(20)


def _free_port() -> int:
    # agentd's health address must be known before Prometheus starts (its scrape target), and
    # Prometheus's before agentd starts (agentd's service URL): one of them takes a port picked here
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def prometheus(url: str, **overrides: object) -> ServiceSettings:
    values: dict[str, object] = {"name": "prometheus", "url": url, "methods": ("GET", "POST"), "paths": ("/api/v1/",)}
    values.update(overrides)
    return ServiceSettings(**values)  # type: ignore[arg-type]


async def test_an_allowed_request_reaches_the_service_with_agentds_credential_only(
        nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    upstream = await serve_upstream(nursery, lambda s, h, r: answer_json(s, h, r, {"status": "success", "data": 1}))
    token = tmp_path / "token"
    token.write_text("first-secret\n")
    caplog.set_level(logging.DEBUG, logger="agentd")
    service = prometheus(upstream.url + "/prom/", credentials_file=token)
    async with service_tunnel([service]) as tunnel:
        with trio.fail_after(5):
            response, body = await tunnel.request(
                "GET", "/api/v1/query?query=up",
                headers=(("authorization", "Bearer kasd-user-token"), ("cookie", "_kasd_session=s3cret"),
                         ("private-token", "glpat-x"), ("job-token", "jt-x"), ("x-custom", "kept")))
        assert response.status == 200
        assert json.loads(body) == {"status": "success", "data": 1}
        # the URL's path is a prefix; the query passes on; the client's Authorization never does
        assert upstream.request_line() == "GET /prom/api/v1/query?query=up HTTP/1.1"
        assert upstream.header(0, "authorization") == "Bearer first-secret"
        assert upstream.header(0, "host") == f"127.0.0.1:{upstream.port}"
        # nor any other credential of kasd's clients; their other headers pass on
        assert [upstream.header(0, name) for name in ("cookie", "private-token", "job-token")] == [None] * 3
        assert upstream.header(0, "x-custom") == "kept"
        # a rotated token (a Secret's new content) is used from the next request on
        token.write_text("second-secret\n")
        os.utime(token, ns=(1, 1))  # a new mtime even within the file system's timestamp granularity
        with trio.fail_after(5):
            response, _ = await tunnel.request("GET", "/api/v1/query?query=up")
        assert upstream.header(1, "authorization") == "Bearer second-secret"
        with trio.fail_after(5):
            await tunnel.wait_records(2)
    assert [(r.service, r.method, r.path, r.status, r.outcome) for r in tunnel.records] == [
        ("prometheus", "GET", "/api/v1/query", 200, "ok")] * 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
    assert lines and lines[0].startswith("request service=prometheus method=GET path=/api/v1/query status=200 outcome=ok")
    assert not any("secret" in r.getMessage() for r in caplog.records)


async def test_an_unreadable_credentials_file_refuses_without_naming_it_or_keeps_the_last_token(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    upstream = await serve_upstream(nursery, answer_json)
    token = tmp_path / "token"
    token.write_text("only-secret\n")
    async with service_tunnel([prometheus(upstream.url, credentials_file=token)]) as tunnel:
        token.unlink()  # gone before the first request: no token to fall back on
        with trio.fail_after(5), pytest.raises(StreamRefusedError) as refused:
            await tunnel.request("GET", "/api/v1/query?query=up")
        assert refused.value.code == TunnelCode.UPSTREAM_UNREACHABLE
        assert refused.value.message == "agentd cannot read the credentials of service 'prometheus' (its log says why)"
        token.write_text("only-secret\n")
        with trio.fail_after(5):
            response, _ = await tunnel.request("GET", "/api/v1/query?query=up")
        assert response.status == 200
        token.write_text("two\nlines\n")  # a rotation caught half-way: the last good token goes on
        with trio.fail_after(5):
            response, _ = await tunnel.request("GET", "/api/v1/query?query=up")
    assert response.status == 200
    assert [upstream.header(i, "authorization") for i in range(2)] == ["Bearer only-secret"] * 2
    assert upstream.heads and len(upstream.heads) == 2


async def test_a_service_agentd_does_not_have_is_refused_naming_it(nursery: trio.Nursery) -> None:
    async with service_tunnel([prometheus("http://127.0.0.1:9")]) as tunnel:
        with trio.fail_after(5), pytest.raises(StreamRefusedError) as refused:
            await tunnel.request("GET", "/api/v1/query", service="grafana")
    assert refused.value.code == TunnelCode.UNKNOWN_TARGET
    assert refused.value.message == "agentd has no service named 'grafana'"


@pytest.mark.parametrize(("method", "target", "status", "message"), [
    ("GET", "/api/v1/../../admin", 400,
     "agentd: refusing the path for service 'prometheus': the path holds a dot segment (. or .., in any encoding)"),
    ("GET", "/api/v1/%2e%2e/%2E%2e/-/quit", 400,
     "agentd: refusing the path for service 'prometheus': the path holds a dot segment (. or .., in any encoding)"),
    ("GET", "/api/v1%2f..%2fadmin", 400,
     "agentd: refusing the path for service 'prometheus': the path holds an encoded / (%2f)"),
    ("GET", "/api/v1/%5c..%5cadmin", 400,
     "agentd: refusing the path for service 'prometheus': the path holds a backslash (\\ or %5c)"),
    ("GET", "/api/v1/query%00", 400,
     "agentd: refusing the path for service 'prometheus': the path holds a NUL (%00)"),
    ("DELETE", "/api/v1/admin/tsdb/series", 403,
     "agentd: service 'prometheus' allows the methods GET, POST, not DELETE"),
    ("GET", "/-/quit", 403, "agentd: service 'prometheus' allows the paths under /api/v1/, not '/-/quit'"),
    ("GET", "/api/v1beta/x", 403, "agentd: service 'prometheus' allows the paths under /api/v1/, not '/api/v1beta/x'"),
])
async def test_a_request_outside_the_allow_list_is_answered_with_a_status_and_never_sent(
        nursery: trio.Nursery, method: str, target: str, status: int, message: str) -> None:
    upstream = await serve_upstream(nursery, answer_json)
    async with service_tunnel([prometheus(upstream.url)]) as tunnel:
        with trio.fail_after(5):
            response, body = await tunnel.request(method, target)
            await tunnel.wait_records(1)
    assert response.status == status
    document = json.loads(body)
    assert document == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": message, "reason": "BadRequest" if status == 400 else "Forbidden", "code": status}
    assert upstream.heads == []
    assert [(r.status, r.outcome) for r in tunnel.records] == [(status, "bad-target" if status == 400 else "forbidden")]


async def test_a_target_that_is_not_a_path_is_answered_400(nursery: trio.Nursery) -> None:
    async with service_tunnel([prometheus("http://127.0.0.1:9")]) as tunnel:
        metadata = service_head("GET", "/x").to_metadata()
        metadata["target"] = "api/v1/query"
        with trio.fail_after(5):
            stream = await tunnel.open(metadata)
            response = ResponseHead.from_metadata(await stream.wait_accepted())
            body = json.loads(await read_all(stream))
    assert (response.status, body["reason"], body["message"]) == (
        400, "BadRequest", "agentd: refusing the path: the path must start with /")


async def test_an_unreachable_service_is_refused_upstream_unreachable() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with service_tunnel([prometheus(f"http://127.0.0.1:{port}")]) as tunnel:
        with trio.fail_after(5), pytest.raises(StreamRefusedError) as refused:
            await tunnel.request("GET", "/api/v1/query?query=up")
    assert refused.value.code == TunnelCode.UPSTREAM_UNREACHABLE
    assert refused.value.message.startswith(f"cannot reach http://127.0.0.1:{port}: ")


async def test_a_service_that_never_answers_gets_a_504_status_within_its_bound(nursery: trio.Nursery) -> None:
    hung = trio.Event()

    async def never(stream: trio.SocketStream, head: bytes, rest: bytes) -> None:
        await hung.wait()

    upstream = await serve_upstream(nursery, never)
    async with service_tunnel([prometheus(upstream.url, response_header_timeout=0.3)]) as tunnel:
        started = trio.current_time()
        with trio.fail_after(5):
            response, body = await tunnel.request("GET", "/api/v1/query?query=up")
            await tunnel.wait_records(1)
        assert trio.current_time() - started >= 0.3
    hung.set()
    status = json.loads(body)
    assert response.status == 504
    assert (status["reason"], status["code"]) == ("Timeout", 504)
    assert status["message"] == "agentd: service 'prometheus' sent no response head within 0.3s"
    assert [(r.status, r.outcome) for r in tunnel.records] == [(504, "upstream-timeout")]


async def test_a_large_answer_streams_through_before_the_service_has_sent_it_all(nursery: trio.Nursery) -> None:
    first_arrived = trio.Event()
    chunk = b"x" * 65536

    async def slow_large(stream: trio.SocketStream, head: bytes, rest: bytes) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        await stream.send_all(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await first_arrived.wait()  # the rest only once kasd's side holds the first bytes
        for _ in range(64):
            await stream.send_all(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await stream.send_all(b"0\r\n\r\n")

    upstream = await serve_upstream(nursery, slow_large)
    async with service_tunnel([prometheus(upstream.url)]) as tunnel:
        with trio.fail_after(10):
            stream = await tunnel.open(service_head("GET", "/api/v1/query_range?query=up").to_metadata())
            response = ResponseHead.from_metadata(await stream.wait_accepted())
            assert response.status == 200
            received = await stream.receive_some()
            assert received
            first_arrived.set()
            total = len(received) + len(await read_all(stream))
    assert total == 65 * len(chunk)


async def test_a_post_body_streams_to_the_service(nursery: trio.Nursery) -> None:
    async def echo_length(stream: trio.SocketStream, head: bytes, rest: bytes) -> None:
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(rest) < length:
            rest += await stream.receive_some(65536)
        await answer_json(stream, head, b"", {"got": rest.decode()})

    upstream = await serve_upstream(nursery, echo_length)
    async with service_tunnel([prometheus(upstream.url)]) as tunnel:
        with trio.fail_after(5):
            response, body = await tunnel.request(
                "POST", "/api/v1/query", body=b"query=up",
                headers=(("content-type", "application/x-www-form-urlencoded"), ("content-length", "8")))
    assert response.status == 200
    assert json.loads(body) == {"got": "query=up"}


async def test_an_upgrade_becomes_a_raw_pipe(nursery: trio.Nursery) -> None:
    async def upgrade_then_echo(stream: trio.SocketStream, head: bytes, rest: bytes) -> None:
        await stream.send_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\r\n")
        while data := await stream.receive_some(65536):
            await stream.send_all(data.upper())

    upstream = await serve_upstream(nursery, upgrade_then_echo)
    async with service_tunnel([prometheus(upstream.url, paths=("/",))]) as tunnel:
        with trio.fail_after(5):
            stream = await tunnel.kasd.open_stream(service_head(
                "GET", "/ws", headers=(("connection", "Upgrade"), ("upgrade", "websocket"))).to_metadata())
            response = ResponseHead.from_metadata(await stream.wait_accepted())
            assert response.status == 101
            await stream.send_all(b"hello")
            assert await stream.receive_some() == b"HELLO"
            await stream.send_eof()
            await read_all(stream)
            await stream.aclose()


@needs_prometheus
@pytest.mark.e2e
@pytest.mark.timeout(60)
async def test_a_query_through_agentd_returns_what_prometheus_answers_directly(nursery: trio.Nursery,
                                                                                tmp_path: Path) -> None:
    # A real Prometheus behind agentd as run_agent wires it (the service stream kind registered),
    # kasd's side played by the harness; Prometheus scrapes agentd's own /metrics (its health address).
    health_port = _free_port()
    async with start_prometheus([f"127.0.0.1:{health_port}"]) as real:
        kasd = await start_fake_kasd(nursery)
        config = agent_config(tmp_path, kasd.url, services=(prometheus(real),),
                              health=HostPort("127.0.0.1", health_port))
        async with running_agent(nursery, config, KubeTarget(scheme="http", host="127.0.0.1", port=9)):
            session = await kasd.session()
            with trio.fail_after(30):
                await wait_for_series(real, "up")
                scraped = await wait_for_series(real, "agentd_tunnels_up == 1")
            at = f"{time.time():.3f}"  # both answers evaluated at one instant
            with trio.fail_after(10):
                response, body = await exchange(session, service_head("GET", f"/api/v1/query?query=up&time={at}"))
                direct = await trio.to_thread.run_sync(functools.partial(query, real, "up", time=at))
                mine_response, mine = await exchange(
                    session, service_head("GET", f"/api/v1/query?query=agentd_tunnels_up&time={at}"))
                mine_direct = await trio.to_thread.run_sync(functools.partial(query, real, "agentd_tunnels_up", time=at))
    assert response.status == 200
    assert ("content-type", "application/json") in response.headers
    answer = json.loads(body)
    assert answer == direct
    assert answer["status"] == "success"
    assert f"127.0.0.1:{health_port}" in {r["metric"]["instance"] for r in answer["data"]["result"]}
    # agentd's own metrics, scraped by Prometheus, read back through agentd's tunnel
    assert scraped[0]["metric"]["instance"] == f"127.0.0.1:{health_port}"
    assert mine_response.status == 200 and json.loads(mine) == mine_direct
    assert json.loads(mine)["data"]["result"][0]["value"][1] == "1"
