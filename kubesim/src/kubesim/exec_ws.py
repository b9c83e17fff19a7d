"""`pods/exec` and `pods/attach` over a WebSocket: the ASGI side of the kubelet's stream server.

The server routes an upgraded request here once it has found the pod. A session negotiates a
channel protocol (`channels`), sends the kubelet's "connected" signal (an empty message on the
lowest writable channel), runs the command (`shell`) or attaches to the container's console
(`console`) with stdin/stdout/stderr mapped onto channels, sends the Status on the error channel
and closes normally. One task reads the socket; writes are serialised by a lock; stdin is a
bounded channel, so a command that does not read stdin stops the reader (backpressure).
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, Protocol

import trio

from kubesim import channels
from kubesim.channels import ChannelProtocol, ChannelProtocolError, TerminalSize
from kubesim.console import ContainerConsole
from kubesim.fs import FileSystem
from kubesim.shell import LineDiscipline, Terminal, is_command, run_command

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: The kubelet copies streams with io.Copy's 32 KiB buffer: no message carries more.
MAX_MESSAGE_DATA = 32 * 1024
STDIN_BUFFER = 16
CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
#: Exit status of a command ended by ^C on its terminal (128 + SIGINT).
INTERRUPTED = 130
#: How long the API server takes, after accepting a v5 WebSocket, to reach the kubelet (its
#: StreamTranslator dials SPDY and opens the streams before any byte flows back). A real round
#: trip; it also keeps kubectl <= 1.32 working, whose WebSocket client starts reading before it
#: has made its streams and drops what arrives first (fixed in later client-go: "wait until all
#: streams have been created before starting the readDemuxLoop").
KUBELET_DIAL_LATENCY = 0.025


async def serve_exec(
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    command: list[str],
    env: Mapping[str, str],
    fs: FileSystem | None = None,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
) -> None:
    """Serve one `pods/exec` WebSocket: run `command` (in the container's filesystem `fs`) and
    report its exit status."""
    session = await _Session.accept(scope, receive, send, stdin=stdin)
    if session is None:
        return
    await session.greet(stdout=stdout, stderr=stderr)
    io = ChannelIO(session, stdout=stdout, stderr=stderr and not tty, tty=tty)

    async def run() -> Mapping[str, Any]:
        return await exec_status(command, io, env, fs)

    await session.run(run)


async def serve_attach(
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    console: ContainerConsole,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
) -> None:
    """Serve one `pods/attach` WebSocket onto the container's console.

    Output is what the container prints from now on; input goes to its main process: the
    command it runs, else kubesim's idle process, which echoes it. The session ends when the
    container stops or, for the idle process with stdin attached, when the client closes stdin
    (after the output it caused has been sent).
    """
    session = await _Session.accept(scope, receive, send, stdin=stdin)
    if session is None:
        return
    await session.greet(stdout=stdout, stderr=stderr)
    io = ChannelIO(session, stdout=stdout, stderr=stderr and not tty, tty=tty)

    async def run() -> Mapping[str, Any]:
        await attach_console(console, io, stdin=stdin, tty=tty)
        return channels.success_status()

    await session.run(run)


# -- running ------------------------------------------------------------------------------------


async def exec_status(
    command: list[str], io: ChannelIO, env: Mapping[str, str], fs: FileSystem | None = None
) -> Mapping[str, Any]:
    if not command:
        return channels.internal_error_status(
            "error executing command in container: command must not be empty"
        )
    if not is_command(command[0]):
        return channels.internal_error_status(_not_found_error(command[0]))
    try:
        if io.tty:
            code = await _run_on_terminal(command, io, env, fs)
        else:
            code = await run_command(command, io, env, fs=fs)
    except Exception as exc:  # a bug in a command must still end the session properly
        log.exception("exec %r failed", command)
        return channels.internal_error_status(f"error executing command in container: {exc!r}")
    if code == 0:
        return channels.success_status()
    return channels.exit_code_status(command, code)


def _not_found_error(name: str) -> str:
    # What containerd + runc report when the executable does not exist.
    exec_id = secrets.token_hex(32)
    return (
        "error executing command in container: failed to exec in container: "
        f'failed to start exec "{exec_id}": OCI runtime exec failed: exec failed: '
        f'unable to start container process: exec: "{name}": '
        "executable file not found in $PATH: unknown"
    )


async def _run_on_terminal(command: list[str], io: ChannelIO, env: Mapping[str, str],
                           fs: FileSystem | None) -> int:
    """Run `command` behind a `Terminal`; ^C that no interactive shell takes ends it (130)."""
    interrupted = False
    with trio.CancelScope() as command_scope:

        def interrupt() -> None:
            nonlocal interrupted
            interrupted = True
            command_scope.cancel()

        terminal = Terminal(io, on_interrupt=interrupt)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(terminal.pump_input)
            code = await run_command(command, terminal, env, fs=fs)
            nursery.cancel_scope.cancel()
    return INTERRUPTED if interrupted else code


async def attach_console(console: ContainerConsole, io: ChannelIO, *, stdin: bool, tty: bool) -> None:
    start = console.next_seq
    stop_at: int | None = None
    stdin_done = trio.Event()
    newline = b"\r\n" if tty else b"\n"

    async def feed_stdin() -> None:
        nonlocal stop_at
        discipline = LineDiscipline() if tty else None
        while data := await io.read_stdin():
            if discipline is None:
                console.write_stdin(data)
                continue
            typed = discipline.feed(data)
            if typed.echo:
                await io.write_stdout(typed.echo)
            for line in itertools.takewhile(bool, typed.reads):
                console.write_stdin(line)
            if typed.eof:  # ^D: the client is done typing
                break
        console.flush_stdin()
        if not console.runs_command:
            # The echoing main process answered all it was sent; a command may still be
            # working on it (`cat`), so then the session lasts until the command exits.
            stop_at = console.next_seq
            stdin_done.set()

    async def wait_for_more(seq: int) -> None:
        async with trio.open_nursery() as nursery:

            async def line() -> None:
                await console.wait_for_line(seq)
                nursery.cancel_scope.cancel()

            async def detach() -> None:
                await stdin_done.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(line)
            nursery.start_soon(detach)

    async with trio.open_nursery() as nursery:
        if stdin:
            nursery.start_soon(feed_stdin)
        seq = start
        while True:
            for line in console.lines_since(seq):
                await io.write_stdout(line.text.encode("utf-8") + newline)
                seq = line.seq + 1
            if stop_at is not None and seq >= stop_at:
                break
            if console.closed and seq >= console.next_seq:
                break
            await wait_for_more(seq)
        nursery.cancel_scope.cancel()


# -- the connection ----------------------------------------------------------------------------


class _Session:
    """One accepted WebSocket: a reader task, a write lock, stdin as a bounded channel."""

    def __init__(self, receive: Receive, send: Send, protocol: ChannelProtocol, *, stdin: bool):
        self.protocol = protocol
        self.stdin_enabled = stdin
        self.terminal_size: TerminalSize | None = None
        self.disconnected = False
        self.protocol_error: ChannelProtocolError | None = None
        self._receive = receive
        self._send = send
        self._write_lock = trio.StrictFIFOLock()
        self._closed = False
        self._stdin_send, self._stdin_receive = trio.open_memory_channel[bytes](STDIN_BUFFER)
        self._resize = channels.ResizeDecoder()
        self._scope = trio.CancelScope()

    @classmethod
    async def accept(
        cls, scope: Scope, receive: Receive, send: Send, *, stdin: bool
    ) -> _Session | None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return None
        protocol = channels.select_protocol(list(scope.get("subprotocols") or []))
        if protocol is None:
            # Before accepting, a close is an HTTP 403, as the kubelet's handshake answers.
            await send({"type": "websocket.close", "code": CLOSE_PROTOCOL_ERROR})
            return None
        accept: dict[str, Any] = {"type": "websocket.accept"}
        if protocol.name:
            accept["subprotocol"] = protocol.name
        await send(accept)
        return cls(receive, send, protocol, stdin=stdin)

    async def greet(self, *, stdout: bool, stderr: bool) -> None:
        """The kubelet's signal that the streams are ready: an empty message."""
        if self.protocol.close_signal:  # v5: only the API server speaks it (see above)
            await trio.sleep(KUBELET_DIAL_LATENCY)
        channel = channels.STDOUT if stdout else channels.STDERR if stderr else channels.ERROR
        await self._write_message(channel, b"")

    async def run(self, work: Callable[[], Awaitable[Mapping[str, Any]]]) -> None:
        """Run `work` while reading the socket; then send its Status and close."""
        status: Mapping[str, Any] | None = None
        with self._scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_loop)
                status = await work()
                nursery.cancel_scope.cancel()
        if self.protocol_error is not None:
            await self.close(CLOSE_PROTOCOL_ERROR)
            return
        if self.disconnected or status is None:
            return
        if self.protocol.close_signal:
            # Only the API server speaks v5: it translates to SPDY towards the kubelet.
            status = channels.translated_status(status)
        payload = channels.status_payload(self.protocol, status)
        if payload is not None:
            await self._write_message(channels.ERROR, payload)
        await self.close(CLOSE_NORMAL)

    async def _read_loop(self) -> None:
        try:
            while True:
                message = await self._receive()
                kind = message["type"]
                if kind == "websocket.disconnect":
                    self.disconnected = True
                    self._scope.cancel()
                    return
                if kind != "websocket.receive":
                    continue
                payload = message.get("bytes")
                if payload is None:
                    payload = message.get("text") or b""
                await self._dispatch(channels.decode_message(self.protocol, payload))
        except ChannelProtocolError as exc:
            log.warning("exec/attach client broke the channel protocol: %s", exc)
            self.protocol_error = exc
            self._scope.cancel()
        finally:
            self._stdin_send.close()

    async def _dispatch(self, event: channels.ChannelData | channels.ChannelClosed | None) -> None:
        if isinstance(event, channels.ChannelClosed):
            if event.channel == channels.STDIN:
                self._stdin_send.close()
        elif isinstance(event, channels.ChannelData):
            if event.channel == channels.STDIN and self.stdin_enabled and event.data:
                try:
                    await self._stdin_send.send(event.data)
                except trio.ClosedResourceError:
                    pass  # data after the client closed stdin: dropped, as the kubelet does
            elif event.channel == channels.RESIZE:
                for size in self._resize.feed(event.data):
                    self.terminal_size = size
        await trio.lowlevel.checkpoint()

    async def read_stdin(self) -> bytes:
        if not self.stdin_enabled:
            await trio.lowlevel.checkpoint()
            return b""
        try:
            return await self._stdin_receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return b""

    async def write(self, channel: int, data: bytes) -> None:
        for start in range(0, len(data), MAX_MESSAGE_DATA):
            await self._write_message(channel, data[start : start + MAX_MESSAGE_DATA])

    async def _write_message(self, channel: int, data: bytes) -> None:
        message = channels.encode_message(self.protocol, channel, data)
        event: dict[str, Any] = {"type": "websocket.send"}
        event["bytes" if isinstance(message, bytes) else "text"] = message
        async with self._write_lock:
            if not self._closed:
                await self._send(event)

    async def close(self, code: int) -> None:
        async with self._write_lock:
            if not self._closed:
                self._closed = True
                await self._send({"type": "websocket.close", "code": code})


class Channels(Protocol):
    """Where a command's streams go: a WebSocket session's channels, or SPDY streams."""

    async def read_stdin(self) -> bytes: ...

    async def write(self, channel: int, data: bytes) -> None: ...


class ChannelIO:
    """A command's standard streams on a session's channels (what a pipe-backed exec gets).

    Shared by both transports: exec_ws (WebSocket channels) and exec_spdy (SPDY streams).
    """

    def __init__(self, session: Channels, *, stdout: bool, stderr: bool, tty: bool) -> None:
        self._session = session
        self._stdout = stdout
        self._stderr = stderr
        self.tty = tty

    async def read_stdin(self) -> bytes:
        return await self._session.read_stdin()

    async def write_stdout(self, data: bytes) -> None:
        if self._stdout and data:
            await self._session.write(channels.STDOUT, data)
        else:
            await trio.lowlevel.checkpoint()

    async def write_stderr(self, data: bytes) -> None:
        if self._stderr and data:
            await self._session.write(channels.STDERR, data)
        elif self.tty:
            await self.write_stdout(data)
        else:
            await trio.lowlevel.checkpoint()
