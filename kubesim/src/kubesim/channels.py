"""The remotecommand channel framing that exec and attach speak over a WebSocket (sans-I/O).

Every WebSocket message carries one channel's data: the first byte names the channel (0 stdin,
1 stdout, 2 stderr, 3 error, 4 resize), the rest is the payload. The base64 protocols send text
messages whose first character is the channel digit and whose rest is base64. `v4` makes the error
channel a JSON `metav1.Status`; `v5` adds the close signal `[255, channel]`, a half-close of one
channel (how a client says "stdin is at EOF"). Nothing here does I/O or knows a clock.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

STDIN = 0
STDOUT = 1
STDERR = 2
ERROR = 3
RESIZE = 4
CLOSE_SIGNAL = 255
CHANNEL_COUNT = 5


class ChannelProtocolError(Exception):
    """The peer sent a message that breaks the channel protocol (its fault, not ours)."""


@attrs.frozen(kw_only=True)
class ChannelProtocol:
    """One negotiable subprotocol: how its messages are coded and what its error channel holds."""

    name: str
    base64: bool
    #: v4+: the error channel carries a JSON Status, always; before v4 only a failure's message.
    status_json: bool
    #: v5: `[255, channel]` half-closes a channel.
    close_signal: bool


V5 = ChannelProtocol(name="v5.channel.k8s.io", base64=False, status_json=True, close_signal=True)
V4 = ChannelProtocol(name="v4.channel.k8s.io", base64=False, status_json=True, close_signal=False)
V4_BASE64 = ChannelProtocol(
    name="v4.base64.channel.k8s.io", base64=True, status_json=True, close_signal=False
)
V1 = ChannelProtocol(name="channel.k8s.io", base64=False, status_json=False, close_signal=False)
V1_BASE64 = ChannelProtocol(
    name="base64.channel.k8s.io", base64=True, status_json=False, close_signal=False
)
#: What the kubelet speaks to a client that offers no subprotocol at all: v1, binary.
NO_PROTOCOL = ChannelProtocol(name="", base64=False, status_json=False, close_signal=False)

#: Most capable first: the server picks the first of these the client offers.
PREFERENCE: tuple[ChannelProtocol, ...] = (V5, V4, V4_BASE64, V1, V1_BASE64)
PROTOCOLS: Mapping[str, ChannelProtocol] = {p.name: p for p in PREFERENCE}


def select_protocol(offered: Sequence[str]) -> ChannelProtocol | None:
    """The protocol to accept for a client offering `offered`, or None if none is supported."""
    names = {name.strip() for name in offered}
    if not names:
        return NO_PROTOCOL
    for protocol in PREFERENCE:
        if protocol.name in names:
            return protocol
    return None


# -- events a client's message decodes to -------------------------------------------------------


@attrs.frozen(kw_only=True)
class ChannelData:
    """Bytes for one channel (for a client: 0 stdin or 4 resize)."""

    channel: int
    data: bytes


@attrs.frozen(kw_only=True)
class ChannelClosed:
    """v5 close signal: the client will send nothing more on `channel`."""

    channel: int


@attrs.frozen(kw_only=True)
class TerminalSize:
    width: int
    height: int


def decode_message(protocol: ChannelProtocol, message: bytes | str) -> ChannelData | ChannelClosed | None:
    """Decode one WebSocket message; None for an empty one (which the kubelet skips).

    The frame type does not matter, only the protocol's codec: the kubelet reads text and binary
    messages alike, and the Python client sends stdin as text messages on binary protocols.
    """
    raw = message.encode("utf-8") if isinstance(message, str) else bytes(message)
    if not raw:
        return None
    if protocol.close_signal and raw[0] == CLOSE_SIGNAL:
        if len(raw) != 2:
            raise ChannelProtocolError(
                f"close signal must be followed by exactly one channel byte, got {len(raw) - 1}"
            )
        if raw[1] >= CHANNEL_COUNT:
            raise ChannelProtocolError(f"close signal for unknown channel {raw[1]}")
        return ChannelClosed(channel=raw[1])
    if protocol.base64:
        channel = raw[0] - ord("0")
        try:
            data = base64.b64decode(raw[1:], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ChannelProtocolError(f"invalid base64 payload on channel {channel}: {exc}") from exc
    else:
        channel = raw[0]
        data = raw[1:]
    return ChannelData(channel=channel, data=data)


def encode_message(protocol: ChannelProtocol, channel: int, data: bytes) -> bytes | str:
    """One message for `channel`: bytes for a binary protocol (send as binary), str for base64."""
    if not 0 <= channel < CHANNEL_COUNT:
        raise ValueError(f"no such channel: {channel}")
    if protocol.base64:
        return chr(ord("0") + channel) + base64.b64encode(data).decode("ascii")
    return bytes((channel,)) + data


def encode_close(protocol: ChannelProtocol, channel: int) -> bytes:
    """The v5 half-close of `channel` (a client sends it for stdin; tests use it)."""
    if not protocol.close_signal:
        raise ValueError(f"{protocol.name or 'no protocol'} has no close signal")
    if not 0 <= channel < CHANNEL_COUNT:
        raise ValueError(f"no such channel: {channel}")
    return bytes((CLOSE_SIGNAL, channel))


class ResizeDecoder:
    """The resize channel is a stream of JSON `{"Width": w, "Height": h}` objects.

    The kubelet reads it with a streaming JSON decoder, so an object may span messages or several
    may share one; feed every payload and take the sizes that completed.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._decoder = json.JSONDecoder()

    def feed(self, data: bytes) -> list[TerminalSize]:
        try:
            self._buffer += data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ChannelProtocolError(f"resize message is not UTF-8: {exc}") from exc
        sizes: list[TerminalSize] = []
        while True:
            text = self._buffer.lstrip()
            if not text:
                self._buffer = ""
                return sizes
            try:
                obj, end = self._decoder.raw_decode(text)
            except json.JSONDecodeError as exc:
                if exc.pos >= len(text):  # incomplete: wait for more
                    self._buffer = text
                    return sizes
                raise ChannelProtocolError(f"invalid resize message: {exc}") from exc
            self._buffer = text[end:]
            sizes.append(_terminal_size(obj))


def _terminal_size(obj: Any) -> TerminalSize:
    if not isinstance(obj, dict):
        raise ChannelProtocolError(f"resize message must be an object, got {type(obj).__name__}")
    # Go's decoder matches field names case-insensitively and leaves absent ones zero.
    fields = {str(k).lower(): v for k, v in obj.items()}
    width, height = fields.get("width", 0), fields.get("height", 0)
    for value in (width, height):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0xFFFF:
            raise ChannelProtocolError(f"resize dimensions must be uint16, got {obj!r}")
    return TerminalSize(width=width, height=height)


def encode_resize(size: TerminalSize) -> bytes:
    return json.dumps({"Width": size.width, "Height": size.height}, separators=(",", ":")).encode()


# -- the error channel -----------------------------------------------------------------------


def success_status() -> dict[str, Any]:
    return {"metadata": {}, "status": "Success"}


def exit_code_status(command: Sequence[str], code: int) -> dict[str, Any]:
    """What the kubelet (via containerd's `CodeExitError`) reports for a non-zero exit."""
    # Go's %v of a []string: "[sh -c exit 3]".
    detail = f"error executing command [{' '.join(command)}], exit code {code}"
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: {detail}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def internal_error_status(error: str) -> dict[str, Any]:
    """apierrors.NewInternalError, e.g. for a command that could not be started at all."""
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"Internal error occurred: {error}",
        "reason": "InternalError",
        "details": {"causes": [{"message": error}]},
        "code": 500,
    }


def translated_status(status: Mapping[str, Any]) -> dict[str, Any]:
    """What the API server's StreamTranslator (the only speaker of v5) makes of a kubelet Status.

    It reads the kubelet's Status with client-go's SPDY executor and writes a new one: an exit
    code survives but the message becomes client-go's; any other failure is wrapped again as an
    internal error (hence kubectl's "Internal error occurred: Internal error occurred: ...").
    """
    if status.get("status") == "Success":
        return success_status()
    if status.get("reason") == "NonZeroExitCode":
        code = exit_code_of(status)
        result = exit_code_status((), code)
        result["message"] = (
            f"command terminated with non-zero exit code: command terminated with exit code {code}"
        )
        return result
    return internal_error_status(str(status.get("message", "")))


def status_payload(protocol: ChannelProtocol, status: Mapping[str, Any]) -> bytes | None:
    """The error-channel payload for `status`, or None when the protocol sends nothing.

    v4+ always sends the Status as compact JSON; the older protocols send only a failure's message.
    """
    if protocol.status_json:
        return go_json(status).encode("utf-8")
    if status.get("status") == "Success":
        return None
    return str(status.get("message", "")).encode("utf-8")


def go_json(value: Any) -> str:
    """Compact JSON as Go's encoding/json writes it, HTML-escaping included."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escape in _GO_ESCAPES:
        text = text.replace(char, escape)
    return text


_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def decode_status(payload: bytes) -> dict[str, Any]:
    """Parse a v4+ error-channel payload (for clients and tests)."""
    try:
        status = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChannelProtocolError(f"error channel is not a JSON Status: {exc}") from exc
    if not isinstance(status, dict) or "status" not in status:
        raise ChannelProtocolError(f"error channel is not a Status: {payload!r}")
    return status


def exit_code_of(status: Mapping[str, Any]) -> int:
    """The exit code a Status reports, the way client-go's errorDecoderV4 reads it."""
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in status.get("details", {}).get("causes", []):
            if cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message", ""))
                except ValueError as exc:
                    raise ChannelProtocolError(f"invalid exit code in {status!r}") from exc
    raise ChannelProtocolError(f"status reports no exit code: {status.get('message', status)!r}")
