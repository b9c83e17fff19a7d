"""Events pushed to agents (issue 28; docs/events.md): the values the store keeps, the limits a
poster meets, and ``events:`` (``EventSettings``, one field of kasd's ``Config``).

Each agent has its own queue in the store (``kasd.store.sqlite`` for a lone kasd, ``kasd.store.redis``
among replicas: a Redis Stream per agent), so a replica's death loses nothing. An event is posted
(``queued``, numbered ``seq`` in its agent's order), delivered by one replica at a time
(``delivering``, ``attempts`` counted), and ends ``delivered`` (agentd answered done, duplicate or
ignored), ``failed`` (agentd answered failed) or ``expired`` (not delivered within ``events.ttl``).
Undelivered events are bounded per agent (``max_queued_per_agent``: the 429 past it); ended ones
are kept for their status for ``keep_for`` seconds, at most ``max_kept_per_agent`` of them, without
their payload (dropped when the event ends: a kept status costs a few hundred bytes, not 64 KiB).
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from kasd.config.events import EventSettings

#: the most bytes a POST's body may have (413 beyond)
MAX_EVENT_BODY = 64 * 1024
#: an event's type and id (the contract's)
EVENT_TYPE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
EVENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: states an event passes through; ``UNDELIVERED`` are the queue's
STATES = ("queued", "delivering", "delivered", "failed", "expired")
UNDELIVERED = ("queued", "delivering")
#: agentd's answers (ACCEPT ``outcome``) and the state each ends an event in
OUTCOMES = {"done": "delivered", "duplicate": "delivered", "ignored": "delivered", "failed": "failed"}
#: the most characters of agentd's ``detail`` kept
MAX_DETAIL = 1024
#: events one status listing answers with at most
MAX_LISTED = 100

class QueueFull(Exception):
    """The agent's queue holds ``max_queued_per_agent`` undelivered events (429)."""

    def __init__(self, agent_id: int, limit: int) -> None:
        super().__init__(f"agent {agent_id} has {limit} undelivered events (events.max_queued_per_agent); "
                         "post again once some are delivered")
        self.agent_id = agent_id
        self.limit = limit


@attrs.frozen(kw_only=True)
class QueuedEvent:
    """One event and its delivery status (what ``GET …/events/<id>`` answers)."""

    agent_id: int
    id: str
    type: str
    #: the payload as the JSON text it was posted as (sent to agentd as is); empty once the event ended
    payload: str = attrs.field(repr=False)
    seq: int = 0
    state: str = "queued"
    posted_at: float = 0.0
    delivered_at: float | None = None
    attempts: int = 0
    outcome: str | None = None
    detail: str | None = None
    pod: str | None = None

    def status_json(self) -> dict[str, Any]:
        """The REST answer: the status fields (not the payload: a listing stays small)."""
        return {"id": self.id, "type": self.type, "agent_id": self.agent_id, "seq": self.seq, "state": self.state,
                "posted_at": self.posted_at, "delivered_at": self.delivered_at, "attempts": self.attempts,
                "outcome": self.outcome, "detail": self.detail, "pod": self.pod}


def event_to_json(event: QueuedEvent) -> dict[str, Any]:
    """The record the stores keep (the payload as its JSON text)."""
    return attrs.asdict(event)


def event_from_json(data: dict[str, Any]) -> QueuedEvent:
    def opt(name: str) -> Any:
        value = data.get(name)
        return None if value is None or value == "" else value

    delivered = opt("delivered_at")
    return QueuedEvent(agent_id=int(data["agent_id"]), id=str(data["id"]), type=str(data["type"]),
                 payload=str(data["payload"]), seq=int(data.get("seq") or 0), state=str(data["state"]),
                 posted_at=float(data["posted_at"]), delivered_at=None if delivered is None else float(delivered),
                 attempts=int(data.get("attempts") or 0), outcome=opt("outcome"), detail=opt("detail"), pod=opt("pod"))


def ended_state(outcome: str) -> str:
    """The state agentd's ``outcome`` ends an event in (an unknown word counts as failed)."""
    return OUTCOMES.get(outcome, "failed")


__all__ = [
    "EVENT_ID",
    "EVENT_TYPE",
    "MAX_DETAIL",
    "MAX_EVENT_BODY",
    "MAX_LISTED",
    "OUTCOMES",
    "STATES",
    "UNDELIVERED",
    "EventSettings",
    "QueueFull",
    "QueuedEvent",
    "ended_state",
    "event_from_json",
    "event_to_json",
]
