"""Who is asking, and what they may see: personal tokens (``PRIVATE-TOKEN`` or ``Authorization:
Bearer``, GitLab's), the session cookie, CSRF for cookie calls that change state, a project's or
group's role from the directory (a project the user cannot see is 404, as GitLab answers), and an
agent's ``user_access`` for what runs through it."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import parse_qsl

import attrs
from starlette.requests import Request

from kasd.authz.directory import Group, Project, Role
from kasd.authz.jobtokens import TokenInvalid, verify_personal_token
from kasd.authz.policy import authorize_user
from kasd.authz.snapshot import Snapshot
from kasd.environments.values import Viewer
from kasd.seams import AccessDenied, parse_bearer
from kasd.web.session import COOKIE, BrowserSession, SessionSigner
from routing.retry import (
    SAFE_METHODS,  # HTTP's safe methods (RFC 9110 §9.2.1): change nothing, no CSRF token asked
)


class ApiRefusal(Exception):
    """An answer in GitLab's words: ``{"message": "404 Project Not Found"}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, *, key: str = "message") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        #: "message", or "error" for a parameter that fails GitLab's (Grape's) validation
        self.key = key


UNAUTHORIZED = "401 Unauthorized"
#: the most digits an id or a number of a request may have (ids are 63-bit: 19 digits); longer is no
#: id at all, never handed to ``int()`` (which refuses over 4,300 digits and is slow well before)
MAX_DIGITS = 19


def small_int(text: str) -> int | None:
    """``text`` as a whole number when it is ASCII digits only and at most ``MAX_DIGITS`` of them, else None."""
    return int(text) if 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit() else None


@attrs.frozen(kw_only=True)
class Caller:
    username: str
    #: how: "token" (PRIVATE-TOKEN / Bearer) or "session" (the cookie)
    via: str
    session: BrowserSession | None = None
    #: until when (seconds since the epoch) the proof holds
    expires: int = 0
    token_id: str = ""
    #: the ``kid`` of the key that signed the token
    key_id: str = ""


def _header(request: Request, name: str) -> str | None:
    value = request.headers.get(name)
    return value.strip() if value is not None and value.strip() else None


def offered_token(request: Request) -> str | None:
    """A personal token as GitLab's API reads one from a header: ``PRIVATE-TOKEN``, else
    ``Authorization: Bearer``. (GitLab's ``?private_token=`` is not read: a token in a URL ends up
    in histories and logs.)"""
    token = _header(request, "private-token")
    if token:
        return token
    authorization = _header(request, "authorization")
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            # the proxy port's form (pat:<agent id>:<token>, read as the proxy reads it) carries the
            # same personal token
            try:
                credentials = parse_bearer(authorization)
            except AccessDenied:
                return value.strip()
            return credentials.secret if credentials.kind == "pat" else value.strip()
        raise ApiRefusal(401, f"{UNAUTHORIZED}: send a personal token as PRIVATE-TOKEN: <token> or Authorization: "
                           "Bearer <token>")
    return None


def verify_token(snapshot: Snapshot, token: str, now: float) -> Caller:
    """The user a personal token proves, or 401 saying which check failed."""
    t = snapshot.tokens
    if t.keyset is None:
        raise ApiRefusal(401, f"{UNAUTHORIZED}: kasd verifies no tokens (authorization.tokens.public_keys is empty)")
    try:
        claims = verify_personal_token(token, t.keyset, audience=t.audience, issuer=t.issuer, now=now, leeway=t.leeway,
                                       revoked=t.revoked)
    except TokenInvalid as exc:
        raise ApiRefusal(401, f"{UNAUTHORIZED}: personal token {exc.reason}") from None
    if snapshot.directory.user(claims.user) is None:
        raise ApiRefusal(401, f"{UNAUTHORIZED}: user {claims.user!r} is not known to kasd")
    assert claims.stamp is not None
    return Caller(username=claims.user, via="token", expires=claims.stamp.expires_at, token_id=claims.stamp.token_id,
                  key_id=claims.stamp.key_id)


def authenticate(request: Request, snapshot: Snapshot, signer: SessionSigner, now: float) -> Caller:
    """The caller of ``request`` (a token wins over a cookie), or 401; a cookie call that changes
    state without the session's CSRF token is 403."""
    token = offered_token(request)
    if token is not None:
        return verify_token(snapshot, token, now)
    session = signer.read(request.cookies.get(COOKIE), now)
    if session is None:
        raise ApiRefusal(401, UNAUTHORIZED)
    # what would refuse the token now refuses its session: its id revoked, its signing key taken out
    # of authorization.tokens.public_keys (rotation after a leak), its user gone
    keyset = snapshot.tokens.keyset
    if session.token_id in snapshot.tokens.revoked or keyset is None or keyset.get(session.key_id) is None \
            or snapshot.directory.user(session.user) is None:
        raise ApiRefusal(401, f"{UNAUTHORIZED}: the session's token is revoked, its signing key is no longer "
                              "trusted, or its user is no longer known")
    if request.method not in SAFE_METHODS:
        offered = _header(request, "x-csrf-token") or csrf_query(request)
        if not signer.csrf_ok(session, offered):
            raise ApiRefusal(403, "403 Forbidden: a call made with the session cookie that changes something needs the "
                               "session's CSRF token (X-CSRF-Token header, from the sign-in answer or GET /-/session)")
    return Caller(username=session.user, via="session", session=session, expires=session.expires,
                  token_id=session.token_id, key_id=session.key_id)


def csrf_query(request: Request) -> str | None:
    query = request.scope.get("query_string", b"").decode("latin-1")
    return dict(parse_qsl(query)).get("csrf_token") if "csrf_token" in query else None


T = TypeVar("T")


def _by_id_or_path(ident: str, by_id: Callable[[int], T | None], by_path: Callable[[str], T | None]) -> T | None:
    """A project or group named as GitLab's API names one: its id (ASCII digits; more than
    ``MAX_DIGITS`` of them is no id, and no path either), else its full path."""
    if ident.isascii() and ident.isdigit():
        number = small_int(ident)
        return by_id(number) if number is not None else None
    return by_path(ident)


def project_for(snapshot: Snapshot, caller: Caller, ident: str, *, need: Role = Role.REPORTER,
                explain: bool = False) -> Project:
    """The project named by ``ident`` (its id, or its full path) if ``caller`` may see it: 404 when
    not (unknown or not a member: GitLab does not tell them apart), 403 below ``need`` (GitLab's
    bare ``403 Forbidden``; kasd's own paths, ``explain``, say which role)."""
    directory = snapshot.directory
    project = _by_id_or_path(ident, directory.project_by_id, directory.project)
    role = directory.role_of(caller.username, project) if project is not None else None
    if project is None or role is None:
        raise ApiRefusal(404, "404 Project Not Found")
    if role < need:
        raise ApiRefusal(403, f"403 Forbidden: this needs the {need.name.title()} role in {project.path}" if explain
                      else "403 Forbidden")
    return project


def group_for(snapshot: Snapshot, caller: Caller, ident: str) -> Group:
    directory = snapshot.directory
    group = _by_id_or_path(ident, directory.group_by_id, directory.group)
    # a member of one of its projects sees it too (as GitLab shows a private group to them)
    if group is None or (directory.group_role(caller.username, group) is None and not any(
            p.path.lower().startswith(group.path.lower() + "/") and directory.role_of(caller.username, p) is not None
            for p in directory.projects)):
        raise ApiRefusal(404, "404 Group Not Found")
    return group


def viewer_for(snapshot: Snapshot, caller: Caller, agent_id: int) -> Viewer:
    """As whom ``caller`` sees through agent ``agent_id`` (its ``user_access``), or 403 with why not."""
    compiled = snapshot.agents.get(agent_id)
    if compiled is None:
        raise ApiRefusal(403, f"403 Forbidden: agent {agent_id} is not known")
    decision = authorize_user(snapshot.directory, agent_id, compiled.config, caller.username)
    if not decision.allowed:
        raise ApiRefusal(403, f"403 Forbidden: {decision.reason}")
    key = "agent" if decision.identity is None else f"user:{caller.username}"
    return Viewer(agent_id, identity=decision.identity, key=key)


class SignInLimit:
    """At most ``burst`` sign-in attempts per source, refilled at ``per_minute``; ``max_sources``
    sources remembered (the oldest forgotten first), so a stranger's cost is bounded."""

    def __init__(self, clock: Callable[[], float], *, per_minute: float = 10.0, burst: int = 10,
                 max_sources: int = 10_000) -> None:
        self._clock = clock
        self._rate = per_minute / 60.0
        self._burst = burst
        self._max = max_sources
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def take(self, source: str) -> float:
        """0 when allowed now; else seconds until the next attempt is."""
        now = self._clock()
        tokens, at = self._buckets.pop(source, (float(self._burst), now))
        tokens = min(float(self._burst), tokens + (now - at) * self._rate)
        if tokens < 1.0:
            self._buckets[source] = (tokens, now)
            return (1.0 - tokens) / self._rate
        self._buckets[source] = (tokens - 1.0, now)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return 0.0
