"""``ServiceProxy``: the handler of logical streams of kind ``service`` — one HTTP exchange with an
in-cluster service of agentd's allow-list (``agentd.services``).

The stream's OPEN is a ``RequestHead`` naming the service; its target is relative to the service's
URL. A service agentd does not have is REFUSEd (``UNKNOWN_TARGET``); a target that could be read
two ways is answered ``400`` and a method or path the allow-list does not cover ``403``, each as a
Kubernetes-style ``Status`` saying why. The rest goes through the service's own ``UpstreamPool``
exactly as a Kubernetes API request does (``agentd.proxy.StreamProxy``): bodies stream both ways,
a ``101`` becomes a raw pipe, no response head in time is a ``504`` and an unreachable service a
REFUSE with ``UPSTREAM_UNREACHABLE``. agentd adds the service's credential; whatever
``Authorization``, ``Cookie``, ``PRIVATE-TOKEN``, ``JOB-TOKEN`` or ``Proxy-Authorization`` the head
carried is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import attrs
import trio

from agentd.proxy import ExchangeCounters, StreamProxy, UpstreamRequestRecord, answer_status, refuse
from agentd.services import CredentialsError, ServiceSettings, ServiceTarget, check_request
from agentd.upstream import UpstreamPool
from tunnelhttp.drain import Drain
from tunnelhttp.head import RequestHead, TunnelCode
from tunnelhttp.kinds import KIND_SERVICE
from wire.errors import RemoteProtocolError
from wire.session import MuxStream

log = logging.getLogger("agentd.services")

#: what kasd's clients authenticate to kasd with: never a service's business (``Authorization`` is
#: replaced by the pool with agentd's own credential, or dropped)
KASD_CREDENTIAL_HEADERS = frozenset({"cookie", "private-token", "job-token", "proxy-authorization"})


class _Service:
    def __init__(self, settings: ServiceSettings, connect_timeout: float) -> None:
        self.settings = settings
        self.target = ServiceTarget.for_service(settings)
        self.pool = UpstreamPool(self.target, connect_timeout=connect_timeout,
                                 response_header_timeout=settings.response_header_timeout)


class ServiceProxy(StreamProxy):
    """Serves streams of kind ``service`` against agentd's allow-list, one pool per service."""

    kind = KIND_SERVICE
    status_prefix = "agentd: "

    def __init__(self, services: Sequence[ServiceSettings], *,
                 on_done: Callable[[UpstreamRequestRecord], None] | None = None, drain: Drain | None = None,
                 connect_timeout: float = 10.0) -> None:
        super().__init__(on_done=on_done, drain=drain)
        self.services = {service.name: _Service(service, connect_timeout) for service in services}

    def pool(self, name: str) -> UpstreamPool:
        return self.services[name].pool

    async def aclose(self) -> None:
        for service in self.services.values():
            await service.pool.aclose()

    async def bad_head(self, stream: MuxStream, problem: RemoteProtocolError, counters: ExchangeCounters) -> None:
        target = stream.metadata.get("target") if isinstance(stream.metadata, dict) else None
        if isinstance(target, str) and not target.startswith("/"):
            # A head that is whole but for its target: the client's path, answered as any bad path.
            counters.status, counters.outcome = 400, "bad-target"
            await answer_status(stream, 400, "BadRequest", "agentd: refusing the path: the path must start with /",
                                counters)
            return
        await super().bad_head(stream, problem, counters)

    async def route(self, stream: MuxStream, head: RequestHead,
                    counters: ExchangeCounters) -> tuple[UpstreamPool, RequestHead] | None:
        service = self.services.get(head.service) if head.service is not None else None
        if service is None:
            counters.outcome = "refused"
            shown = (head.service or "")[:64]
            await refuse(stream, TunnelCode.UNKNOWN_TARGET, f"agentd has no service named {shown!r}")
            return None
        verdict = check_request(service.settings, head.method, head.target)
        if verdict is not None:
            counters.status = verdict.status
            counters.outcome = "bad-target" if verdict.status == 400 else "forbidden"
            await answer_status(stream, verdict.status, verdict.reason, verdict.message, counters)
            return None
        if service.target.credentials is not None:
            try:
                service.target.credentials.refresh()
            except CredentialsError as exc:
                log.error("service credentials unusable service=%s error=%r", service.settings.name, str(exc))
                counters.outcome = "refused"
                await refuse(stream, TunnelCode.UPSTREAM_UNREACHABLE,
                             f"agentd cannot read the credentials of service {service.settings.name!r} "
                             "(its log says why)")
                return None
        await trio.lowlevel.checkpoint()
        # kasd strips its clients' credentials; should one slip through, it still stops here.
        headers = tuple((name, value) for name, value in head.headers if name not in KASD_CREDENTIAL_HEADERS)
        return service.pool, attrs.evolve(head, headers=headers)


__all__ = ["ServiceProxy"]
