"""``GET /api/kasd/v1/config`` (the agents' configuration in force: Git commits or files) and
``POST /api/kasd/v1/config/refresh`` (a push hook: look for a new commit now; ``kasctl notify
--config-changed``).

Who may: a personal token (``PRIVATE-TOKEN`` or ``Authorization: Bearer``) of a user kasd knows.
``GET`` lists the config projects the caller has the Reporter role (or more) in. A refresh needs the
Developer role (or more) in the named config project (the role that may push to it: a refresh does
nothing a push would not), or, without a project, in at least one config project; a project the
caller cannot see is 404, as GitLab answers. A stranger (no token, a bad one, no role) is refused
before kasd does anything; a member's refreshes cost one look at the refs at a time, shared by every
caller waiting (``CiAuthority.refresh``), whatever their number; the body is at most ``MAX_BODY``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from kasd.authz.directory import Role
from kasd.authz.snapshot import Snapshot
from kasd.web.auth import UNAUTHORIZED, ApiRefusal, Caller, offered_token, project_for, verify_token
from kasd.web.shapes import iso

#: bytes of a refresh's body read (``{"project": "<path>"}``); more is 413
MAX_BODY = 4096
#: seconds a refresh waits for its look before answering 202 (the look goes on)
REFRESH_WAIT = 10.0


class ConfigAuthority(Protocol):
    """What these routes need of ``kasd.authority.CiAuthority``."""

    @property
    def snapshot(self) -> Snapshot: ...
    def config_state(self) -> dict[str, Any]: ...
    async def refresh(self, wait: float = ...) -> bool: ...


def _caller(request: Request, snapshot: Snapshot, now: float) -> Caller:
    token = offered_token(request)
    if token is None:
        raise ApiRefusal(401, f"{UNAUTHORIZED}: send a personal token as PRIVATE-TOKEN: <token> or Authorization: "
                              "Bearer <token>")
    return verify_token(snapshot, token, now)


def _config_projects(snapshot: Snapshot) -> list[str]:
    return sorted({agent.config_project for agent in snapshot.directory.agents})


def _visible(snapshot: Snapshot, caller: Caller, need: Role) -> set[str]:
    directory = snapshot.directory
    out = set()
    for path in _config_projects(snapshot):
        project = directory.project(path)
        role = directory.role_of(caller.username, project) if project is not None else None
        if role is not None and role >= need:
            out.add(path)
    return out


def _state(authority: ConfigAuthority, visible: set[str]) -> dict[str, Any]:
    state = authority.config_state()
    return {"source": state["source"], "projects": [
        {**p, "loaded_at": iso(p["loaded_at"])} for p in state["projects"] if p["project"] in visible]}


async def _project_of(request: Request) -> str | None:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise ApiRefusal(413, f"413 Payload Too Large: a refresh's body is at most {MAX_BODY} bytes")
    if not body.strip():
        return None
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # (a member's `[[[[…`: not a 500)
        raise ApiRefusal(400, "400 Bad Request: the body must be JSON: {\"project\": \"<config project path>\"} "
                              "or {\"project\": null}") from None
    if not isinstance(document, dict) or set(document) - {"project"}:
        raise ApiRefusal(400, "400 Bad Request: the body must be {\"project\": \"<config project path>\"} or "
                              "{\"project\": null}")
    project = document.get("project")
    if project is not None and (not isinstance(project, str) or not project or len(project) > 255):
        raise ApiRefusal(400, "400 Bad Request: project must be a config project's path or id, or null")
    return project


def config_routes(authority: ConfigAuthority, *, refresh: Callable[[float], Awaitable[bool]] | None = None,
                  clock: Callable[[], float] = time.time) -> list[BaseRoute]:
    """The two routes, for ``WebApp(extra_routes=…)``; ``refresh``: the look a refresh asks for
    (``kasd.gitrefresh.RefreshFanout.refresh`` among replicas), else ``authority.refresh``."""
    look = refresh if refresh is not None else authority.refresh

    async def show(request: Request) -> Response:
        snapshot = authority.snapshot
        caller = _caller(request, snapshot, clock())
        return JSONResponse(_state(authority, _visible(snapshot, caller, Role.REPORTER)),
                            headers={"cache-control": "no-store"})

    async def refresh_now(request: Request) -> Response:
        snapshot = authority.snapshot
        caller = _caller(request, snapshot, clock())
        ident = await _project_of(request)
        if ident is not None:
            project = project_for(snapshot, caller, ident, need=Role.DEVELOPER, explain=True)
            if project.path not in _config_projects(snapshot):
                raise ApiRefusal(404, f"404 Not Found: {project.path} is no agent's config project")
        elif not _visible(snapshot, caller, Role.DEVELOPER):
            raise ApiRefusal(403, "403 Forbidden: a refresh needs the Developer role in a config project")
        done = await look(REFRESH_WAIT)
        answer = _state(authority, _visible(authority.snapshot, caller, Role.REPORTER))
        return JSONResponse(answer, status_code=200 if done else 202, headers={"cache-control": "no-store"})

    return [Route("/api/kasd/v1/config", show, methods=["GET"]),
            Route("/api/kasd/v1/config/refresh", refresh_now, methods=["POST"])]


__all__ = ["MAX_BODY", "REFRESH_WAIT", "ConfigAuthority", "config_routes"]
