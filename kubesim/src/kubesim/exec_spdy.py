"""`pods/exec` and `pods/attach` over SPDY: the kubelet's remotecommand server on a SpdySession.

As pkg/kubelet/cri/streaming/remotecommand (httpstream.go, exec.go, attach.go) does it: the
client opens one stream per standard stream, each with a `streamType` header (`error`,
`stdin`, `stdout`, `stderr`, `resize`); every stream is replied to at once; once the expected
number arrived (error, plus each of stdin/stdout/stderr asked for, plus resize for a tty on v3
and v4; stderr is dropped for a tty) the command runs with its streams on them — the same
runner as the WebSocket path (exec_ws.exec_status / attach_console over exec_ws.ChannelIO).
The result goes on the error stream: v4.channel.k8s.io writes the Status as JSON, always;
v3, v2 and channel.k8s.io write only a failure's message. Then, as the kubelet's
`connection.Close()`, every stream is reset and the session ends with GOAWAY. The resize stream
is a sequence of JSON `{"Width":..,"Height":..}` objects.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import trio

from kubesim import channels, errors, exec_ws
from kubesim.asgi import Query, flag, one
from kubesim.podio import check_streamable, running_console
from kubesim.processes import container_env
from kubesim.spdy_session import SpdySession, SpdyStream
from kubesim.streaming import PodStreamRequest, SpdySubresource

log = logging.getLogger(__name__)

V4 = "v4.channel.k8s.io"
V3 = "v3.channel.k8s.io"
V2 = "v2.channel.k8s.io"
V1 = "channel.k8s.io"
#: remotecommandconsts.SupportedStreamingProtocols: what the kubelet serves.
PROTOCOLS = (V4, V3, V2, V1)
#: How long the kubelet waits for the client's streams (DefaultStreamCreationTimeout).
STREAM_CREATION_TIMEOUT = 30.0
STREAM_TYPES = ("error", "stdin", "stdout", "stderr", "resize")


class _Options:
    """remotecommand.NewOptions: which streams the request asked for."""

    def __init__(self, query: Query) -> None:
        self.stdin = flag(query, "stdin")
        self.stdout = flag(query, "stdout")
        self.tty = flag(query, "tty")
        self.stderr = flag(query, "stderr") and not self.tty

    def expected(self, protocol: str) -> int:
        resize = self.tty and protocol in (V4, V3)
        return 1 + self.stdin + self.stdout + self.stderr + resize


def _check_options(request: PodStreamRequest) -> None:
    opts = _Options(request.query)
    if not (opts.stdin or opts.stdout or opts.stderr):
        raise errors.bad_request("you must specify at least 1 of stdin, stdout, stderr")


def _check_exec(request: PodStreamRequest) -> None:
    check_streamable(request.store, request.controllers, request.target, request.query)
    if not request.query.get("command"):
        raise errors.bad_request("you must specify at least 1 command")
    _check_options(request)


def _check_attach(request: PodStreamRequest) -> None:
    check_streamable(request.store, request.controllers, request.target, request.query)
    _check_options(request)


class _Streams:
    """The client's streams of one session, as exec_ws.Channels for ChannelIO."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.by_type: dict[str, SpdyStream] = {}
        self.terminal_size: channels.TerminalSize | None = None

    @classmethod
    async def collect(cls, session: SpdySession, protocol: str, opts: _Options) -> _Streams | None:
        streams = cls(protocol)
        expected = opts.expected(protocol)
        received = 0
        with trio.move_on_after(STREAM_CREATION_TIMEOUT):
            while received < expected:
                stream = await session.accept()
                if stream is None:
                    return None
                await stream.reply()
                kind = stream.header("streamtype") or ""
                if kind not in STREAM_TYPES or (kind == "resize" and protocol not in (V4, V3)):
                    log.warning("exec/attach: unexpected stream type %r", kind)
                    continue  # replied to, not counted: as the kubelet
                streams.by_type[kind] = stream
                received += 1
            if protocol == V1:
                # channel.k8s.io: the kubelet closes its half of stdin, and (a 1.0.x quirk it
                # keeps) resets the error stream once the streams are in.
                if "stdin" in streams.by_type:
                    await _quietly(streams.by_type["stdin"].send_eof())
                if "error" in streams.by_type:
                    await streams.by_type["error"].reset()
            return streams
        log.warning("exec/attach: timed out waiting for the client to create streams")
        return None

    async def read_stdin(self) -> bytes:
        stream = self.by_type.get("stdin")
        if stream is None:
            await trio.lowlevel.checkpoint()
            return b""
        return await stream.receive_some()

    async def write(self, channel: int, data: bytes) -> None:
        name = {channels.STDOUT: "stdout", channels.STDERR: "stderr"}.get(channel)
        stream = self.by_type.get(name or "")
        if stream is None or not data:
            await trio.lowlevel.checkpoint()
            return
        await _quietly(stream.send_all(data))  # a reset stream drops output, as a closed pipe

    async def read_resizes(self) -> None:
        stream = self.by_type.get("resize")
        if stream is None:
            return
        decoder = channels.ResizeDecoder()
        try:
            while data := await stream.receive_some():
                for size in decoder.feed(data):
                    self.terminal_size = size
        except channels.ChannelProtocolError as exc:
            log.warning("exec/attach: bad resize message: %s", exc)  # the kubelet stops reading

    async def finish(self, status: Mapping[str, Any]) -> None:
        """Write `status` on the error stream, then reset every stream (connection.Close)."""
        protocol = channels.V4 if self.protocol == V4 else channels.V1
        payload = channels.status_payload(protocol, status)
        error = self.by_type.get("error")
        if payload is not None and error is not None:
            await _quietly(error.send_all(payload))
        for stream in self.by_type.values():
            await _quietly(stream.reset())


async def _quietly(action: Any) -> None:
    try:
        await action
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client went away or reset the stream


async def _run(request: PodStreamRequest, session: SpdySession, work: Any) -> None:
    opts = _Options(request.query)
    streams = await _Streams.collect(session, request.protocol, opts)
    if streams is None:
        return
    io = exec_ws.ChannelIO(streams, stdout=opts.stdout, stderr=opts.stderr, tty=opts.tty)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(streams.read_resizes)
        status = await work(io, opts)
        nursery.cancel_scope.cancel()
    await streams.finish(status)


async def _serve_exec(request: PodStreamRequest, session: SpdySession) -> None:
    pod, container, _ = running_console(request.store, request.controllers, request.target,
                                        one(request.query, "container"))
    command = request.query.get("command") or []
    env = container_env(pod, container)
    target = request.target
    fs = request.controllers.filesystem(target.namespace or "", target.name or "", container)

    async def work(io: exec_ws.ChannelIO, opts: _Options) -> Mapping[str, Any]:
        with request.controllers.network.commands_in(pod):  # `httpd` listens in the pod
            return await exec_ws.exec_status(command, io, env, fs)

    await _run(request, session, work)


async def _serve_attach(request: PodStreamRequest, session: SpdySession) -> None:
    _, _, console = running_console(request.store, request.controllers, request.target,
                                    one(request.query, "container"))

    async def work(io: exec_ws.ChannelIO, opts: _Options) -> Mapping[str, Any]:
        await exec_ws.attach_console(console, io, stdin=opts.stdin, tty=opts.tty)
        return channels.success_status()

    await _run(request, session, work)


EXEC = SpdySubresource(protocols=PROTOCOLS, check=_check_exec, serve=_serve_exec)
ATTACH = SpdySubresource(protocols=PROTOCOLS, check=_check_attach, serve=_serve_attach)
