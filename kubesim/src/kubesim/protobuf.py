"""Decode Kubernetes protobuf request bodies into the dict their JSON form would be.

kubectl's typed clients (every ``kubectl create <kind>`` generator, ``kubectl autoscale``,
``kubectl create token``, ``kubectl create job --from``) always send
``application/vnd.kubernetes.protobuf`` bodies, whatever discovery says, and never fall back to
JSON. A body is the ``k8s\\x00`` magic followed by a ``runtime.Unknown`` envelope whose ``raw`` is
the object's gogo-generated protobuf encoding (without TypeMeta, which the envelope carries).

``decode_protobuf_object`` turns such a body into exactly what ``encoding/json`` would print for the
decoded Go object, so the rest of kubesim can treat JSON and protobuf bodies alike:

* field names and nesting of the JSON API (inline structs such as ``VolumeSource`` are flattened);
* ``omitempty`` rules: gogo writes every non-pointer field, so zero values are dropped where the Go
  field has ``omitempty`` and kept where it has not; non-pointer structs are always present (Go's
  JSON encoder never omits a struct), so ``"status": {}`` and ``"creationTimestamp": null`` appear
  just as kubectl prints them; pointer fields appear only when sent;
* ``metav1.Time`` as RFC 3339 (``null`` when zero), ``IntOrString`` as int or str,
  ``resource.Quantity`` as its string, ``[]byte`` as base64, maps as key-sorted dicts.

The message tables live in ``protobuf_tables.json``, generated from a kubectl binary by
``kubesim/tools/gen_protobuf_tables.py`` (docs/kubesim-protobuf.md): field numbers and kinds from the
``generated.proto`` descriptors of k8s.io/api and k8s.io/apimachinery where the binary has them, JSON
names, Go struct order, pointer-ness and ``omitempty`` from the Go struct tags compiled into it.
Unknown field numbers are skipped, as the Go decoder does, so newer clients stay decodable.

This module does no I/O. Every malformed or unsupported input raises ``ProtobufDecodeError``; work
is linear in the input size because the schema is not recursive.
"""

from __future__ import annotations

import base64
import datetime
import enum
import json
import re
from collections.abc import Iterator
from importlib import resources as importlib_resources
from typing import Any, TypeAlias

import attrs

from kubesim.protobuf_kinds import KINDS

__all__ = ["MAGIC", "ProtobufDecodeError", "decode_protobuf_object", "supported_kinds"]

#: Prefix of every Kubernetes protobuf body (``k8s.io/apimachinery/pkg/runtime/serializer/protobuf``).
MAGIC = b"k8s\x00"

#: The only inner content type the Unknown envelope may announce (empty means the same).
_PROTOBUF_CONTENT_TYPE = "application/vnd.kubernetes.protobuf"


class ProtobufDecodeError(ValueError):
    """The request body is not a protobuf object kubesim can decode (the client's fault: 400/415)."""


# --------------------------------------------------------------------------------------------------
# Descriptor model


class Scalar(enum.Enum):
    """How one wire value becomes one JSON value."""

    STRING = "string"
    BYTES = "bytes"  # []byte: base64 in JSON
    BOOL = "bool"
    INT32 = "int32"
    INT64 = "int64"
    # apimachinery messages with a custom JSON form:
    TIME = "metav1.Time"  # {seconds, nanos} -> RFC 3339 seconds, null when zero
    MICROTIME = "metav1.MicroTime"  # {seconds, nanos} -> RFC 3339 microseconds
    INT_OR_STRING = "intstr.IntOrString"  # {type, intVal, strVal} -> int | str
    QUANTITY = "resource.Quantity"  # {string} -> str
    RAW_JSON = "raw JSON"  # FieldsV1 {Raw}: the bytes are JSON already


class Presence(enum.Enum):
    """When a field appears in the JSON form; follows from Go pointer-ness and ``omitempty``."""

    OMIT = "omitempty"  # value type with omitempty: dropped when zero/empty
    ALWAYS = "always"  # value type without omitempty, or any struct: zero value when not sent
    POINTER = "pointer"  # pointer with omitempty: present iff sent (even when zero)
    POINTER_OR_NULL = "pointer, no omitempty"  # pointer without omitempty: null when not sent
    INLINE = "inline"  # embedded struct (json:",inline"): its fields join the parent


@attrs.frozen
class Repeated:
    """A Go slice of ``item``."""

    item: Scalar | str


@attrs.frozen
class Map:
    """A Go ``map[string]value`` (protobuf map entry: key = 1, value = 2)."""

    value: Scalar | str


Kind: TypeAlias = Scalar | str | Repeated | Map  # str names a message in _MESSAGES


@attrs.frozen(kw_only=True)
class Field:
    """One protobuf field of a message and how it shows in JSON (json_name "" when inline)."""

    number: int
    json_name: str
    kind: Kind
    presence: Presence


@attrs.frozen(kw_only=True)
class Message:
    """A message table, named "<group>/<version>.<Type>" as in k8s.io/api's package layout."""

    name: str
    fields: tuple[Field, ...]  # Go struct order, which is JSON output order
    by_number: dict[int, Field] = attrs.field(eq=False)


STRING, BYTES, BOOL = Scalar.STRING, Scalar.BYTES, Scalar.BOOL
INT32, INT64 = Scalar.INT32, Scalar.INT64
TIME, MICROTIME = Scalar.TIME, Scalar.MICROTIME
INT_OR_STRING, QUANTITY, RAW_JSON = Scalar.INT_OR_STRING, Scalar.QUANTITY, Scalar.RAW_JSON
OMIT, ALWAYS, POINTER = Presence.OMIT, Presence.ALWAYS, Presence.POINTER
POINTER_OR_NULL, INLINE = Presence.POINTER_OR_NULL, Presence.INLINE


#: The message tables: generated from kubectl by kubesim/tools/gen_protobuf_tables.py (see
#: docs/kubesim-protobuf.md), plus the hand-kept list of kinds whose bodies kubesim accepts.
TABLES_FILE = "protobuf_tables.json"
_KINDS = KINDS


def _kind(spelled: Any) -> Kind:
    """A kind as the JSON file spells it: a Scalar name, a message name, {"repeated"|"map": kind}."""
    if isinstance(spelled, dict):
        ((shape, inner),) = spelled.items()
        item = _kind(inner)
        if isinstance(item, Repeated | Map):
            raise RuntimeError(f"{TABLES_FILE}: nested {shape} of {inner}")
        return Repeated(item) if shape == "repeated" else Map(item)
    return spelled if "/" in spelled else Scalar[spelled]


def _load_tables() -> dict[str, tuple[tuple[int, str, Kind, Presence], ...]]:
    document = json.loads(importlib_resources.files("kubesim").joinpath(TABLES_FILE).read_text())
    return {
        name: tuple((number, json_name, _kind(kind), Presence[presence]) for number, json_name, kind, presence in rows)
        for name, rows in document["messages"].items()
    }


def _build(tables: dict[str, tuple[tuple[int, str, Kind, Presence], ...]]) -> dict[str, Message]:
    messages: dict[str, Message] = {}
    for name, rows in tables.items():
        fields = tuple(Field(number=n, json_name=j, kind=k, presence=p) for n, j, k, p in rows)
        messages[name] = Message(name=name, fields=fields, by_number={f.number: f for f in fields})
    # A dangling reference would only surface on some rare input; fail at import instead.
    for message in messages.values():
        for f in message.fields:
            inner = f.kind.item if isinstance(f.kind, Repeated) else f.kind
            inner = inner.value if isinstance(inner, Map) else inner
            if isinstance(inner, str) and inner not in messages:
                raise RuntimeError(f"{message.name}.{f.json_name}: unknown message {inner}")
    for target in _KINDS.values():
        if target not in messages:
            raise RuntimeError(f"unknown top-level message {target}")
    return messages


MESSAGES = _build(_load_tables())


def supported_kinds() -> frozenset[tuple[str, str]]:
    """(apiVersion, kind) pairs that ``decode_protobuf_object`` accepts."""
    return frozenset(_KINDS)


# --------------------------------------------------------------------------------------------------
# Wire format

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_MASK64 = (1 << 64) - 1


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise ProtobufDecodeError("truncated varint")
        if shift >= 64:
            raise ProtobufDecodeError("varint longer than 64 bits")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            # Go's decoders keep the low 64 bits of a 10-byte varint; so do we.
            return result & _MASK64, pos
        shift += 7


WireValue: TypeAlias = int | memoryview


def _iter_fields(buf: memoryview) -> Iterator[tuple[int, int, WireValue]]:
    """Yield (field number, wire type, value); fixed-width values come back as ints."""
    pos = 0
    end = len(buf)
    while pos < end:
        key, pos = _read_varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0 or number > 0x1FFFFFFF:
            raise ProtobufDecodeError(f"illegal field number {number}")
        if wire_type == _VARINT:
            value, pos = _read_varint(buf, pos)
            yield number, wire_type, value
        elif wire_type == _LEN:
            length, pos = _read_varint(buf, pos)
            if length > end - pos:
                raise ProtobufDecodeError("length-delimited field runs past its message")
            yield number, wire_type, buf[pos : pos + length]
            pos += length
        elif wire_type in (_FIXED64, _FIXED32):
            width = 8 if wire_type == _FIXED64 else 4
            if width > end - pos:
                raise ProtobufDecodeError("truncated fixed-width field")
            yield number, wire_type, int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        else:
            # Groups (3, 4) are proto1 relics no Kubernetes type uses; 6 and 7 do not exist.
            raise ProtobufDecodeError(f"unsupported wire type {wire_type} (field {number})")


def _as_int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _as_int32(v: int) -> int:
    # gogo accumulates into an int32, so only the low 32 bits survive.
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _string(buf: memoryview) -> str:
    # Go strings need not be UTF-8; encoding/json writes invalid bytes as U+FFFD.
    return bytes(buf).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------------
# Special apimachinery messages


def _small_fields(buf: memoryview) -> dict[int, tuple[int, WireValue]]:
    """Last (wire type, value) per field number of a tiny fixed message (Time, IntOrString, …)."""
    return {number: (wire_type, value) for number, wire_type, value in _iter_fields(buf)}


def _varint_field(fields: dict[int, tuple[int, WireValue]], number: int, what: str) -> int:
    wire_type, value = fields.get(number, (_VARINT, 0))
    if wire_type != _VARINT:
        raise ProtobufDecodeError(f"{what}: field {number} must be a varint")
    assert isinstance(value, int)
    return value


def _bytes_field(
    fields: dict[int, tuple[int, WireValue]], number: int, what: str
) -> memoryview | None:
    if number not in fields:
        return None
    wire_type, value = fields[number]
    if wire_type != _LEN:
        raise ProtobufDecodeError(f"{what}: field {number} must be length-delimited")
    assert isinstance(value, memoryview)
    return value


_UNIX_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
# time.Unix(s, 0) for this s is Go's zero time.Time, which metav1.Time marshals as null.
_GO_ZERO_TIME_SECONDS = -62135596800


def _timestamp(buf: memoryview, micro: bool) -> str | None:
    what = "MicroTime" if micro else "Time"
    if len(buf) == 0:
        return None  # metav1.Time.Unmarshal: no bytes means the zero time
    fields = _small_fields(buf)
    seconds = _as_int64(_varint_field(fields, 1, what))
    # metav1.Time drops nanos on decode (time_proto.go), MicroTime keeps them.
    nanos = _as_int32(_varint_field(fields, 2, what)) if micro else 0
    total_us = seconds * 1_000_000 + nanos // 1000
    if total_us == _GO_ZERO_TIME_SECONDS * 1_000_000 and nanos % 1000 == 0:
        return None
    try:
        moment = _UNIX_EPOCH + datetime.timedelta(microseconds=total_us)
    except OverflowError:
        raise ProtobufDecodeError(f"{what} out of range: {seconds}s") from None
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ").rjust(27, "0")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ").rjust(20, "0")


def _int_or_string(buf: memoryview) -> int | str:
    fields = _small_fields(buf)
    kind = _as_int64(_varint_field(fields, 1, "IntOrString"))
    if kind == 0:
        return _as_int32(_varint_field(fields, 2, "IntOrString"))
    if kind == 1:
        raw = _bytes_field(fields, 3, "IntOrString")
        return "" if raw is None else _string(raw)
    raise ProtobufDecodeError(f"IntOrString with impossible type {kind}")


# resource.ParseQuantity's grammar: signed decimal, then a binary SI, decimal SI or exponent suffix.
_QUANTITY = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?",
    re.ASCII,
)


def _quantity(buf: memoryview) -> str:
    fields = _small_fields(buf)
    raw = _bytes_field(fields, 1, "Quantity")
    if raw is None:
        return "0"  # a zero Quantity marshals as "0"
    text = _string(raw)
    if not _QUANTITY.fullmatch(text):
        raise ProtobufDecodeError(f"quantities must match the regular expression: {text!r}")
    # kubectl always sends the canonical form (Quantity.String()), so it is passed through as is.
    return text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _raw_json(buf: memoryview) -> Any:
    fields = _small_fields(buf)
    raw = _bytes_field(fields, 1, "FieldsV1")
    if raw is None or len(raw) == 0:
        return None
    try:
        return json.loads(bytes(raw), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        raise ProtobufDecodeError(f"FieldsV1 is not valid JSON: {e}") from None


_SPECIAL_ZERO: dict[Scalar, Any] = {
    Scalar.TIME: None,
    Scalar.MICROTIME: None,
    Scalar.INT_OR_STRING: 0,
    Scalar.QUANTITY: "0",
    Scalar.RAW_JSON: None,
}
_SCALAR_ZERO: dict[Scalar, Any] = {
    Scalar.STRING: "",
    Scalar.BYTES: None,  # a nil []byte marshals as null
    Scalar.BOOL: False,
    Scalar.INT32: 0,
    Scalar.INT64: 0,
}


# --------------------------------------------------------------------------------------------------
# Messages


def _expect_len(value: WireValue, where: str) -> memoryview:
    if not isinstance(value, memoryview):
        raise ProtobufDecodeError(f"{where}: expected a length-delimited field")
    return value


def _scalar(kind: Scalar, wire_type: int, value: WireValue, where: str) -> Any:
    if kind in (Scalar.BOOL, Scalar.INT32, Scalar.INT64):
        if wire_type != _VARINT:
            raise ProtobufDecodeError(f"{where}: wrong wire type {wire_type} for a varint")
        assert isinstance(value, int)
        if kind is Scalar.BOOL:
            return value != 0
        return _as_int32(value) if kind is Scalar.INT32 else _as_int64(value)
    buf = _expect_len(value, where)
    if kind is Scalar.STRING:
        return _string(buf)
    if kind is Scalar.BYTES:
        return base64.b64encode(buf).decode("ascii")
    if kind is Scalar.TIME:
        return _timestamp(buf, micro=False)
    if kind is Scalar.MICROTIME:
        return _timestamp(buf, micro=True)
    if kind is Scalar.INT_OR_STRING:
        return _int_or_string(buf)
    if kind is Scalar.QUANTITY:
        return _quantity(buf)
    return _raw_json(buf)


def _zero(kind: Scalar | str) -> Any:
    """What Go's JSON encoder prints for a zero value of ``kind``."""
    if isinstance(kind, str):
        return _decode_message(MESSAGES[kind], memoryview(b""))
    if kind in _SPECIAL_ZERO:
        return _SPECIAL_ZERO[kind]
    return _SCALAR_ZERO[kind]


def _is_empty(value: Any) -> bool:
    # encoding/json's isEmptyValue for the kinds omitempty scalars can have.
    return value is None or value == "" or value is False or (type(value) is int and value == 0)


def _element(kind: Scalar | str, wire_type: int, value: WireValue, where: str) -> Any:
    if isinstance(kind, str):
        return _decode_message(MESSAGES[kind], _expect_len(value, where))
    return _scalar(kind, wire_type, value, where)


def _repeated(item: Scalar | str, seen: list[tuple[int, WireValue]], where: str) -> list[Any]:
    out: list[Any] = []
    for wire_type, value in seen:
        if item in (Scalar.BOOL, Scalar.INT32, Scalar.INT64) and wire_type == _LEN:
            # Packed encoding: gogo accepts it for repeated varints, so must we.
            assert isinstance(value, memoryview)
            pos = 0
            while pos < len(value):
                v, pos = _read_varint(value, pos)
                out.append(_scalar(item, _VARINT, v, where))
        else:
            out.append(_element(item, wire_type, value, where))
    return out


def _map(value_kind: Scalar | str, seen: list[tuple[int, WireValue]], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _, entry in seen:
        key = ""
        value: Any = _MISSING
        for number, wire_type, v in _iter_fields(_expect_len(entry, where)):
            if number == 1:
                key = _string(_expect_len(v, where))
            elif number == 2:
                value = _element(value_kind, wire_type, v, where)
        if value is _MISSING:
            # gogo leaves a missing map value at its zero value; a nil []byte value prints as "".
            value = "" if value_kind is Scalar.BYTES else _zero(value_kind)
        out[key] = value  # a repeated key: the last entry wins, as in Go
    return dict(sorted(out.items()))  # encoding/json sorts map keys


_MISSING = object()


def _decode_message(message: Message, buf: memoryview) -> dict[str, Any]:
    seen: dict[int, list[tuple[int, WireValue]]] = {}
    for number, wire_type, wire_value in _iter_fields(buf):
        if number in message.by_number:
            seen.setdefault(number, []).append((wire_type, wire_value))
        # Unknown numbers are skipped: fields added by newer clients must not break older servers.
    out: dict[str, Any] = {}
    for f in message.fields:
        where = f"{message.name}.{f.json_name or f.number}"
        values = seen.get(f.number)
        kind = f.kind
        if isinstance(kind, Repeated | Map):
            items: list[Any] | dict[str, Any] = (
                _repeated(kind.item, values or [], where)
                if isinstance(kind, Repeated)
                else _map(kind.value, values or [], where)
            )
            if items:
                out[f.json_name] = items
            elif f.presence is not Presence.OMIT:
                out[f.json_name] = None  # a nil slice or map without omitempty prints as null
            continue
        if values is None:
            if f.presence is Presence.POINTER or (
                f.presence is Presence.OMIT and not isinstance(kind, str)
            ):
                continue
            if f.presence is Presence.POINTER_OR_NULL:
                out[f.json_name] = None
                continue
            value: Any = _zero(kind)
        elif isinstance(kind, str):
            # A singular message sent several times is merged, which for the wire format is
            # exactly decoding the concatenation of the pieces.
            parts = [_expect_len(v, where) for _, v in values]
            joined = parts[0] if len(parts) == 1 else memoryview(b"".join(parts))
            value = _decode_message(MESSAGES[kind], joined)
        elif kind is Scalar.INT_OR_STRING and len(values) > 1:
            # IntOrString's Unmarshal is generated, so it merges; the other special types have
            # hand-written Unmarshal methods that replace, which "last one wins" below matches.
            parts = [_expect_len(v, where) for _, v in values]
            value = _scalar(kind, _LEN, memoryview(b"".join(parts)), where)
        else:
            last_type, last = values[-1]  # a repeated scalar: the last one wins
            value = _scalar(kind, last_type, last, where)
        if f.presence is Presence.INLINE:
            out.update(value)
        elif f.presence is Presence.OMIT and _is_empty(value):
            continue
        else:
            out[f.json_name] = value
    return out


# --------------------------------------------------------------------------------------------------
# Envelope


@attrs.frozen(kw_only=True)
class _Unknown:
    """runtime.Unknown: {typeMeta{apiVersion, kind}, raw, contentEncoding, contentType}."""

    api_version: str
    kind: str
    raw: memoryview
    content_encoding: str
    content_type: str


def _unknown(buf: memoryview) -> _Unknown:
    api_version = kind = content_encoding = content_type = ""
    raw = memoryview(b"")
    for number, _, value in _iter_fields(buf):
        if number == 1:
            for n, _, v in _iter_fields(_expect_len(value, "Unknown.typeMeta")):
                if n == 1:
                    api_version = _string(_expect_len(v, "TypeMeta.apiVersion"))
                elif n == 2:
                    kind = _string(_expect_len(v, "TypeMeta.kind"))
        elif number == 2:
            raw = _expect_len(value, "Unknown.raw")
        elif number == 3:
            content_encoding = _string(_expect_len(value, "Unknown.contentEncoding"))
        elif number == 4:
            content_type = _string(_expect_len(value, "Unknown.contentType"))
    return _Unknown(
        api_version=api_version,
        kind=kind,
        raw=raw,
        content_encoding=content_encoding,
        content_type=content_type,
    )


def decode_protobuf_object(body: bytes) -> dict[str, Any]:
    """Decode a ``application/vnd.kubernetes.protobuf`` request body into its JSON-API dict.

    The result starts with ``kind`` and ``apiVersion`` (from the envelope) followed by the object's
    fields, as ``kubectl ... -o json`` would print the same object. Raises ``ProtobufDecodeError``
    for anything malformed, and for kinds outside ``supported_kinds()``.
    """
    if not isinstance(body, bytes | bytearray | memoryview):
        raise ProtobufDecodeError("body must be bytes")
    buf = memoryview(bytes(body))
    if buf[: len(MAGIC)] != MAGIC:
        raise ProtobufDecodeError("missing the k8s\\x00 protobuf magic")
    try:
        envelope = _unknown(buf[len(MAGIC) :])
        if envelope.content_encoding:
            raise ProtobufDecodeError(f"unsupported contentEncoding {envelope.content_encoding!r}")
        if envelope.content_type not in ("", _PROTOBUF_CONTENT_TYPE):
            raise ProtobufDecodeError(f"unsupported inner contentType {envelope.content_type!r}")
        target = _KINDS.get((envelope.api_version, envelope.kind))
        if target is None:
            raise ProtobufDecodeError(
                f"no protobuf decoder for {envelope.api_version or '?'}/{envelope.kind or '?'}"
            )
        fields = _decode_message(MESSAGES[target], envelope.raw)
    except ProtobufDecodeError:
        raise
    except (ValueError, OverflowError, RecursionError) as e:  # pragma: no cover
        # Safety net: the decoder must never leak another exception type to the HTTP layer.
        raise ProtobufDecodeError(f"malformed protobuf body: {e}") from None
    return {"kind": envelope.kind, "apiVersion": envelope.api_version, **fields}
