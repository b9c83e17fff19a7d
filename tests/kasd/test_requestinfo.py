"""The audit line's verb, resource and namespace, read as kube-apiserver's RequestInfoFactory reads them."""

from __future__ import annotations

import hypothesis
import pytest
from hypothesis import strategies as st

from kasd.k8sproxy.requestinfo import RequestInfo, created_namespace, request_info


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods/p", RequestInfo(verb="get", resource="pods", namespace="ns", name="p")),
        ("GET", "/api/v1/namespaces/ns/pods", RequestInfo(verb="list", resource="pods", namespace="ns")),
        ("GET", "/api/v1/namespaces/ns/pods?watch=1&resourceVersion=5",
         RequestInfo(verb="watch", resource="pods", namespace="ns")),
        ("GET", "/api/v1/pods?watch=true", RequestInfo(verb="watch", resource="pods")),
        ("GET", "/apis/apps/v1/deployments", RequestInfo(verb="list", resource="deployments")),
        ("POST", "/apis/apps/v1/namespaces/ns/deployments", RequestInfo(verb="create", resource="deployments",
                                                                        namespace="ns")),
        ("PATCH", "/apis/apps/v1/namespaces/ns/deployments/web/scale",
         RequestInfo(verb="patch", resource="deployments", subresource="scale", namespace="ns", name="web")),
        ("DELETE", "/api/v1/namespaces/ns/configmaps", RequestInfo(verb="deletecollection", resource="configmaps",
                                                                    namespace="ns")),
        ("POST", "/api/v1/namespaces/ns/pods/p/exec?command=ls",
         RequestInfo(verb="create", resource="pods", subresource="exec", namespace="ns", name="p")),
        # the namespace object itself: kube names it the request's namespace too
        ("DELETE", "/api/v1/namespaces/review-x", RequestInfo(verb="delete", resource="namespaces",
                                                              namespace="review-x", name="review-x")),
        ("PUT", "/api/v1/namespaces/ns/finalize", RequestInfo(verb="update", resource="namespaces", namespace="ns",
                                                              name="ns", subresource="finalize")),
        ("GET", "/api/v1/namespaces", RequestInfo(verb="list", resource="namespaces")),
        ("GET", "/version", RequestInfo(verb="get", resource_request=False)),
        ("GET", "/api", RequestInfo(verb="get", resource_request=False)),
        ("GET", "/apis/apps", RequestInfo(verb="get", resource_request=False)),
        ("GET", "/api/v1", RequestInfo(verb="get", resource_request=False)),
        ("GET", "/apis/apps/v1", RequestInfo(verb="get", resource_request=False)),
    ],
)
def test_kube_apiserver_reads_it_so(method: str, target: str, expected: RequestInfo) -> None:
    assert request_info(method, target) == expected


#: ``kubectl create namespace env-prod`` as kubectl 1.37 sends it: Kubernetes protobuf (``k8s\0``,
#: then runtime.Unknown: typeMeta v1/Namespace, raw the Namespace, empty contentEncoding/Type)
_NAMESPACE_META = b"\n\x08env-prod\x12\x00\x1a\x00\"\x00*\x002\x008\x00B\x00"
_NAMESPACE_RAW = b"\n" + bytes([len(_NAMESPACE_META)]) + _NAMESPACE_META + b"\x12\x00\x1a\x02\n\x00"
KUBECTL_PROTOBUF = (b"k8s\x00\n\x0f\n\x02v1\x12\tNamespace\x12" + bytes([len(_NAMESPACE_RAW)]) + _NAMESPACE_RAW
                    + b"\x1a\x00\"\x00")


@pytest.mark.parametrize(
    ("body", "name"),
    [
        (b'{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"env-prod"}}', "env-prod"),
        (KUBECTL_PROTOBUF, "env-prod"),  # what kubectl 1.35+ sends: recorded as the JSON form is
        (KUBECTL_PROTOBUF.replace(b"\tNamespace", b"\tConfigMap"), ""),  # (same length) not a Namespace
        (KUBECTL_PROTOBUF[:-12], ""),  # cut short (the tap keeps 16 KiB): nothing read past the end
        (KUBECTL_PROTOBUF.replace(b"env-prod", b"ENV_PROD"), ""),  # not a namespace name
        (b"k8s\x00" + b"\xff" * 20, ""),  # not protobuf at all
        (b"k8s\x00", ""),
    ],
)
def test_the_name_a_namespace_create_makes_is_read_from_json_or_protobuf(body: bytes, name: str) -> None:
    assert created_namespace(body) == name


@pytest.mark.timeout(5)
def test_a_namespace_create_body_nested_deeper_than_pythons_stack_names_nothing_and_never_raises() -> None:
    # The API server accepts JSON nested 10,000 deep in an unknown field (fieldValidation Warn): the
    # create succeeds, and this runs in the pipeline's `finally` — before, a RecursionError there.
    deep = b'{"apiVersion":"v1","kind":"Namespace","x":' + b"[" * 16000
    assert created_namespace(deep) == ""
    assert created_namespace(b"[" * 16384) == ""


@pytest.mark.timeout(30)
@hypothesis.settings(max_examples=400, deadline=200, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(body=st.binary(max_size=16384), protobuf=st.booleans())
def test_any_16_kib_a_job_sends_as_a_namespace_create_is_read_in_bounded_time_without_raising(
        body: bytes, protobuf: bool) -> None:
    name = created_namespace((b"k8s\x00" if protobuf else b"") + body)
    assert name == "" or (name.isascii() and len(name) <= 63)
