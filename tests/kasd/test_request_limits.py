"""What kasd takes from a request before it reaches the agent: front-proxy identity headers are
stripped (and those configured like them), over HTTP/1.1 and HTTP/2."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from kasd.config import Config, ConfigError, load_config
from tests.kasd.helpers import (
    CI_TOKEN,
    FakeAgent,
    bearer,
    fake_agent,
    http_request,
    make_config,
    running_kasd,
)
from tests.kasd.test_http2_tls import H2Client

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
