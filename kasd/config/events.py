"""``events:``: events pushed to agents (``kasd.store.events``, docs/events.md): how many wait per
agent, how long, and how long their status is kept."""

from __future__ import annotations

import attrs

from daemonkit.settings import setting
from kasd.config.store import _duration
from kasd.config.values import parse_count

DEFAULT_MAX_QUEUED = 1000
DEFAULT_TTL = 3600.0
DEFAULT_KEEP_FOR = 3600.0
DEFAULT_MAX_KEPT = 1000
DEFAULT_DELIVERY_TIMEOUT = 60.0


@attrs.frozen(kw_only=True)
class EventSettings:
    """``events:``: how many events wait per agent, how long, and how long their status is kept."""

    max_queued_per_agent: int = setting(
        DEFAULT_MAX_QUEUED, parse=parse_count, env="KASD_EVENTS_MAX_QUEUED_PER_AGENT",
        flag="--events-max-queued-per-agent", metavar="N",
        help="undelivered events kept per agent; a POST past it is answered 429 with Retry-After",
    )
    ttl: float = setting(
        DEFAULT_TTL, parse=_duration, env="KASD_EVENTS_TTL", flag="--events-ttl", metavar="DURATION",
        help="how long an event waits for delivery before it expires (seconds, or 30m, 1h…)",
    )
    keep_for: float = setting(
        DEFAULT_KEEP_FOR, parse=_duration, env="KASD_EVENTS_KEEP_FOR", flag="--events-keep-for", metavar="DURATION",
        help="how long a delivered, failed or expired event's status is kept for GET",
    )
    max_kept_per_agent: int = setting(
        DEFAULT_MAX_KEPT, parse=parse_count, env="KASD_EVENTS_MAX_KEPT_PER_AGENT",
        flag="--events-max-kept-per-agent", metavar="N",
        help="ended events whose status is kept per agent, the newest",
    )
    delivery_timeout: float = setting(
        DEFAULT_DELIVERY_TIMEOUT, parse=_duration, env="KASD_EVENTS_DELIVERY_TIMEOUT",
        flag="--events-delivery-timeout", metavar="SECONDS",
        help="how long one delivery may wait for agentd's answer (longer than agentd's events.retry_for)",
    )


__all__ = ["EventSettings"]
