"""The remotecommand channel framing, sans-I/O."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubesim import channels
from kubesim.channels import (
    V1,
    V1_BASE64,
    V4,
    V4_BASE64,
    V5,
    ChannelClosed,
    ChannelData,
    ChannelProtocolError,
    ResizeDecoder,
    TerminalSize,
)

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [
        (["v5.channel.k8s.io", "v4.channel.k8s.io"], V5),
        (["v4.channel.k8s.io", "v5.channel.k8s.io"], V5),
        (["v4.channel.k8s.io"], V4),
        (["base64.channel.k8s.io", "channel.k8s.io"], V1),
        (["v4.base64.channel.k8s.io"], V4_BASE64),
        (["base64.channel.k8s.io"], V1_BASE64),
        ([" v4.channel.k8s.io "], V4),
        ([], channels.NO_PROTOCOL),
        (["v9.channel.k8s.io"], None),
    ],
)
def test_select_protocol(offered: list[str], chosen: channels.ChannelProtocol | None) -> None:
    assert channels.select_protocol(offered) == chosen


def test_binary_message_round_trip() -> None:
    message = channels.encode_message(V5, channels.STDOUT, b"hello")
    assert message == b"\x01hello"
    assert channels.decode_message(V5, message) == ChannelData(channel=1, data=b"hello")


def test_base64_message_round_trip() -> None:
    message = channels.encode_message(V1_BASE64, channels.STDERR, b"\x00\xffhi")
    assert message == "2AP9oaQ=="
    assert channels.decode_message(V1_BASE64, message) == ChannelData(channel=2, data=b"\x00\xffhi")


def test_text_message_on_binary_protocol_is_raw() -> None:
    # The Python client sends str stdin as a text message with a raw channel character.
    assert channels.decode_message(V4, "\x00abc") == ChannelData(channel=0, data=b"abc")


def test_empty_message_is_skipped() -> None:
    assert channels.decode_message(V5, b"") is None


def test_v5_close_signal() -> None:
    assert channels.encode_close(V5, channels.STDIN) == b"\xff\x00"
    assert channels.decode_message(V5, b"\xff\x00") == ChannelClosed(channel=0)


def test_close_signal_is_data_before_v5() -> None:
    assert channels.decode_message(V4, b"\xff\x00") == ChannelData(channel=255, data=b"\x00")
    with pytest.raises(ValueError, match="no close signal"):
        channels.encode_close(V4, channels.STDIN)


@pytest.mark.parametrize("message", [b"\xff", b"\xff\x00\x00", b"\xff\x09"])
def test_malformed_close_signal(message: bytes) -> None:
    with pytest.raises(ChannelProtocolError):
        channels.decode_message(V5, message)


def test_bad_base64_is_the_peers_fault() -> None:
    with pytest.raises(ChannelProtocolError, match="base64"):
        channels.decode_message(V4_BASE64, "0!!!")


def test_encode_rejects_unknown_channel() -> None:
    with pytest.raises(ValueError, match="no such channel"):
        channels.encode_message(V5, 7, b"")


@given(
    protocol=st.sampled_from(channels.PREFERENCE),
    channel=st.integers(0, 4),
    data=st.binary(max_size=200),
)
def test_round_trip_property(protocol: channels.ChannelProtocol, channel: int, data: bytes) -> None:
    message = channels.encode_message(protocol, channel, data)
    assert isinstance(message, str) == protocol.base64
    assert channels.decode_message(protocol, message) == ChannelData(channel=channel, data=data)


def test_resize_decoder_handles_split_and_joined_objects() -> None:
    decoder = ResizeDecoder()
    assert decoder.feed(b'{"Width":80,') == []
    assert decoder.feed(b'"Height":24}{"Width":100,"Height":40}') == [
        TerminalSize(width=80, height=24),
        TerminalSize(width=100, height=40),
    ]
    assert decoder.feed(b'{"width":1}') == [TerminalSize(width=1, height=0)]


@pytest.mark.parametrize("payload", [b"[1,2]", b'{"Width":-1,"Height":1}', b"}", b"\xff"])
def test_resize_decoder_rejects_garbage(payload: bytes) -> None:
    with pytest.raises(ChannelProtocolError):
        ResizeDecoder().feed(payload)


def test_encode_resize_matches_client_go() -> None:
    assert channels.encode_resize(TerminalSize(width=80, height=24)) == b'{"Width":80,"Height":24}'


def test_success_status_bytes() -> None:
    assert channels.status_payload(V5, channels.success_status()) == (
        b'{"metadata":{},"status":"Success"}'
    )
    assert channels.status_payload(V1, channels.success_status()) is None


def test_exit_code_status_matches_the_kubelet() -> None:
    status = channels.exit_code_status(["sh", "-c", "exit 3"], 3)
    assert channels.status_payload(V4, status) == (
        b'{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code:'
        b' error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode",'
        b'"details":{"causes":[{"reason":"ExitCode","message":"3"}]}}'
    )
    assert channels.status_payload(V1, status) == (
        b"command terminated with non-zero exit code: error executing command [sh -c exit 3],"
        b" exit code 3"
    )
    assert channels.exit_code_of(status) == 3


def test_status_json_escapes_like_go() -> None:
    payload = channels.status_payload(V5, channels.exit_code_status(["sh", "-c", "a<b>&c"], 1))
    assert payload is not None
    assert b"a\\u003cb\\u003e\\u0026c" in payload
    assert json.loads(payload)["message"].endswith("[sh -c a<b>&c], exit code 1")


def test_internal_error_status() -> None:
    status = channels.internal_error_status("boom")
    assert status["code"] == 500 and status["reason"] == "InternalError"
    assert status["message"] == "Internal error occurred: boom"
    with pytest.raises(ChannelProtocolError, match="no exit code"):
        channels.exit_code_of(status)


def test_translated_status_is_what_the_api_server_sends_for_v5() -> None:
    assert channels.translated_status(channels.success_status()) == channels.success_status()
    translated = channels.translated_status(channels.exit_code_status(["false"], 1))
    assert translated["message"] == (
        "command terminated with non-zero exit code: command terminated with exit code 1"
    )
    assert channels.exit_code_of(translated) == 1
    wrapped = channels.translated_status(channels.internal_error_status("boom"))
    assert wrapped["message"] == "Internal error occurred: Internal error occurred: boom"
    assert wrapped["details"] == {"causes": [{"message": "Internal error occurred: boom"}]}


def test_decode_status_rejects_non_status() -> None:
    with pytest.raises(ChannelProtocolError):
        channels.decode_status(b"not json")
    with pytest.raises(ChannelProtocolError):
        channels.decode_status(b"[]")
    assert channels.exit_code_of(channels.decode_status(b'{"status":"Success"}')) == 0
