"""What kasd takes from a request before it reaches the agent: front-proxy identity headers are
stripped (and those configured like them), over HTTP/1.1 and HTTP/2; and how many requests one
token may have open at once (429 beyond, watches counting while they run)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from kasd.config import Config, ConfigError, load_config
from tests.kasd.helpers import (
    CI_SECRET,
    CI_TOKEN,
    PAT_TOKEN,
    FakeAgent,
    H1Client,
    Handler,
    accept,
    bearer,
    fake_agent,
    http_request,
    json_handler,
    make_config,
    read_all,
    running_kasd,
)
from tests.kasd.test_http2_tls import H2Client
from tunnelhttp.head import RequestHead, ResponseHead
from wire.session import MuxStream, Session

pytestmark = pytest.mark.timeout(20)

CLAIMS = [
    ("X-Remote-User", "admin"),
    ("x-remote-group", "system:masters"),
    ("X-REMOTE-EXTRA-Scopes", "everything"),
    ("X-Forwarded-User", "eve"),  # configured below
    ("X-Auth-Request-Email", "eve@example.com"),  # configured below, as a prefix
]
KEPT = [("x-custom", "kept"), ("x-remote-users", "not a front-proxy header: kept")]


def _config(**kubernetes_api: Any) -> Config:
    return make_config(strip_request_headers=["X-Forwarded-User", "x-auth-request-*"], **kubernetes_api)


def _assert_stripped(agent: FakeAgent) -> None:
    (head,) = agent.heads
    names = {name.lower() for name, _ in head.headers}
    assert not names & {"x-remote-user", "x-remote-group", "x-remote-extra-scopes", "x-forwarded-user", "x-auth-request-email"}
    assert {"x-custom", "x-remote-users"} <= names


async def test_front_proxy_headers_are_stripped_over_http1() -> None:
    async with running_kasd(_config()) as kasd, fake_agent(kasd) as agent:
        reply = await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(CI_TOKEN), *CLAIMS, *KEPT])
        assert reply.status == 200
        _assert_stripped(agent)


async def test_front_proxy_headers_are_stripped_over_http2() -> None:
    async with running_kasd(_config()) as kasd, fake_agent(kasd) as agent:
        client = H2Client(await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api")))
        await client.flush()
        lower = [(name.lower(), value) for name, value in [*CLAIMS, *KEPT]]
        sid = await client.request("GET", "/api", [bearer(CI_TOKEN), *lower])
        headers, _ = await client.response(sid)
        assert headers[":status"] == "200"
        _assert_stripped(agent)
        await client.stream.aclose()


def test_limits_come_from_environment_and_flags_too() -> None:
    argv = ["--kubernetes-api-strip-request-header", "X-Forwarded-User", "--kubernetes-api-strip-request-header", "x-auth-*"]
    environ = {"KASD_AGENT_MAX_CONNECTIONS": "100", "KASD_KUBERNETES_API_MAX_CONNECTIONS_PER_SOURCE": "7"}
    config = load_config(argv, environ)
    assert config.kubernetes_api.strip_request_headers == ("x-forwarded-user", "x-auth-*")
    assert config.agent.max_connections == 100
    assert config.kubernetes_api.max_connections_per_source == 7
    environ = {"KASD_KUBERNETES_API_STRIP_REQUEST_HEADERS": "X-A,X-B*"}
    assert load_config([], environ).kubernetes_api.strip_request_headers == ("x-a", "x-b*")


def test_a_bad_header_name_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match=r"listeners\.kubernetes_api\.strip_request_headers\[1\]: 'X Bad'"):
        make_config(strip_request_headers=["X-Good", "X Bad"])


# --------------------------------------------------------------------------- requests per principal


def _watching_agent(release: trio.Event) -> Handler:
    """Watches stay open (one event sent) until ``release``; other requests are answered at once."""

    async def handler(stream: MuxStream, head: RequestHead, session: Session) -> None:
        if "watch=1" not in head.target:
            await json_handler(stream, head, session)
            return
        await read_all(stream)
        await accept(stream, ResponseHead(status=200, headers=(("content-type", "application/json"),)))
        await stream.send_all(b'{"type":"ADDED"}\n')
        await release.wait()
        await stream.send_eof()

    return handler


async def _watch(port: int, token: str) -> H1Client:
    client = await H1Client.connect(port)
    await client.request("GET", "/api/v1/pods?watch=1", [bearer(token)])
    assert (await client.response()).status_code == 200
    assert await client.chunk()  # the watch is open: its request holds its principal's slot
    return client


async def test_a_principal_over_its_open_requests_gets_429_until_one_ends() -> None:
    release = trio.Event()
    async with running_kasd(_config(max_requests_per_principal=2)) as kasd, fake_agent(kasd, _watching_agent(release)):
        port = kasd.port("kubernetes_api")
        watches = [await _watch(port, CI_TOKEN) for _ in range(2)]

        refused = await http_request(port, "GET", "/api", [bearer(CI_TOKEN)])
        assert refused.status == 429
        assert refused.headers["retry-after"] == "1"
        status = refused.json()
        assert status["reason"] == "TooManyRequests" and status["code"] == 429
        assert "ci_job:7 has 2 open" in status["message"]
        assert "max_requests_per_principal" in status["message"]
        # another token is not held back
        assert (await http_request(port, "GET", "/api", [bearer(PAT_TOKEN)])).status == 200

        release.set()
        for watch in watches:
            await watch.body()
            await watch.aclose()
        await trio.testing.wait_all_tasks_blocked()  # kasd has finished with both watches
        assert kasd.proxy.pipeline.principal_requests.principals == 0  # forgotten once it has none open
        assert (await http_request(port, "GET", "/api", [bearer(CI_TOKEN)])).status == 200
        assert kasd.metrics.registry.get_sample_value("kasd_proxy_requests_total", {"code": "429"}) == 1


async def test_a_refused_request_is_logged_without_the_token(caplog: pytest.LogCaptureFixture) -> None:
    release = trio.Event()
    async with running_kasd(_config(max_requests_per_principal=1)) as kasd, fake_agent(kasd, _watching_agent(release)):
        port = kasd.port("kubernetes_api")
        watch = await _watch(port, CI_TOKEN)
        with caplog.at_level(logging.INFO):
            for _ in range(5):
                assert (await http_request(port, "GET", "/api", [bearer(CI_TOKEN)])).status == 429
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == ["request refused: principal at its limit of open requests subject=ci_job:7 agent_id=1 limit=1"]
        assert CI_SECRET not in caplog.text
        release.set()
        await watch.body()
        await watch.aclose()


async def test_an_exec_session_holds_its_principal_slot_while_it_runs() -> None:
    async def exec_(stream: MuxStream, head: RequestHead, session: Session) -> None:
        if "/exec" not in head.target:
            await json_handler(stream, head, session)
            return
        await accept(stream, ResponseHead(status=101, headers=(("connection", "Upgrade"), ("upgrade", "SPDY/3.1"))))
        while chunk := await stream.receive_some():
            await stream.send_all(chunk)
        await stream.send_eof()

    async with running_kasd(_config(max_requests_per_principal=1)) as kasd, fake_agent(kasd, exec_):
        port = kasd.port("kubernetes_api")
        client = await H1Client.connect(port)
        upgrade = [bearer(CI_TOKEN), ("connection", "Upgrade"), ("upgrade", "SPDY/3.1")]
        await client.request("POST", "/api/v1/namespaces/default/pods/p/exec?command=sh", upgrade, body=b"")
        assert (await client.response()).status_code == 101
        assert (await http_request(port, "GET", "/api", [bearer(CI_TOKEN)])).status == 429
        await client.stream.send_eof()  # type: ignore[attr-defined]
        assert await client.stream.receive_some(100) == b""  # the session is over
        await client.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert (await http_request(port, "GET", "/api", [bearer(CI_TOKEN)])).status == 200
