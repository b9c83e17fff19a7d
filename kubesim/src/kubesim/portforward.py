"""The kubelet's port-forward stream protocol (`portforward.k8s.io`), sans-I/O.

Over one SPDY connection (plain, or inside the WebSocket `SPDY/3.1+portforward.k8s.io`), the
client opens two streams per connection it accepted locally: an `error` stream, then a `data`
stream, each with the headers `streamType`, `port` and `requestID` (SPDY lowercases them). The
server pairs them by request id; once both are there it connects to the port in the pod, copies
bytes both ways on the data stream, and writes a message on the error stream if the port cannot be
reached (kubectl prints it: "an error occurred forwarding 8080 -> 81: error forwarding port 81 to
pod …").

Mirrors the kubelet's `pkg/kubelet/cri/streaming/portforward/httpstream.go`:

- `httpStreamReceived`: a stream without a valid `port` (Go's `strconv.ParseUint(s, 10, 16)`,
  and > 0) or `streamType` (`error` or `data`) is refused — the SPDY layer resets it — with the
  kubelet's reason, e.g. `"port" header is required`, `unable to parse "x" as a port:
  strconv.ParseUint: parsing "x": invalid syntax`, `port "0" must be > 0`, `invalid stream type
  "foo"`. A valid one is accepted (SYN_REPLY).
- `requestID`: a stream without one gets the id old clients imply: its stream id for `error`,
  its stream id − 2 for `data`.
- a second stream of a type a pair already has: `error processing stream for request 1: error
  stream already assigned` on the pair's error stream (when it has one); the pair is unchanged.
- a pair not complete within the stream creation timeout (the kubelet's default, 30 s) is dropped
  with `(conn=…, request=1) timed out waiting for streams` on its error stream.
- a complete pair is forgotten at once: the port of its *data* stream is forwarded.

Bounds (not in the kubelet, which trusts the API server in front of it): at most `max_pending`
incomplete pairs at once (a stream that would open one more is refused) and a `requestID` of at
most `MAX_REQUEST_ID` bytes. The SPDY layer bounds the streams and header blocks themselves.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

PROTOCOL = "portforward.k8s.io"
STREAM_TYPE_HEADER = "streamtype"
PORT_HEADER = "port"
REQUEST_ID_HEADER = "requestid"
STREAM_TYPE_ERROR = "error"
STREAM_TYPE_DATA = "data"
#: The kubelet's default stream creation timeout (remotecommand's DefaultStreamCreationTimeout).
STREAM_CREATION_TIMEOUT = 30.0
#: kubectl's request ids are decimal counters; nothing legitimate comes near this.
MAX_REQUEST_ID = 128
DEFAULT_MAX_PENDING = 64


# -- events --------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class StreamRefused:
    """Reset this stream (the kubelet's stream handler returned `reason`)."""

    stream_id: int
    reason: str


@attrs.frozen(kw_only=True)
class StreamAccepted:
    """Reply to this stream (SYN_REPLY): it is part of a pair now."""

    stream_id: int


@attrs.frozen(kw_only=True)
class PairReady:
    """Both streams of a request are there: forward `port` over `data_stream`."""

    request_id: str
    port: int
    error_stream: int
    data_stream: int


@attrs.frozen(kw_only=True)
class PairError:
    """Write `message` on `error_stream` (a duplicate stream, or the pair timed out)."""

    request_id: str
    error_stream: int
    message: str


Event = StreamRefused | StreamAccepted | PairReady | PairError


# -- header checks -------------------------------------------------------------------------------


def _get(headers: Iterable[tuple[str, str]], name: str) -> str:
    """Go's `http.Header.Get`: the first value, "" when absent."""
    for key, value in headers:
        if key == name:
            return value
    return ""


def parse_port(text: str) -> int:
    """The `port` header as the kubelet reads it; ValueError with the kubelet's message."""
    if not text:
        raise ValueError(f'"{PORT_HEADER_CANONICAL}" header is required')
    if not text.isascii() or not text.isdigit():
        raise ValueError(f'unable to parse "{text}" as a port: strconv.ParseUint: parsing "{text}": invalid syntax')
    port = int(text)
    if port > 0xFFFF:
        raise ValueError(f'unable to parse "{text}" as a port: strconv.ParseUint: parsing "{text}": value out of range')
    if port < 1:
        raise ValueError(f'port "{text}" must be > 0')
    return port


# The names as the kubelet prints them (k8s.io/api/core/v1: PortHeader, StreamType).
PORT_HEADER_CANONICAL = "port"
STREAM_TYPE_HEADER_CANONICAL = "streamType"


def check_stream_headers(headers: Iterable[tuple[str, str]]) -> tuple[int, str]:
    """(port, stream type) of a valid port-forward stream; ValueError with the kubelet's reason."""
    headers = tuple(headers)
    port = parse_port(_get(headers, PORT_HEADER))
    stream_type = _get(headers, STREAM_TYPE_HEADER)
    if not stream_type:
        raise ValueError(f'"{STREAM_TYPE_HEADER_CANONICAL}" header is required')
    if stream_type not in (STREAM_TYPE_ERROR, STREAM_TYPE_DATA):
        raise ValueError(f'invalid stream type "{stream_type}"')
    return port, stream_type


# -- pairing -------------------------------------------------------------------------------------


@attrs.define
class _Pair:
    request_id: str
    deadline: float
    error_stream: int | None = None
    data_stream: int | None = None
    data_port: int = 0


class StreamPairing:
    """Pairs a connection's port-forward streams by request id (no I/O; time is an argument)."""

    def __init__(self, *, max_pending: int = DEFAULT_MAX_PENDING,
                 timeout: float = STREAM_CREATION_TIMEOUT, connection_name: str = "kubesim") -> None:
        self.max_pending = max_pending
        self.timeout = timeout
        self._name = connection_name
        self._pending: dict[str, _Pair] = {}

    @property
    def pending(self) -> int:
        """How many pairs wait for their second stream."""
        return len(self._pending)

    def next_deadline(self) -> float | None:
        """When the oldest incomplete pair times out (None: nothing pending)."""
        return min((pair.deadline for pair in self._pending.values()), default=None)

    def stream_opened(self, stream_id: int, headers: Iterable[tuple[str, str]], now: float) -> list[Event]:
        """The client opened a stream: refuse it, or accept it and perhaps complete a pair."""
        headers = tuple(headers)
        try:
            port, stream_type = check_stream_headers(headers)
        except ValueError as exc:
            return [StreamRefused(stream_id=stream_id, reason=str(exc))]
        request_id = _get(headers, REQUEST_ID_HEADER)
        if not request_id:
            # Old clients send no request id: the kubelet's best-effort pseudo id.
            request_id = str(stream_id if stream_type == STREAM_TYPE_ERROR else stream_id - 2)
        if len(request_id.encode()) > MAX_REQUEST_ID:
            return [StreamRefused(stream_id=stream_id, reason=f"requestID longer than {MAX_REQUEST_ID} bytes")]
        pair = self._pending.get(request_id)
        if pair is None:
            if len(self._pending) >= self.max_pending:
                return [StreamRefused(stream_id=stream_id,
                                      reason=f"too many port-forward requests waiting for their streams "
                                             f"(at most {self.max_pending})")]
            pair = self._pending[request_id] = _Pair(request_id=request_id, deadline=now + self.timeout)
        events: list[Event] = [StreamAccepted(stream_id=stream_id)]
        if stream_type == STREAM_TYPE_ERROR:
            if pair.error_stream is not None:
                return [*events, *self._duplicate(pair, "error")]
            pair.error_stream = stream_id
        else:
            if pair.data_stream is not None:
                return [*events, *self._duplicate(pair, "data")]
            pair.data_stream = stream_id
            pair.data_port = port
        if pair.error_stream is not None and pair.data_stream is not None:
            del self._pending[request_id]
            events.append(PairReady(request_id=request_id, port=pair.data_port,
                                    error_stream=pair.error_stream, data_stream=pair.data_stream))
        return events

    def _duplicate(self, pair: _Pair, kind: str) -> list[Event]:
        if pair.error_stream is None:
            return []
        return [PairError(request_id=pair.request_id, error_stream=pair.error_stream,
                          message=f"error processing stream for request {pair.request_id}: "
                                  f"{kind} stream already assigned")]

    def expire(self, now: float) -> list[PairError | StreamRefused]:
        """Drop the pairs whose time is up: a message on the error stream, or a reset data stream."""
        events: list[PairError | StreamRefused] = []
        for request_id, pair in list(self._pending.items()):
            if pair.deadline > now:
                continue
            del self._pending[request_id]
            message = f"(conn={self._name}, request={request_id}) timed out waiting for streams"
            if pair.error_stream is not None:
                events.append(PairError(request_id=request_id, error_stream=pair.error_stream, message=message))
            elif pair.data_stream is not None:
                # The kubelet leaves it to the client; resetting it frees the stream here too.
                events.append(StreamRefused(stream_id=pair.data_stream, reason=message))
        return events


def forward_error(*, port: int, sandbox_id: str, netns: str, reason: str) -> str:
    """What the kubelet writes on the error stream when the port cannot be reached.

    The kubelet's `error forwarding port %d to pod %s, uid %v: %v` (the CRI streaming server
    passes the pod sandbox id and no uid) around containerd's `failed to execute portforward in
    network namespace %q: failed to connect to localhost:%d inside namespace %q, IPv4: %v IPv6
    %v ` (internal/cri/server/sandbox_portforward_linux.go; a pod without IPv6 gets Go's
    "no suitable address found").
    """
    return (f"error forwarding port {port} to pod {sandbox_id}, uid : failed to execute portforward in "
            f'network namespace "{netns}": failed to connect to localhost:{port} inside namespace '
            f'"{sandbox_id}", IPv4: dial tcp4 127.0.0.1:{port}: connect: {reason} '
            f"IPv6 dial tcp6: address localhost: no suitable address found ")


def sandbox_gone_error(*, port: int, sandbox_id: str) -> str:
    """The error stream's message for a pod that went away while its forward stayed up: the
    kubelet's wrapping of containerd's `failed to find sandbox %q in store: %w` (its store's
    `not found`)."""
    return (f"error forwarding port {port} to pod {sandbox_id}, uid : failed to find sandbox "
            f'"{sandbox_id}" in store: not found')
