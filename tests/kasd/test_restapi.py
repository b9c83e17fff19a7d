"""The REST API port: GitLab's GET /api/v4/job/allowed_agents for a CI job's token, in GitLab's shape,
served by hypercorn on kasd's own capped listener."""

from __future__ import annotations

import inspect
import json
import logging
from typing import Any

import pytest

from kasd.config import Config
from kasd.restapi import ALLOWED_AGENTS_PATH, RestApi
from tests.kasd.helpers import AUTH, CI_SECRET, PAT_SECRET, http_request, make_config, running_kasd

pytestmark = pytest.mark.timeout(30)


def _config() -> Config:
    return make_config({"listeners": {
        "agent": {"address": "127.0.0.1:0"}, "observability": {"address": "127.0.0.1:0"},
        "kubernetes_api": {"address": "127.0.0.1:0"}, "api": {"address": "127.0.0.1:0"},
    }})


async def _get(port: int, path: str, headers: list[tuple[str, str]], method: str = "GET") -> tuple[int, Any]:
    reply = await http_request(port, method, path, headers)
    assert reply.headers["content-type"] == "application/json"
    return reply.status, json.loads(reply.body)


async def test_a_job_learns_the_agents_it_may_use_in_gitlabs_shape() -> None:
    async with running_kasd(_config()) as kasd:
        port = kasd.port("api")
        status, body = await _get(port, ALLOWED_AGENTS_PATH, [("job-token", CI_SECRET)])
    assert status == 200
    # helpers' configuration: group/app's jobs may use both agents, impersonating a fixed identity
    assert [a["id"] for a in body["allowed_agents"]] == [1, 2]
    prod = body["allowed_agents"][0]
    assert prod["config_project"] == {"id": 1, "path_with_namespace": "group/infra"}
    assert prod["configuration"]["access_as"]["impersonate"]["username"] == "gitlab:ci_job:7"
    assert prod["kasd"] == {"name": "prod", "context": "group/infra:prod", "namespace": None,
                            "access_as": "impersonate"}
    assert body["job"] == {"id": 7} and body["pipeline"]["id"] == 1
    assert body["project"] == {"id": 42, "path_with_namespace": "group/app", "groups": [{"id": 10}]}
    assert body["user"]["username"] == "alice" and "environment" not in body


async def test_a_job_of_a_project_no_agent_allows_gets_an_empty_list() -> None:
    token = AUTH.job_token("group/infra", job_id=8)  # the config project: implicit access to both agents
    other = AUTH.job_token("group/nowhere", job_id=9)
    async with running_kasd(_config()) as kasd:
        port = kasd.port("api")
        assert [a["id"] for a in (await _get(port, ALLOWED_AGENTS_PATH, [("job-token", token)]))[1]["allowed_agents"]] \
            == [1, 2]
        status, body = await _get(port, ALLOWED_AGENTS_PATH, [("job-token", other)])
    assert status == 200 and body["allowed_agents"] == []


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "message"),
    [
        ("GET", ALLOWED_AGENTS_PATH, [], 401, "401 Unauthorized: send the CI job token in a Job-Token header"),
        ("GET", ALLOWED_AGENTS_PATH, [("job-token", "nope")], 401, "401 Unauthorized: bad token: CI job token malformed"),
        ("GET", ALLOWED_AGENTS_PATH, [("job-token", PAT_SECRET)], 401,
         "401 Unauthorized: bad token: CI job token not a job token"),
        ("POST", ALLOWED_AGENTS_PATH, [("job-token", CI_SECRET)], 405, "405 Method Not Allowed"),
        ("GET", "/api/v4/projects", [("job-token", CI_SECRET)], 404, "404 Not Found"),
    ],
)
async def test_what_is_refused_says_why(method: str, path: str, headers: list[tuple[str, str]], status: int,
                                        message: str) -> None:
    async with running_kasd(_config()) as kasd:
        got, body = await _get(kasd.port("api"), path, headers, method)
    assert (got, body) == (status, {"message": message})


async def test_the_api_port_is_off_unless_an_address_is_set() -> None:
    async with running_kasd() as kasd:
        assert "api" not in kasd.addresses


def test_the_hypercorn_internals_kasd_relies_on() -> None:
    """kasd.restapi's fence, point by point (its docstring): if one fails after a hypercorn upgrade,
    serve_api must change with it."""
    from hypercorn.trio import run
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.typing import ConnectionState
    from hypercorn.utils import wrap_app

    # 1. TCPServer(app, config, context, state, stream), awaitable, TLS by do_handshake, else .socket
    assert list(inspect.signature(TCPServer.__init__).parameters)[1:] == ["app", "config", "context", "state", "stream"]
    assert hasattr(TCPServer, "__await__")
    source = inspect.getsource(TCPServer.run)
    assert "do_handshake" in source and "self.stream.socket" in source and "ssl_handshake_timeout" in source
    # 2. what worker_serve gives it
    assert list(inspect.signature(WorkerContext.__init__).parameters)[1:] == ["max_requests"]
    assert "ConnectionState(" in inspect.getsource(run.worker_serve) and ConnectionState({}) == {}
    # 3. the app wrapper
    assert list(inspect.signature(wrap_app).parameters) == ["app", "wsgi_max_body_size", "mode"]


async def test_a_silent_or_oversized_client_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API port is a stranger's port: a head that outgrows MAX_HEAD_BYTES is refused (431) and
    the connection closed; a client that stops sending is closed after READ_TIMEOUT (shortened here)."""
    import trio

    from kasd import restapi

    monkeypatch.setattr(restapi, "READ_TIMEOUT", 1)
    monkeypatch.setattr(restapi, "KEEP_ALIVE_TIMEOUT", 1)
    async with running_kasd(_config()) as kasd:
        port = kasd.port("api")
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET " + ALLOWED_AGENTS_PATH.encode() + b" HTTP/1.1\r\nHost: k\r\n")  # never ends
        with trio.fail_after(5):
            while await stream.receive_some(4096):
                pass  # closed (with or without an answer) within the read timeout
        big = await trio.open_tcp_stream("127.0.0.1", port)
        # (a head that arrives in one read of up to 64 KiB is parsed whole: the bound is per read)
        try:
            await big.send_all(b"GET / HTTP/1.1\r\nHost: k\r\nX-Pad: " + b"a" * (200 * 1024) + b"\r\n\r\n")
        except trio.BrokenResourceError:
            pass  # closed while we were still sending: refused all the same
        with trio.fail_after(5):
            answer = b""
            while chunk := await big.receive_some(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 431 ") and b"connection: close" in answer, answer[:100]


async def test_an_unexpected_exception_is_a_500_in_gitlabs_words_and_one_error_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(self: RestApi, method: str, path: str, job_token: str | None) -> Any:
        raise RuntimeError(f"bug while looking at {job_token}")

    monkeypatch.setattr(RestApi, "answer", broken)
    async with running_kasd(_config()) as kasd:
        for _ in range(5):
            assert await _get(kasd.port("api"), ALLOWED_AGENTS_PATH, [("job-token", CI_SECRET)]) \
                == (500, {"message": "500 Internal Server Error"})
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and not errors[0].exc_info and "error=RuntimeError" in errors[0].getMessage()
    assert CI_SECRET not in caplog.text
