"""The in-cluster services' routes on the REST API port (``kasd.web.services``): the API port's
HTTP/1.1 front end over memory streams hands them to the proxy's pipeline (a fake router, the
agent's side a real wire session); the authorization is a real snapshot with signed tokens."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any

import pytest
import trio
import trio.testing

from kasctl.authsetup import AuthSetup
from kasd.asgiport import AsgiPort, PortLimits
from kasd.authority import load_authorization
from kasd.authz.snapshot import Snapshot
from kasd.config import config_from_mapping
from kasd.k8sproxy.pipeline import RequestPipeline
from kasd.metrics import Metrics
from kasd.tokens import hash_token
from kasd.web.services import (
    ServiceDispatch,
    ServiceRoutes,
    inert_answer_headers,
    promql_target,
    service_target,
)
from routing.local import TunnelRegistry
from tests.kasd.helpers import read_all
from tests.kasd.test_pipeline import FakeAuthority, FakeRouter, agent_session
from tunnelhttp.head import RequestHead, ResponseHead, TunnelCode
from wire.session import MuxStream

pytestmark = pytest.mark.timeout(10)

CONFIG = """
ci_access:
  projects: [{id: group/app}]
services:
  - name: prometheus
    ci_access: {projects: [{id: group/app}]}
    user_access: {projects: [{id: group/app}]}
"""


@cache
def _world() -> tuple[Snapshot, AuthSetup]:
    import tempfile
    from pathlib import Path

    auth = AuthSetup(Path(tempfile.mkdtemp(prefix="kasd-services-")))
    auth.agent_config("group/infra", "prod", CONFIG)
    config = config_from_mapping({
        "agents": [{"id": 1, "name": "prod", "config_project": "group/infra", "token_sha256": hash_token("a1")}],
        "groups": [{"path": "group", "id": 10}],
        "projects": [{"path": "group/infra", "id": 1}, {"path": "group/app", "id": 42}, {"path": "group/other", "id": 43}],
        "users": [{"username": "alice", "memberships": {"group/app": "developer"}},
                  {"username": "bob", "memberships": {"group/app": "reporter", "group/infra": "developer"}},
                  {"username": "mallory", "memberships": {"group/other": "maintainer"}}],
        **auth.kasd_settings(),
    })
    return load_authorization(config, None).snapshot, auth


def _job(project: str = "group/app") -> str:
    return _world()[1].job_token(project, job_id=7, user="alice")


Agent = Callable[[MuxStream, RequestHead], Awaitable[None]]


async def _converse(data: bytes, agent: Agent | None = None, *, feed: Callable[[trio.abc.Stream], Awaitable[bytes]]
                    | None = None) -> tuple[bytes, list[RequestHead]]:
    """``data`` sent to the API port on one connection (then ``feed``, if any, talks on); what came
    back until the port closed, and the heads agentd got."""
    heads: list[RequestHead] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the ASGI app must not see a service request")

    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:

        async def serve_agent() -> None:
            while True:
                stream = await agent_side.accept_stream()
                head = RequestHead.from_metadata(stream.metadata)
                heads.append(head)
                assert agent is not None
                nursery.start_soon(agent, stream, head)

        nursery.start_soon(serve_agent)
        router = FakeRouter(kasd_side)
        pipeline = RequestPipeline(FakeAuthority(), router, Metrics(TunnelRegistry()))
        dispatch = ServiceDispatch(pipeline, ServiceRoutes(lambda: _world()[0]))
        port = AsgiPort(app, limits=PortLimits(), log=logging.getLogger("kasd.api"), bypass=dispatch)
        client, server = trio.testing.memory_stream_pair()
        nursery.start_soon(port.handle_connection, server)
        with trio.fail_after(5):
            await client.send_all(data)
            out = await feed(client) if feed is not None else b""
            while chunk := await client.receive_some(65536):
                out += chunk
        nursery.cancel_scope.cancel()
    return out, heads


def _get(path: str, *headers: str) -> bytes:
    lines = "".join(f"{h}\r\n" for h in headers)
    return f"GET {path} HTTP/1.1\r\nHost: kasd\r\nConnection: close\r\n{lines}\r\n".encode()


def _answer(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


async def _echo_head(stream: MuxStream, head: RequestHead) -> None:
    body = await read_all(stream)
    seen = json.dumps({"target": head.target, "kind": head.kind, "service": head.service, "headers": head.headers,
                       "body_bytes": len(body)}).encode()
    await stream.accept(ResponseHead(status=200, headers=(("content-type", "application/json"),
                                                          ("content-length", str(len(seen))))).to_metadata())
    await stream.send_all(seen)
    await stream.send_eof()


async def test_a_jobs_request_reaches_the_service_without_any_credential() -> None:
    raw, _heads = await _converse(_get(f"/api/v4/agents/1/services/prometheus/api/v1/query?query=up&job_token={_job()}"
                                      "&time=5", "Cookie: s=1", "Accept: application/json", "Private-Token: x"),
                                 _echo_head)
    status, headers, body = _answer(raw)
    assert status == 200 and "x-request-id" in headers
    seen = json.loads(body)
    assert seen["kind"] == "service" and seen["service"] == "prometheus"
    assert seen["target"] == "/api/v1/query?query=up&time=5"  # job_token removed, the rest as sent
    assert seen["headers"] == [["accept", "application/json"]]  # no cookie, token, host or hop-by-hop header


async def test_every_credential_form_is_read_and_none_is_forwarded() -> None:
    _snapshot, auth = _world()
    pat = auth.personal_token("alice")
    for header in (f"JOB-TOKEN: {_job()}", f"PRIVATE-TOKEN: {pat}", f"Authorization: Bearer {pat}",
                   f"Authorization: Bearer ci:1:{_job()}"):
        raw, _heads = await _converse(_get("/api/v4/agents/1/services/prometheus/-/ready?private_token=p", header),
                                     _echo_head)
        status, _, body = _answer(raw)
        assert status == 200, (header, body)
        assert json.loads(body)["target"] == "/-/ready" and json.loads(body)["headers"] == []


@pytest.mark.parametrize(("request_path", "headers", "status", "message"), [
    ("/api/v4/agents/1/services/prometheus/", (), 401, "401 Unauthorized: send a CI job token"),
    ("/api/v4/agents/1/services/prometheus/", ("JOB-TOKEN: forged",), 401, "401 Unauthorized: CI job token"),
    ("/api/v4/agents/1/services/prometheus/", ("PRIVATE-TOKEN: {bob}",), 403,
     "403 Forbidden: user bob needs at least the Developer role"),
    ("/api/v4/agents/1/services/grafana/", ("JOB-TOKEN: {job}",), 404, "404 Service Not Found"),
    ("/api/v4/agents/2/services/prometheus/", ("JOB-TOKEN: {job}",), 404, "404 Agent Not Found"),
    ("/api/v4/agents/x1/services/prometheus/", ("JOB-TOKEN: {job}",), 404, "404 Agent Not Found"),
    ("/api/v4/agents/1/services/Prom/", ("JOB-TOKEN: {job}",), 404, "404 Service Not Found"),
    # traversal, in every spelling, before any token is looked at
    ("/api/v4/agents/1/services/prometheus/api/../admin", (), 400, "dot segment"),
    ("/api/v4/agents/1/services/prometheus/api/%2e%2E/admin", (), 400, "dot segment"),
    ("/api/v4/agents/1/services/prometheus/api/.%2e", (), 400, "dot segment"),
    ("/api/v4/agents/1/services/prometheus/./x", (), 400, "dot segment"),
    ("/api/v4/agents/1/services/prometheus/api%2F..%2Fadmin", (), 400, "(%2f)"),
    ("/api/v4/agents/1/services/prometheus/api%5c..", (), 400, "%5c"),
    ("/api/v4/agents/1/services/prometheus/a%00b", (), 400, "NUL (%00)"),
    # ... and every spelling agentd refuses: a servlet's "..;", double encoding, full-width dots, not UTF-8
    ("/api/v4/agents/1/services/prometheus/api/v1/..;x/admin", (), 400, "dot segment"),
    ("/api/v4/agents/1/services/prometheus/api/v1/%252e%252E/admin", (), 400, "dot segment"),
    ("/api/v4/agents/1/services/prometheus/api/v1/%EF%BC%8E%EF%BC%8E/admin", (), 400, "dot segment"),
    ("/api/v4/agents/1/services/prometheus/api/v1/%252f", (), 400, "(%2f)"),
    ("/api/v4/agents/1/services/prometheus/api/%c0%ae%c0%ae/admin", (), 400, "not UTF-8"),
    ("/api/v4/agents/1/services/prometheus//admin", (), 400, "single /"),
    ("/api/kasd/v1/agents/1/promql?query=up&start=1", ("JOB-TOKEN: {job}",), 400, "needs start, end and step"),
    ("/api/kasd/v1/agents/1/promql?time=1", ("JOB-TOKEN: {job}",), 400, "query is missing"),
    ("/api/kasd/v1/agents/1/promql?query=up&evil=1", ("JOB-TOKEN: {job}",), 400, "unknown parameter 'evil'"),
])
async def test_a_refused_request_never_reaches_the_agent_and_says_why_in_gitlabs_shape(
        request_path: str, headers: tuple[str, ...], status: int, message: str) -> None:
    _snapshot, auth = _world()
    filled = [h.format(job=_job(), other=_job("group/other"), bob=auth.personal_token("bob")) for h in headers]
    raw, heads = await _converse(_get(request_path, *filled))
    got, answer_headers, body = _answer(raw)
    assert heads == []
    assert got == status and answer_headers["content-type"] == "application/json"
    assert message in json.loads(body)["message"], body


async def test_agentd_refusing_is_404_or_502_and_its_status_json_passes_through() -> None:
    async def unknown(stream: MuxStream, head: RequestHead) -> None:
        await stream.refuse(TunnelCode.UNKNOWN_TARGET, "agentd has no service named 'prometheus'")

    async def unreachable(stream: MuxStream, head: RequestHead) -> None:
        await stream.refuse(TunnelCode.UPSTREAM_UNREACHABLE, "connection refused")

    status_json = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": "agentd: service prometheus allows only paths under /api/v1/",
                              "reason": "Forbidden", "code": 403}).encode()

    async def forbidden(stream: MuxStream, head: RequestHead) -> None:
        await read_all(stream)
        await stream.accept(ResponseHead(status=403, headers=(("content-type", "application/json"),
                                                              ("content-length", str(len(status_json))))).to_metadata())
        await stream.send_all(status_json)
        await stream.send_eof()

    path = "/api/v4/agents/1/services/prometheus/admin"
    for agent, status, message in ((unknown, 404, "404 Not Found: agent 1: agentd has no service named 'prometheus'"),
                                   (unreachable, 502, "502 Bad Gateway: the service is unreachable from agent 1: "
                                                      "connection refused")):
        raw, _ = await _converse(_get(path, f"JOB-TOKEN: {_job()}"), agent)
        got, _, body = _answer(raw)
        assert (got, json.loads(body)) == (status, {"message": message})
    raw, _ = await _converse(_get(path, f"JOB-TOKEN: {_job()}"), forbidden)
    got, _, body = _answer(raw)
    assert got == 403 and body == status_json


async def test_a_request_body_streams_past_the_api_ports_64_kib_cap() -> None:
    size = 1024 * 1024
    head = (f"POST /api/v4/agents/1/services/prometheus/api/v1/write HTTP/1.1\r\nHost: kasd\r\nConnection: close\r\n"
            f"JOB-TOKEN: {_job()}\r\nContent-Length: {size}\r\n\r\n").encode()
    raw, _ = await _converse(head + b"x" * size, _echo_head)
    status, _, body = _answer(raw)
    assert status == 200 and json.loads(body)["body_bytes"] == size


async def test_an_upgrade_the_service_accepts_becomes_a_byte_pipe() -> None:
    async def websocket(stream: MuxStream, head: RequestHead) -> None:
        assert ("upgrade", "websocket") in head.headers
        await stream.accept(ResponseHead(status=101, headers=(("connection", "Upgrade"),
                                                              ("upgrade", "websocket"))).to_metadata())
        while data := await stream.receive_some():
            await stream.send_all(data.upper())
        await stream.send_eof()

    async def talk(client: trio.abc.Stream) -> bytes:
        got = b""
        while b"\r\n\r\n" not in got:
            got += await client.receive_some(65536)
        await client.send_all(b"hello through the tunnel")
        while not got.endswith(b"HELLO THROUGH THE TUNNEL"):
            got += await client.receive_some(65536)
        await client.send_eof()  # type: ignore[attr-defined]
        return got

    request = (f"GET /api/v4/agents/1/services/prometheus/ws HTTP/1.1\r\nHost: kasd\r\nJOB-TOKEN: {_job()}\r\n"
               "Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n").encode()
    raw, heads = await _converse(request, websocket, feed=talk)
    assert raw.startswith(b"HTTP/1.1 101 ") and raw.endswith(b"\r\n\r\nHELLO THROUGH THE TUNNEL")
    assert heads[0].target == "/ws"


@pytest.mark.parametrize(("target", "service", "expected"), [
    ("/api/kasd/v1/agents/3/promql?query=up", "prometheus", "/api/v1/query?query=up"),
    ("/api/kasd/v1/agents/3/promql?query=sum(rate(x%5B5m%5D))&time=1700000000&service=prom-2", "prom-2",
     "/api/v1/query?query=sum%28rate%28x%5B5m%5D%29%29&time=1700000000"),
    ("/api/kasd/v1/agents/3/promql?job_token=t&query=up&start=1&end=2&step=15s", "prometheus",
     "/api/v1/query_range?query=up&start=1&end=2&step=15s"),
])
def test_a_promql_call_is_prometheus_own_query_of_the_service(target: str, service: str, expected: str) -> None:
    found = promql_target("GET", target)
    assert found is not None and not isinstance(found, Exception)
    assert (found.agent_id, found.service, found.target) == (3, service, expected)


def test_only_these_routes_are_taken_from_the_app() -> None:
    for path in ("/api/v4/agents/1/events", "/api/v4/agents/1/services", "/api/kasd/v1/agents/1/cluster",
                 "/api/v4/job/allowed_agents", "/api/kasd/v1/agents/1/promql/x"):
        assert service_target(path) is None and promql_target("GET", path) is None


async def test_an_answer_streams_to_the_client_before_the_service_has_finished_it() -> None:
    seen_first = trio.Event()

    async def slow_answer(stream: MuxStream, head: RequestHead) -> None:
        await read_all(stream)
        await stream.accept(ResponseHead(status=200, headers=(("content-type", "application/json"),)).to_metadata())
        await stream.send_all(b'{"first": true}')
        await seen_first.wait()  # the rest only once the client holds the first part: kasd holds nothing back
        await stream.send_all(b', {"rest": true}')
        await stream.send_eof()

    async def read_first(client: trio.abc.Stream) -> bytes:
        got = b""
        while b'{"first": true}' not in got:
            got += await client.receive_some(65536)
        seen_first.set()
        return got

    raw, _ = await _converse(_get("/api/v4/agents/1/services/prometheus/api/v1/query_range",
                                  f"JOB-TOKEN: {_job()}"), slow_answer, feed=read_first)
    assert raw.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in raw and b'{"rest": true}' in raw


async def test_no_spelling_of_a_credential_and_no_rewriting_header_reaches_the_service() -> None:
    """Servers read parameters case-insensitively, split on ``;``, fold ``_`` and ``-`` in header
    names, or believe a header over the method and path agentd judged: none of it leaves kasd."""
    _snapshot, auth = _world()
    pat, job = auth.personal_token("alice"), _job()
    query = "&".join([f"JOB_TOKEN={job}", f"query=up;job_token={job}", f"Private%5FToken={pat}", f"job_token[]={job}",
                      f"job-token%00={job}", f"job+token={job}", f"job.token={job}", f"PRIVATE_TOKEN.x={pat}", "match[]=a;b"])
    raw, _heads = await _converse(_get(
        f"/api/v4/agents/1/services/prometheus/api/v1/query?{query}", f"PRIVATE-TOKEN: {pat}", f"Private_Token: {pat}",
        f"JOB_TOKEN: {job}", "X-HTTP-Method-Override: DELETE", "X-Original-URL: /admin", "X-WEBAUTH-USER: admin",
        "X-Forwarded-User: admin", "X_Forwarded_For: 10.0.0.1", "Forwarded: for=10.0.0.1", "Accept: */*",
        f"Referer: https://kasd/api/v4/agents/1/services/prometheus/graph?job_token={job}"), _echo_head)
    status, _, body = _answer(raw)
    assert status == 200, body
    seen = json.loads(body)
    assert seen["target"] == "/api/v1/query?query=up&match[]=a;b"
    assert seen["headers"] == [["accept", "*/*"]]


@pytest.mark.parametrize("where", ["path", "param", "header", "promql"])
async def test_the_token_a_request_authenticates_with_never_reaches_the_service_anywhere(where: str) -> None:
    pat = _world()[1].personal_token("alice")
    path, headers = {
        "path": (f"/api/v4/agents/1/services/prometheus/api/v1/{pat}", ()),
        "param": (f"/api/v4/agents/1/services/prometheus/api/v1/query?q={pat.replace('.', '%2E')}", ()),
        "header": ("/api/v4/agents/1/services/prometheus/api/v1/query", (f"X-Token: {pat}",)),
        "promql": (f"/api/kasd/v1/agents/1/promql?query={pat}", ()),
    }[where]
    raw, heads = await _converse(_get(path, f"Authorization: Bearer {pat}", *headers), _echo_head)
    status, _, body = _answer(raw)
    assert heads == [] and status == 400, body
    assert "carries its token" in json.loads(body)["message"] and pat not in body.decode()


async def test_a_caller_who_cannot_see_the_agent_cannot_tell_it_or_its_services_from_none() -> None:
    """A user of another group, or a CI job of a project the agent's configuration never names, gets
    what an agent that does not exist gets, for a configured service and an unknown one alike."""
    _snapshot, auth = _world()
    answers = set()
    for credential in (f"JOB-TOKEN: {_job('group/other')}", f"PRIVATE-TOKEN: {auth.personal_token('mallory')}"):
        for path in ("/api/v4/agents/1/services/prometheus/", "/api/v4/agents/1/services/grafana/",
                     "/api/v4/agents/2/services/prometheus/", "/api/kasd/v1/agents/1/promql?query=up"):
            raw, heads = await _converse(_get(path, credential))
            status, _, body = _answer(raw)
            assert heads == [] and status == 404, (path, credential[:12], body)
            answers.add(body)
    assert answers == {b'{"message":"404 Agent Not Found"}'}


async def test_a_connect_to_a_service_is_refused_not_left_hanging() -> None:
    pat = _world()[1].personal_token("alice")
    raw, heads = await _converse(f"CONNECT /api/v4/agents/1/services/prometheus/x HTTP/1.1\r\nHost: kasd\r\n"
                                 f"PRIVATE-TOKEN: {pat}\r\nConnection: close\r\n\r\n".encode(), _echo_head)
    status, _, body = _answer(raw)
    assert heads == [] and status == 405 and "CONNECT is not relayed" in json.loads(body)["message"]


async def test_a_services_page_never_runs_nor_sets_cookies_as_kasds_origin() -> None:
    """The API port's origin is the dashboard's: a page a service sends (or is made to reflect),
    opened through a link carrying the attacker's own ?job_token=, must not run script there (it
    would read the victim's CSRF token and act with their session) nor set the origin's cookies."""
    page = b"<script>fetch('/-/session')</script>"

    async def html(stream: MuxStream, head: RequestHead) -> None:
        await read_all(stream)
        await stream.accept(ResponseHead(status=200, headers=(
            ("content-type", "text/html"), ("content-length", str(len(page))), ("Set-Cookie", "kasd_session=evil; Path=/"),
            ("strict-transport-security", "max-age=63072000; includeSubDomains"), ("x-content-type-options", "sniff"),
            ("clear-site-data", '"*"'), ("content-security-policy", "script-src *"))).to_metadata())
        await stream.send_all(page)
        await stream.send_eof()

    raw, _heads = await _converse(_get(f"/api/v4/agents/1/services/prometheus/graph?job_token={_job()}"), html)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = [line.lower() for line in head.decode().split("\r\n")[1:]]
    assert body == page
    assert not [line for line in lines if line.startswith(("set-cookie", "strict-transport", "clear-site-data"))]
    assert "x-content-type-options: nosniff" in lines and "x-content-type-options: sniff" not in lines
    policies = [line for line in lines if line.startswith("content-security-policy: ")]
    assert any(p.startswith("content-security-policy: sandbox;") for p in policies)  # (theirs may stay: both apply)


async def test_a_token_in_the_path_is_refused_and_never_written_to_the_access_log(
        caplog: pytest.LogCaptureFixture) -> None:
    pat = _world()[1].personal_token("alice")
    with caplog.at_level(logging.INFO):
        raw, heads = await _converse(_get(f"/api/v4/agents/1/services/prometheus/api/{pat}", f"PRIVATE-TOKEN: {pat}"))
    assert heads == [] and _answer(raw)[0] == 400
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
    assert lines and all(pat not in line and "/api/[redacted]" in line for line in lines)


#: what a hostile in-cluster service answers: headers that would act on kasd's origin (the API port
#: also serves the dashboard and its ``_kasd_session`` cookie), and a page with a script
_HOSTILE_HEADERS = (("content-type", "text/html"), ("set-cookie", "_kasd_session=attacker; Path=/"),
                    ("Set-Cookie2", "x=1"), ("clear-site-data", '"cookies"'),
                    ("strict-transport-security", "max-age=63072000; includeSubDomains"),
                    ("alt-svc", 'h2=":8443"'), ("service-worker-allowed", "/"),
                    ("content-security-policy", "script-src *"), ("x-content-type-options", "sniff-me"),
                    ("www-authenticate", 'Basic realm="GitLab sign-in"'),
                    ("location", "https://evil.example/sign_in"), ("refresh", "0; url=//evil.example/"),
                    ("x-prometheus-api", "kept"))


def _assert_neutralised(headers: dict[str, str]) -> None:
    """(``_answer`` gives names and values lower-case.)"""
    for name in ("set-cookie", "set-cookie2", "clear-site-data", "strict-transport-security", "alt-svc",
                 "service-worker-allowed", "www-authenticate", "location", "refresh"):
        assert name not in headers, name
    policy = headers["content-security-policy"]
    assert policy.startswith("sandbox;") and "default-src 'none'" in policy and "script-src *" not in policy
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "deny"
    assert headers["x-prometheus-api"] == "kept"


async def test_a_services_answer_cannot_act_on_kasds_origin() -> None:
    page = b"<script>fetch('/api/kasd/v1/agents',{credentials:'include'})</script>"

    async def hostile(stream: MuxStream, head: RequestHead) -> None:
        await read_all(stream)
        await stream.accept(ResponseHead(status=200, headers=(*_HOSTILE_HEADERS, ("content-length",
                                                                                   str(len(page))))).to_metadata())
        await stream.send_all(page)
        await stream.send_eof()

    # a link a victim signed in to the dashboard could be sent: the token in it is the attacker's own
    raw, _ = await _converse(_get(f"/api/v4/agents/1/services/prometheus/graph?job_token={_job()}"), hostile)
    status, headers, body = _answer(raw)
    assert status == 200 and body == page  # the body as sent, but inert: a sandboxed, opaque origin
    _assert_neutralised(headers)


async def test_a_services_switching_answer_sets_no_cookie_either() -> None:
    async def hostile(stream: MuxStream, head: RequestHead) -> None:
        await stream.accept(ResponseHead(status=101, headers=(("connection", "Upgrade"), ("upgrade", "websocket"),
                                                              *_HOSTILE_HEADERS)).to_metadata())
        await stream.send_eof()

    async def read_head(client: trio.abc.Stream) -> bytes:
        got = b""
        while b"\r\n\r\n" not in got:
            got += await client.receive_some(65536)
        await client.send_eof()  # type: ignore[attr-defined]
        return got

    request = (f"GET /api/v4/agents/1/services/prometheus/ws HTTP/1.1\r\nHost: kasd\r\nJOB-TOKEN: {_job()}\r\n"
               "Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n").encode()
    raw, _ = await _converse(request, hostile, feed=read_head)
    status, headers, _ = _answer(raw.partition(b"\r\n\r\n")[0] + b"\r\n\r\n")
    assert status == 101 and headers["upgrade"] == "websocket"
    _assert_neutralised(headers)


@pytest.mark.parametrize(("name", "value", "kept"), [
    ("Location", "/api/v1/query", True), ("Refresh", "5", True), ("Refresh", "0; url=/graph", True),
    ("Location", "https://evil.example/", False), ("Location", "//evil.example/", False),
    ("location", "/\\evil.example/", False), ("Location", "javascript:alert(1)", False),
    ("Refresh", "0; URL='https://evil.example/'", False), ("Content-Location", "http://evil.example/", False),
    ("Location", "/ok\tx", False),
])
def test_a_services_redirect_stays_on_kasds_origin_or_is_dropped(name: str, value: str, kept: bool) -> None:
    """A link through kasd must not be an open redirect to another site: a redirect header that
    names anything but a path of kasd's own origin is dropped."""
    out = inert_answer_headers([(name, value)])
    assert ((name, value) in out) is kept
