"""Fixtures for kubesim's end-to-end tests: one server per module, every kubectl found."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kubesim.kubectl_harness import ServerThread, kubectl_binaries

KUBECTLS = kubectl_binaries()


@pytest.fixture(scope="module")
def kube_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    workdir: Path = tmp_path_factory.mktemp("kubesim")
    server = ServerThread(workdir, bookmark_interval=0.2).start()
    try:
        yield server
    finally:
        server.stop()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kubectl_bin" in metafunc.fixturenames:
        metafunc.parametrize("kubectl_bin", [path for _, path in KUBECTLS],
                             ids=[f"kubectl-{minor}" for minor, _ in KUBECTLS])
