"""kubesim.protobuf: real kubectl protobuf bodies decode to what kubectl itself prints as JSON.

Fixtures (tests/kubesim/fixtures/protobuf/) were captured from /usr/bin/kubectl 1.32 (``k132``) and
the venv's kubectl 1.37 (``k137``) talking to a throwaway capture server on 127.0.0.1; index.json
lists each command line, the request it made and any object the server had to serve for it.
``<case>.<kubectl>.pb`` is the POSTed body byte for byte; ``<case>.<kubectl>.json`` is the same
kubectl's ``--dry-run=client -o json`` output for the same command: the oracle.

One normalization, because the oracle itself changed between the two kubectls: ObjectMeta's
``creationTimestamp`` became ``omitzero`` in apimachinery 1.33, so kubectl 1.32 prints
``"creationTimestamp": null`` where 1.37 prints nothing. The decoder follows the current rule and
the test drops that null from the 1.32 oracle. Nothing else is normalized: ``"status": {}``,
``"resources": {}``, ``"rules": null`` and the key order all come out as kubectl prints them.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubesim.protobuf import (
    _KINDS,
    MAGIC,
    MESSAGES,
    Map,
    Presence,
    ProtobufDecodeError,
    Repeated,
    Scalar,
    decode_protobuf_object,
    supported_kinds,
)

FIXTURES = Path(__file__).parent / "fixtures" / "protobuf"
INDEX: dict[str, Any] = json.loads((FIXTURES / "index.json").read_text())
ORACLE_CASES = sorted(p.stem for p in FIXTURES.glob("*.k13[27].json"))
BODIES = sorted(FIXTURES.glob("*.pb"))


def _drop_null_creation_timestamp(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _drop_null_creation_timestamp(v)
            for k, v in value.items()
            if not (k == "creationTimestamp" and v is None)
        }
    if isinstance(value, list):
        return [_drop_null_creation_timestamp(v) for v in value]
    return value


def _keys_in_order(value: Any, path: str = "") -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    if isinstance(value, dict):
        out.append((path, list(value)))
        for k, v in value.items():
            out += _keys_in_order(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _keys_in_order(v, f"{path}[{i}]")
    return out


# --------------------------------------------------------------------------------------------------
# Real kubectl bodies against kubectl's own JSON


def test_fixtures_cover_both_kubectls_and_are_indexed() -> None:
    assert len(ORACLE_CASES) >= 60
    cases = {stem.rsplit(".", 1)[0] for stem in ORACLE_CASES}
    assert cases | {"token", "_note"} == set(INDEX)
    for case in cases:
        assert (FIXTURES / f"{case}.k132.pb").exists()
        assert (FIXTURES / f"{case}.k137.pb").exists()
        captures = INDEX[case]["captures"]
        assert set(captures) == {"k132", "k137"}
        for capture in captures.values():
            assert capture["content_type"] == "application/vnd.kubernetes.protobuf"
            assert capture["method"] == "POST"


@pytest.mark.parametrize("stem", ORACLE_CASES)
def test_decode_equals_kubectl_dry_run_json(stem: str) -> None:
    body = (FIXTURES / f"{stem}.pb").read_bytes()
    expected = json.loads((FIXTURES / f"{stem}.json").read_text())
    assert decode_protobuf_object(body) == _drop_null_creation_timestamp(expected)


@pytest.mark.parametrize("stem", ORACLE_CASES)
def test_key_order_follows_kubectl(stem: str) -> None:
    # Dict equality ignores order; Go prints fields in struct order, and so does the decoder.
    decoded = decode_protobuf_object((FIXTURES / f"{stem}.pb").read_bytes())
    expected = json.loads((FIXTURES / f"{stem}.json").read_text())
    assert _keys_in_order(decoded) == _keys_in_order(_drop_null_creation_timestamp(expected))


def test_deployment_exact_shape() -> None:
    body = (FIXTURES / "deployment.k137.pb").read_bytes()
    assert body.startswith(MAGIC)
    assert decode_protobuf_object(body) == {
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [
                        {
                            "name": "nginx",
                            "image": "nginx",
                            "ports": [{"containerPort": 80}],
                            "resources": {},
                        }
                    ]
                },
            },
            "strategy": {},
        },
        "status": {},
    }


def test_binary_data_is_base64_like_encoding_json() -> None:
    decoded = decode_protobuf_object((FIXTURES / "configmap-binary.k132.pb").read_bytes())
    blob = decoded["binaryData"]["blob"]
    assert len(base64.b64decode(blob, validate=True)) == 64
    secret = decode_protobuf_object((FIXTURES / "secret-generic.k137.pb").read_bytes())
    assert base64.b64decode(secret["data"]["pass"]) == b"p@ss w0rd"


@pytest.mark.parametrize("kubectl", ["k132", "k137"])
def test_token_request(kubectl: str) -> None:
    # `kubectl create token` has no --dry-run, so this oracle is written by hand from the flags.
    decoded = decode_protobuf_object((FIXTURES / f"token.{kubectl}.pb").read_bytes())
    assert decoded["kind"] == "TokenRequest"
    assert decoded["apiVersion"] == "authentication.k8s.io/v1"
    assert decoded["spec"] == {
        "audiences": ["https://api.example", "vault"],
        "expirationSeconds": 7200,
        "boundObjectRef": {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": "nginx",
            "uid": "5f0c1d4e-0000-4000-8000-000000000001",
        },
    }


# --------------------------------------------------------------------------------------------------
# Hand-built bodies for kinds no kubectl command sends as protobuf. Field numbers here are written
# out independently from k8s.io/api's generated.proto, so they cross-check the transcribed tables.


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def vi(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def ld(number: int, payload: bytes | str) -> bytes:
    if isinstance(payload, str):
        payload = payload.encode()
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def entry(number: int, key: str, value: bytes | str) -> bytes:
    return ld(number, ld(1, key) + ld(2, value))


def envelope(api_version: str, kind: str, raw: bytes, **extra: str) -> bytes:
    body = ld(1, ld(1, api_version) + ld(2, kind)) + ld(2, raw)
    if "content_encoding" in extra:
        body += ld(3, extra["content_encoding"])
    if "content_type" in extra:
        body += ld(4, extra["content_type"])
    return MAGIC + body


def meta(name: str, **more: bytes) -> bytes:
    return ld(1, ld(1, name) + b"".join(more.values()))


def template(container: str, image: str, labels: dict[str, str]) -> bytes:
    # PodTemplateSpec{metadata=1{labels=11}, spec=2{containers=2{name=1, image=2}}}
    metadata = b"".join(entry(11, k, v) for k, v in labels.items())
    return ld(1, metadata) + ld(2, ld(2, ld(1, container) + ld(2, image)))


SELECTOR = ld(1, ld(1, "app") + ld(2, "db"))  # LabelSelector{matchLabels=1}
POD_TEMPLATE_JSON = {
    "metadata": {"labels": {"app": "db"}},
    "spec": {"containers": [{"name": "db", "image": "postgres:16", "resources": {}}]},
}


def test_statefulset() -> None:
    pvc = meta("data") + ld(
        2,
        ld(1, "ReadWriteOnce")  # accessModes
        + ld(2, entry(2, "storage", ld(1, "1Gi")))  # resources{requests=2}
        + ld(5, "fast"),  # storageClassName
    )
    spec = (
        vi(1, 2)  # replicas
        + ld(2, SELECTOR)
        + ld(3, template("db", "postgres:16", {"app": "db"}))
        + ld(4, pvc)  # volumeClaimTemplates
        + ld(5, "db")  # serviceName
        + ld(6, "Parallel")  # podManagementPolicy
        + ld(
            7, ld(1, "RollingUpdate") + ld(2, vi(1, 1))
        )  # updateStrategy{type, rollingUpdate{partition}}
    )
    body = envelope("apps/v1", "StatefulSet", meta("db") + ld(2, spec) + ld(3, b""))
    assert decode_protobuf_object(body) == {
        "kind": "StatefulSet",
        "apiVersion": "apps/v1",
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "db"}},
            "template": POD_TEMPLATE_JSON,
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                        "storageClassName": "fast",
                    },
                    "status": {},
                }
            ],
            "serviceName": "db",
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}},
        },
        "status": {"replicas": 0, "availableReplicas": 0},
    }


def test_daemonset_and_replicaset() -> None:
    ds_spec = (
        ld(1, SELECTOR)
        + ld(2, template("db", "postgres:16", {"app": "db"}))
        + ld(3, ld(1, "RollingUpdate") + ld(2, ld(1, vi(2, 1))))  # maxUnavailable: IntOrString 1
    )
    ds = decode_protobuf_object(envelope("apps/v1", "DaemonSet", meta("agent") + ld(2, ds_spec)))
    assert ds["spec"] == {
        "selector": {"matchLabels": {"app": "db"}},
        "template": POD_TEMPLATE_JSON,
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
    }
    assert ds["status"] == {
        "currentNumberScheduled": 0,
        "numberMisscheduled": 0,
        "desiredNumberScheduled": 0,
        "numberReady": 0,
    }
    rs_spec = vi(1, 0) + ld(2, SELECTOR) + ld(3, template("db", "postgres:16", {"app": "db"}))
    rs = decode_protobuf_object(envelope("apps/v1", "ReplicaSet", meta("rs") + ld(2, rs_spec)))
    # replicas is a pointer: an explicit 0 is kept.
    assert rs["spec"]["replicas"] == 0
    assert rs["status"] == {"replicas": 0}


def test_int_or_string_string_form() -> None:
    # IntOrString{type=1 (String), strVal=3}
    maxu = ld(1, vi(1, 1) + ld(3, "25%"))
    spec = ld(1, SELECTOR) + ld(3, ld(1, "RollingUpdate") + ld(2, maxu))
    ds = decode_protobuf_object(envelope("apps/v1", "DaemonSet", meta("a") + ld(2, spec)))
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "25%"}


def test_persistent_volume_claim() -> None:
    spec = ld(1, "ReadWriteMany") + ld(2, entry(2, "storage", ld(1, "10Gi"))) + ld(6, "Filesystem")
    pvc = decode_protobuf_object(envelope("v1", "PersistentVolumeClaim", meta("c") + ld(2, spec)))
    assert pvc == {
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "metadata": {"name": "c"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "10Gi"}},
            "volumeMode": "Filesystem",
        },
        "status": {},
    }


def test_endpoint_slice() -> None:
    endpoint = ld(1, "10.0.0.5") + ld(2, vi(1, 1) + vi(3, 0)) + ld(6, "node-1")
    port = ld(1, "http") + ld(2, "TCP") + vi(3, 8080)
    raw = meta("s") + ld(4, "IPv4") + ld(2, endpoint) + ld(3, port)
    slice_ = decode_protobuf_object(envelope("discovery.k8s.io/v1", "EndpointSlice", raw))
    assert slice_ == {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": "s"},
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": ["10.0.0.5"],
                "conditions": {"ready": True, "terminating": False},
                "nodeName": "node-1",
            }
        ],
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
    }


def test_hpa_v2_with_memory_metric() -> None:
    ref = ld(1, "Deployment") + ld(2, "web") + ld(3, "apps/v1")
    target = ld(1, "AverageValue") + ld(3, ld(1, "500Mi"))
    metric = ld(1, "Resource") + ld(4, ld(1, "memory") + ld(2, target))
    spec = ld(1, ref) + vi(2, 1) + vi(3, 10) + ld(4, metric)
    hpa = decode_protobuf_object(
        envelope("autoscaling/v2", "HorizontalPodAutoscaler", meta("h") + ld(2, spec))
    )
    assert hpa["spec"] == {
        "scaleTargetRef": {"kind": "Deployment", "name": "web", "apiVersion": "apps/v1"},
        "minReplicas": 1,
        "maxReplicas": 10,
        "metrics": [
            {
                "type": "Resource",
                "resource": {
                    "name": "memory",
                    "target": {"type": "AverageValue", "averageValue": "500Mi"},
                },
            }
        ],
    }
    assert hpa["status"] == {"desiredReplicas": 0, "currentMetrics": None}


def test_scale_and_delete_options() -> None:
    scale = decode_protobuf_object(
        envelope("autoscaling/v1", "Scale", meta("web") + ld(2, vi(1, 5)))
    )
    assert scale == {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": "web"},
        "spec": {"replicas": 5},
        "status": {"replicas": 0},
    }
    # DeleteOptions{gracePeriodSeconds=1, preconditions=2{uid=1}, propagationPolicy=4, dryRun=5}
    raw = vi(1, 0) + ld(2, ld(1, "u-1")) + ld(4, "Foreground") + ld(5, "All")
    assert decode_protobuf_object(envelope("v1", "DeleteOptions", raw)) == {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": "u-1"},
        "propagationPolicy": "Foreground",
        "dryRun": ["All"],
    }


def test_timestamps() -> None:
    # ObjectMeta.creationTimestamp=8 / deletionTimestamp=9: Time{seconds=1, nanos=2}; nanos dropped.
    raw = ld(1, ld(1, "n") + ld(8, vi(1, 1_700_000_000) + vi(2, 999)) + ld(9, b""))
    decoded = decode_protobuf_object(envelope("v1", "Namespace", raw))
    assert decoded["metadata"] == {
        "name": "n",
        "creationTimestamp": "2023-11-14T22:13:20Z",
        "deletionTimestamp": None,
    }
    # Lease.spec.renewTime is a MicroTime, which keeps microseconds.
    spec = ld(1, "me") + ld(4, vi(1, 1_700_000_000) + vi(2, 123_456_789))
    lease = decode_protobuf_object(
        envelope("coordination.k8s.io/v1", "Lease", meta("l") + ld(2, spec))
    )
    assert lease["spec"] == {"holderIdentity": "me", "renewTime": "2023-11-14T22:13:20.123456Z"}
    # Negative seconds are before the epoch; Go's zero time is null.
    raw = ld(1, ld(8, vi(1, -1)))
    assert decode_protobuf_object(envelope("v1", "Namespace", raw))["metadata"] == {
        "creationTimestamp": "1969-12-31T23:59:59Z"
    }
    raw = ld(1, ld(8, vi(1, -62135596800)))
    assert decode_protobuf_object(envelope("v1", "Namespace", raw))["metadata"] == {}


def test_wire_format_details() -> None:
    security = (
        vi(2, 1000)  # runAsUser (int64 pointer)
        + ld(4, _varint(1) + _varint(2) + _varint(3))  # supplementalGroups, packed
        + vi(4, 4)  # ... and one more unpacked
    )
    container = ld(1, "c") + ld(2, "i") + ld(6, vi(3, -1 & 0xFFFFFFFF))  # containerPort -1 (int32)
    spec = ld(2, container) + ld(14, security) + ld(99, "from the future") + vi(98, 7)
    pod = decode_protobuf_object(envelope("v1", "Pod", meta("p") + ld(2, spec)))
    assert pod["spec"]["securityContext"] == {"runAsUser": 1000, "supplementalGroups": [1, 2, 3, 4]}
    assert pod["spec"]["containers"] == [
        {"name": "c", "image": "i", "ports": [{"containerPort": -1}], "resources": {}}
    ]
    # A singular message sent twice is merged; a repeated scalar: the last one wins.
    raw = ld(1, ld(1, "first") + entry(11, "a", "1")) + ld(1, ld(1, "second") + entry(11, "b", "2"))
    assert decode_protobuf_object(envelope("v1", "Namespace", raw))["metadata"] == {
        "name": "second",
        "labels": {"a": "1", "b": "2"},
    }
    # Map entries: a missing value is the zero value; keys come out sorted; invalid UTF-8 -> U+FFFD.
    raw = meta("m") + ld(2, ld(1, "z")) + entry(2, "a", b"\xff") + ld(3, ld(1, "k"))
    assert decode_protobuf_object(envelope("v1", "ConfigMap", raw)) == {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": "m"},
        "data": {"a": "\ufffd", "z": ""},
        "binaryData": {"k": ""},
    }


def test_tables_are_consistent() -> None:
    for message in MESSAGES.values():
        numbers = [f.number for f in message.fields]
        assert len(numbers) == len(set(numbers)), message.name
        names = [f.json_name for f in message.fields if f.presence is not Presence.INLINE]
        assert len(names) == len(set(names)), message.name
        for f in message.fields:
            if f.presence is Presence.INLINE:
                assert isinstance(f.kind, str) and f.json_name == ""
            if isinstance(f.kind, Repeated | Map):
                assert f.presence in (Presence.OMIT, Presence.ALWAYS)
    assert ("apps/v1", "Deployment") in supported_kinds()


def test_schema_is_acyclic_so_nesting_is_bounded() -> None:
    depth: dict[str, int] = {}

    def refs(name: str) -> list[str]:
        out = []
        for f in MESSAGES[name].fields:
            inner = f.kind.item if isinstance(f.kind, Repeated) else f.kind
            inner = inner.value if isinstance(inner, Map) else inner
            if isinstance(inner, str):
                out.append(inner)
        return out

    def walk(name: str, stack: tuple[str, ...]) -> int:
        assert name not in stack, " -> ".join((*stack, name))
        if name not in depth:
            depth[name] = 1 + max((walk(r, (*stack, name)) for r in refs(name)), default=0)
        return depth[name]

    assert max(walk(name, ()) for name in MESSAGES) < 20


# --------------------------------------------------------------------------------------------------
# omitempty rules for every field of every root kind, against kubectl's typed JSON
#
# typed-roundtrip.json holds what kubectl printed after decoding a "maximal" object (every field of
# the kind present with a zero value) into its Go type; see its _note. gogo-protobuf would encode
# that Go object with every field present, which _maximal() reproduces from the tables (whose
# field numbers the real-capture tests above vouch for). Decoding it must print what kubectl did:
# this pins each field's omitempty / pointer / nil-list rule, including status and metadata.

ROUNDTRIP: dict[str, Any] = json.loads((FIXTURES / "typed-roundtrip.json").read_text())["objects"]
_TIME_SECONDS = 1704164645  # 2024-01-02T03:04:05Z


def _zero_field(number: int, kind: Scalar, name: str, named: frozenset[str]) -> bytes:
    if kind is Scalar.STRING:
        return ld(number, "c" if name in named else b"")
    if kind in (Scalar.BOOL, Scalar.INT32, Scalar.INT64):
        return vi(number, 0)
    if kind is Scalar.BYTES:
        return ld(number, b"")
    if kind in (Scalar.TIME, Scalar.MICROTIME):
        return ld(number, vi(1, _TIME_SECONDS) + vi(2, 0))
    if kind is Scalar.INT_OR_STRING:
        return ld(number, vi(1, 0) + vi(2, 0) + ld(3, b""))
    if kind is Scalar.QUANTITY:
        return ld(number, ld(1, "0"))
    return ld(number, ld(1, "{}"))  # FieldsV1


def _maximal(name: str, stack: frozenset[str], nil: bool, named: frozenset[str]) -> bytes:
    out = b""
    for f in MESSAGES[name].fields:
        kind = f.kind
        scalar_list = isinstance(kind, Repeated) and not isinstance(kind.item, str)
        if nil and (isinstance(kind, Map) or scalar_list):
            continue
        inner = kind.item if isinstance(kind, Repeated) else kind
        inner = inner.value if isinstance(inner, Map) else inner
        number = 2 if isinstance(kind, Map) else f.number
        if isinstance(inner, str):
            if inner in stack:
                continue
            value = ld(number, _maximal(inner, stack | {inner}, nil, named))
        elif scalar_list and inner is Scalar.STRING:
            value = ld(number, "x")
        else:
            value = _zero_field(number, inner, f.json_name, named)
        out += ld(f.number, ld(1, "k") + value) if isinstance(kind, Map) else value
    return out


@pytest.mark.parametrize("key", sorted(ROUNDTRIP))
def test_zero_values_follow_go_omitempty(key: str) -> None:
    kind, rest = key.split(".", 1)
    api_version, mode = rest.rsplit(".", 1)
    api_version = api_version.replace("_", "/")
    named = frozenset({"name", "image", "token"} if kind == "TokenRequest" else {"name", "image"})
    message = _KINDS[(api_version, kind)]
    raw = _maximal(message, frozenset({message}), mode == "nil", named)
    decoded = decode_protobuf_object(envelope(api_version, kind, raw))
    expected = ROUNDTRIP[key]
    assert decoded == expected
    assert _keys_in_order(decoded) == _keys_in_order(expected)


# --------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "magic"),
        (b'{"kind": "Pod"}', "magic"),
        (MAGIC + b"\x0a", "truncated varint"),
        (MAGIC + b"\x0a\x05ab", "runs past"),
        (MAGIC + b"\x0b", "wire type"),
        (MAGIC + b"\x00", "field number"),
        (MAGIC + b"\x08" + b"\xff" * 11, "64 bits"),
        (envelope("v1", "Node", b""), "no protobuf decoder"),
        (envelope("", "", b""), "no protobuf decoder"),
        (envelope("v1", "Namespace", b"", content_encoding="gzip"), "contentEncoding"),
        (envelope("v1", "Namespace", b"", content_type="application/json"), "contentType"),
        (envelope("v1", "Namespace", vi(1, 3)), "length-delimited"),
        (envelope("v1", "Namespace", ld(1, vi(1, 0))), "length-delimited"),
        (envelope("v1", "Service", ld(2, ld(1, ld(4, vi(2, 1) + ld(2, "x"))))), "varint"),
        (envelope("v1", "Namespace", ld(1, vi(7, 1) + ld(7, "x"))), "wire type"),
        (envelope("v1", "Namespace", ld(1, ld(8, vi(1, 1 << 62)))), "out of range"),
        (envelope("v1", "ResourceQuota", ld(2, entry(1, "cpu", ld(1, "lots")))), "quantities"),
        (envelope("v1", "ResourceQuota", ld(2, entry(1, "cpu", ld(1, "")))), "quantities"),
        (envelope("v1", "Service", ld(2, ld(1, vi(3, 80) + ld(4, vi(1, 7))))), "IntOrString"),
        (envelope("v1", "Namespace", ld(1, ld(17, ld(7, ld(1, "{nope"))))), "FieldsV1"),
        (envelope("v1", "Namespace", ld(1, ld(17, ld(7, ld(1, "NaN"))))), "FieldsV1"),
        (envelope("v1", "Namespace", ld(1, ld(17, ld(7, ld(1, "[" * 100_000))))), "FieldsV1"),
    ],
)
def test_malformed_bodies(body: bytes, message: str) -> None:
    with pytest.raises(ProtobufDecodeError, match=message):
        decode_protobuf_object(body)


def test_non_bytes_input() -> None:
    with pytest.raises(ProtobufDecodeError):
        decode_protobuf_object("k8s\x00")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Hostile input: only ProtobufDecodeError, and quickly


def _split_envelope(body: bytes) -> tuple[str, str, bytes]:
    """(apiVersion, kind, raw) of a well-formed fixture, so mutations can target the object."""
    pos = len(MAGIC)
    fields: dict[int, bytes] = {}
    while pos < len(body):
        key = body[pos]
        length = 0
        shift = 0
        pos += 1
        while True:
            b = body[pos]
            pos += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        fields[key >> 3] = body[pos : pos + length]
        pos += length
    decoded = decode_protobuf_object(body)
    return decoded["apiVersion"], decoded["kind"], fields[2]


_RAWS = [_split_envelope(p.read_bytes()) for p in BODIES]


def test_split_envelope_round_trips() -> None:
    for path, (api_version, kind, raw) in zip(BODIES, _RAWS, strict=True):
        assert decode_protobuf_object(envelope(api_version, kind, raw)) == decode_protobuf_object(
            path.read_bytes()
        )


def _decode_or_reject(body: bytes) -> None:
    # Decoded or refused with ProtobufDecodeError, nothing else. What the slowest of such bodies
    # costs is a figure in bench/worstcase.py, not a clock read here.
    try:
        decode_protobuf_object(body)
    except ProtobufDecodeError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_random_bytes(data: bytes) -> None:
    _decode_or_reject(data)
    _decode_or_reject(MAGIC + data)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(_RAWS),
    st.lists(
        st.tuples(
            st.sampled_from(["flip", "insert", "delete", "truncate"]),
            st.integers(0, 1 << 20),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=8,
    ),
    st.booleans(),
)
def test_mutated_fixtures(
    target: tuple[str, str, bytes], mutations: list[tuple[str, int, int]], rewrap: bool
) -> None:
    api_version, kind, raw = target
    data = bytearray(raw)
    for op, where, byte in mutations:
        i = where % (len(data) + 1)
        if op == "flip" and i < len(data):
            data[i] ^= byte or 1
        elif op == "insert":
            data.insert(i, byte)
        elif op == "delete" and i < len(data):
            del data[i]
        elif op == "truncate":
            del data[i:]
    if rewrap:
        # A valid envelope around a damaged object, so the damage reaches the object decoder.
        _decode_or_reject(envelope(api_version, kind, bytes(data)))
    else:
        _decode_or_reject(MAGIC + bytes(data))


def test_many_tiny_messages_decode_whole() -> None:
    # 32 KiB of empty containers: each 2-byte element becomes {"name": "", "resources": {}}.
    # That the time per element stays flat as the count grows to 128 Ki (linear decoding) is a
    # figure of bench/worstcase.py (docs/benchmarks.md), not a clock read here: it failed under load.
    count = 16 * 1024
    body = envelope("v1", "Pod", ld(2, ld(2, b"") * count))
    pod = decode_protobuf_object(body)
    assert len(pod["spec"]["containers"]) == count
    assert pod["spec"]["containers"][0] == {"name": "", "resources": {}}


def test_deeply_nested_unknown_field_is_skipped_not_parsed() -> None:
    nested = b"x"
    for _ in range(2000):
        nested = ld(1, nested)
    body = envelope("v1", "Namespace", ld(50, nested) + meta("n"))
    assert decode_protobuf_object(body)["metadata"] == {"name": "n"}
