"""The REST API port: GitLab's GET /api/v4/job/allowed_agents for a CI job's token, in GitLab's shape,
served on kasd's own HTTP/1.1 front end (the proxy port's framing rules) on its capped listener."""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

import pytest
import trio

from kasd.authz.slugs import environment_slug
from kasd.config import Config
from kasd.restapi import RestApi
from kasd.restpaths import ALLOWED_AGENTS_PATH
from tests.kasd.helpers import (
    AUTH,
    CI_SECRET,
    PAT_SECRET,
    http_request,
    make_config,
    read_until_closed,
    running_kasd,
)

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
    # GitLab's ProjectIdentity; standalone kasd knows no description or creation time
    assert prod["config_project"] == {"id": 1, "description": None, "name": "infra", "name_with_namespace": "group / infra",
                                      "path": "infra", "path_with_namespace": "group/infra", "created_at": None}
    # the ci_access entry as written in config.yaml, without its id
    assert prod["configuration"] == {"access_as": {"impersonate": {
        "username": "gitlab:ci_job:7", "uid": "ci-7", "groups": ["gitlab:ci_job", "gitlab:project:42"],
        "extra": [{"key": "agent.gitlab.com/job_id", "val": ["7"]}]}}}
    assert prod["kasd"] == {"name": "prod", "context": "group/infra:prod", "namespace": None,
                            "access_as": "impersonate"}
    assert body["job"] == {"id": 7} and body["pipeline"]["id"] == 1
    assert body["project"] == {"id": 42, "path_with_namespace": "group/app", "groups": [{"id": 10}]}
    assert body["user"] == {"id": None, "name": "alice", "username": "alice", "state": "active", "avatar_url": None,
                            "web_url": None, "roles_in_project": ["guest", "planner", "reporter", "developer"]}
    assert "environment" not in body


async def test_a_job_of_a_project_no_agent_allows_gets_an_empty_list() -> None:
    token = AUTH.job_token("group/infra", job_id=8)  # the config project: implicit access to both agents
    other = AUTH.job_token("group/nowhere", job_id=9)
    async with running_kasd(_config()) as kasd:
        port = kasd.port("api")
        assert [a["id"] for a in (await _get(port, ALLOWED_AGENTS_PATH, [("job-token", token)]))[1]["allowed_agents"]] \
            == [1, 2]
        status, body = await _get(port, ALLOWED_AGENTS_PATH, [("job-token", other)])
    assert status == 200 and body["allowed_agents"] == []


async def test_a_jobs_environment_has_gitlabs_tier_even_when_its_token_names_none() -> None:
    """GitLab's ``environment.tier`` is the deployment tier, guessed from the name when not given
    (as ``CI_ENVIRONMENT_TIER``): never null."""
    untiered = AUTH.job_token("group/app", job_id=11, environment="review/feat-x")
    tiered = AUTH.job_token("group/app", job_id=12, environment="review/feat-x", environment_tier="staging")
    async with running_kasd(_config()) as kasd:
        port = kasd.port("api")
        guessed = (await _get(port, ALLOWED_AGENTS_PATH, [("job-token", untiered)]))[1]["environment"]
        given = (await _get(port, ALLOWED_AGENTS_PATH, [("job-token", tiered)]))[1]["environment"]
    slug = environment_slug("review/feat-x")
    assert guessed == {"slug": slug, "tier": "development"}
    assert given == {"slug": slug, "tier": "staging"}


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "message"),
    [
        ("GET", ALLOWED_AGENTS_PATH, [], 401, "401 Unauthorized: send the CI job token in a JOB-TOKEN header or a job_token parameter"),
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


async def _exchange(port: int, data: bytes) -> bytes:
    """``data`` sent on a fresh connection; everything kasd answers until it closes (within 5 s)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        try:
            await stream.send_all(data)
        except trio.BrokenResourceError:
            pass  # closed while we were still sending: what it answered is still to be read
        return await read_until_closed(stream)
    finally:
        await stream.aclose()


def _statuses(answer: bytes) -> list[int]:
    """The statuses of the responses in ``answer`` (each framed by its Content-Length)."""
    out = []
    while answer:
        head, _, rest = answer.partition(b"\r\n\r\n")
        out.append(int(head.split(b" ", 2)[1]))
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")[1:]
                          if line.lower().startswith(b"content-length:")))
        answer = rest[length:]
    return out


_SMUGGLED = (f"GET {ALLOWED_AGENTS_PATH} HTTP/1.1\r\nHost: k\r\nJob-Token: {CI_SECRET}\r\n\r\n").encode()


async def test_a_request_the_proxy_port_refuses_as_ambiguous_is_refused_here_and_nothing_behind_it_served() -> None:
    """Request smuggling: each head a front proxy and kasd could read differently gets 400 and the
    connection closes, so the request behind it (here a valid job's) is never served."""
    post = f"POST {ALLOWED_AGENTS_PATH} HTTP/1.1\r\nHost: k\r\n"
    heads = {
        "CL+TE": post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "TE+CL": post + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        "two lengths": post + "Content-Length: 0\r\nContent-Length: 5\r\n\r\n",
        "bad length": post + "Content-Length: +5\r\n\r\n",
        "TE not chunked last": post + "Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
        "obs-fold": post + "Content-Length: 0\r\nX-Folded: a\r\n b\r\n\r\n",
        "space before colon": post + "Content-Length : 5\r\n\r\n",
        "bare LF": post.replace("\r\n", "\n") + "\n",
        # RFC 9112, 3.2: an HTTP/1.1 request without Host, or any with two, is 400
        "no Host": f"GET {ALLOWED_AGENTS_PATH} HTTP/1.1\r\nJob-Token: x\r\n\r\n",
        "two Hosts": f"GET {ALLOWED_AGENTS_PATH} HTTP/1.1\r\nHost: k\r\nHost: evil\r\nJob-Token: x\r\n\r\n",
        "two Hosts, HTTP/1.0": f"GET {ALLOWED_AGENTS_PATH} HTTP/1.0\r\nHost: k\r\nHost: evil\r\n\r\n",
        # a bad chunk is in the body, which this call never reads: answered, then closed unread
        "bad chunk size": post + "Transfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
    }
    async with running_kasd(_config()) as kasd:
        port = kasd.port("api")
        for name, head in heads.items():
            answer = await _exchange(port, head.encode() + _SMUGGLED)
            assert _statuses(answer) == [405 if name == "bad chunk size" else 400], (name, answer)
            assert b"connection: close" in answer.lower(), name


async def test_the_head_limit_is_16_kib_as_on_the_proxy_port() -> None:
    """A 17 KiB head is 431 and the connection closes (whether it arrives in one read or many); a
    15 KiB head is served."""
    def head(size: int) -> bytes:
        start = f"GET {ALLOWED_AGENTS_PATH} HTTP/1.1\r\nHost: k\r\nJob-Token: {CI_SECRET}\r\nX-Pad: ".encode()
        return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"

    async with running_kasd(_config()) as kasd:
        port = kasd.port("api")
        big = await _exchange(port, head(17 * 1024) + _SMUGGLED)
        assert _statuses(big) == [431], big
        assert b"connection: close" in big.lower()
        ok = await http_request(port, "GET", ALLOWED_AGENTS_PATH, [("job-token", CI_SECRET), ("x-pad", "a" * (15 * 1024 - 600))])
        assert ok.status == 200 and json.loads(ok.body)["allowed_agents"]


async def test_a_client_that_stops_sending_its_head_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from kasd import restapi

    monkeypatch.setattr(restapi, "HEAD_TIMEOUT", 0.5)
    async with running_kasd(_config()) as kasd:
        answer = await _exchange(kasd.port("api"), f"GET {ALLOWED_AGENTS_PATH} HTTP/1.1\r\nHost: k\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]


async def test_the_job_token_may_come_as_a_query_parameter_and_is_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    """GitLab's ``?job_token=`` (and ``?token=``), which win over the ``JOB-TOKEN`` header as in
    GitLab's API; the access line names the path, never the query."""
    caplog.set_level(logging.DEBUG)
    async with running_kasd(_config()) as kasd:
        port = kasd.port("api")
        by_query = await http_request(port, "GET", f"{ALLOWED_AGENTS_PATH}?job_token={CI_SECRET}")
        by_token = await http_request(port, "GET", f"{ALLOWED_AGENTS_PATH}?token={CI_SECRET}")
        over_header = await http_request(port, "GET", f"{ALLOWED_AGENTS_PATH}?job_token={CI_SECRET}",
                                         [("job-token", "nope")])
        bad_query = await http_request(port, "GET", f"{ALLOWED_AGENTS_PATH}?job_token=nope", [("job-token", CI_SECRET)])
    assert (by_query.status, by_token.status, over_header.status, bad_query.status) == (200, 200, 200, 401)
    assert [a["id"] for a in json.loads(by_query.body)["allowed_agents"]] == [1, 2]
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("kasd.api")]
    assert any(f"path={ALLOWED_AGENTS_PATH} " in line and "status=200" in line for line in lines), lines
    assert CI_SECRET not in caplog.text and "job_token" not in caplog.text


async def test_the_api_stays_an_asgi_app_any_asgi_server_can_serve() -> None:
    """The architecture's next layer serves it with hypercorn on trio: its public ``serve`` runs it
    as it is (lifespan included)."""
    from hypercorn.config import Config as HypercornConfig
    from hypercorn.trio import serve

    from kasd.authority import load_authorization
    from kasd.restapi import RestApi

    snapshot = load_authorization(_config(), None).snapshot
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, RestApi(lambda: snapshot), config))  # type: ignore[arg-type]
        port = int(binds[0].rsplit(":", 1)[1])
        reply = await http_request(port, "GET", f"{ALLOWED_AGENTS_PATH}?job_token={CI_SECRET}")
        nursery.cancel_scope.cancel()
    assert reply.status == 200 and [a["id"] for a in json.loads(reply.body)["allowed_agents"]] == [1, 2]


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
