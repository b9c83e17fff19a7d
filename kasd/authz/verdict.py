"""The verdict on one bearer token for one agent: a ``Grant`` or an ``AccessDenied``.

One value each, from the verified token to the request it lets through: ``Snapshot.authorize``
gives them, the ``Authority`` seam (``kasd.seams``, which re-exports both) answers with them, the
pipeline acts on them and kasd's REST API reads them. They live here, in the pure package, because
the seam already depends on it (a grant names its managed resources): defining them in
``kasd.seams`` would make the two import each other and pull trio into authorization.
"""

from __future__ import annotations

import attrs

from kasd.authz.jobtokens import JobClaims
from kasd.authz.templates import ManagedResources
from tunnelhttp.head import Impersonation

__all__ = ["AccessDenied", "Grant"]


@attrs.frozen(kw_only=True)
class Grant:
    """Allowed: for which agent, as whom agentd acts, in which namespace, and what must exist first."""

    #: the token's kind: ``ci`` (a CI job token) or ``pat`` (a personal token)
    kind: str
    agent_id: int
    #: None: agentd acts as itself
    impersonate: Impersonation | None
    #: who this is, for logs (never the token): ``ci_job:42``, ``user:alice``
    subject: str
    #: how the agent acts: ``agent`` (itself: the only mode where the client's own
    #: ``Impersonate-*`` headers pass), ``impersonate``, ``ci_job``, ``ci_user`` or ``user``
    access_as: str = "agent"
    #: the namespace the request's kubeconfig context selects: a rule's, else the entry's default
    namespace: str | None = None
    #: the CI job's environment, if it deploys to one
    environment: str | None = None
    #: what must exist before the request goes on (a managed namespace): ``kasd.managed`` applies it
    managed: ManagedResources | None = None
    #: the verified job (``ci``): the token's own claims, never copied into another shape
    job: JobClaims | None = None
    #: the verified username (``pat``)
    user: str | None = None
    #: the ``ci_access`` entry that allowed the job (its kind and project or group path; None for
    #: ``instance`` and the implicit one): what ``GET /api/v4/job/allowed_agents`` shows as written
    entry_kind: str | None = None
    entry_id: str | None = None
    #: the token's expiry (seconds since the epoch): a remembered grant is good until then;
    #: None: not to be remembered
    expires_at: int | None = None

    @property
    def client_may_impersonate(self) -> bool:
        return self.access_as == "agent"


class AccessDenied(Exception):
    """Not allowed: ``status`` 401 (who are you?: the token proves nothing), 403 (not for this agent)
    or 503 (what the decision needs could not be read); ``message`` is safe to show the client (never
    the token)."""

    def __init__(self, status: int, message: str, *, principal: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        #: who was refused, when the credentials said it (``ci_job:42``, ``user:alice``): for the
        #: audit line, never the token
        self.principal = principal
