"""The audit line's verb, resource and namespace, read as kube-apiserver's RequestInfoFactory reads them."""

from __future__ import annotations

import pytest

from kasd.k8sproxy.requestinfo import RequestInfo, request_info


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
