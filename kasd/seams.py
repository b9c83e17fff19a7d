"""The two seams of kasd's request pipeline: who may use an agent (``Authority``) and how a request
reaches it (``Router``), with the values and typed failures they answer with.

The pipeline (``kasd.k8sproxy.pipeline``) is given one of each and asks nothing else: the
implementations are CI job and personal tokens checked against the agents' configuration
(``kasd.authority.CiAuthority``) and the tunnel registry (``routing.local.LocalRouter``; among
replicas ``routing.router.ReplicatedRouter`` over it); neither touches a protocol front end. Tests
inject fakes.

May import: ``wire`` (a router answers with a logical stream), ``routing.errors`` (its failures),
``tunnelhttp`` (impersonation), ``kasd.authz`` (pure values: a grant's managed resources), the
standard library, attrs. Never the proxy, a front end or a listener.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from kasd.authz.templates import ManagedResources
from routing.errors import (
    AgentNotConnected,
    NoFreeStream,
    NoOtherSession,
    PeerUnreachable,
    RouteError,
)
from tunnelhttp.head import Impersonation
from wire.frames import Metadata
from wire.ids import InvalidNumber, parse_id
from wire.session import MuxStream, Session, StreamRefusedError

#: the bearer token formats on the Kubernetes API proxy port, as in GitLab
TOKEN_FORMATS = "ci:<agent id>:<job token> or pat:<agent id>:<token>"


# ------------------------------------------------------------------ Authority


@attrs.frozen(kw_only=True)
class Credentials:
    """What a client proved itself with: ``ci:<agent id>:<job token>`` or ``pat:<agent id>:<token>``."""

    kind: str
    agent_id: int
    #: never logged
    secret: str = attrs.field(repr=False)


@attrs.frozen(kw_only=True)
class Grant:
    """Allowed: for which agent, and as whom agentd acts."""

    kind: str
    agent_id: int
    #: None: agentd acts as itself
    impersonate: Impersonation | None
    #: who this is, for logs (never the token): ``ci_job:42``, ``user:alice``
    subject: str
    #: how the agent acts: ``agent`` (itself: the only mode where the client's own
    #: ``Impersonate-*`` headers pass), ``impersonate``, ``ci_job``, ``ci_user`` or ``user``
    access_as: str = "agent"
    #: the namespace the request's context selects (a rule's, else the entry's default)
    namespace: str | None = None
    #: the CI job's environment, if any
    environment: str | None = None
    #: what must exist before the request goes on (a managed namespace): ``kasd.managed`` applies it
    managed: ManagedResources | None = None

    @property
    def client_may_impersonate(self) -> bool:
        return self.access_as == "agent"


class AccessDenied(Exception):
    """Not allowed: ``status`` 401 (who are you?) or 403 (not for this agent); ``message`` is safe
    to show the client."""

    def __init__(self, status: int, message: str, *, principal: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        #: who was refused, when the credentials said it (``ci_job:42``, ``user:alice``): for the
        #: audit line, never the token
        self.principal = principal


class Authority(Protocol):
    async def authorize(self, credentials: Credentials, agent_id: int) -> Grant:
        """The grant of ``credentials`` for ``agent_id``; ``AccessDenied`` saying why not."""
        ...


def parse_bearer(authorization: str | None) -> Credentials:
    """An ``Authorization`` header → credentials, or AccessDenied(401) saying what is wrong."""
    if not authorization:
        raise AccessDenied(401, f"missing bearer token: send Authorization: Bearer {TOKEN_FORMATS}")
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise AccessDenied(401, f"bad token: expected Authorization: Bearer {TOKEN_FORMATS}")
    kind, sep1, rest = credentials.strip().partition(":")
    agent_text, sep2, secret = rest.partition(":")
    if kind not in ("ci", "pat") or not (sep1 and sep2) or not secret:
        raise AccessDenied(401, f"bad token: malformed, expected {TOKEN_FORMATS}")
    try:
        agent_id = parse_id(agent_text, "agent id")
    except InvalidNumber as exc:
        raise AccessDenied(401, f"bad token: {exc.message} (expected {TOKEN_FORMATS})") from None
    return Credentials(kind=kind, agent_id=agent_id, secret=secret)


# ------------------------------------------------------------------ Router

#: re-exported: the failures a router raises live in ``routing.errors`` (routing never imports kasd)
__all__ = [
    "TOKEN_FORMATS",
    "AccessDenied",
    "AgentNotConnected",
    "Authority",
    "Credentials",
    "Grant",
    "NoFreeStream",
    "NoOtherSession",
    "PeerUnreachable",
    "RouteError",
    "Router",
    "parse_bearer",
]


class Router(Protocol):
    async def open_stream(self, agent_id: int, metadata: Metadata, *,
                          avoid: frozenset[Session] = frozenset()) -> MuxStream:
        """A logical stream to ``agent_id`` opened with ``metadata`` (waiting, bounded, for one);
        a ``RouteError`` saying why not.

        ``avoid``: the sessions (``stream.session``) this request already tried; the stream is
        opened on none of them, and if one of them is the only usable session, ``NoOtherSession``
        is raised at once. Metadata no session could carry raises ``wire.errors.UnsendableFrameError``
        at once (a verdict on the request, never a reason to try another session).
        """
        ...

    def report(self, stream: MuxStream, refusal: StreamRefusedError | None) -> None:
        """How the agent answered a stream from ``open_stream``: it took it (``refusal`` None) or
        refused it. A router steers later requests by it: a session whose agent cannot reach its
        API server (``UPSTREAM_UNREACHABLE``) is passed over for a while."""
        ...
