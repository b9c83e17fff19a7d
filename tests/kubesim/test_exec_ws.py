"""serve_exec / serve_attach behind a real hypercorn on 127.0.0.1, driven by a real WebSocket client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio_websocket
from hypercorn.config import Config
from hypercorn.trio import serve

from kubesim import channels
from kubesim.console import ContainerConsole
from kubesim.exec_ws import serve_attach, serve_exec

pytestmark = pytest.mark.timeout(10)

ENV = {"PATH": "/usr/bin:/bin", "HOSTNAME": "web-0", "GREETING": "hello"}
V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"


def _flags(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[-1] == "true"


def make_app(
    console: ContainerConsole | None = None, done: trio.Event | None = None
) -> Callable[..., Any]:
    from urllib.parse import parse_qs

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        assert scope["type"] == "websocket"
        query = parse_qs(scope["query_string"].decode())
        flags = {name: _flags(query, name) for name in ("stdin", "stdout", "stderr", "tty")}
        if scope["path"].endswith("/attach"):
            assert console is not None
            await serve_attach(scope, receive, send, console=console, **flags)
        else:
            await serve_exec(scope, receive, send, command=query["command"], env=ENV, **flags)
        if done is not None:
            done.set()

    return app


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[Callable[..., Any]]:
    async def start(
        console: ContainerConsole | None = None, done: trio.Event | None = None
    ) -> str:
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        config.errorlog = None
        binds = await nursery.start(serve, make_app(console, done), config)
        return binds[0].replace("http://", "")

    yield start


def exec_path(command: list[str], **flags: bool) -> str:
    from urllib.parse import urlencode

    query = [("command", c) for c in command]
    query += [(k, "true") for k, v in flags.items() if v]
    return "/api/v1/namespaces/default/pods/web-0/exec?" + urlencode(query)


class Result:
    def __init__(self) -> None:
        self.messages: list[bytes | str] = []
        self.streams: dict[int, bytes] = {}
        self.close_code: int | None = None

    def on(self, channel: int) -> bytes:
        return self.streams.get(channel, b"")

    def status(self) -> dict[str, Any]:
        return channels.decode_status(self.on(channels.ERROR))


async def collect(
    ws: trio_websocket.WebSocketConnection, protocol: channels.ChannelProtocol
) -> Result:
    result = Result()
    try:
        while True:
            message = await ws.get_message()
            result.messages.append(message)
            event = channels.decode_message(protocol, message)
            if isinstance(event, channels.ChannelData):
                result.streams[event.channel] = result.on(event.channel) + event.data
    except trio_websocket.ConnectionClosed as exc:
        result.close_code = exc.reason.code
    return result


async def run_exec(
    host: str,
    command: list[str],
    *,
    stdin_chunks: list[bytes] = (),  # type: ignore[assignment]
    close_stdin: bool = True,
    subprotocols: list[str] | None = None,
    **flags: bool,
) -> Result:
    hostname, port = host.rsplit(":", 1)
    protocols = [V5, V4] if subprotocols is None else subprotocols
    async with trio_websocket.open_websocket(
        hostname, int(port), exec_path(command, **flags), use_ssl=False, subprotocols=protocols
    ) as ws:
        protocol = channels.PROTOCOLS.get(ws.subprotocol or "", channels.NO_PROTOCOL)
        for chunk in stdin_chunks:
            await ws.send_message(channels.encode_message(protocol, channels.STDIN, chunk))
        if close_stdin and flags.get("stdin") and protocol.close_signal:
            await ws.send_message(channels.encode_close(protocol, channels.STDIN))
        return await collect(ws, protocol)


async def test_echo_success_v5(server: Callable[..., Any]) -> None:
    host = await server()
    result = await run_exec(host, ["echo", "hi"], stdout=True, stderr=True)
    # The kubelet's "ready" signal comes first: an empty stdout message.
    assert result.messages[0] == bytes([channels.STDOUT])
    assert result.on(channels.STDOUT) == b"hi\n"
    assert result.on(channels.ERROR) == b'{"metadata":{},"status":"Success"}'
    assert result.close_code == 1000


async def test_nonzero_exit_status_v4_is_the_kubelets(server: Callable[..., Any]) -> None:
    host = await server()
    result = await run_exec(
        host, ["sh", "-c", "echo oops >&2; exit 3"], stdout=True, stderr=True, subprotocols=[V4]
    )
    assert result.on(channels.STDERR) == b"oops\n"
    assert result.on(channels.ERROR) == (
        b'{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit'
        b' code: error executing command [sh -c echo oops \\u003e\\u00262; exit 3], exit code 3",'
        b'"reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}'
    )
    assert channels.exit_code_of(result.status()) == 3


async def test_nonzero_exit_status_v5_is_the_api_servers(server: Callable[..., Any]) -> None:
    host = await server()
    result = await run_exec(host, ["sh", "-c", "exit 3"], stdout=True, subprotocols=[V5, V4])
    assert result.on(channels.ERROR) == (
        b'{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit'
        b' code: command terminated with exit code 3","reason":"NonZeroExitCode",'
        b'"details":{"causes":[{"reason":"ExitCode","message":"3"}]}}'
    )


async def test_stdin_until_v5_close_signal(server: Callable[..., Any]) -> None:
    host = await server()
    result = await run_exec(
        host, ["cat"], stdin_chunks=[b"line one\n", b"line two\n"], stdin=True, stdout=True, stderr=True
    )
    assert result.on(channels.STDOUT) == b"line one\nline two\n"
    assert result.status()["status"] == "Success"


async def test_without_stdin_cat_sees_eof_at_once(server: Callable[..., Any]) -> None:
    host = await server()
    result = await run_exec(host, ["cat"], stdout=True)
    assert result.on(channels.STDOUT) == b""
    assert result.status()["status"] == "Success"


async def test_v4_text_stdin_like_the_python_client(server: Callable[..., Any]) -> None:
    host = await server()
    hostname, port = host.rsplit(":", 1)
    async with trio_websocket.open_websocket(
        hostname,
        int(port),
        exec_path(["sh", "-c", "read x; echo got $x"], stdin=True, stdout=True),
        use_ssl=False,
        subprotocols=[V4],
    ) as ws:
        assert ws.subprotocol == V4
        # The Python client writes str stdin as a text message: chr(0) + data.
        await ws.send_message("\x00abc\n")
        result = await collect(ws, channels.V4)
    assert result.on(channels.STDOUT) == b"got abc\n"
    assert result.status() == {"metadata": {}, "status": "Success"}


async def test_base64_protocol(server: Callable[..., Any]) -> None:
    host = await server()
    result = await run_exec(
        host, ["sh", "-c", "exit 2"], stdout=True, subprotocols=["base64.channel.k8s.io"]
    )
    assert all(isinstance(m, str) for m in result.messages)
    # Before v4, failure is the bare message and success sends nothing.
    assert result.on(channels.ERROR).startswith(b"command terminated with non-zero exit code")


async def test_unsupported_subprotocol_is_refused(server: Callable[..., Any]) -> None:
    host = await server()
    with pytest.raises(trio_websocket.HandshakeError) as info:
        await run_exec(host, ["true"], stdout=True, subprotocols=["v9.channel.k8s.io"])
    assert "403" in str(info.value)


async def test_unknown_executable_is_an_internal_error(server: Callable[..., Any]) -> None:
    host = await server()
    result = await run_exec(host, ["nosuchthing"], stdout=True, stderr=True)
    status = result.status()
    assert status["reason"] == "InternalError" and status["code"] == 500
    # v5 goes through the API server's translator, which wraps the kubelet's error once more.
    assert status["message"].startswith(
        "Internal error occurred: Internal error occurred: error executing command in container: "
    )
    assert 'exec: "nosuchthing": executable file not found in $PATH: unknown' in status["message"]


async def test_tty_with_resize_and_cooked_input(server: Callable[..., Any]) -> None:
    host = await server()
    hostname, port = host.rsplit(":", 1)
    async with trio_websocket.open_websocket(
        hostname, int(port), exec_path(["sh"], stdin=True, stdout=True, tty=True),
        use_ssl=False, subprotocols=[V5, V4],
    ) as ws:
        size = channels.encode_resize(channels.TerminalSize(width=80, height=24))
        await ws.send_message(channels.encode_message(channels.V5, channels.RESIZE, size))
        seen = b""

        async def until(text: bytes) -> None:
            nonlocal seen
            while text not in seen:
                event = channels.decode_message(channels.V5, await ws.get_message())
                assert isinstance(event, channels.ChannelData)
                seen += event.data

        await until(b"/ # ")
        await ws.send_message(channels.encode_message(channels.V5, channels.STDIN, b"echo $HOSTNAME\r"))
        await until(b"web-0\r\n/ # ")
        await ws.send_message(channels.encode_message(channels.V5, channels.STDIN, b"exit 5\r"))
        result = await collect(ws, channels.V5)
    # A pty echoes what is typed, and its output turns \n into \r\n.
    assert seen + result.on(channels.STDOUT) == b"/ # echo $HOSTNAME\r\nweb-0\r\n/ # exit 5\r\n"
    assert channels.exit_code_of(result.status()) == 5


async def test_client_disconnect_cancels_the_command(server: Callable[..., Any]) -> None:
    done = trio.Event()
    host = await server(done=done)
    hostname, port = host.rsplit(":", 1)
    with trio.fail_after(5):
        async with trio_websocket.open_websocket(
            hostname, int(port), exec_path(["sleep", "3600"], stdout=True), use_ssl=False,
            subprotocols=[V5],
        ) as ws:
            assert await ws.get_message() == bytes([channels.STDOUT])
        # Leaving the block closed the socket; serve_exec must return, not wait out the sleep.
        await done.wait()


async def test_attach_echoes_stdin_and_ends_at_stdin_close(server: Callable[..., Any]) -> None:
    console = ContainerConsole()
    console.log("before attach")
    host = await server(console)
    hostname, port = host.rsplit(":", 1)
    path = "/api/v1/namespaces/default/pods/web-0/attach?stdin=true&stdout=true"
    async with trio_websocket.open_websocket(
        hostname, int(port), path, use_ssl=False, subprotocols=[V5, V4]
    ) as ws:
        assert await ws.get_message() == bytes([channels.STDOUT])
        console.log("from the app")
        await ws.send_message(channels.encode_message(channels.V5, channels.STDIN, b"typed\npartial"))
        await ws.send_message(channels.encode_close(channels.V5, channels.STDIN))
        result = await collect(ws, channels.V5)
    assert result.on(channels.STDOUT) == b"from the app\ntyped\npartial\n"
    assert json.loads(result.on(channels.ERROR)) == {"metadata": {}, "status": "Success"}
    assert [line.text for line in console.lines_since(0)] == [
        "before attach", "from the app", "typed", "partial"
    ]


async def test_attach_ends_when_the_container_stops(server: Callable[..., Any]) -> None:
    console = ContainerConsole()
    host = await server(console)
    hostname, port = host.rsplit(":", 1)
    path = "/api/v1/namespaces/default/pods/web-0/attach?stdout=true&stderr=true"
    async with trio_websocket.open_websocket(
        hostname, int(port), path, use_ssl=False, subprotocols=[V5]
    ) as ws:
        assert await ws.get_message() == bytes([channels.STDOUT])
        console.log("last words")
        console.close()
        result = await collect(ws, channels.V5)
    assert result.on(channels.STDOUT) == b"last words\n"
    assert result.status()["status"] == "Success"
    assert result.close_code == 1000


async def test_attach_with_tty_echoes_keys(server: Callable[..., Any]) -> None:
    console = ContainerConsole()
    host = await server(console)
    hostname, port = host.rsplit(":", 1)
    path = "/api/v1/namespaces/default/pods/web-0/attach?stdin=true&stdout=true&tty=true"
    async with trio_websocket.open_websocket(
        hostname, int(port), path, use_ssl=False, subprotocols=[V5]
    ) as ws:
        assert await ws.get_message() == bytes([channels.STDOUT])
        await ws.send_message(channels.encode_message(channels.V5, channels.STDIN, b"hi\r"))
        await ws.send_message(channels.encode_message(channels.V5, channels.STDIN, b"\x04"))
        result = await collect(ws, channels.V5)
    # The terminal echoes the keys, then the main process prints the line back.
    assert result.on(channels.STDOUT) == b"hi\r\nhi\r\n"
    assert [line.text for line in console.lines_since(0)] == ["hi"]


async def test_large_output_is_split_into_32k_messages(server: Callable[..., Any]) -> None:
    host = await server()
    result = await run_exec(host, ["sh", "-c", "yes abcdefg | head -n 20000"], stdout=True)
    assert result.on(channels.STDOUT) == b"abcdefg\n" * 20000
    assert max(len(m) for m in result.messages) <= 32 * 1024 + 1
    assert result.status()["status"] == "Success"
