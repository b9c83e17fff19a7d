"""kasd's web app (``kasd.web``) in process, with fakes for the store and the live views: who may
see what (GitLab's 401/403/404), the session cookie and CSRF, CORS, GitLab's shapes, SSE, and the
one app on the API port that still gives the job-token calls to ``RestApi``."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from kasd.asgiport import AsgiPort
from kasd.environments.values import ViewerTooSlow
from kasd.restapi import RestApi
from kasd.restpaths import ALLOWED_AGENTS_PATH
from kasd.web import WebApp, WebSettings, mount
from kasd.web.openapi import document
from kasd.web.streams import COALESCE_SECONDS, WRITE_TIMEOUT_SECONDS
from tests.kasd.helpers import http_request
from tests.kasd.webfakes import (
    TOKENS,
    AgentRequestError,
    FakeAgents,
    FakeStore,
    FakeViews,
    Snap,
    Update,
    call,
    fake_graph,
    pod,
    snapshot,
)

pytestmark = pytest.mark.timeout(30)
KEY = b"k" * 32


def _app(views: FakeViews | None = None, **settings: Any) -> tuple[Any, FakeViews]:
    views = views or FakeViews()
    snap = snapshot()
    web = WebApp(lambda: snap, FakeStore(), views, FakeAgents(), key=KEY, settings=WebSettings(**settings),
                 graph_of=fake_graph, agent_errors=(AgentRequestError,))
    return mount(RestApi(lambda: snap), web), views


def _token(user: str) -> list[tuple[str, str]]:
    return [("private-token", TOKENS[user])]


async def test_no_token_is_401_and_a_project_the_user_cannot_see_is_404_as_gitlab_answers() -> None:
    app, _ = _app()
    reply = await call(app, "GET", "/api/v4/projects/group%2Fapp/environments")
    assert (reply.status, reply.json()) == (401, {"message": "401 Unauthorized"})
    bad = await call(app, "GET", "/api/v4/projects/42/environments", [("authorization", "Bearer nope")])
    assert bad.status == 401 and bad.json()["message"].startswith("401 Unauthorized: personal token")
    for project in ("group%2Fapp", "42", "group%2Fnowhere"):
        reply = await call(app, "GET", f"/api/v4/projects/{project}/environments", _token("carol"))
        assert (reply.status, reply.json()) == (404, {"message": "404 Project Not Found"}), project
    # digits Python reads but no id is spelled with (superscript two, Arabic-Indic four): not found, never a 500
    for ident in ("%C2%B2", "%D9%A4"):
        for path in (f"/api/v4/projects/{ident}/environments", f"/api/v4/groups/{ident}/environments"):
            reply = await call(app, "GET", path, _token("alice"))
            assert reply.status == 404, (path, reply.status)
    odd = await call(app, "GET", "/api/kasd/v1/environments/1/resources?agent=%C2%B2", _token("alice"))
    assert odd.status == 400, odd.status
    # a Guest sees the project, not its environments
    guest = await call(app, "GET", "/api/v4/projects/42/environments", _token("dave"))
    assert (guest.status, guest.json()) == (403, {"message": "403 Forbidden"})
    # Reporter sees the environment, not a Developer's actions (kasd's path says which role)
    refused = await call(app, "DELETE", "/api/kasd/v1/environments/1/pods/prod/hello-1", _token("bob"))
    assert refused.json() == {"message": "403 Forbidden: this needs the Developer role in group/app"}
    # an environment of another project, by id: not found either
    assert (await call(app, "GET", "/api/kasd/v1/environments/9", _token("alice"))).json() == \
        {"message": "404 Environment Not Found"}


async def test_resources_need_the_agents_user_access_and_say_why_not() -> None:
    app, views = _app()
    reply = await call(app, "GET", "/api/kasd/v1/environments/1/resources", _token("bob"))
    assert reply.status == 403
    assert reply.json()["message"] == ("403 Forbidden: user bob needs at least the Developer role in a project or "
                                       "group that agent 1 authorizes for user access (user_access)")
    ok = await call(app, "GET", "/api/kasd/v1/environments/1/resources",
                    [("authorization", f"Bearer {TOKENS['alice']}")])
    assert ok.status == 200
    body = ok.json()
    assert body["graph"]["health"]["status"] == "Healthy" and body["environment"]["name"] == "production"
    assert body["problems"] == [{"group": "", "version": "v1", "kind": "Secret", "namespace": "prod",
                                 "reason": "forbidden", "message": "no"}]
    assert views.viewers[-1].agent_id == 1 and views.viewers[-1].key == "agent"  # user_access access_as agent
    # the kubeconfig's form of the same token (pat:<agent id>:<token>) is read too
    assert (await call(app, "GET", "/api/kasd/v1/environments/1", [("authorization", f"Bearer pat:1:{TOKENS['alice']}")]
                       )).json()["health"]["status"] == "Healthy"


async def test_gitlab_shapes_filters_and_pagination() -> None:
    app, _ = _app()
    reply = await call(app, "GET", "/api/v4/projects/group%2Fapp/environments?per_page=2", _token("bob"))
    assert reply.status == 200
    envs = reply.json()
    assert [e["name"] for e in envs] == ["production", "review/feat-x"]
    assert set(envs[0]) >= {"id", "name", "slug", "external_url", "state", "tier", "created_at", "updated_at"}
    assert envs[0]["created_at"] == "2026-05-28T20:26:40.000Z"
    assert reply.headers["x-total"] == "3" and reply.headers["x-total-pages"] == "2"
    assert reply.headers["x-next-page"] == "2" and 'rel="next"' in reply.headers["link"]
    stopped = await call(app, "GET", "/api/v4/projects/42/environments?states=stopped", _token("bob"))
    assert [e["name"] for e in stopped.json()] == ["review/old"]
    search = await call(app, "GET", "/api/v4/projects/42/environments?search=review", _token("bob"))
    assert [e["name"] for e in search.json()] == ["review/feat-x", "review/old"]
    both = await call(app, "GET", "/api/v4/projects/42/environments?search=rev&name=x", _token("bob"))
    assert both.json() == {"error": "name, search cannot be used together"}  # Grape's words
    short = await call(app, "GET", "/api/v4/projects/42/environments?search=re", _token("bob"))
    assert short.json() == {"message": "400 Bad request - Search query is less than 3 characters"}
    bad_state = await call(app, "GET", "/api/v4/projects/42/environments?states=gone", _token("bob"))
    assert (bad_state.status, bad_state.json()) == (400, {"error": "states does not have a valid value"})
    other = await call(app, "GET", "/api/v4/projects/42/environments/9", _token("bob"))  # group/infra's
    assert (other.status, other.json()) == (404, {"message": "404 Not found"})
    huge = await call(app, "GET", f"/api/v4/projects/42/environments/{2**64}", _token("bob"))
    assert (huge.status, huge.json()) == (404, {"message": "404 Not found"})
    one = await call(app, "GET", "/api/v4/projects/42/environments/1", _token("bob"))
    assert one.json()["last_deployment"]["deployable"]["id"] == 7
    group = await call(app, "GET", "/api/v4/groups/group/environments", _token("bob"))
    assert [e["id"] for e in group.json()] == [1, 2, 3]  # not group/infra's: bob cannot see it
    # whose environment each is: GitLab's Environment entity exposes its project (BasicProjectDetails)
    project = {"id": 42, "name": "app", "path": "app", "path_with_namespace": "group/app"}
    assert [e["project"] for e in group.json()] == [project] * 3
    assert envs[0]["project"] == one.json()["project"] == project


async def test_a_session_cookie_is_signed_http_only_strict_and_state_changes_need_its_csrf_token() -> None:
    app, views = _app(tls=True)
    signed_in = await call(app, "POST", "/-/sign_in", [("content-type", "application/json")],
                           json.dumps({"token": TOKENS["alice"]}).encode())
    assert signed_in.status == 200
    (cookie,) = signed_in.cookies
    flags = [f.strip().lower() for f in cookie.split(";")]
    assert {"httponly", "samesite=strict", "secure", "path=/"} <= set(flags)
    assert TOKENS["alice"] not in cookie
    csrf = signed_in.json()["csrf_token"]
    jar = [("cookie", cookie.split(";")[0])]
    assert (await call(app, "GET", "/-/session", jar)).json()["csrf_token"] == csrf
    path = "/api/kasd/v1/environments/1/pods/prod/hello-1"
    missing = await call(app, "DELETE", path, jar)
    assert missing.status == 403 and "CSRF" in missing.json()["message"]
    wrong = await call(app, "DELETE", path, [*jar, ("x-csrf-token", csrf[:-2] + "xx")])
    assert wrong.status == 403
    assert not [r for r in views.requests if r[1] == "DELETE"]
    ok = await call(app, "DELETE", path, [*jar, ("x-csrf-token", csrf)])
    assert ok.status == 200 and views.requests[-1][1:3] == ("DELETE", "/api/v1/namespaces/prod/pods/hello-1")
    # a token call needs no CSRF token
    assert (await call(app, "DELETE", path, _token("alice"))).status == 200
    # a forged cookie is nobody
    forged = cookie.split(";")[0][:-4] + "AAAA"
    assert (await call(app, "GET", "/-/session", [("cookie", forged)])).status == 401


async def test_a_form_sign_in_goes_to_the_dashboard_and_sign_ins_are_rate_limited_per_source() -> None:
    app, _ = _app(sign_in_per_minute=3)
    form = [("content-type", "application/x-www-form-urlencoded")]
    reply = await call(app, "POST", "/-/sign_in", form, f"token={TOKENS['bob']}".encode())
    assert reply.status == 303 and reply.headers["location"] == "/-/dashboard/"
    assert "secure" not in reply.cookies[0].lower()  # no TLS on this port
    for _ in range(2):
        assert (await call(app, "POST", "/-/sign_in", form, b"token=wrong")).status == 401
    limited = await call(app, "POST", "/-/sign_in", form, b"token=wrong")
    assert limited.status == 429 and int(limited.headers["retry-after"]) >= 1
    assert (await call(app, "POST", "/-/sign_in", form, b"token=wrong", client="10.0.0.2")).status == 401
    other_site = await call(app, "POST", "/-/sign_in", [*form, ("origin", "https://evil.example")],
                            f"token={TOKENS['bob']}".encode(), client="10.0.0.3")
    assert other_site.status == 403 and not other_site.cookies
    same_site = await call(app, "POST", "/-/sign_in", [*form, ("origin", "http://kasd")],
                           f"token={TOKENS['bob']}".encode(), client="10.0.0.3")
    assert same_site.status == 303
    # login CSRF without Origin: a browser still says where the request came from; and a cross-site
    # form's text/plain body that reads as JSON is not a sign-in
    no_origin = await call(app, "POST", "/-/sign_in", [*form, ("sec-fetch-site", "cross-site")],
                           f"token={TOKENS['bob']}".encode(), client="10.0.0.4")
    assert no_origin.status == 403 and not no_origin.cookies
    plain = await call(app, "POST", "/-/sign_in", [("content-type", "text/plain")],
                       json.dumps({"token": TOKENS["bob"], "x": "="}).encode(), client="10.0.0.4")
    assert plain.status == 415 and not plain.cookies


async def test_cors_answers_only_configured_origins_and_every_answer_has_the_security_headers() -> None:
    app, _ = _app(cors_origins=("https://dash.example",))
    preflight = [("access-control-request-method", "GET"), ("access-control-request-headers", "private-token")]
    ok = await call(app, "OPTIONS", "/api/v4/projects/42/environments", [("origin", "https://dash.example"), *preflight])
    assert ok.headers["access-control-allow-origin"] == "https://dash.example"
    other = await call(app, "OPTIONS", "/api/v4/projects/42/environments", [("origin", "https://evil.example"),
                                                                             *preflight])
    assert "access-control-allow-origin" not in other.headers
    get = await call(app, "GET", "/api/v4/projects/42/environments", [("origin", "https://evil.example"),
                                                                       *_token("bob")])
    assert "access-control-allow-origin" not in get.headers
    none, _ = _app()
    plain = await call(none, "GET", "/api/v4/projects/42/environments", [("origin", "https://dash.example"),
                                                                          *_token("bob")])
    assert "access-control-allow-origin" not in plain.headers
    for reply in (ok, get, plain, await call(none, "GET", ALLOWED_AGENTS_PATH)):
        assert reply.headers["content-security-policy"].startswith("default-src 'self'")
        assert "frame-ancestors 'none'" in reply.headers["content-security-policy"]
        assert reply.headers["x-content-type-options"] == "nosniff"
        assert reply.headers["referrer-policy"] == "no-referrer"


async def test_objects_are_read_only_from_the_graph_and_flux_reconcile_annotates() -> None:
    app, views = _app()
    base = "/api/kasd/v1/environments/1"
    got = await call(app, "GET", f"{base}/objects/_/v1/Pod/prod/hello-1", _token("alice"))
    assert got.status == 200 and "managedFields" not in got.json()["metadata"]
    assert views.requests[-1][2] == "/api/v1/namespaces/prod/pods/hello-1"
    as_yaml = await call(app, "GET", f"{base}/objects/core/v1/Pod/prod/hello-1", [*_token("alice"),
                                                                                  ("accept", "application/yaml")])
    assert as_yaml.headers["content-type"].startswith("application/yaml")
    # as `kubectl get -o yaml` shows an object, whatever order the API server sent its keys in
    assert as_yaml.body.decode().startswith("apiVersion: v1\nkind: Pod\nmetadata:\n  name: hello-1\n  namespace: prod\n")
    for path in (f"{base}/objects/core/v1/Secret/prod/db", f"{base}/pods/prod/other/log",
                 f"{base}/flux/Kustomization/prod/other/reconcile"):
        method = "POST" if path.endswith("reconcile") else "GET"
        assert (await call(app, method, path, _token("alice"))).status == 404, path
    events = await call(app, "GET", f"{base}/objects/core/v1/Pod/prod/hello-1/events", _token("alice"))
    assert events.json()["events"][0]["reason"] == "BackOff"
    assert "involvedObject.uid%3Duid-hello-1" in views.requests[-1][2]
    log = await call(app, "GET", f"{base}/pods/prod/hello-1/log?tailLines=10&follow=true", _token("alice"))
    assert log.body == b"line 1\nline 2\n" and log.headers["content-type"].startswith("text/plain")
    assert "content-length" not in log.headers  # streamed: chunked on the wire
    assert views.requests[-1][2] == "/api/v1/namespaces/prod/pods/hello-1/log?follow=true&tailLines=10"
    done = await call(app, "POST", f"{base}/flux/Kustomization/prod/apps/reconcile", _token("alice"))
    assert done.status == 200
    _, method, target, (body, content_type) = views.requests[-1]
    assert (method, target) == ("PATCH", "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/prod/kustomizations/apps")
    assert content_type == "application/merge-patch+json"
    assert body["metadata"]["annotations"]["reconcile.fluxcd.io/requestedAt"].endswith("Z")
    bad = await call(app, "GET", f"{base}/pods/prod/hello-1/log?tailLines=-1", _token("alice"))
    assert bad.status == 400 and "tailLines" in bad.json()["message"]
    views.log_refused = True  # refused as it opens: still a whole error answer
    refused = await call(app, "GET", f"{base}/pods/prod/hello-1/log", _token("alice"))
    assert (refused.status, refused.json()) == (404, {"message": "404 container not found"})
    views.unreachable = True  # the agent's answer is the caller's, in kasd's words
    gone = await call(app, "GET", f"{base}/resources", _token("alice"))
    assert (gone.status, gone.json()) == (503, {"message": "503 agent 1 is not connected"})


async def _sse(app: Any, views: FakeViews, *, leave: trio.Event) -> list[bytes]:
    """Chunks of the watch stream until it ends (the client leaves when ``leave`` is set)."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": "/api/kasd/v1/environments/1/resources/watch",
             "raw_path": b"/api/kasd/v1/environments/1/resources/watch", "query_string": b"", "root_path": "",
             "server": None, "client": ("127.0.0.1", 1),
             "headers": [(b"private-token", TOKENS["alice"].encode())]}
    chunks: list[bytes] = []
    first = True

    async def receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b"", "more_body": False}
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert dict(message["headers"])[b"content-type"].startswith(b"text/event-stream")
        else:
            chunks.append(message.get("body", b""))
            if b"event: graph" in chunks[-1] and b"hello-2" in chunks[-1]:
                leave.set()  # the update arrived: the client goes

    await app(scope, receive, send)
    return chunks


async def test_sse_sends_the_graph_then_each_coalesced_change_and_ends_when_the_client_goes(
        autojump_clock: trio.testing.MockClock) -> None:
    app, views = _app()
    leave = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(views.updates_in.send, Update("ADDED", object=pod("hello-2", "Pending")))
        chunks = await _sse(app, views, leave=leave)
    text = b"".join(chunks).decode()
    graphs = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and '"nodes"' in line]
    # the first RESYNC and the ADDED came within one coalescing window: one event with both
    assert graphs[-1]["health"]["status"] == "Progressing" and "/Pod/prod/hello-2" in graphs[-1]["health"]["message"]
    assert views.watch_closed.is_set()


async def test_sse_heartbeats_and_a_viewer_dropped_as_too_slow_gets_an_end_event(
        autojump_clock: trio.testing.MockClock) -> None:
    app, views = _app()
    leave = trio.Event()
    async with trio.open_nursery() as nursery:
        async def later() -> None:
            await trio.sleep(40)  # (mock clock) long enough for two heartbeats
            await views.updates_in.send(ViewerTooSlow("the viewer fell behind"))
        nursery.start_soon(later)
        text = b"".join(await _sse(app, views, leave=leave)).decode()
    assert text.count(": ping") >= 2
    assert 'event: end\ndata: {"message":"ViewerTooSlow: the viewer fell behind"}' in text
    assert views.watch_closed.is_set()


async def test_a_stream_ended_by_a_bug_tells_the_client_only_that_kasd_logged_it(
        autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    """An error nobody foresaw (its text may quote anything: a header, a token) is one log line
    (type and frames, no message) and, to the client, no more than that kasd logged it."""
    app, views = _app()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(views.updates_in.send, RuntimeError("PRIVATE-TOKEN: glpat-secret"))
        text = b"".join(await _sse(app, views, leave=trio.Event())).decode()
    assert 'event: end\ndata: {"message":"kasd could not go on with this stream (it logged why)"}' in text
    assert "glpat-secret" not in text and "glpat-secret" not in caplog.text
    assert "error=RuntimeError" in caplog.text


class _BroadcastViews(FakeViews):
    """One live view every watch shares, as ``kasd.environments`` does: each update (the same
    object) goes to every viewer."""

    def __init__(self) -> None:
        super().__init__()
        self.channels: list[trio.MemorySendChannel[Any]] = []

    @asynccontextmanager
    async def watch(self, env: Any, viewer: Any) -> AsyncIterator[AsyncIterator[Update]]:
        send, receive = trio.open_memory_channel[Any](10)
        self.channels.append(send)

        async def updates() -> AsyncIterator[Update]:
            yield Update("RESYNC", snapshot=Snap(tuple(self.objects)))
            async for item in receive:
                yield item

        yield updates()

    async def publish(self, update: Update) -> None:
        for channel in self.channels:
            await channel.send(update)


async def _viewer(app: Any, events: list[dict[str, Any]], leave: trio.Event,
                  send_blocks_after: int | None = None) -> None:
    """An SSE client of environment 1: each graph event into ``events`` until ``leave``; with
    ``send_blocks_after``, it takes that many body parts and then nothing (its socket is full)."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": "/api/kasd/v1/environments/1/resources/watch",
             "raw_path": b"/api/kasd/v1/environments/1/resources/watch", "query_string": b"", "root_path": "",
             "server": None, "client": ("127.0.0.1", 1), "headers": [(b"private-token", TOKENS["alice"].encode())]}
    asked = False
    parts = 0

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal parts
        if message["type"] != "http.response.body":
            return
        parts += 1
        if send_blocks_after is not None and parts > send_blocks_after:
            await trio.sleep_forever()
        for block in message.get("body", b"").decode().split("\n\n"):
            if block.startswith("event: graph\n"):
                events.append(json.loads(block.split("data: ", 1)[1]))

    await app(scope, receive, send)


async def test_viewers_of_one_environment_share_each_graph_built_once_per_change(
        autojump_clock: trio.testing.MockClock) -> None:
    builds = 0

    def counted(objects: Any, selector: Any) -> dict[str, Any]:
        nonlocal builds
        builds += 1
        return fake_graph(objects, selector)

    views = _BroadcastViews()
    snap = snapshot()
    web = WebApp(lambda: snap, FakeStore(), views, FakeAgents(), key=KEY, graph_of=counted,
                 agent_errors=(AgentRequestError,))
    app = mount(RestApi(lambda: snap), web)
    seen: list[list[dict[str, Any]]] = [[] for _ in range(3)]
    leave = trio.Event()
    async with trio.open_nursery() as nursery:
        for events in seen:
            nursery.start_soon(_viewer, app, events, leave)
        await trio.sleep(1)
        assert [len(events) for events in seen] == [1, 1, 1] and builds == 1
        await views.publish(Update("ADDED", object=pod("hello-2", "Pending")))
        await trio.sleep(1)
        leave.set()
    assert all("/Pod/prod/hello-2" in {n["id"] for n in events[-1]["nodes"]} for events in seen)
    assert all(events == seen[0] for events in seen)
    assert builds == 2  # one graph per state for the three viewers, not one per viewer


async def test_a_viewer_that_takes_nothing_is_cut_off_and_leaves_the_view(
        autojump_clock: trio.testing.MockClock) -> None:
    app, views = _app()
    events: list[dict[str, Any]] = []
    began = trio.current_time()
    with trio.fail_after(WRITE_TIMEOUT_SECONDS + 60):  # (before: held open for as long as the client was there)
        await _viewer(app, events, trio.Event(), send_blocks_after=1)  # ": connected", then its socket is full
    assert views.watch_closed.is_set()  # the shared watch is left: the view is not held for it
    assert trio.current_time() - began == pytest.approx(WRITE_TIMEOUT_SECONDS + COALESCE_SECONDS)


def test_the_openapi_document_is_served_kept_in_docs_and_describes_every_route() -> None:
    from pathlib import Path
    doc = document()
    kept = json.loads((Path(__file__).parents[2] / "docs" / "openapi.json").read_text())
    assert kept == doc, "run: python -m kasd.web.openapi > docs/openapi.json"
    snap = snapshot()
    web = WebApp(lambda: snap, FakeStore(), FakeViews(), FakeAgents(), key=KEY, graph_of=fake_graph)
    for route in web.routes:
        path = route.path.replace(":path}", "}").replace(":int}", "}").replace(":env_id}", "}")
        assert path in doc["paths"], path
        assert set(m.lower() for m in route.methods or ()) - {"head"} <= set(doc["paths"][path]), path


async def test_starlette_runs_on_trio_behind_kasds_own_front_end_beside_the_job_token_calls(
        caplog: pytest.LogCaptureFixture) -> None:
    app, views = _app()
    snap = snapshot()
    port = AsgiPort(app, log=logging.getLogger("test.web"))
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, port.handle_connection, 0, host="127.0.0.1"))
        number = listeners[0].socket.getsockname()[1]
        web = await http_request(number, "GET", "/api/v4/projects/group%2Fapp/environments",
                                 [("private-token", TOKENS["bob"])])
        assert web.status == 200 and [e["id"] for e in json.loads(web.body)] == [1, 2, 3]
        with caplog.at_level(logging.INFO, logger="test.web"):
            await http_request(number, "DELETE", "/api/kasd/v1/environments/1/pods/prod/hello-1?csrf_token=SEKRIT",
                               [("cookie", "_kasd_session=x")])
        assert "SEKRIT" not in caplog.text and "path=/api/kasd/v1/environments/1/pods/prod/hello-1 " in caplog.text
        # a browser that leaves the live graph: kasd.asgiport says http.disconnect, the watch closes
        client = await trio.open_tcp_stream("127.0.0.1", number)
        await client.send_all(b"GET /api/kasd/v1/environments/1/resources/watch HTTP/1.1\r\nHost: kasd\r\n"
                              b"PRIVATE-TOKEN: " + TOKENS["alice"].encode() + b"\r\n\r\n")
        seen = b""
        while b"event: graph" not in seen:
            seen += await client.receive_some(65536)
        assert b"text/event-stream" in seen and b"transfer-encoding: chunked" in seen.lower()
        await client.aclose()
        with trio.fail_after(5):
            await views.watch_closed.wait()
        rest = await http_request(number, "GET", ALLOWED_AGENTS_PATH, [])
        assert rest.status == 401 and b"JOB-TOKEN" in rest.body
        assert rest.headers["x-content-type-options"] == "nosniff"
        nursery.cancel_scope.cancel()
    del snap


async def test_a_session_lasts_at_most_12_hours_and_ends_when_its_token_is_revoked_or_its_key_rotated_out() -> None:
    from datetime import timedelta

    import attrs

    from kasd.authz.jobtokens import verify_personal_token
    from kasd.authz.keys import KeySet, SigningKey
    from tests.kasd.helpers import AUTH

    token = AUTH.personal_token("alice", ttl=timedelta(days=2))
    snap = snapshot()
    current = [snap]
    web = WebApp(lambda: current[0], FakeStore(), FakeViews(), FakeAgents(), key=KEY, graph_of=fake_graph)
    signed_in = await call(web, "POST", "/-/sign_in", [("content-type", "application/json")],
                           json.dumps({"token": token}).encode())
    (cookie,) = signed_in.cookies
    max_age = int(next(f for f in cookie.split("; ") if f.lower().startswith("max-age=")).split("=")[1])
    assert 12 * 3600 - 5 <= max_age <= 12 * 3600
    jar = [("cookie", cookie.split(";")[0])]
    assert (await call(web, "GET", "/-/session", jar)).status == 200
    assert snap.tokens.keyset is not None
    jti = verify_personal_token(token, snap.tokens.keyset, audience=snap.tokens.audience,
                                issuer=snap.tokens.issuer).stamp.token_id  # type: ignore[union-attr]
    current[0] = attrs.evolve(snap, tokens=attrs.evolve(snap.tokens, revoked=frozenset({jti})))
    assert (await call(web, "GET", "/-/session", jar)).status == 401
    # rotating the signing key (after a leak) ends every token the old key signed: their sessions too
    current[0] = snap
    assert (await call(web, "GET", "/-/session", jar)).status == 200
    rotated = KeySet.of([SigningKey.generate().verification_key()])
    current[0] = attrs.evolve(snap, tokens=attrs.evolve(snap.tokens, keyset=rotated))
    ended = await call(web, "GET", "/-/session", jar)
    assert ended.status == 401 and "signing key" in ended.json()["message"]


async def test_agents_among_replicas_name_the_replica_holding_a_tunnel_elsewhere() -> None:
    """``/api/kasd/v1/agents`` on a replica without the agent's tunnel: the directory in Redis says
    which replica holds it (it knows no pod, version or time), asked only for agents shown."""
    from kasd.web.wiring import RegistryAgents
    from routing.local import TunnelRegistry

    class Directory:
        def __init__(self) -> None:
            self.asked: list[int] = []

        async def holders(self, agent_id: int) -> frozenset[str]:
            self.asked.append(agent_id)
            return frozenset({"kasd-1"}) if agent_id == 1 else frozenset()

    directory = Directory()
    agents = RegistryAgents(TunnelRegistry(), "kasd-2", directory)  # type: ignore[arg-type]
    assert await agents.connections([1, 2]) == {
        1: [{"pod": None, "pod_uid": None, "pod_namespace": None, "node": None, "namespaces": None,
             "version": None, "since": None, "replica": "kasd-1"}]}
    assert directory.asked == [1, 2]
    assert await RegistryAgents(TunnelRegistry(), "kasd").connections([1]) == {}  # a lone kasd


async def test_a_sign_in_body_nested_deeper_than_pythons_stack_is_a_400_not_a_500() -> None:
    app, _ = _app()
    reply = await call(app, "POST", "/-/sign_in", [("content-type", "application/json")], b"[" * 100_000)
    assert reply.status == 400 and "token" in reply.json()["message"]


async def test_a_number_of_thousands_of_digits_anywhere_is_a_clear_4xx_never_a_500() -> None:
    # Python's int() refuses a string of over 4,300 digits: every id and number a request carries
    # (path, query, with or without credentials) is refused by its length before it gets there
    app, _ = _app()
    big = "1" * 5000
    for path, status in ((f"/api/kasd/v1/environments/{big}", 404), (f"/api/v4/projects/{big}/environments", 404),
                         (f"/api/v4/groups/{big}/environments", 404), (f"/api/v4/projects/42/environments/{big}", 404),
                         (f"/api/kasd/v1/environments/1/deployments?limit={big}", 400),
                         (f"/api/v4/projects/42/environments?page={big}", 400),
                         (f"/api/kasd/v1/environments/1/resources?agent={big}", 400),
                         (f"/api/kasd/v1/environments/1/pods/prod/hello-1/log?tailLines={big}", 400)):
        reply = await call(app, "GET", path, _token("alice"))
        assert reply.status == status, (path[:60], reply.status)
        assert "message" in reply.json() or "error" in reply.json()
    stranger = await call(app, "GET", f"/api/kasd/v1/environments/{big}/resources")
    assert stranger.status == 401  # (as for any id: who asks is checked first)


async def test_one_person_may_hold_only_a_few_live_streams_open_at_once(autojump_clock: trio.testing.MockClock) -> None:
    # each open graph stream or followed log holds a watch or a log stream through the agent: one
    # person (many tabs, a script, many source addresses) cannot open them without bound
    app, _ = _app(max_streams_per_user=2)
    leave = trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(_viewer, app, [], leave)
        await trio.testing.wait_all_tasks_blocked()
        for path in ("/api/kasd/v1/environments/1/resources/watch",
                     "/api/kasd/v1/environments/1/pods/prod/hello-1/log?follow=true"):
            with trio.fail_after(5):  # (a stream let through would never end)
                refused = await call(app, "GET", path, _token("alice"))
            assert refused.status == 429, (path, refused.status)
            assert "live streams" in refused.json()["message"] and refused.headers["retry-after"] == "10"
        leave.set()
    # closed streams give their places back
    log = await call(app, "GET", "/api/kasd/v1/environments/1/pods/prod/hello-1/log", _token("alice"))
    assert (log.status, log.body) == (200, b"line 1\nline 2\n")


async def test_who_sees_an_environment_in_a_group_listing_follows_its_projects_id_not_a_recorded_path() -> None:
    # group/infra's environment recorded when group/infra was called group/app (or before group/app
    # took the freed path): bob, a Reporter of today's group/app, must not see it, as by its id
    from tests.kasd.webfakes import ENVIRONMENTS, Environment
    stale = Environment(id=11, project_id=1, project="group/app", name="ops-old", slug="ops-old")
    snap = snapshot()
    web = WebApp(lambda: snap, FakeStore([*ENVIRONMENTS, stale]), FakeViews(), FakeAgents(), key=KEY,
                 graph_of=fake_graph)
    listed = await call(web, "GET", "/api/v4/groups/group/environments", _token("bob"))
    assert [e["id"] for e in listed.json()] == [1, 2, 3]
    assert (await call(web, "GET", "/api/kasd/v1/environments/11", _token("bob"))).status == 404


async def test_the_status_codes_the_app_answers_are_those_its_openapi_document_lists(
        autojump_clock: trio.testing.MockClock) -> None:
    doc = document()
    app, views = _app(max_streams_per_user=0)
    watch = "/api/kasd/v1/environments/{env_id}/resources/watch"
    answers = [("get", "/api/v4/projects/{project}/environments",
                await call(app, "GET", "/api/v4/projects/42/environments?states=gone", _token("bob"))),
               ("get", watch, await call(app, "GET", "/api/kasd/v1/environments/1/resources/watch", _token("alice"))),
               ("get", "/api/kasd/v1/environments/{env_id}/pods/{namespace}/{name}/log",
                await call(app, "GET", "/api/kasd/v1/environments/1/pods/prod/hello-1/log", _token("alice")))]
    views.unreachable = True
    answers.append(("get", "/api/kasd/v1/environments/{env_id}/resources",
                    await call(app, "GET", "/api/kasd/v1/environments/1/resources", _token("alice"))))
    assert [reply.status for _, _, reply in answers] == [400, 429, 429, 503]
    for method, path, reply in answers:
        responses = doc["paths"][path][method]["responses"]
        assert str(reply.status) in responses, (method, path, reply.status)
        schema = responses[str(reply.status)]["content"]["application/json"]["schema"]["$ref"].rpartition("/")[2]
        shapes = doc["components"]["schemas"][schema].get("oneOf") or [doc["components"]["schemas"][schema]]
        assert any(set(shape["required"]) == set(reply.json()) for shape in shapes), (path, reply.json())


async def test_an_object_nested_too_deeply_for_yaml_is_a_502_that_says_so_never_a_500() -> None:
    """A custom resource keeps unknown fields the tenant nests 900 deep: JSON reads it, the YAML
    dumper's recursion does not; the YAML view says so (and JSON still works)."""
    app, views = _app()
    deep: Any = "leaf"
    for _ in range(900):
        deep = {"a": deep}
    answer = views.request

    async def nested(viewer: Any, method: str, target: str, **kwargs: Any) -> Any:
        reply = await answer(viewer, method, target, **kwargs)
        if method == "GET" and target.endswith("/pods/hello-1"):
            reply = type(reply)(200, {**reply.body, "spec": deep})
        return reply

    views.request = nested  # type: ignore[method-assign]
    base = "/api/kasd/v1/environments/1/objects/_/v1/Pod/prod/hello-1"
    as_yaml = await call(app, "GET", base, [*_token("alice"), ("accept", "application/yaml")])
    assert as_yaml.status == 502 and "nested too deeply" in as_yaml.json()["message"]
    assert (await call(app, "GET", base, _token("alice"))).status == 200


async def test_a_reporter_of_the_config_project_does_not_see_the_agents_pods_nor_its_cluster() -> None:
    """GitLab shows agents to the Developer role and up: a Reporter gets what a stranger gets."""
    app, _ = _app()
    for user, shown in (("carol", []), ("alice", [1])):  # (carol: Reporter in group/infra; alice: user_access)
        listed = await call(app, "GET", "/api/kasd/v1/agents", _token(user))
        assert [a["id"] for a in listed.json()] == shown
        cluster = await call(app, "GET", "/api/kasd/v1/agents/1/cluster", _token(user))
        assert cluster.status == (200 if shown else 404)
