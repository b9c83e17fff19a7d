"""Events pushed to agents on the API port (issue 28; docs/events.md):

- ``POST /api/v4/agents/<id>/events`` ``{"type", "payload", "id"?}`` → 202 and the queued event; an id
  already known for that agent → 200 and that event (nothing queued); a body over 64 KiB → 413; the
  agent's queue full → 429 with ``Retry-After``;
- ``GET /api/v4/agents/<id>/events/<event id>`` → the event's delivery status;
- ``GET /api/v4/agents/<id>/events?state=…`` → the agent's kept events, newest first (at most 100).

Who may (the same for reading and posting): a personal token (``PRIVATE-TOKEN`` or ``Authorization:
Bearer``) of a user with the Maintainer role or more in the agent's configuration project, or one
the agent's ``user_access`` admits; or a CI job token (``JOB-TOKEN`` header, ``job_token``
parameter) of a job the agent's ``ci_access`` admits (a pipeline telling the cluster of a push).
An agent the caller cannot see is 404, as GitLab answers; one it sees but may not notify is 403.
The session cookie is not accepted here (the dashboard does not post events; a token is asked).

May import: ``kasd.web.auth``, ``kasd.authz``, ``kasd.restapi`` (how GitLab reads a job token),
``kasd.store`` (the values and the errors), ``kasd.eventdelivery`` (the poster), starlette, the
standard library.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kasd.authz.directory import Role
from kasd.authz.policy import authorize_user
from kasd.authz.snapshot import Snapshot
from kasd.authz.verdict import AccessDenied
from kasd.authz.visibility import job_sees_agent, user_sees_agent
from kasd.restapi import job_token_of
from kasd.store.events import (
    EVENT_ID,
    EVENT_TYPE,
    MAX_EVENT_BODY,
    MAX_LISTED,
    STATES,
    QueuedEvent,
    QueueFull,
)
from kasd.web.auth import UNAUTHORIZED, ApiRefusal, offered_token, small_int, verify_token

#: seconds a client refused for a full queue is told to wait (``Retry-After``)
RETRY_AFTER = 5
_KEYS = {"type", "payload", "id"}


class EventPoster(Protocol):
    """``kasd.eventdelivery.EventDelivery``: posts, and its ``store`` answers the status."""

    async def post(self, agent_id: int, event_type: str, payload: str, event_id: str | None = None
                   ) -> tuple[QueuedEvent, bool]: ...

    async def status(self, agent_id: int, event_id: str) -> QueuedEvent | None: ...

    async def listing(self, agent_id: int, state: str | None) -> list[QueuedEvent]: ...


class Counts(Protocol):
    def event_received(self) -> None: ...
    def event_refused(self) -> None: ...


class EventsApi:
    """The routes (``routes()``); ``snapshot()`` is the authorization in force."""

    def __init__(self, snapshot: Callable[[], Snapshot], poster: EventPoster, *, counts: Counts | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._snapshot = snapshot
        self._poster = poster
        self._counts = counts
        self._clock = clock

    def routes(self) -> list[Route]:
        return [
            Route("/api/v4/agents/{agent_id}/events", self.post, methods=["POST"]),
            Route("/api/v4/agents/{agent_id}/events", self.listing, methods=["GET"]),
            Route("/api/v4/agents/{agent_id}/events/{event_id}", self.status, methods=["GET"]),
        ]

    # ------------------------------------------------------------------ who

    def _authorize(self, request: Request) -> int:
        """The agent of the path, once the caller may notify it; else 401/403/404 in GitLab's words."""
        snapshot, now = self._snapshot(), self._clock()
        agent_id = small_int(str(request.path_params["agent_id"]))
        agent = snapshot.directory.agent(agent_id) if agent_id is not None else None
        personal = offered_token(request)
        job_token = job_token_of(cast(dict[str, Any], request.scope)) if personal is None else None
        if job_token is not None:
            try:
                claims = snapshot.verify_job(job_token, now=now)
            except AccessDenied as exc:
                raise ApiRefusal(401, f"{UNAUTHORIZED}: {exc.message}") from None
            if agent is None or agent_id is None:
                raise ApiRefusal(404, "404 Agent Not Found")
            try:
                snapshot.decide_job(claims, agent_id)
            except AccessDenied as exc:
                compiled = snapshot.agents.get(agent_id)
                if not job_sees_agent(snapshot.directory, agent_id, compiled.config if compiled else None, claims):
                    raise ApiRefusal(404, "404 Agent Not Found") from None
                raise ApiRefusal(403, f"403 Forbidden: {exc.message.removeprefix('forbidden: ')}") from None
            return agent_id
        if personal is None:
            raise ApiRefusal(401, f"{UNAUTHORIZED}: send a personal token (PRIVATE-TOKEN or Authorization: Bearer) "
                                  "or a CI job token (JOB-TOKEN)")
        caller = verify_token(snapshot, personal, now)
        if agent is None or agent_id is None:
            raise ApiRefusal(404, "404 Agent Not Found")
        directory = snapshot.directory
        config_project = directory.project(agent.config_project)
        role = directory.role_of(caller.username, config_project) if config_project is not None else None
        if role is not None and role >= Role.MAINTAINER:
            return agent_id
        compiled = snapshot.agents.get(agent_id)
        if compiled is not None and authorize_user(directory, agent_id, compiled.config, caller.username).allowed:
            return agent_id
        if not user_sees_agent(directory, agent_id, compiled.config if compiled is not None else None,
                               caller.username):  # (the agent is not theirs to see: as one that does not exist)
            raise ApiRefusal(404, "404 Agent Not Found")
        raise ApiRefusal(403, f"403 Forbidden: events to agent {agent_id} need the Maintainer role in "
                              f"{agent.config_project} or the agent's user_access")

    # ------------------------------------------------------------------ the routes

    async def post(self, request: Request) -> Response:
        agent_id = self._authorize(request)
        event_type, payload, event_id = parse_event(await _body(request))
        try:
            event, new = await self._poster.post(agent_id, event_type, payload, event_id)
        except QueueFull as exc:
            if self._counts is not None:
                self._counts.event_refused()
            raise ApiRefusal(429, f"429 Too Many Requests: {exc}", {"Retry-After": str(RETRY_AFTER)}) from None
        if new and self._counts is not None:
            self._counts.event_received()
        return JSONResponse(event.status_json(), status_code=202 if new else 200, headers={"cache-control": "no-store"})

    async def status(self, request: Request) -> Response:
        agent_id = self._authorize(request)
        event_id = str(request.path_params["event_id"])
        event = await self._poster.status(agent_id, event_id) if EVENT_ID.fullmatch(event_id) else None
        if event is None:
            raise ApiRefusal(404, "404 Event Not Found")
        return JSONResponse(event.status_json(), headers={"cache-control": "no-store"})

    async def listing(self, request: Request) -> Response:
        agent_id = self._authorize(request)
        state = request.query_params.get("state") or None
        if state is not None and state not in STATES:
            raise ApiRefusal(400, f"state does not have a valid value: one of {', '.join(STATES)}", key="error")
        events = await self._poster.listing(agent_id, state)
        return JSONResponse([e.status_json() for e in events[:MAX_LISTED]], headers={"cache-control": "no-store"})


async def _body(request: Request) -> bytes:
    """The request's body, at most ``MAX_EVENT_BODY`` bytes (413 beyond, read no further)."""
    too_large = ApiRefusal(413, f"413 Request Entity Too Large: an event's body is at most {MAX_EVENT_BODY} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > 9 or int(declared) > MAX_EVENT_BODY):
        raise too_large
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_EVENT_BODY:
                raise too_large
    except ClientDisconnect:
        raise ApiRefusal(400, "400 Bad Request: the body ended early") from None
    return bytes(body)


def parse_event(body: bytes) -> tuple[str, str, str | None]:
    """(type, the payload as compact JSON text, id or None) of a POST's body; 400 naming what is wrong."""
    def bad(what: str) -> ApiRefusal:
        return ApiRefusal(400, f"400 Bad Request: {what}")

    try:
        data: Any = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad('the body is not JSON: send {"type": "...", "payload": ..., "id": "..."}') from None
    if not isinstance(data, dict):
        raise bad('the body must be a JSON object: {"type": "...", "payload": ..., "id": "..."}')
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise bad(f"unknown key {unknown[0][:64]!r}: an event has type, payload and id")
    event_type = data.get("type")
    if not isinstance(event_type, str) or not EVENT_TYPE.fullmatch(event_type):
        raise bad("type must be 1-128 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit")
    event_id = data.get("id")
    if event_id is not None and (not isinstance(event_id, str) or not EVENT_ID.fullmatch(event_id)):
        raise bad("id must be 1-128 characters of A-Z, a-z, 0-9, '.', '_', ':' or '-'")
    try:
        payload = json.dumps(data.get("payload"), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError):
        raise bad("payload is not JSON that can be sent on (NaN or Infinity, or nested too deep)") from None
    try:  # JSON's \ud800 escape spells a lone surrogate, which no UTF-8 store, stream or receiver can hold
        stored = payload.encode("utf-8")
    except UnicodeEncodeError:
        raise bad("payload holds a lone surrogate (an unpaired \\ud800-\\udfff escape): not Unicode text") from None
    if len(stored) > MAX_EVENT_BODY:
        # written again it can be longer than sent (1E5 is 100000.0): what is stored and sent is bounded
        raise ApiRefusal(413, f"413 Request Entity Too Large: the payload, written as JSON, is {len(stored)} bytes; "
                              f"an event's payload is at most {MAX_EVENT_BODY} bytes")
    return event_type, payload, event_id


__all__ = ["MAX_EVENT_BODY", "RETRY_AFTER", "EventPoster", "EventsApi", "parse_event"]
