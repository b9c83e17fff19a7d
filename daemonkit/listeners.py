"""The connection caps of a daemon's listeners (``netio.admission``), with the log line a refusal
gets: one warning per source and interval (for a full listener, one per interval whatever the
source), the lines held back counted in the next (``BurstLimitedLog``), so a flood of refused
connections writes a few lines, not one each."""

from __future__ import annotations

from collections.abc import Callable

from daemonkit.logs import BurstLimitedLog
from netio.admission import TOTAL, Admission, ConnectionCaps, Refusal

#: seconds between two log lines about refused connections (of one source, or of a full listener)
REFUSAL_LOG_INTERVAL = 10.0


def capped_admission(
    caps: ConnectionCaps,
    *,
    listener: str,
    log: BurstLimitedLog,
    count: Callable[[Refusal], None] | None = None,
    gate: Callable[[str], str | None] | None = None,
) -> Admission:
    """An ``Admission`` for ``listener`` that logs each refusal to ``log`` and tells ``count`` (a metric)."""

    def on_refused(refusal: Refusal) -> None:
        if count is not None:
            count(refusal)
        key = (listener, refusal.reason, "" if refusal.reason == TOTAL else refusal.source)
        log.warning(
            key, "connection refused listener=%s peer=%s reason=%s limit=%d",
            listener, refusal.peer, refusal.reason, refusal.limit,
        )

    return Admission(caps, on_refused=on_refused, gate=gate)
