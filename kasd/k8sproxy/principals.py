"""How many requests each principal has open at once, and the cap on it.

A principal is whoever holds one token (its kind and secret: the key lives in memory only while
that token has requests open, and is never logged — log lines name the grant's subject). A request
counts from authorization until its exchange is over, so a watch, ``logs -f`` or an exec session
holds its slot for as long as it runs. Beyond ``limit`` a request gets ``429`` with ``Retry-After``
(client-go waits and retries on its own).

May import: the standard library, this package's ``status``.
"""

from __future__ import annotations

from collections.abc import Hashable

from kasd.k8sproxy.status import ProxyError

#: what the client is told to wait before trying again, in seconds (kube-apiserver's own 429 says 1)
RETRY_AFTER = 1


class PrincipalRequests:
    """Open requests per principal; the table holds only principals with at least one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[Hashable, int] = {}

    def acquire(self, principal: Hashable, subject: str) -> None:
        """Count one more request of ``principal``, or raise ProxyError(429) naming ``subject``."""
        held = self._open.get(principal, 0)
        if held >= self.limit:
            raise ProxyError(
                429,
                f"too many requests at once: {subject} has {held} open, the most kasd allows one token "
                f"(kubernetes_api.max_requests_per_principal); retry once one has ended",
                (("retry-after", str(RETRY_AFTER)),),
            )
        self._open[principal] = held + 1

    def release(self, principal: Hashable) -> None:
        held = self._open[principal] - 1
        if held:
            self._open[principal] = held
        else:
            del self._open[principal]

    @property
    def principals(self) -> int:
        """Principals with a request open."""
        return len(self._open)
