"""The Kubernetes API proxy over HTTP/1.1, with a fake agent on the other end of the tunnel."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from typing import Any

import pytest
import trio

from kasd.k8sproxy.pipeline import RequestPipeline
from tests.kasd.helpers import (
    CI_IMPERSONATION,
    CI_SECRET,
    CI_TOKEN,
    PAT_SECRET,
    PAT_TOKEN,
    H1Client,
    accept,
    bearer,
    fake_agent,
    first_chunk_then_reset,
    http_request,
    make_config,
    read_all,
    read_until_closed,
    reply,
    running_kasd,
)
from tunnelhttp.head import Impersonation, RequestHead, ResponseHead, TunnelCode
from wire.session import MuxStream, Session, StreamResetError

pytestmark = pytest.mark.timeout(20)


async def test_get_reaches_agent_with_impersonation_and_without_client_credentials() -> None:
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        reply_ = await http_request(
            kasd.port("kubernetes_api"),
            "GET",
            "/api/v1/namespaces/default/pods?limit=5",
            [
                bearer(CI_TOKEN),
                ("cookie", "session=secret"),
                ("connection", "keep-alive, x-hop"),
                ("x-hop", "only-for-this-hop"),
                ("keep-alive", "timeout=5"),
                ("te", "trailers"),
                ("proxy-authorization", "Basic eA=="),
                ("x-remote-user", "system:admin"),
                ("x-remote-group", "system:masters"),
                ("accept", "application/json"),
                ("user-agent", "kubectl/v1.37"),
            ],
        )
        assert reply_.status == 200, reply_.body
        assert len(agent.heads) == 1
        head = agent.heads[0]
        assert head.method == "GET"
        assert head.target == "/api/v1/namespaces/default/pods?limit=5"
        assert head.impersonate == Impersonation(
            user="gitlab:ci_job:7",
            groups=("gitlab:ci_job", "gitlab:project:42"),
            uid="ci-7",
            extra=(("agent.gitlab.com/job_id", ("7",)),),
        )
        names = {k for k, _ in head.headers}
        for forbidden in ("authorization", "cookie", "connection", "x-hop", "keep-alive", "te", "proxy-authorization", "host"):
            assert forbidden not in names
        assert not any(n.startswith("impersonate-") for n in names)
        assert ("accept", "application/json") in head.headers
        assert ("user-agent", "kubectl/v1.37") in head.headers
        # The request id travels in the open frame and comes back to the client.
        assert head.request_id and reply_.headers["x-request-id"] == head.request_id
        assert reply_.json()["target"] == "/api/v1/namespaces/default/pods?limit=5"
        assert CI_IMPERSONATION["user"] == head.impersonate.user
        assert not any(n.startswith("x-remote-") for n in names)
        # The client's own Impersonate-* headers cannot choose another identity: 400, never sent on.
        refused = await http_request(kasd.port("kubernetes_api"), "GET", "/api",
                                     [bearer(CI_TOKEN), ("impersonate-user", "system:admin"),
                                      ("impersonate-group", "system:masters")])
        assert refused.status == 400 and "Impersonate-* headers are not allowed" in refused.json()["message"]
        assert len(agent.heads) == 1


async def test_pat_without_impersonation_and_keep_alive() -> None:
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        client = await H1Client.connect(kasd.port("kubernetes_api"))
        for path in ("/version", "/api"):
            await client.request("GET", path, [bearer(PAT_TOKEN)])
            response = await client.response()
            assert response.status_code == 200
            assert json.loads(await client.body())["target"] == path
            client.conn.start_next_cycle()
        # An error answer keeps the connection too.
        await client.request("GET", "/api", [bearer("pat:1:wrong")])
        response = await client.response()
        assert response.status_code == 401 and (b"connection", b"close") not in response.headers
        await client.body()
        client.conn.start_next_cycle()
        await client.request("GET", "/apis", [bearer(PAT_TOKEN)])
        assert (await client.response()).status_code == 200
        await client.body()
        await client.aclose()
        assert [h.impersonate for h in agent.heads] == [None, None, None]


def _status(reply_: object) -> dict[str, object]:
    body = reply_.json()  # type: ignore[attr-defined]
    assert reply_.headers["content-type"] == "application/json"  # type: ignore[attr-defined]
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    return body  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        ([], "missing bearer token"),
        ([("authorization", "Basic dXNlcjpwdw==")], "expected Authorization: Bearer"),
        ([bearer("ci-1-nope")], "malformed"),
        ([bearer("ci:x:secret")], "agent id"),
        ([bearer("ci:1:wrong-secret")], "bad token: CI job token malformed"),
        ([bearer("pat:1:job-secret-7")], "bad token: personal token malformed"),
        ([bearer(f"pat:1:{CI_SECRET}")], "bad token: personal token not a personal token"),
        ([bearer(f"ci:1:{CI_SECRET[:-4]}AAAA")], "bad token: CI job token bad signature"),
    ],
)
async def test_bad_tokens_are_401(headers: list[tuple[str, str]], fragment: str) -> None:
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        reply_ = await http_request(kasd.port("kubernetes_api"), "GET", "/api", headers)
        assert reply_.status == 401
        body = _status(reply_)
        assert body["reason"] == "Unauthorized" and body["code"] == 401
        assert fragment in str(body["message"])
        assert reply_.headers["www-authenticate"].startswith("Bearer")
        assert agent.heads == []


async def test_agent_not_allowed_is_403() -> None:
    async with running_kasd() as kasd, fake_agent(kasd):
        reply_ = await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(f"pat:2:{PAT_SECRET}")])
        assert reply_.status == 403
        body = _status(reply_)
        assert body["reason"] == "Forbidden"
        assert body["message"] == "forbidden: agent 2 is not configured for user access (user_access)"


async def test_agent_not_connected_is_503_after_bounded_wait() -> None:
    async with running_kasd(make_config({"agent_wait_timeout": 0.3})) as kasd:
        started = trio.current_time()
        reply_ = await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(f"ci:2:{CI_SECRET}")])
        assert trio.current_time() - started >= 0.3
        assert reply_.status == 503
        body = _status(reply_)
        assert body["reason"] == "ServiceUnavailable"
        assert body["message"] == "agent 2 is not connected (waited 0.3s)"


async def test_request_waits_for_agent_that_connects_during_the_wait() -> None:
    async with running_kasd() as kasd, trio.open_nursery() as nursery:
        done = trio.Event()
        result: list[int] = []

        async def call() -> None:
            result.append((await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(CI_TOKEN)])).status)
            done.set()

        nursery.start_soon(call)
        while kasd.registry.statistics().waiting < 1:
            await kasd.registry.wait_changed()
        async with fake_agent(kasd):
            await done.wait()
        assert result == [200]


async def test_cluster_unreachable_is_502() -> None:
    async def unreachable(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await stream.refuse(TunnelCode.UPSTREAM_UNREACHABLE, "dial tcp 10.0.0.1:443: connect: connection refused")

    async with running_kasd() as kasd, fake_agent(kasd, unreachable):
        reply_ = await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(CI_TOKEN)])
        assert reply_.status == 502
        body = _status(reply_)
        assert body["reason"] == "BadGateway"
        assert body["message"] == "cluster API unreachable from agent 1: dial tcp 10.0.0.1:443: connect: connection refused"


async def test_five_mib_request_body_streams_through() -> None:
    payload = bytes(range(256)) * (5 * 1024 * 4)  # 5 MiB
    assert len(payload) == 5 * 1024 * 1024

    async def digest(stream: MuxStream, head: RequestHead, session: Session) -> None:
        h = hashlib.sha256()
        size = 0
        biggest = 0
        while chunk := await stream.receive_some():
            h.update(chunk)
            size += len(chunk)
            biggest = max(biggest, len(chunk))
        body = json.dumps({"size": size, "sha256": h.hexdigest(), "biggest_chunk": biggest}).encode()
        await reply(stream, 201, body, [("content-type", "application/json")])

    async with running_kasd() as kasd, fake_agent(kasd, digest) as agent:
        reply_ = await http_request(
            kasd.port("kubernetes_api"),
            "POST",
            "/apis/apps/v1/namespaces/default/deployments",
            [bearer(CI_TOKEN), ("content-type", "application/yaml")],
            payload,
        )
        assert reply_.status == 201
        seen = reply_.json()
        assert seen["size"] == len(payload)
        assert seen["sha256"] == hashlib.sha256(payload).hexdigest()
        assert seen["biggest_chunk"] < len(payload)  # it arrived in pieces, never as one buffer
        assert ("content-length", str(len(payload))) in agent.heads[0].headers


async def test_long_response_streams_chunk_by_chunk() -> None:
    """A watch: each event reaches the client while the response is still open."""
    go = [trio.Event() for _ in range(3)]

    async def watch(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await read_all(stream)
        await accept(stream, ResponseHead(status=200, headers=(("content-type", "application/json"),)))
        for i, event in enumerate(go):
            await event.wait()
            await stream.send_all(json.dumps({"type": "ADDED", "n": i}).encode() + b"\n")
        await stream.send_eof()

    async with running_kasd() as kasd, fake_agent(kasd, watch):
        client = await H1Client.connect(kasd.port("kubernetes_api"))
        await client.request("GET", "/api/v1/pods?watch=1", [bearer(CI_TOKEN)])
        response = await client.response()
        assert response.status_code == 200
        assert (b"transfer-encoding", b"chunked") in response.headers
        for i, event in enumerate(go):
            event.set()
            chunk = await client.chunk()
            assert chunk is not None and json.loads(chunk) == {"type": "ADDED", "n": i}
        assert await client.chunk() is None
        await client.aclose()


async def test_client_disconnect_resets_the_stream_and_frees_it() -> None:
    reset_seen = trio.Event()
    codes: list[int] = []

    async def endless(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await read_all(stream)
        await accept(stream, ResponseHead(status=200, headers=()))
        try:
            while True:
                await stream.send_all(b'{"type":"BOOKMARK"}\n')
                await trio.sleep(0.01)  # pacing, not synchronisation
        except StreamResetError as exc:
            codes.append(exc.code)
            reset_seen.set()

    async with running_kasd() as kasd, fake_agent(kasd, endless) as agent:
        client = await H1Client.connect(kasd.port("kubernetes_api"))
        await client.request("GET", "/api/v1/pods?watch=1", [bearer(CI_TOKEN)])
        assert (await client.response()).status_code == 200
        assert await client.chunk()
        assert agent.session.statistics().open_streams == 1
        await client.aclose()
        await reset_seen.wait()
        assert codes == [TunnelCode.CLIENT_GONE]
        assert agent.session.statistics().open_streams == 0
        (tunnel,) = kasd.registry.tunnels(1)
        assert tunnel.session.statistics().open_streams == 0


async def test_upgrade_turns_into_a_raw_pipe_both_ways() -> None:
    async def exec_(stream: MuxStream, head: RequestHead, session: Session) -> None:
        assert ("upgrade", "SPDY/3.1") in head.headers
        assert ("connection", "Upgrade") in head.headers
        assert ("x-stream-protocol-version", "v4.channel.k8s.io") in head.headers
        await accept(
            stream,
            ResponseHead(
                status=101,
                headers=(("connection", "Upgrade"), ("upgrade", "SPDY/3.1"), ("x-stream-protocol-version", "v4.channel.k8s.io")),
            ),
        )
        while chunk := await stream.receive_some():
            await stream.send_all(chunk.upper())
        await stream.send_all(b"bye")
        await stream.send_eof()

    async with running_kasd() as kasd, fake_agent(kasd, exec_):
        client = await H1Client.connect(kasd.port("kubernetes_api"))
        await client.request(
            "POST",
            "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true",
            [
                bearer(CI_TOKEN),
                ("connection", "Upgrade"),
                ("upgrade", "SPDY/3.1"),
                ("x-stream-protocol-version", "v4.channel.k8s.io"),
            ],
            body=b"",
        )
        response = await client.response()
        assert response.status_code == 101
        headers = {k.decode(): v.decode() for k, v in response.headers}
        assert headers["upgrade"] == "SPDY/3.1"
        early, _ = client.conn.trailing_data
        assert early == b""
        sock = client.stream
        for word in (b"hello", b"world"):
            await sock.send_all(word)
            got = b""
            while len(got) < len(word):
                got += await sock.receive_some(100)
            assert got == word.upper()
        await sock.send_eof()  # type: ignore[attr-defined]
        rest = b""
        while data := await sock.receive_some(100):
            rest += data
        assert rest == b"bye"
        await client.aclose()


async def test_unauthorized_large_upload_still_gets_its_401() -> None:
    """kubectl apply -f of 5 MiB with a bad token: the 401 arrives although the body was never read."""
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        client = await H1Client.connect(kasd.port("kubernetes_api"))
        payload = b"y" * (5 * 1024 * 1024)
        async with trio.open_nursery() as nursery:

            async def upload() -> None:
                try:
                    await client.request("PUT", "/api/v1/namespaces/default/configmaps/big", [bearer("ci:1:bad")], payload)
                except trio.BrokenResourceError:
                    pass  # kasd may close once it answered: that is allowed

            nursery.start_soon(upload)
            response = await client.response()
            assert response.status_code == 401
            assert (b"connection", b"close") in response.headers
            assert b"bad token: CI job token malformed" in await client.body()
        await client.aclose()
        assert agent.heads == []


async def _raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection and read until kasd closes it."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(data)
    out = await read_until_closed(stream)
    await stream.aclose()
    return out


def _auth_line(token: str = CI_TOKEN) -> bytes:
    return f"Authorization: Bearer {token}\r\n".encode()


async def test_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        one = b"GET /api/%d HTTP/1.1\r\nHost: k\r\n" + _auth_line() + b"\r\n"
        last = b"GET /api/3 HTTP/1.1\r\nHost: k\r\nConnection: close\r\n" + _auth_line() + b"\r\n"
        raw = await _raw_exchange(kasd.port("kubernetes_api"), one % 1 + one % 2 + last)
        assert raw.count(b"HTTP/1.1 200 OK\r\n") == 3
        assert re.findall(rb'"target": "([^"]*)"', raw) == [b"/api/1", b"/api/2", b"/api/3"]
        assert [h.target for h in agent.heads] == ["/api/1", "/api/2", "/api/3"]


async def test_an_http10_client_gets_its_body_without_chunks_ended_by_the_close() -> None:
    async def unsized(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await read_all(stream)
        await accept(stream, ResponseHead(status=200, headers=(("content-type", "text/plain"),)))
        await stream.send_all(b"no length given")
        await stream.send_eof()

    async with running_kasd() as kasd, fake_agent(kasd, unsized):
        raw = await _raw_exchange(kasd.port("kubernetes_api"), b"GET /logs HTTP/1.0\r\n" + _auth_line() + b"\r\n")
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"transfer-encoding" not in head.lower() and b"connection: close" in head.lower()
        assert body == b"no length given"


async def test_the_answer_to_head_carries_no_body_even_if_the_agent_sends_one() -> None:
    async with running_kasd() as kasd, fake_agent(kasd):  # json_handler always sends a body
        req = b"HEAD /api HTTP/1.1\r\nHost: k\r\n" + _auth_line() + b"\r\n"
        raw = await _raw_exchange(kasd.port("kubernetes_api"), req + req.replace(b"HEAD", b"GET") [:-2] + b"Connection: close\r\n\r\n")
        first, _, rest = raw.partition(b"\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: " in first.lower()
        assert rest.startswith(b"HTTP/1.1 200 OK\r\n")  # the next answer follows the head directly
        assert b'"method": "GET"' in rest


async def test_a_refused_upgrade_leaves_the_connection_serving_http() -> None:
    async def refuse(stream: MuxStream, head: RequestHead, session: Session) -> None:
        if head.method == "GET":
            await read_all(stream)  # (an upgrade request's stream is not half-closed: its body never ends)
        await reply(stream, 403, b"no exec for you")

    async with running_kasd() as kasd, fake_agent(kasd, refuse) as agent:
        upgrade = (b"POST /api/v1/namespaces/default/pods/p/exec HTTP/1.1\r\nHost: k\r\n" + _auth_line()
                   + b"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n")
        after = b"GET /api HTTP/1.1\r\nHost: k\r\nConnection: close\r\n" + _auth_line() + b"\r\n"
        stream = await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
        await stream.send_all(upgrade)
        raw = b""
        with trio.fail_after(5):
            while not raw.endswith(b"no exec for you"):
                raw += await stream.receive_some(65536)
            assert raw.startswith(b"HTTP/1.1 403 Forbidden\r\n")
            await stream.send_all(after)
        raw = await read_until_closed(stream)
        assert raw.startswith(b"HTTP/1.1 403 Forbidden\r\n") and [h.method for h in agent.heads] == ["POST", "GET"]


async def test_a_request_llhttp_cannot_parse_gets_a_400_that_says_why() -> None:
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        raw = await _raw_exchange(
            kasd.port("kubernetes_api"),
            b"PUT /api HTTP/1.1\r\nHost: k\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n" + _auth_line() + b"\r\n")
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert "Transfer-Encoding can't be present with Content-Length" in json.loads(body)["message"]
        assert agent.heads == []


async def test_an_agent_stream_that_breaks_mid_response_cuts_the_client_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Too late for a Status: the client must see a truncated body (no final chunk), never a whole one.
    caplog.set_level(logging.INFO, logger="kasd.access")
    more = trio.Event()
    async with running_kasd() as kasd, fake_agent(kasd, first_chunk_then_reset(more)):
        client = await H1Client.connect(kasd.port("kubernetes_api"))
        await client.request("GET", "/api/v1/pods?watch=1", [bearer(CI_TOKEN)])
        assert (await client.response()).status_code == 200
        assert await client.chunk() == b'{"type": "ADDED"}\n'
        more.set()
        rest = await read_until_closed(client.stream)
        assert not rest.endswith(b"0\r\n\r\n")  # no last chunk: the body is cut, not ended
        await client.aclose()
    assert "agent stream broke mid-response" in caplog.text
    assert "outcome=upstream-broken" in caplog.text


async def test_the_audit_line_says_who_as_whom_what_and_where_and_never_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One access line per request: the principal, how the agent acted and whom it impersonated,
    the Kubernetes verb and namespace; a refused request names the principal its token proved."""
    caplog.set_level(logging.INFO, logger="kasd.access")
    async with running_kasd() as kasd, fake_agent(kasd):
        port = kasd.port("kubernetes_api")
        assert (await http_request(port, "GET", "/api/v1/namespaces/web/pods?watch=1&labelSelector=x",
                                   [bearer(CI_TOKEN)])).status == 200
        assert (await http_request(port, "DELETE", "/apis/apps/v1/namespaces/web/deployments/site",
                                   [bearer(PAT_TOKEN)])).status == 200
        assert (await http_request(port, "GET", "/api/v1/pods", [bearer(f"pat:2:{PAT_SECRET}")])).status == 403
    lines = [r.getMessage() for r in caplog.records if r.name == "kasd.access"]
    assert len(lines) == 3
    job, user, refused = lines
    assert ("agent=1 subject=ci_job:7 access_as=impersonate as_user=gitlab:ci_job:7 "
            'as_groups=gitlab:ci_job,gitlab:project:42 verb=watch namespace=web status=200') in job
    assert "path=/api/v1/namespaces/web/pods " in job  # never the query
    assert ("agent=1 subject=user:alice access_as=agent as_user=- as_groups=- verb=delete namespace=web "
            "status=200") in user
    assert "agent=- subject=user:alice access_as=- as_user=- as_groups=- verb=list namespace=- status=403" in refused
    for secret in (CI_SECRET, PAT_SECRET, "labelSelector"):
        assert secret not in caplog.text


# An agent id str.isdigit() takes and int() refuses: '²' (one latin-1 byte of the header), and more
# digits than int() reads. Each is a 401 naming the problem, on a connection that goes on serving.
STRANGE_AGENT_IDS = [(b"\xb2", "is not a number"), (b"7" * 5000, "is too long")]


async def test_an_agent_id_int_refuses_is_a_401_on_a_connection_that_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with running_kasd() as kasd, fake_agent(kasd) as agent:
        client = await H1Client.connect(kasd.port("kubernetes_api"))
        for agent_id, problem in STRANGE_AGENT_IDS:
            await client.request("GET", "/api", [("authorization", b"Bearer ci:" + agent_id + b":x")])  # type: ignore[list-item]
            response = await client.response()
            body = json.loads(await client.body())
            assert response.status_code == 401 and (b"connection", b"close") not in response.headers
            assert body["kind"] == "Status" and body["reason"] == "Unauthorized"
            assert "bad token: agent id" in body["message"] and problem in body["message"]
            assert len(body["message"]) < 200
            client.conn.start_next_cycle()
        await client.request("GET", "/api", [bearer(CI_TOKEN)])
        assert (await client.response()).status_code == 200
        await client.body()
        await client.aclose()
    assert len(agent.heads) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_a_request_that_escapes_the_pipeline_is_a_500_then_a_close(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # The front end's own net, behind the pipeline's: a bug there is answered, in one line.
    async def buggy(self: RequestPipeline, ex: Any, **kw: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(RequestPipeline, "serve", buggy)
    async with running_kasd() as kasd:
        for _ in range(3):
            reply_ = await http_request(kasd.port("kubernetes_api"), "GET", "/api", [bearer(CI_TOKEN)])
            assert reply_.status == 500 and reply_.headers["connection"] == "close"
            assert _status(reply_)["reason"] == "InternalError"
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
