"""Fixtures for kubesim's end-to-end tests: one server per module (per route), every kubectl found.

A module sets `KUBESIM_OPTIONS` (keyword arguments of `serve_kubesim`) to configure its servers.
A test marked `@pytest.mark.routes` runs once per route ("direct": kubectl → kubesim; "tunnel":
kubectl → kasd → agentd → kubesim), with ids like `kubectl-1.32-tunnel`; unmarked tests take the
direct route only. See tests/kubesim/kubectl_harness.py.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest

from tests.kubesim.kubectl_harness import (
    ROUTES,
    Kubectl,
    ServerPool,
    ServerThread,
    kubectl_binaries,
)

KUBECTLS = kubectl_binaries()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "routes: run a kubectl test both straight at kubesim and through kasd and agentd")


@pytest.fixture(scope="module")
def kube_servers(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    options = getattr(request.module, "KUBESIM_OPTIONS", {"bookmark_interval": 0.2})
    pool = ServerPool(lambda route: tmp_path_factory.mktemp(f"kubesim-{route}"), **options)
    try:
        yield pool
    finally:
        pool.stop()


@pytest.fixture
def kube_server(kube_servers: ServerPool, request: pytest.FixtureRequest) -> ServerThread:
    """The module's server for this test's route (parametrized by the `routes` marker)."""
    return kube_servers.get(getattr(request, "param", "direct"))


_NAMESPACES = itertools.count()


@pytest.fixture
def k(kube_server: ServerThread, kubectl_bin: str, request: pytest.FixtureRequest) -> Kubectl:
    """kubectl (each version found) against the module's server, in a fresh namespace."""
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    namespace = f"{base}-{next(_NAMESPACES)}"
    kube_server.make_namespace(namespace)
    return Kubectl(kubectl_bin, kube_server, namespace)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kubectl_bin" in metafunc.fixturenames:
        metafunc.parametrize("kubectl_bin", [path for _, path in KUBECTLS],
                             ids=[f"kubectl-{minor}" for minor, _ in KUBECTLS])
    if "kube_server" in metafunc.fixturenames and metafunc.definition.get_closest_marker("routes"):
        metafunc.parametrize("kube_server", ROUTES, ids=ROUTES, indirect=True)
