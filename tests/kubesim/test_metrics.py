"""`GET /metrics`: Prometheus text exposition of the API server's own metrics, read with real kubectl
(`kubectl get --raw /metrics`, as against a real cluster) and parsed with prometheus-client."""

from __future__ import annotations

import functools
import ssl
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.kubesim.kubectl_harness import TOKEN, ServerThread, kubectl

pytestmark = [pytest.mark.timeout(60), pytest.mark.routes]

_COUNTER = iter(range(10_000))


@pytest.fixture
def namespace(kube_server: ServerThread) -> str:
    name = f"metrics-{next(_COUNTER)}"
    kube_server.make_namespace(name)
    return name


def samples(text: str) -> dict[str, list[Any]]:
    """Every sample of the exposition, by metric name (parsing fails on a malformed text)."""
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(found: dict[str, list[Any]], name: str, **labels: str) -> float | None:
    for sample in found.get(name, []):
        if all(sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    return None


async def test_kubectl_get_raw_metrics_counts_requests(kube_server: ServerThread,
                                                       kubectl_bin: str, namespace: str) -> None:
    for _ in range(2):
        await kubectl(kubectl_bin, kube_server, "-n", namespace, "get", "pods")
    await kubectl(kubectl_bin, kube_server, "-n", namespace, "create", "configmap", "c",
                  "--from-literal=a=b")
    text = (await kubectl(kubectl_bin, kube_server, "get", "--raw", "/metrics")).stdout
    assert "# TYPE apiserver_request_total counter" in text
    found = samples(text)
    lists = value(found, "apiserver_request_total", verb="LIST", resource="pods", group="",
                  version="v1", scope="namespace", code="200", component="apiserver",
                  subresource="", dry_run="")
    assert lists is not None and lists >= 2
    assert value(found, "apiserver_request_total", verb="POST", resource="configmaps",
                 scope="namespace", code="201") is not None
    assert value(found, "apiserver_request_duration_seconds_count", verb="LIST", resource="pods",
                 scope="namespace") is not None
    assert value(found, "apiserver_current_inflight_requests", request_kind="mutating") == 0
    # this very request is the one read-only request in flight (unless another test's overlaps)
    assert (value(found, "apiserver_current_inflight_requests", request_kind="readOnly") or 0) >= 1
    assert (value(found, "apiserver_storage_objects", resource="namespaces") or 0) >= 1
    assert value(found, "kubernetes_build_info", git_version="v1.32.0", major="1", minor="32") == 1


async def test_a_watch_is_a_long_running_request(kube_server: ServerThread, kubectl_bin: str,
                                                 namespace: str) -> None:

    async def watching() -> float:
        text = (await kubectl(kubectl_bin, kube_server, "get", "--raw", "/metrics")).stdout
        return value(samples(text), "apiserver_longrunning_requests", verb="WATCH",
                     resource="configmaps", scope="namespace") or 0

    before = await watching()
    async with trio.open_nursery() as nursery:
        process = await nursery.start(functools.partial(
            trio.run_process, [kubectl_bin, "-n", namespace, "get", "configmaps", "-w"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=kube_server.env(), check=False))
        with trio.fail_after(10):
            buffer = b""
            while b"kube-root-ca.crt" not in buffer:  # the list arrived: the watch comes next
                buffer += await process.stdout.receive_some()
            while True:  # the watch request reaches kubesim a moment after the list's answer
                if await watching() > before:
                    break
                await trio.sleep(0.05)
        process.kill()


async def test_metrics_need_a_token_and_are_prometheus_text(kube_server: ServerThread,
                                                            kubectl_bin: str) -> None:
    refused = await kubectl(kubectl_bin, kube_server, "get", "--raw", "/metrics", "--token", "wrong",
                            check=False)
    assert refused.returncode == 1
    assert "Unauthorized" in refused.stderr or "must be logged in" in refused.stderr
    if kube_server.route != "direct":
        return
    sim = kube_server.sim
    assert sim is not None
    context = ssl.create_default_context(cafile=str(kube_server.ca_path))

    def fetch(token: str | None) -> tuple[int, str, str]:
        request = urllib.request.Request(sim.url + "/metrics")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                return response.status, response.headers["content-type"], response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["content-type"], exc.read().decode()

    status, content_type, body = await trio.to_thread.run_sync(fetch, TOKEN)
    assert status == 200
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert samples(body)["apiserver_request_total"]
    status, _, body = await trio.to_thread.run_sync(fetch, None)
    assert status == 401 and '"reason":"Unauthorized"' in body.replace(" ", "")


async def test_invented_methods_do_not_grow_the_series(kube_server: ServerThread,
                                                       kubectl_bin: str) -> None:
    """A client sending made-up HTTP methods to a resource path is counted under verb "other"
    (the API server's cleanVerb), not one new series per method: memory stays bounded."""
    if kube_server.route != "direct":
        return
    sim = kube_server.sim
    assert sim is not None
    context = ssl.create_default_context(cafile=str(kube_server.ca_path))

    def send(method: str) -> int:
        request = urllib.request.Request(sim.url + "/api/v1/pods", method=method)
        request.add_header("Authorization", f"Bearer {TOKEN}")
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    for index in range(3):
        assert await trio.to_thread.run_sync(send, f"INVENTED{index}") == 405
    text = (await kubectl(kubectl_bin, kube_server, "get", "--raw", "/metrics")).stdout
    assert "INVENTED" not in text
    assert (value(samples(text), "apiserver_request_total", verb="other", resource="pods",
                  code="405") or 0) >= 3
