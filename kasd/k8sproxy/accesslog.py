"""One structured line per proxied request — the audit line: who (the principal, and as whom the agent
acted), what (verb, path, namespace), which agent, the outcome, bytes and time. Never a token, never
a query string (it may carry anything)."""

from __future__ import annotations

import logging

import attrs
import trio

from daemonkit.logs import logfmt, redact_tokens

log = logging.getLogger("kasd.access")


@attrs.define(kw_only=True)
class RequestRecord:
    request_id: str
    method: str
    path: str
    protocol: str
    peer: str
    started: float = attrs.field(factory=trio.current_time)
    agent_id: int | None = None
    #: the principal: ``ci_job:<id>``, ``user:<name>`` (also on a 403, when the token said who)
    subject: str = ""
    #: how the agent acted (``agent``, ``impersonate``, ``ci_job``, ``ci_user``, ``user``)
    access_as: str = ""
    #: the grant's token kind (``ci``, ``pat``; None: no grant): the metrics' access type
    token_kind: str | None = None
    #: whom agentd impersonated, and with which groups (empty: the agent itself)
    as_user: str = ""
    as_groups: tuple[str, ...] = ()
    #: the Kubernetes verb and namespace, as kube-apiserver reads the request (``requestinfo``)
    verb: str = ""
    namespace: str = ""
    status: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    outcome: str = "ok"
    #: the whole response reached the client's connection: leaving afterwards is not "client-gone"
    answered: bool = False
    #: a response head went to the client (or began to): a failure now can only cut the answer short
    head_sent: bool = False

    @property
    def dropped(self) -> bool:
        """The client left before any answer began (an HTTP/2 stream reset, a connection lost)."""
        return self.status == 0 and self.outcome == "client-gone"

    def write(self) -> None:
        duration = trio.current_time() - self.started
        # The query string may carry anything; log the path only.
        log.info(
            "request request_id=%s method=%s path=%s proto=%s peer=%s agent=%s subject=%s access_as=%s as_user=%s as_groups=%s "
            "verb=%s namespace=%s status=%d bytes_in=%d bytes_out=%d duration=%.3f outcome=%s",
            self.request_id,
            self.method,
            redact_tokens(self.path.split("?", 1)[0])[:512],
            self.protocol,
            self.peer,
            self.agent_id if self.agent_id is not None else "-",
            logfmt(self.subject) if self.subject else "-",
            self.access_as or "-",
            logfmt(self.as_user[:256]) if self.as_user else "-",
            logfmt(",".join(self.as_groups)[:1024]) if self.as_groups else "-",
            self.verb or "-",
            logfmt(self.namespace[:253]) if self.namespace else "-",
            self.status,
            self.bytes_in,
            self.bytes_out,
            duration,
            self.outcome,
        )

