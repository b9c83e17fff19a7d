"""Whether agentd can reach its Kubernetes API server, for ``/readiness``.

Every connection agentd opens to the API server (the proxy's, cluster discovery's, this check's)
reports its outcome here, and a light ``GET /version`` every ``CHECK_INTERVAL`` seconds (bounded by
``CHECK_TIMEOUT``) keeps the answer fresh while nothing else is asked. Any HTTP answer, even 401 or
403, means the server is reachable: readiness is about the network path and TLS, not about what the
service account may do.
"""

from __future__ import annotations

import logging

import trio

from agentd.upstream import UpstreamPool, UpstreamTimeout, UpstreamUnreachable, exchange

log = logging.getLogger("agentd.apicheck")

#: seconds between two checks of the API server
CHECK_INTERVAL = 10.0
#: seconds one check may take (connect, TLS handshake and answer)
CHECK_TIMEOUT = 5.0
#: the check reads no more than this of the answer (``/version`` is a few hundred bytes)
_MAX_ANSWER = 64 * 1024


class ApiServerReachability:
    """The outcome of the latest connection to the API server: ``unreachable`` is None (reachable,
    or not tried yet) or why it could not be reached. ``checked`` is set once anything was tried."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.unreachable: str | None = None
        self.checked = trio.Event()

    def connected(self, failure: str | None) -> None:
        """A connection to the API server was made (None) or failed (why)."""
        if failure is not None and self.unreachable is None:
            log.warning("the API server is unreachable url=%s error=%r", self.url, failure)
        elif failure is None and self.unreachable is not None:
            log.info("the API server is reachable again url=%s", self.url)
        self.unreachable = failure
        self.checked.set()

    async def run(self, pool: UpstreamPool, *, interval: float = CHECK_INTERVAL,
                  each_within: float = CHECK_TIMEOUT) -> None:
        """Check every ``interval`` seconds through ``pool`` (one whose ``on_connect`` is ``connected``)."""
        while True:
            await self.check(pool, within=each_within)
            await trio.sleep(interval)

    async def check(self, pool: UpstreamPool, *, within: float = CHECK_TIMEOUT) -> None:
        """One ``GET /version``, given ``within`` seconds."""
        try:
            with trio.fail_after(within):
                await exchange(pool, "GET", "/version", [("accept", "application/json"),
                                                         ("user-agent", "agentd-readiness")],
                               None, max_response=_MAX_ANSWER)
        except UpstreamUnreachable:
            pass  # the pool reported it (its on_connect), with the reason
        except (trio.TooSlowError, UpstreamTimeout):
            self.connected(f"no answer to GET /version within {within:g}s")
        except Exception as exc:  # lost mid-answer, an answer too large: it answered, so reachable
            log.debug("API server check answered oddly error=%s", type(exc).__name__)
            self.connected(None)
        else:
            self.connected(None)


__all__ = ["CHECK_INTERVAL", "CHECK_TIMEOUT", "ApiServerReachability"]
