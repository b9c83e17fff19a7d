"""Events on the API port (``kasd.web.events``), in process with a real store (SQLite in memory) and
no deliverer: who may post and read (a Maintainer of the agent's config project, a user its
user_access admits, a CI job its ci_access admits; others 404/403 in GitLab's words), the
contract's shapes, dedup by id (200), 413 over 64 KiB, 429 + Retry-After when the queue is full,
and bad bodies named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kasd.authority import load_authorization
from kasd.config.events import EventSettings
from kasd.eventdelivery import EventDelivery
from kasd.restapi import RestApi
from kasd.store.sqlite import SqliteStore
from kasd.web import WebApp, mount
from kasd.web.events import EventsApi
from tests.kasd.helpers import AUTH, CI_SECRET, DIRECTORY, make_config
from tests.kasd.webfakes import USERS, FakeAgents, FakeStore, FakeViews, call, fake_graph

pytestmark = pytest.mark.timeout(30)

# erin: Maintainer of the agents' config project; alice: admitted by agent 1's user_access (Developer
# in group/app), not agent 2's; carol: Reporter in the config project; bob: nothing of group/infra
EVENT_USERS = [*USERS, {"username": "erin", "memberships": {"group/infra": "maintainer"}},
               {"username": "frank", "memberships": {"group/infra": "developer"}}]
TOKENS = {u["username"]: AUTH.personal_token(str(u["username"])) for u in EVENT_USERS}
TOKENS["carol"] = AUTH.personal_token("carol")


class Counts:
    def __init__(self) -> None:
        self.received = self.refused = 0

    def event_received(self) -> None:
        self.received += 1

    def event_refused(self) -> None:
        self.refused += 1


def _app(max_queued: int = 1000) -> tuple[Any, Counts, EventDelivery]:
    snap = load_authorization(make_config({**DIRECTORY, "users": EVENT_USERS}), None).snapshot
    store = SqliteStore.open_sync(":memory:", max_entries=10)
    delivery = EventDelivery(store, router=None,  # type: ignore[arg-type]  # (nothing delivers here)
                             settings=EventSettings(max_queued_per_agent=max_queued))
    counts = Counts()
    events = EventsApi(lambda: snap, delivery, counts=counts)
    web = WebApp(lambda: snap, FakeStore(), FakeViews(), FakeAgents(), key=b"k" * 32, graph_of=fake_graph,
                 extra_routes=events.routes())
    return mount(RestApi(lambda: snap), web), counts, delivery


def _as(user: str) -> list[tuple[str, str]]:
    return [("private-token", TOKENS[user]), ("content-type", "application/json")]


def _body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


async def test_who_may_post_and_read_an_agents_events_in_gitlabs_words() -> None:
    app, _, _ = _app()
    push = _body(type="push", payload={"ref": "main"})
    assert (await call(app, "POST", "/api/v4/agents/1/events", _as("erin"), push)).status == 202  # Maintainer
    assert (await call(app, "POST", "/api/v4/agents/1/events", _as("alice"), push)).status == 202  # user_access
    job = await call(app, "POST", "/api/v4/agents/1/events?job_token=" + CI_SECRET, body=push)  # ci_access
    assert job.status == 202
    assert (await call(app, "POST", "/api/v4/agents/1/events", [("job-token", CI_SECRET)], push)).status == 202
    refusals = [
        (await call(app, "POST", "/api/v4/agents/1/events", body=push), 401, "401 Unauthorized"),
        (await call(app, "POST", "/api/v4/agents/1/events", [("private-token", "nope")], push), 401, "401 Unauthorized"),
        (await call(app, "POST", "/api/v4/agents/2/events", _as("alice"), push), 404, "404 Agent Not Found"),
        (await call(app, "POST", "/api/v4/agents/1/events", _as("bob"), push), 404, "404 Agent Not Found"),
        (await call(app, "POST", "/api/v4/agents/1/events", _as("frank"), push), 403, "403 Forbidden"),
        # a Reporter of its configuration project does not see the agent (GitLab: Developer and up)
        (await call(app, "POST", "/api/v4/agents/1/events", _as("carol"), push), 404, "404 Agent Not Found"),
        (await call(app, "POST", "/api/v4/agents/99/events", _as("erin"), push), 404, "404 Agent Not Found"),
        (await call(app, "POST", "/api/v4/agents/" + "9" * 5000 + "/events", _as("erin"), push), 404, "404 Agent"),
        (await call(app, "GET", "/api/v4/agents/1/events", _as("bob")), 404, "404 Agent Not Found"),
        # a job whose project the agent's configuration never names cannot tell an agent from none
        (await call(app, "POST", "/api/v4/agents/1/events",
                    [("job-token", AUTH.job_token("elsewhere/app", job_id=9, user="alice"))], push), 404, "404 Agent"),
        (await call(app, "GET", "/api/v4/agents/1/events/x",
                    [("job-token", AUTH.job_token("elsewhere/app", job_id=9, user="alice"))]), 404, "404 Agent"),
        (await call(app, "GET", "/api/v4/agents/1/events", _as("dave")), 404, "404 Agent Not Found"),  # a Guest
    ]
    for reply, status, words in refusals:
        assert (reply.status, reply.json()["message"][:len(words)]) == (status, words), reply.json()
        assert "eyJ" not in reply.json()["message"]  # (no token quoted)
    listed = await call(app, "GET", "/api/v4/agents/1/events", _as("alice"))
    assert listed.status == 200 and len(listed.json()) == 4


async def test_an_event_is_queued_then_read_back_with_its_status_and_a_known_id_is_not_queued_again() -> None:
    app, counts, delivery = _app()
    posted = await call(app, "POST", "/api/v4/agents/1/events", _as("erin"),
                        _body(type="push", payload={"ref": "main"}, id="pipeline-7:push"))
    assert posted.status == 202 and posted.headers["cache-control"] == "no-store"
    event = posted.json()
    assert {k: event[k] for k in ("id", "type", "agent_id", "seq", "state", "attempts", "outcome", "delivered_at")} == \
        {"id": "pipeline-7:push", "type": "push", "agent_id": 1, "seq": 1, "state": "queued", "attempts": 0,
         "outcome": None, "delivered_at": None}
    again = await call(app, "POST", "/api/v4/agents/1/events", _as("erin"),
                       _body(type="other", payload=None, id="pipeline-7:push"))
    assert (again.status, again.json()["seq"], again.json()["type"]) == (200, 1, "push")
    made = await call(app, "POST", "/api/v4/agents/1/events", _as("erin"), _body(type="push"))
    assert made.status == 202 and len(made.json()["id"]) == 32 and made.json()["seq"] == 2
    await delivery.store.end_delivery(1, "pipeline-7:push", state="delivered", outcome="done", detail="200",
                                      pod="agentd-0", at=made.json()["posted_at"] + 0.5)
    status = (await call(app, "GET", "/api/v4/agents/1/events/pipeline-7:push", _as("alice"))).json()
    assert (status["state"], status["outcome"], status["pod"]) == ("delivered", "done", "agentd-0")
    queued = await call(app, "GET", "/api/v4/agents/1/events?state=queued", _as("alice"))
    assert [e["seq"] for e in queued.json()] == [2]
    assert (await call(app, "GET", "/api/v4/agents/1/events/nope", _as("alice"))).json() == \
        {"message": "404 Event Not Found"}
    assert (await call(app, "GET", "/api/v4/agents/1/events?state=lost", _as("alice"))).status == 400
    assert counts.received == 2


async def test_an_oversized_body_is_413_a_full_queue_429_and_bad_bodies_say_what_is_wrong() -> None:
    app, counts, _ = _app(max_queued=2)
    big = _body(type="push", payload="x" * (64 * 1024))
    reply = await call(app, "POST", "/api/v4/agents/1/events", _as("erin"), big)
    assert reply.status == 413 and "at most 65536 bytes" in reply.json()["message"]
    for _ in range(2):
        assert (await call(app, "POST", "/api/v4/agents/1/events", _as("erin"), _body(type="push"))).status == 202
    full = await call(app, "POST", "/api/v4/agents/1/events", _as("erin"), _body(type="push"))
    assert full.status == 429 and full.headers["retry-after"] == "5" and "max_queued_per_agent" in full.json()["message"]
    assert counts.refused == 1
    # another agent's queue is its own
    assert (await call(app, "POST", "/api/v4/agents/2/events", _as("erin"), _body(type="push"))).status == 202
    bad = {b"": "not JSON", b"[1]": "JSON object", b'{"type": "Push"}': "type must be",
           b'{"type": "push", "id": "a b"}': "id must be", b'{"type": "push", "extra": 1}': "unknown key 'extra'",
           b'{"type": "push", "payload": ' + b"[" * 30_000 + b"]" * 30_000 + b"}": "not JSON",
           b'{"type": "push", "payload": NaN}': "payload is not JSON",
           b'{"type": "push", "payload": 1e400}': "payload is not JSON",
           b'{"type": "push", "payload": {"url": "\\ud800"}}': "lone surrogate",
           b'{"type": "push", "payload": {"\\udfff": 1}}': "lone surrogate"}
    for body, words in bad.items():
        answer = await call(app, "POST", "/api/v4/agents/2/events", _as("erin"), body)
        assert answer.status in (400, 413) and words in answer.json()["message"], (body[:40], answer.json())
    # a body under the limit whose payload, written again as JSON, is over it (1E5 is 100000.0): what
    # is stored and sent to agentd is bounded, not only what was sent
    grows = b'{"type": "push", "payload": [' + b",".join([b"1E5"] * 15_000) + b"]}"
    assert len(grows) < 64 * 1024
    answer = await call(app, "POST", "/api/v4/agents/2/events", _as("erin"), grows)
    assert answer.status == 413 and "written as JSON" in answer.json()["message"], answer.json()


def test_the_openapi_document_describes_the_event_routes_and_their_answers() -> None:
    from kasd.web.openapi import document

    doc = document()
    for route in EventsApi(lambda: None, None).routes():  # type: ignore[arg-type,return-value]
        path = route.path
        assert path in doc["paths"], path
        assert {m.lower() for m in route.methods or ()} - {"head"} <= set(doc["paths"][path]), path
    post = doc["paths"]["/api/v4/agents/{agent_id}/events"]["post"]["responses"]
    assert {"200", "202", "400", "401", "403", "404", "413", "429", "503"} <= set(post)
