"""Protocol version, the settings each side announces, and the decoder's hard limits."""

from __future__ import annotations

from typing import Any

import attrs

from wire.errors import RemoteProtocolError

#: (major, minor). Peers with a different major refuse each other; minors negotiate down.
#: 1.1 added NOTICE (a one-way control message: kasd's placement of an agent's connections).
PROTOCOL_VERSION: tuple[int, int] = (1, 1)
#: the first version with NOTICE
NOTICE_VERSION: tuple[int, int] = (1, 1)

KiB = 1024
MiB = 1024 * KiB

# Largest window any stream may ever have: 2**31 - 1, as in HTTP/2.
MAX_WINDOW_LIMIT = 2**31 - 1


@attrs.frozen(kw_only=True)
class Settings:
    """What one side announces in its HELLO frame; the peer obeys it when sending to this side."""

    #: credit each new stream starts with, in both directions' receive budget of the announcer
    initial_window: int = 256 * KiB
    #: the receive window of a stream may auto-grow up to this (bandwidth × delay)
    max_window: int = 16 * MiB
    #: streams the *peer* may have open towards the announcer at once
    max_concurrent_streams: int = 4096
    #: largest DATA payload the announcer accepts in one frame
    max_frame_payload: int = 64 * KiB

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.initial_window <= self.max_window <= MAX_WINDOW_LIMIT:
            raise ValueError("need 1 <= initial_window <= max_window <= 2**31-1")
        if not 1 <= self.max_frame_payload <= 16 * MiB:
            raise ValueError("max_frame_payload must be in 1..16 MiB")
        if self.max_concurrent_streams < 1:
            raise ValueError("max_concurrent_streams must be >= 1")

    def to_wire(self) -> dict[str, int]:
        return {
            "initial_window": self.initial_window,
            "max_window": self.max_window,
            "max_concurrent_streams": self.max_concurrent_streams,
            "max_frame_payload": self.max_frame_payload,
        }

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Settings:
        """Unknown keys are ignored (forward compatibility); known ones must be valid integers."""
        known = {}
        for key in ("initial_window", "max_window", "max_concurrent_streams", "max_frame_payload"):
            if key in raw:
                value = raw[key]
                if type(value) is not int:
                    raise RemoteProtocolError(f"setting {key!r} is not an integer")
                known[key] = value
        try:
            return cls(**known)
        except ValueError as exc:
            raise RemoteProtocolError(f"invalid settings: {exc}") from None


@attrs.frozen(kw_only=True)
class Limits:
    """Hard limits of the decoder: what a hostile peer can make this side hold in memory."""

    #: largest DATA payload accepted (should equal our Settings.max_frame_payload)
    max_frame_payload: int = 64 * KiB
    #: largest encoded non-DATA frame (OPEN/ACCEPT carry metadata: the request head)
    max_control_frame: int = 64 * KiB
    #: longest string anywhere in a frame
    max_string: int = 16 * KiB
    #: most entries in any one metadata map, most items in any one array
    max_map_entries: int = 256
    max_array_items: int = 256
    #: deepest nesting inside metadata (maps and arrays)
    max_depth: int = 8

    @property
    def max_frame_bytes(self) -> int:
        """Upper bound of one encoded frame of any kind."""
        return max(self.max_frame_payload + 32, self.max_control_frame)
