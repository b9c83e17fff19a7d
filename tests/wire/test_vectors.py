"""docs/protocol.md, tests/wire/vectors.json and the codec agree: the test vectors and the state table
in the spec are checked against the code, so the spec cannot drift."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from wire import codec
from wire.errors import ErrorCode
from wire.frames import (
    Accept,
    Data,
    Frame,
    FrameKind,
    GoAway,
    HalfClose,
    Hello,
    Notice,
    Open,
    Ping,
    Pong,
    Refuse,
    Reset,
    WindowUpdate,
)
from wire.settings import PROTOCOL_VERSION, Limits, Settings
from wire.streamstate import TRANSITIONS, StreamInput, StreamState

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
VECTORS: list[dict[str, Any]] = json.loads((Path(__file__).with_name("vectors.json")).read_text())[
    "vectors"
]
CLASSES: dict[str, type[Frame]] = {
    "HELLO": Hello,
    "OPEN": Open,
    "ACCEPT": Accept,
    "REFUSE": Refuse,
    "DATA": Data,
    "WINDOW_UPDATE": WindowUpdate,
    "HALF_CLOSE": HalfClose,
    "RESET": Reset,
    "PING": Ping,
    "PONG": Pong,
    "GOAWAY": GoAway,
    "NOTICE": Notice,
}


def frame_of(vector: dict[str, Any]) -> Frame:
    fields = dict(vector["frame"])
    if vector["kind"] == "DATA":
        fields["payload"] = bytes.fromhex(fields["payload"])
    return CLASSES[vector["kind"]](**fields)


def section(title: str) -> str:
    """The text of the doc's ``## <n>. title`` section."""
    match = re.search(rf"^## \d+\. {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, re.S | re.M)
    assert match, f"docs/protocol.md has no section {title!r}"
    return match.group(1)


def doc_vectors() -> dict[str, str]:
    """``#### KIND`` headings in the test-vector section, each with the ```hex block under it."""
    found = re.findall(r"^#### (\w+)\n(.*?)```hex\n(.*?)```", section("Test vectors"), re.S | re.M)
    vectors = {kind: "".join(hexdump.split()).lower() for kind, _, hexdump in found}
    assert len(vectors) == len(found), "a kind appears twice"
    return vectors


def test_there_is_one_vector_per_frame_kind() -> None:
    assert [v["kind"] for v in VECTORS] == [kind.name for kind in FrameKind]
    assert list(doc_vectors()) == [kind.name for kind in FrameKind]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["kind"] for v in VECTORS])
def test_codec_encodes_and_decodes_each_vector(vector: dict[str, Any]) -> None:
    frame = frame_of(vector)
    assert frame.kind.name == vector["kind"]
    assert codec.encode(frame).hex() == vector["hex"]
    assert codec.FrameDecoder().feed(bytes.fromhex(vector["hex"])) == [frame]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["kind"] for v in VECTORS])
def test_the_doc_shows_each_vector(vector: dict[str, Any]) -> None:
    assert doc_vectors()[vector["kind"]] == vector["hex"]


def test_the_hello_vector_announces_this_version_and_the_default_settings() -> None:
    hello = frame_of(VECTORS[0])
    assert isinstance(hello, Hello)
    assert (hello.major, hello.minor) == PROTOCOL_VERSION
    assert Settings.from_wire(hello.settings) == Settings()
    assert f"version {PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]}" in DOC.splitlines()[0]


def test_the_frame_kind_table_matches_the_code() -> None:
    rows = re.findall(r"^\| (\d+) \| ([A-Z_]+) \|", section("Framing"), re.M)
    assert [(int(n), name) for n, name in rows] == [(kind.value, kind.name) for kind in FrameKind]


def test_the_state_table_matches_the_code() -> None:
    rows = re.findall(
        r"^\| `([a-z/-]+)` \| `([a-z-]+)` \| `([a-z/-]+)` \|$", section("Streams"), re.M
    )
    documented = {
        (None if state == "idle" else StreamState(state), StreamInput(event)): StreamState(target)
        for state, event, target in rows
    }
    assert len(documented) == len(rows), "a row appears twice"
    assert documented == TRANSITIONS


def test_the_error_code_table_matches_the_code() -> None:
    rows = re.findall(r"^\| (0x[0-9A-F]+) \| `([A-Z_]+)` \|", section("Errors"), re.M)
    assert [(int(code, 16), name) for code, name in rows] == [
        (code.value, code.name) for code in ErrorCode
    ]


def test_the_settings_table_shows_the_defaults() -> None:
    rows = re.findall(r"^\| `(\w+)` \| (\d+)", section("Settings"), re.M)
    assert {key: int(value) for key, value in rows} == Settings().to_wire()


def test_the_limits_table_shows_the_defaults() -> None:
    text = section("Limits")
    limits = Limits()
    for label, value in [
        ("control frame", limits.max_control_frame),
        ("string", limits.max_string),
        ("map entries", limits.max_map_entries),
        ("array items", limits.max_array_items),
        ("depth", limits.max_depth),
    ]:
        match = re.search(rf"^\| {label} \| (\d+)( KiB)? \|", text, re.M)
        assert match, label
        assert int(match.group(1)) * (1024 if match.group(2) else 1) == value, label
