"""What an ``event`` stream carries, sans-I/O: the OPEN metadata kasd sends (``EventHead``), the
payload's bounds, and the ACCEPT metadata agentd answers with (``Outcome``). docs/agentd.md
§Events describes them; /work/notes/SVC_CONTRACT.md (issue 28) fixed their names and shapes.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from typing import Any, Literal

import attrs

from agentd.events.settings import TYPE_RE
from tunnelhttp.kinds import KIND_EVENT

EVENT_STREAM_VERSION = 1
#: kasd refuses a larger REST body (413), so a larger payload on the stream is a broken kasd
MAX_PAYLOAD = 64 * 1024
MAX_DETAIL = 1024
ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: datetime's last year: a larger posted_at has no RFC 3339 form
_MAX_POSTED_AT = 253402300799.0
_MAX_REQUEST_ID = 256

OutcomeName = Literal["done", "duplicate", "ignored", "failed"]


class BadEvent(ValueError):
    """The stream does not carry an event agentd can act on; the message names what is wrong."""


@attrs.frozen(kw_only=True)
class EventHead:
    id: str
    type: str
    seq: int
    #: when kasd took the event (epoch seconds): the annotation's value, so a redelivery writes the same
    posted_at: float
    request_id: str = ""

    @classmethod
    def from_metadata(cls, raw: dict[str, Any]) -> EventHead:
        if raw.get("v") != EVENT_STREAM_VERSION:
            raise BadEvent(f"unsupported event stream version {_shown(raw.get('v'))} (agentd speaks {EVENT_STREAM_VERSION})")
        if raw.get("kind") != KIND_EVENT:
            raise BadEvent(f"kind must be {KIND_EVENT!r}, got {_shown(raw.get('kind'))}")
        event_id, event_type = raw.get("id"), raw.get("type")
        if not isinstance(event_id, str) or not ID_RE.fullmatch(event_id):
            raise BadEvent(f"id must match [A-Za-z0-9._:-]{{1,128}}, got {_shown(event_id)}")
        if not isinstance(event_type, str) or not TYPE_RE.fullmatch(event_type):
            raise BadEvent(f"type must match [a-z0-9][a-z0-9._-]{{0,127}}, got {_shown(event_type)}")
        seq = raw.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise BadEvent(f"seq must be a whole number >= 0, got {_shown(seq)}")
        posted_at = raw.get("posted_at")
        if (isinstance(posted_at, bool) or not isinstance(posted_at, int | float) or not math.isfinite(posted_at)
                or not 0 <= posted_at <= _MAX_POSTED_AT):
            raise BadEvent(f"posted_at must be epoch seconds, got {_shown(posted_at)}")
        request_id = raw.get("request_id", "")
        if not isinstance(request_id, str) or len(request_id) > _MAX_REQUEST_ID:
            raise BadEvent(f"request_id must be a string of at most {_MAX_REQUEST_ID} characters")
        return cls(id=event_id, type=event_type, seq=seq, posted_at=float(posted_at), request_id=request_id)

    @property
    def posted_rfc3339(self) -> str:
        """``posted_at`` as RFC 3339 in UTC with microseconds (``2026-11-27T19:05:01.250000Z``)."""
        moment = datetime.datetime.fromtimestamp(self.posted_at, datetime.UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@attrs.frozen(kw_only=True)
class Event:
    head: EventHead
    #: the payload's JSON value (None for an empty payload)
    payload: Any


def parse_payload(data: bytes) -> Any:
    """The payload's JSON value; ``BadEvent`` when it is not UTF-8 JSON."""
    if not data.strip():
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadEvent("payload is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise BadEvent(f"payload is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise BadEvent("payload is nested too deeply") from None


@attrs.frozen(kw_only=True)
class Outcome:
    outcome: OutcomeName
    detail: str = ""
    status: int | None = None

    def to_metadata(self) -> dict[str, Any]:
        detail = self.detail if len(self.detail) <= MAX_DETAIL else self.detail[: MAX_DETAIL - 1] + "…"
        return {"outcome": self.outcome, "detail": detail, "status": self.status}


def _shown(value: object) -> str:
    if isinstance(value, str):
        return repr(value if len(value) <= 64 else value[:64] + "…")
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    return f"a {type(value).__name__}"


__all__ = ["MAX_PAYLOAD", "BadEvent", "Event", "EventHead", "Outcome", "parse_payload"]
