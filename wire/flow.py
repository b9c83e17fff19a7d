"""Per-stream credit flow control, receive side, with windows that grow toward bandwidth × delay.

The receiver grants credit; the sender may have at most that many unacknowledged bytes in flight.
Credit is returned only once the application *consumed* data, so a stream nobody reads stops at its
window and buffers no more — while every other stream keeps moving.

Auto-tuning (as in QUIC implementations): when a whole window's worth was consumed in less than two
round trips, the window, not the consumer, is what limits throughput, so it doubles, up to the max.
"""

from __future__ import annotations

import attrs

from wire.errors import ErrorCode, RemoteProtocolError


@attrs.define(kw_only=True)
class ReceiveWindow:
    #: current window size: how far ahead of the consumer the peer may send
    window: int
    max_window: int
    #: credit the peer still has (from this side's point of view)
    available: int = attrs.field(default=attrs.Factory(lambda self: self.window, takes_self=True))
    #: consumed by the application, not yet given back as credit
    unacked: int = 0
    #: when credit was last given back (for auto-tuning); None until the first time
    last_update_at: float | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet consumed: never more than ``window``."""
        return self.window - self.available - self.unacked

    def on_data(self, size: int) -> None:
        if size > self.available:
            raise RemoteProtocolError(
                f"{size} bytes of DATA with only {self.available} bytes of credit",
                ErrorCode.FLOW_CONTROL_ERROR,
            )
        self.available -= size

    def on_consumed(self, size: int, now: float, rtt: float | None) -> int:
        """Record ``size`` bytes taken by the application; return the credit to grant now (or 0)."""
        if size < 0 or size > self.buffered:
            raise ValueError(f"consumed {size} bytes but only {self.buffered} are buffered")
        self.unacked += size
        # Return credit in batches (half a window) so a byte-at-a-time reader does not make a
        # WINDOW_UPDATE per byte, but early enough that the sender never runs dry on a fast link.
        if self.unacked < self.window // 2:
            return 0
        increment = self.unacked
        if (
            rtt is not None
            and self.last_update_at is not None
            and now - self.last_update_at < 2 * rtt
            and self.window < self.max_window
        ):
            growth = min(self.window, self.max_window - self.window)
            self.window += growth
            increment += growth
        self.unacked = 0
        self.available += increment
        self.last_update_at = now
        return increment
