#!/usr/bin/env python3
"""Regenerate kubesim's protobuf message tables from a kubectl binary.

    python kubesim/tools/gen_protobuf_tables.py                    # kubectl on PATH
    python kubesim/tools/gen_protobuf_tables.py --kubectl PATH     # another one
    python kubesim/tools/gen_protobuf_tables.py --check            # compare, write nothing

kubesim decodes kubectl's protobuf request bodies with one table per message
(``kubesim/src/kubesim/protobuf_tables.json``): field number, JSON name, kind and when the field
appears in the JSON form. Everything in those tables is compiled into every kubectl, so this
script reads it from the binary instead of a Kubernetes checkout:

* the gzipped ``FileDescriptorProto`` of each ``generated.proto`` of k8s.io/api and
  k8s.io/apimachinery (gogo registers them at init), giving field numbers, proto types,
  repeated/map and gogoproto ``nullable`` (option 65001: ``false`` means a Go value, not a pointer);
* the Go type descriptors the linker keeps for ``reflect``/``encoding/json``: every named struct
  with each field's name, Go kind and struct tag, giving the JSON name, ``omitempty``/``omitzero``,
  ``,inline`` and Go struct order (which is JSON output order). The descriptors lack all of these:
  they come from Go struct tags, not from ``.proto`` text.

No overrides: where the two sources disagree (a pointer in one and a value in the other, a proto
field without a Go field), the script stops and says where.

The Go type walk follows ``internal/abi`` of Go 1.21 and later on 64-bit little-endian ELF (every
kubectl release since 1.29): ``.typelink`` offsets from the start of ``.rodata``, ``abi.Type`` of 48
bytes, ``abi.StructType`` with its fields slice at +56, ``abi.Name`` as flags, varint length, bytes.
A layout change makes the walk find no ``k8s.io/api`` structs, which is an error, not wrong data.

Requires the ``protobuf`` package (kasd's ``dev`` extra); kubesim itself does not.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
from google.protobuf import descriptor_pb2

from kubesim.protobuf_kinds import KINDS

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "kubesim" / "protobuf_tables.json"

#: apimachinery messages with a JSON form of their own -> the decoder's scalar for them
SPECIAL = {
    "k8s.io.apimachinery.pkg.apis.meta.v1.Time": "TIME",
    "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime": "MICROTIME",
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": "INT_OR_STRING",
    "k8s.io.apimachinery.pkg.api.resource.Quantity": "QUANTITY",
    "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1": "RAW_JSON",
}

_F = descriptor_pb2.FieldDescriptorProto
SCALARS = {_F.TYPE_STRING: "STRING", _F.TYPE_BYTES: "BYTES", _F.TYPE_BOOL: "BOOL",
           _F.TYPE_INT32: "INT32", _F.TYPE_INT64: "INT64"}  # fmt: skip

GOGO_NULLABLE = 65001

#: (message, JSON name) -> presence where kubesim deliberately differs from the Go struct tag. The
#: original hand-made tables took these from the OpenAPI ``required`` lists rather than the tags,
#: and the oracles in tests/kubesim/test_protobuf.py were written against them. Keep this short.
OVERRIDES = {
    ("authentication/v1.TokenRequestStatus", "token"): "OMIT",  # tag: json:"token"
    ("core/v1.TypedLocalObjectReference", "apiGroup"): "POINTER",  # tag: json:"apiGroup" on *string
    ("core/v1.TypedObjectReference", "apiGroup"): "POINTER",  # tag: json:"apiGroup" on *string
    ("discovery/v1.EndpointSlice", "ports"): "OMIT",  # tag: json:"ports"
    ("networking/v1.IngressClassParametersReference", "scope"): "POINTER",  # tag: json:"scope" on *string
}

# Go reflect kinds (internal/abi.Kind) the walk follows
_ARRAY, _CHAN, _MAP, _POINTER, _SLICE, _STRUCT = 17, 18, 21, 22, 23, 25
_TFLAG_UNCOMMON, _TFLAG_EXTRA_STAR, _TFLAG_NAMED = 1, 2, 4


class GenerateError(Exception):
    """The binary does not hold what the tables need; the message says what and where."""


# --------------------------------------------------------------------------------------------------
# The binary


class Elf:
    """The loaded sections of a 64-bit little-endian ELF file, addressed by virtual address."""

    def __init__(self, data: bytes) -> None:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise GenerateError("not a 64-bit little-endian ELF executable")
        self.data = data
        shoff = struct.unpack_from("<Q", data, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        raw = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names_at = raw[shstrndx][4]
        self.sections: dict[str, tuple[int, int, int]] = {}  # name -> (address, offset, size)
        for name, _type, _flags, addr, offset, size in raw:
            end = data.index(b"\0", names_at + name)
            self.sections[data[names_at + name : end].decode()] = (addr, offset, size)
        self._loaded = sorted(s for s in self.sections.values() if s[0])

    def offset(self, addr: int) -> int:
        for start, offset, size in self._loaded:
            if start <= addr < start + size:
                return offset + addr - start
        raise GenerateError(f"address {addr:#x} is outside every section")

    def u8(self, addr: int) -> int:
        return self.data[self.offset(addr)]

    def u64(self, addr: int) -> int:
        return int(struct.unpack_from("<Q", self.data, self.offset(addr))[0])

    def i32(self, addr: int) -> int:
        return int(struct.unpack_from("<i", self.data, self.offset(addr))[0])


def file_descriptors(data: bytes) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """Every gzipped ``…/generated.proto`` descriptor in the binary, by file name."""
    found: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    pos = data.find(b"\x1f\x8b\x08")
    while pos >= 0:
        try:
            inflate = zlib.decompressobj(wbits=31)
            raw = inflate.decompress(data[pos : pos + (8 << 20)])
            if inflate.eof:
                fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
                if fd.name.endswith("/generated.proto") and fd.name.startswith("k8s.io/"):
                    found[fd.name] = fd
        except Exception:  # most 1f 8b 08 triples are not gzip members
            pass
        pos = data.find(b"\x1f\x8b\x08", pos + 1)
    return found


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _go_name(elf: Elf, addr: int) -> tuple[str, str, bool]:
    """An ``abi.Name``: (name, struct tag, embedded)."""
    pos = elf.offset(addr)
    flags = elf.data[pos]
    length, pos = _uvarint(elf.data, pos + 1)
    name = elf.data[pos : pos + length].decode()
    pos += length
    tag = ""
    if flags & 2:
        length, pos = _uvarint(elf.data, pos)
        tag = elf.data[pos : pos + length].decode()
    return name, tag, bool(flags & 8)


@attrs.frozen
class GoField:
    name: str
    tag: str
    embedded: bool
    type: int  # address of its abi.Type


@attrs.frozen
class GoTypes:
    """Every named struct type reachable by reflection, by (package path, name) and by address."""

    elf: Elf
    structs: dict[tuple[str, str], list[GoField]]
    names: dict[int, tuple[str, str]]

    def kind(self, addr: int) -> int:
        return self.elf.u8(addr + 23) & 31

    def elem(self, addr: int) -> int:
        """Element type of a pointer, slice or array (abi.PtrType/SliceType.Elem), or a map's value."""
        return self.elf.u64(addr + (56 if self.kind(addr) == _MAP else 48))


def go_types(elf: Elf) -> GoTypes:
    if ".typelink" not in elf.sections or ".rodata" not in elf.sections:
        raise GenerateError("no .typelink/.rodata section: not a Go binary this script knows")
    types = elf.sections[".rodata"][0]
    _, offset, size = elf.sections[".typelink"]
    todo = [types + off for off in struct.unpack_from(f"<{size // 4}i", elf.data, offset)]
    seen: set[int] = set()
    structs: dict[tuple[str, str], list[GoField]] = {}
    names: dict[int, tuple[str, str]] = {}
    while todo:
        addr = todo.pop()
        if addr == 0 or addr in seen:
            continue
        seen.add(addr)
        kind, tflag = elf.u8(addr + 23) & 31, elf.u8(addr + 20)
        ptr_to_this = elf.i32(addr + 44)
        if ptr_to_this > 0:
            todo.append(types + ptr_to_this)
        if kind in (_ARRAY, _CHAN, _POINTER, _SLICE):
            todo.append(elf.u64(addr + 48))
        elif kind == _MAP:
            todo += [elf.u64(addr + 48), elf.u64(addr + 56)]
        elif kind == _STRUCT:
            fields: list[GoField] = []
            start, count = elf.u64(addr + 56), elf.u64(addr + 64)
            for i in range(count):
                name, tag, embedded = _go_name(elf, elf.u64(start + 24 * i))
                fields.append(GoField(name, tag, embedded, elf.u64(start + 24 * i + 8)))
                todo.append(fields[-1].type)
            if tflag & _TFLAG_NAMED and tflag & _TFLAG_UNCOMMON:
                package = _go_name(elf, types + elf.i32(addr + 80))[0]
                name = _go_name(elf, types + elf.i32(addr + 40))[0]
                name = name[1:] if tflag & _TFLAG_EXTRA_STAR else name
                key = (package, name.split(".", 1)[1])
                structs[key] = fields
                names[addr] = key
    if not any(package.startswith("k8s.io/api/") for package, _ in structs):
        raise GenerateError("found no k8s.io/api struct types (a Go type layout this script does not know?)")
    return GoTypes(elf, structs, names)


def _struct_tag(tag: str, key: str) -> str | None:
    """``reflect.StructTag.Lookup``."""
    marker = f'{key}:"'
    for part in _tag_parts(tag):
        if part.startswith(marker):
            return part[len(marker) : -1]
    return None


def _tag_parts(tag: str) -> Iterator[str]:
    i = 0
    while i < len(tag):
        while i < len(tag) and tag[i] == " ":
            i += 1
        start = i
        i = tag.index('"', i) + 1
        while tag[i] != '"':
            i += 2 if tag[i] == "\\" else 1
        i += 1
        yield tag[start:i]


def _varint_option(options: bytes, number: int) -> int | None:
    """A varint extension field of serialized options (gogoproto's are unknown to ``protobuf``)."""
    pos, value = 0, None
    while pos < len(options):
        key, pos = _uvarint(options, pos)
        wire = key & 7
        if wire == 0:
            v, pos = _uvarint(options, pos)
            if key >> 3 == number:
                value = v
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _uvarint(options, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise GenerateError(f"unexpected wire type {wire} in field options")
    return value


# --------------------------------------------------------------------------------------------------
# The tables


def table_name(go_package: str, message: str) -> str:
    """``k8s.io/api/apps/v1`` + ``Deployment`` -> ``apps/v1.Deployment`` (meta/v1 for apimachinery)."""
    return "/".join(go_package.split("/")[-2:]) + "." + message


def _is_api_package(go_package: str) -> bool:
    return go_package.startswith(("k8s.io/api/", "k8s.io/apimachinery/"))


def build_tables(
    go: GoTypes, files: dict[str, descriptor_pb2.FileDescriptorProto] | None, roots: Iterable[str]
) -> tuple[dict[str, list[list[Any]]], list[str]]:
    """Message tables for ``roots`` and every message they reach, as the JSON file holds them, and
    the fields left out because the decoder has no kind for them (it skips them as unknown).

    The Go types alone determine the tables; ``files`` (the descriptors, when the binary has them)
    must agree on every field's number, kind and pointer-ness, else this raises.
    """
    keys = {table_name(*key): key for key in go.structs if _is_api_package(key[0])}
    messages = {}
    for fd in (files or {}).values():
        for message in fd.message_type:
            messages[table_name(fd.options.go_package, message.name)] = (fd, message)
    tables: dict[str, list[list[Any]]] = {}
    skipped: list[str] = []
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in tables:
            continue
        if name not in keys:
            raise GenerateError(f"no Go struct for the message {name}")
        rows, refs, left_out = _go_table(name, go, keys[name])
        if files is not None:
            if name not in messages:
                raise GenerateError(f"no generated.proto message for {name}")
            _check_descriptor(name, rows, [number for number, _ in left_out], *messages[name])
        tables[name] = rows
        skipped += [why for _, why in left_out]
        todo += refs
    return dict(sorted(tables.items())), sorted(skipped)


def _protobuf_number(field: GoField) -> int | None:
    tag = _struct_tag(field.tag, "protobuf")
    return int(tag.split(",")[1]) if tag else None


def _go_table(
    name: str, go: GoTypes, key: tuple[str, str]
) -> tuple[list[list[Any]], list[str], list[tuple[int, str]]]:
    rows: list[list[Any]] = []
    refs: list[str] = []
    left_out: list[tuple[int, str]] = []
    for field in go.structs[key]:  # Go struct order is JSON output order
        number = _protobuf_number(field)
        if number is None:  # TypeMeta and friends: carried by the envelope, not in the message
            continue
        where = f"{name}.{field.name}"
        try:
            kind, ref = _go_kind(go, field.type, where)
        except UnsupportedType as exc:
            left_out.append((number, f"{exc} (field {number})"))
            continue
        refs += [ref] if ref else []
        json_tag = (_struct_tag(field.tag, "json") or "").split(",")
        json_name, options = json_tag[0], set(json_tag[1:])
        go_kind = go.kind(field.type)
        if field.embedded and not json_name:  # encoding/json inlines an unnamed embedded struct
            presence, json_name = "INLINE", ""
        elif go_kind == _POINTER:
            presence = "POINTER" if "omitempty" in options else "POINTER_OR_NULL"
        elif go_kind == _STRUCT:  # encoding/json never omits a struct for omitempty; omitzero does
            presence = "OMIT" if "omitzero" in options else "ALWAYS"
        else:
            presence = "OMIT" if options & {"omitempty", "omitzero"} else "ALWAYS"
        if presence != "INLINE" and not json_name:
            json_name = field.name
        presence = OVERRIDES.get((name, json_name), presence)
        rows.append([number, json_name, kind, presence])
    return rows, refs, left_out


class UnsupportedType(GenerateError):
    """A field whose Go type the decoder cannot represent (a map of slices, say)."""


#: Go reflect kinds of the scalars the decoder knows
_GO_SCALARS = {1: "BOOL", 5: "INT32", 6: "INT64", 24: "STRING"}
_UINT8 = 8


def _go_kind(go: GoTypes, addr: int, where: str, nested: bool = False) -> tuple[Any, str | None]:
    """(kind as the JSON file spells it, message it references or None) of a Go field type."""
    kind = go.kind(addr)
    if kind == _POINTER and not nested:
        return _go_kind(go, go.elem(addr), where, nested=True)
    if kind == _SLICE and go.kind(go.elem(addr)) == _UINT8:
        return "BYTES", None
    if kind in (_SLICE, _MAP) and not nested:
        if kind == _MAP and go.kind(go.elf.u64(addr + 48)) != 24:
            raise GenerateError(f"{where}: a map whose key is not a string")
        inner, ref = _go_kind(go, go.elem(addr), where, nested=True)
        return {("repeated" if kind == _SLICE else "map"): inner}, ref
    if kind == _STRUCT and addr in go.names:
        package, type_name = go.names[addr]
        special = SPECIAL.get(f"{package.replace('/', '.')}.{type_name}")
        if special:
            return special, None
        if _is_api_package(package):
            name = table_name(package, type_name)
            return name, name
    if kind in _GO_SCALARS:
        return _GO_SCALARS[kind], None
    raise UnsupportedType(f"{where}: a Go type (reflect kind {kind}) the decoder has no kind for")


def _check_descriptor(
    name: str,
    rows: list[list[Any]],
    left_out: list[int],
    fd: descriptor_pb2.FileDescriptorProto,
    message: descriptor_pb2.DescriptorProto,
) -> None:
    """The descriptor's fields are the Go struct's protobuf-tagged fields, with the same kinds."""
    fields = {f.number: f for f in message.field}
    go_numbers = sorted([row[0] for row in rows] + left_out)
    if sorted(fields) != go_numbers:
        raise GenerateError(f"{name}: descriptor fields {sorted(fields)}, Go fields {go_numbers}")
    nested = {f".{fd.package}.{message.name}.{n.name}": n for n in message.nested_type}
    for number, json_name, kind, presence in rows:
        where = f"{name} field {number} ({json_name or 'inline'})"
        field = fields[number]
        if _descriptor_kind(field, nested, where) != kind:
            raise GenerateError(f"{where}: descriptor says {_descriptor_kind(field, nested, where)}, Go says {kind}")
        if field.type == _F.TYPE_MESSAGE and field.label != _F.LABEL_REPEATED and field.type_name not in nested:
            # gogoproto.nullable=false is what makes a message field a Go value, not a pointer
            nullable = _varint_option(field.options.SerializeToString(), GOGO_NULLABLE) != 0
            if nullable != presence.startswith("POINTER"):
                raise GenerateError(f"{where}: gogoproto nullable={nullable}, Go presence {presence}")


def _descriptor_kind(
    field: descriptor_pb2.FieldDescriptorProto, nested: dict[str, descriptor_pb2.DescriptorProto], where: str
) -> Any:
    if field.type == _F.TYPE_MESSAGE and field.type_name in nested:
        entry = nested[field.type_name]
        key, value = sorted(entry.field, key=lambda f: f.number)
        if not entry.options.map_entry or key.type != _F.TYPE_STRING:
            raise GenerateError(f"{where}: nested message {field.type_name} is not a map<string, …>")
        return {"map": _descriptor_element(value, where)}
    inner = _descriptor_element(field, where)
    return {"repeated": inner} if field.label == _F.LABEL_REPEATED else inner


def _descriptor_element(field: descriptor_pb2.FieldDescriptorProto, where: str) -> str:
    if field.type == _F.TYPE_MESSAGE:
        if field.type_name[1:] in SPECIAL:
            return SPECIAL[field.type_name[1:]]
        package, _, message = field.type_name[1:].rpartition(".")
        return table_name(package.replace(".", "/"), message)
    if field.type in SCALARS:
        return SCALARS[field.type]
    raise GenerateError(f"{where}: proto type {field.type} has no decoder kind")


# --------------------------------------------------------------------------------------------------
# Command line


def kubectl_version(kubectl: str) -> str:
    out = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True,
                         timeout=30, check=True).stdout  # fmt: skip
    return str(json.loads(out)["clientVersion"]["gitVersion"])


def restrict(tables: dict[str, list[list[Any]]], to: dict[str, list[list[Any]]]) -> tuple[dict[str, list[list[Any]]], int]:
    """The field numbers ``to`` has for the messages it has (a message new to ``to``, reached from a
    kind added to protobuf_kinds, comes whole); and how many fields that left out."""
    kept: dict[str, list[list[Any]]] = {}
    for name, rows in tables.items():
        if name in to:
            numbers = {row[0] for row in to[name]}
            kept[name] = [row for row in rows if row[0] in numbers]
        else:
            kept[name] = rows
    return kept, sum(map(len, tables.values())) - sum(map(len, kept.values()))


def generate(kubectl: str, field_set: dict[str, list[list[Any]]] | None = None) -> dict[str, Any]:
    """The whole JSON document for ``kubectl``; with ``field_set``, only the fields it has."""
    data = Path(kubectl).resolve().read_bytes()
    files = file_descriptors(data)
    # kubectl 1.33 and later no longer register the gogo descriptors; the Go types suffice.
    tables, skipped = build_tables(go_types(Elf(data)), files or None, sorted(set(KINDS.values())))
    left_out = 0
    if field_set is not None:
        tables, left_out = restrict(tables, field_set)
    return {
        "generated_by": "kubesim/tools/gen_protobuf_tables.py; do not edit, run it instead",
        "kubectl": kubectl_version(kubectl),
        "checked_against_descriptors": bool(files),
        "skipped": skipped,
        "fields_not_enabled": left_out,
        "messages": tables,
    }


def dumps(document: dict[str, Any]) -> str:
    """JSON with one field per line, so a new Kubernetes version reads as a small diff."""
    lines = ["{"]
    for key in ("generated_by", "kubectl", "checked_against_descriptors", "skipped", "fields_not_enabled"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(document[key])},")
    lines.append('  "messages": {')
    messages = list(document["messages"].items())
    for i, (name, rows) in enumerate(messages):
        lines.append(f"    {json.dumps(name)}: [")
        lines += [f"      {json.dumps(row)}{',' if j < len(rows) - 1 else ''}" for j, row in enumerate(rows)]
        lines.append("    ]" + ("," if i < len(messages) - 1 else ""))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubectl", default=shutil.which("kubectl"), help="kubectl binary (default: PATH)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT.name} in kubesim")
    parser.add_argument("--check", action="store_true", help="exit 1 if --out differs; write nothing")
    parser.add_argument("--all-fields", action="store_true",
                        help="every field this kubectl has, not only those --out already has (see docs)")
    args = parser.parse_args(argv)
    if not args.kubectl:
        parser.error("no kubectl on PATH; pass --kubectl")
    try:
        field_set = None
        if not args.all_fields and args.out.is_file():
            field_set = json.loads(args.out.read_text())["messages"]
        text = dumps(generate(args.kubectl, field_set))
    except GenerateError as exc:
        print(f"gen_protobuf_tables: {args.kubectl}: {exc}", file=sys.stderr)
        return 1
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'differs'}")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out} from {args.kubectl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
