"""The fence around h2's and hyperframe's internals (``h2trio.lean``).

Each ``test_assumption_*`` checks one internal the fast paths rely on, against the installed h2 and
hyperframe, and fails with a message naming it: when an upgrade breaks one, the message says which,
and ``KASD_SAFE_MODE=1`` runs without them until the fence is fixed.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from importlib.metadata import version

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.frame_buffer
import hyperframe.frame
import pytest

from h2trio import lean
from h2trio.lean import _LeanH2Connection, data_to_send_chunks, new_connection
from netio import safemode


def _pair(server_cls: type[h2.connection.H2Connection]) -> tuple[h2.connection.H2Connection, h2.connection.H2Connection]:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = server_cls(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    return client, server


def test_installed_versions_are_the_checked_ones() -> None:
    installed = {name: version(name) for name in lean.CHECKED_VERSIONS}
    assert installed == lean.CHECKED_VERSIONS, (
        f"h2trio.lean was checked against {lean.CHECKED_VERSIONS}, installed are {installed}: run these "
        "tests, then raise CHECKED_VERSIONS and the upper bounds in pyproject.toml together"
    )


def test_assumption_dataframe_repr_goes_through_body_repr() -> None:
    assert callable(getattr(hyperframe.frame.DataFrame, "_body_repr", None)), (
        "h2trio.lean assumes hyperframe.frame.DataFrame has a _body_repr method (the repr patch replaces it)"
    )
    frame = hyperframe.frame.DataFrame(1, b"x" * 100_000)
    if lean.LEAN:
        assert "<100000 bytes>" in repr(frame), (
            "h2trio.lean assumes repr(DataFrame) uses DataFrame._body_repr for the payload"
        )
    else:
        assert hyperframe.frame.DataFrame._body_repr is not lean._data_frame_body_repr, "KASD_SAFE_MODE must not patch"


def test_assumption_frame_buffer_internals() -> None:
    buffer = h2.frame_buffer.FrameBuffer(server=False)
    assert isinstance(getattr(buffer, "_data", None), bytearray), (
        "h2trio.lean assumes h2's FrameBuffer keeps unparsed bytes in a bytearray self._data"
    )
    assert getattr(buffer, "_headers_buffer", None) == [], (
        "h2trio.lean assumes h2's FrameBuffer assembles header blocks in a list self._headers_buffer"
    )
    assert list(inspect.signature(buffer._validate_frame_length).parameters) == ["length"], (
        "h2trio.lean assumes FrameBuffer._validate_frame_length(length)"
    )
    buffer.max_frame_size = 10
    with pytest.raises(h2.exceptions.FrameTooLargeError):
        buffer._validate_frame_length(11)
    buffer.add_data(b"\x00\x00\x01\x00\x00\x00\x00\x00")  # 8 of 9 header bytes
    with pytest.raises(StopIteration):  # "need more bytes", as the lean __next__ says too
        next(buffer)


def test_assumption_connection_internals() -> None:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    assert isinstance(getattr(conn, "_data_to_send", None), bytearray) and conn._data_to_send, (
        "h2trio.lean assumes H2Connection queues its preface in a bytearray self._data_to_send"
    )
    assert list(inspect.signature(conn._prepare_for_sending).parameters) == ["frames"], (
        "h2trio.lean assumes H2Connection._prepare_for_sending(frames) serialises every frame sent"
    )
    assert isinstance(conn.incoming_buffer, h2.frame_buffer.FrameBuffer) and hasattr(conn.incoming_buffer, "max_frame_size"), (
        "h2trio.lean assumes H2Connection.incoming_buffer is a replaceable FrameBuffer with max_frame_size"
    )
    seen: list[list[hyperframe.frame.Frame]] = []

    class Spy(h2.connection.H2Connection):
        def _prepare_for_sending(self, frames: list[hyperframe.frame.Frame]) -> None:
            seen.append(list(frames))
            super()._prepare_for_sending(frames)

    client, server = _pair(Spy)
    seen.clear()
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/")])
    server.receive_data(client.data_to_send())
    server.send_headers(1, [(":status", "200")])
    server.send_data(1, b"payload", end_stream=True)
    kinds = [type(frame).__name__ for frames in seen for frame in frames]
    assert "HeadersFrame" in kinds and "DataFrame" in kinds, (
        f"h2trio.lean assumes send_headers/send_data hand their frames to _prepare_for_sending (saw {kinds})"
    )


def test_lean_connection_sends_exactly_the_bytes_h2_would() -> None:
    sent = {}
    for cls in (h2.connection.H2Connection, _LeanH2Connection):
        client, server = _pair(cls)
        client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/")])
        server.receive_data(client.data_to_send())
        server.send_headers(1, [(":status", "200")])
        server.send_data(1, b"a" * 3000)
        server.send_data(1, b"b" * 10, pad_length=5)
        server.send_data(1, b"", end_stream=True)
        sent[cls.__name__] = b"".join(data_to_send_chunks(server))
    assert sent["_LeanH2Connection"] == sent["H2Connection"], (
        "h2trio.lean assumes a DATA frame is its 9-byte header and payload, as hyperframe serialises it"
    )


def test_new_connection_follows_the_switch() -> None:
    conn = new_connection(h2.config.H2Configuration(client_side=True))
    assert isinstance(conn, _LeanH2Connection) is lean.LEAN is (not safemode.SAFE_MODE)
    conn.initiate_connection()
    chunks = data_to_send_chunks(conn)
    assert b"".join(chunks).startswith(b"PRI * HTTP/2.0")
    assert data_to_send_chunks(conn) == []


def test_safe_mode_switch_is_read_from_the_environment() -> None:
    code = (
        "import hyperframe.frame as f, h2.config as c; from h2trio import lean; "
        "print(lean.LEAN, type(lean.new_connection(c.H2Configuration())).__name__, "
        "'<3 bytes>' in repr(f.DataFrame(1, b'abc')))"
    )
    results = {}
    for value in ("1", "0"):
        env = {**os.environ, safemode.ENVIRONMENT_VARIABLE: value}
        results[value] = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60
        ).stdout.split()
    assert results["1"] == ["False", "H2Connection", "False"]
    assert results["0"] == ["True", "_LeanH2Connection", "True"]


def test_lean_receive_buffer_parses_padded_and_split_data_frames() -> None:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = _LeanH2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/")])
    client.send_data(1, b"a" * 1000, pad_length=17)
    client.send_data(1, b"b" * 5000, end_stream=True)
    wire = client.data_to_send()
    received, flow, ended = b"", 0, False
    for start in range(0, len(wire), 7):  # every frame split across many reads
        for event in server.receive_data(wire[start : start + 7]):
            if isinstance(event, h2.events.DataReceived):
                received += event.data
                flow += event.flow_controlled_length
            ended = ended or isinstance(event, h2.events.StreamEnded)
    assert received == b"a" * 1000 + b"b" * 5000
    assert flow == 1000 + 18 + 5000  # padding counts against flow control
    assert ended
    # Padding longer than the frame is a protocol error, as in h2's own buffer.
    bad = _LeanH2Connection(h2.config.H2Configuration(client_side=False))
    bad.initiate_connection()
    preamble = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + hyperframe.frame.SettingsFrame(0).serialize()
    bad.receive_data(preamble)
    frame = b"\x00\x00\x02\x00\x08\x00\x00\x00\x01" + b"\x05x"  # DATA, PADDED, pad length 5 > body
    with pytest.raises(h2.exceptions.ProtocolError):
        bad.receive_data(frame)


def test_assumption_h2_makes_a_malformed_request_a_connection_error() -> None:
    """Item 4: what ``_StreamErrors`` copies and why. If h2 ever makes this a stream error itself,
    the override can go."""
    for name in ("_decode_headers", "ConnectionInputs", "AllowedStreamIDs"):
        assert hasattr(h2.connection, name), f"h2trio.lean assumes h2.connection.{name}"
    assert "stream.receive_headers(" in inspect.getsource(h2.connection.H2Connection._receive_headers_frame)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, validate_outbound_headers=False,
                                                                          normalize_outbound_headers=False))
    plain = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    plain.initiate_connection()
    plain.receive_data(client.data_to_send())
    client.send_headers(1, [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", "/"),
                            ("X-Upper", "1")], end_stream=True)
    with pytest.raises(h2.exceptions.ProtocolError):
        plain.receive_data(client.data_to_send())


@pytest.mark.parametrize("server_cls", [lean._StreamErrors, _LeanH2Connection])
def test_a_server_resets_a_malformed_requests_stream_alone(server_cls: type[h2.connection.H2Connection]) -> None:
    config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=False)
    client = h2.connection.H2Connection(config)
    server = server_cls(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    head = [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", "/")]
    client.send_headers(1, [*head, ("content-length", "²")], end_stream=True)
    client.send_headers(3, head, end_stream=True)
    events = server.receive_data(client.data_to_send())
    malformed = [e for e in events if isinstance(e, lean.MalformedRequest)]
    assert [e.stream_id for e in malformed] == [1] and "content-length" in malformed[0].reason
    assert [e.stream_id for e in events if isinstance(e, h2.events.RequestReceived)] == [3]
    answer = client.receive_data(server.data_to_send())
    assert [(e.stream_id, e.error_code) for e in answer if isinstance(e, h2.events.StreamReset)] == [(1, 1)]
    assert not [e for e in answer if isinstance(e, h2.events.ConnectionTerminated)]
