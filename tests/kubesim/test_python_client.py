"""The official Python `kubernetes` client against kubesim: typed calls, a watch, logs and a
`stream()` exec. The client is synchronous, so its calls run in worker threads while the
server and the assertions on its store stay in the test's Trio loop."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trustme
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from kubesim.server import KubeSim, open_kubesim
from kubesim.store import Store

T = TypeVar("T")
TOKEN = "python-client-token"

pytestmark = pytest.mark.timeout(20)


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def api_client(sim: KubeSim, tmp_path: Path) -> client.ApiClient:
    path = sim.write_kubeconfig(tmp_path / "kubeconfig")
    return config.new_client_from_config(config_file=str(path))


def deployment_body(name: str, replicas: int = 2) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "main", "image": "nginx:1.27"}]}}},
    }


def available(store: Store, namespace: str, name: str, replicas: int) -> bool | None:
    dep = store.find(store.kind("apps", "deployments"), namespace, name)
    if dep is None:
        return None
    status = dep.get("status") or {}
    return True if status.get("availableReplicas") == replicas and status.get("updatedReplicas") == replicas else None


async def test_typed_calls_and_owner_references(tmp_path: Path) -> None:
    async with open_kubesim(token=TOKEN) as sim:
        api = api_client(sim, tmp_path)
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        await in_thread(core.create_namespace, {"metadata": {"name": "py"}})
        created = await in_thread(apps.create_namespaced_deployment, "py", deployment_body("web"))
        assert created.metadata.generation == 1 and created.metadata.uid
        await sim.store.wait_for(lambda: available(sim.store, "py", "web", 2))

        pods = await in_thread(core.list_namespaced_pod, "py", label_selector="app=web")
        assert len(pods.items) == 2
        assert int(pods.metadata.resource_version) > 0
        assert {p.status.phase for p in pods.items} == {"Running"}
        owner = pods.items[0].metadata.owner_references[0]
        replicaset = await in_thread(apps.read_namespaced_replica_set, owner.name, "py")
        assert owner.kind == "ReplicaSet" and owner.uid == replicaset.metadata.uid
        assert replicaset.metadata.owner_references[0].uid == created.metadata.uid

        page = await in_thread(core.list_namespaced_pod, "py", limit=1)
        assert len(page.items) == 1 and page.metadata._continue
        rest = await in_thread(core.list_namespaced_pod, "py", limit=1, _continue=page.metadata._continue)
        assert rest.items[0].metadata.name != page.items[0].metadata.name

        patched = await in_thread(apps.patch_namespaced_deployment, "web", "py", {"spec": {"replicas": 3}})
        assert patched.spec.replicas == 3 and patched.metadata.generation == 2
        await sim.store.wait_for(lambda: available(sim.store, "py", "web", 3))
        scale = await in_thread(apps.read_namespaced_deployment_scale, "web", "py")
        assert scale.spec.replicas == 3 and scale.status.selector == "app=web"

        with pytest.raises(ApiException) as missing:
            await in_thread(core.read_namespaced_pod, "nope", "py")
        assert missing.value.status == 404
        with pytest.raises(ApiException) as exists:
            await in_thread(apps.create_namespaced_deployment, "py", deployment_body("web"))
        assert exists.value.status == 409

        await in_thread(apps.delete_namespaced_deployment, "web", "py")
        remaining = await in_thread(core.list_namespaced_pod, "py")
        assert remaining.items == []

        seen = [r for r in sim.requests if r.path.startswith("/apis/apps/v1/namespaces/py")]
        assert seen and all(r.bearer_token == TOKEN for r in seen)
        assert all(r.user_agent.startswith("OpenAPI-Generator/") for r in seen)


async def test_watch_resumes_from_a_resource_version_and_gets_410(tmp_path: Path) -> None:
    async with open_kubesim(token=TOKEN, store=Store(history=20)) as sim:
        api = api_client(sim, tmp_path)
        core = client.CoreV1Api(api)
        listed = await in_thread(core.list_namespaced_config_map, "default")
        kind = sim.store.kind("", "configmaps")
        for name in ("first", "second"):
            sim.store.create(kind, "default", {"metadata": {"name": name}, "data": {"k": name}})

        def collect() -> list[tuple[str, str]]:
            events = []
            w = watch.Watch()
            for event in w.stream(core.list_namespaced_config_map, "default",
                                  resource_version=listed.metadata.resource_version,
                                  timeout_seconds=5):
                events.append((event["type"], event["object"].metadata.name))
                if len(events) == 2:
                    w.stop()
            return events

        assert await in_thread(collect) == [("ADDED", "first"), ("ADDED", "second")]

        for index in range(30):
            sim.store.create(kind, "default", {"metadata": {"name": f"filler-{index}"}})

        def too_old() -> int:
            try:
                for _ in watch.Watch().stream(core.list_namespaced_config_map, "default",
                                              resource_version=listed.metadata.resource_version,
                                              timeout_seconds=5):
                    pass
            except ApiException as exc:
                return int(exc.status)
            return 0

        assert await in_thread(too_old) == 410


async def test_stream_exec_and_logs(tmp_path: Path) -> None:
    async with open_kubesim(token=TOKEN) as sim:
        api = api_client(sim, tmp_path)
        core = client.CoreV1Api(api)
        await in_thread(core.create_namespaced_pod, "default", {
            "metadata": {"name": "box"},
            "spec": {"containers": [{"name": "box", "image": "busybox:1.36",
                                     "env": [{"name": "COLOUR", "value": "teal"}]}]}})
        pods = sim.store.kind("", "pods")
        await sim.store.wait_for(
            lambda: (sim.store.find(pods, "default", "box") or {}).get("status", {}).get("phase") == "Running" or None)

        output = await in_thread(stream, core.connect_get_namespaced_pod_exec, "box", "default",
                                 command=["sh", "-c", "echo $COLOUR"], stderr=True, stdin=False,
                                 stdout=True, tty=False)
        assert output == "teal\n"

        logs = await in_thread(core.read_namespaced_pod_log, "box", "default", tail_lines=1)
        assert logs == "kubesim: ready\n"
        sim.console("default", "box", "box").log("hello from the test")  # type: ignore[union-attr]
        logs = await in_thread(core.read_namespaced_pod_log, "box", "default", tail_lines=1)
        assert logs == "hello from the test\n"


async def test_stream_exec_with_stdin(tmp_path: Path) -> None:
    async with open_kubesim(token=TOKEN) as sim:
        api = api_client(sim, tmp_path)
        core = client.CoreV1Api(api)
        await in_thread(core.create_namespaced_pod, "default", {
            "metadata": {"name": "box"},
            "spec": {"containers": [{"name": "box", "image": "busybox:1.36"}]}})
        pods = sim.store.kind("", "pods")
        await sim.store.wait_for(
            lambda: (sim.store.find(pods, "default", "box") or {}).get("status", {}).get("phase") == "Running" or None)

        def interact() -> str:
            resp = stream(core.connect_get_namespaced_pod_exec, "box", "default", command=["cat"],
                          stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False)
            try:
                resp.write_stdin("round trip\n")
                seen = ""
                while "round trip" not in seen and resp.is_open():
                    resp.update(timeout=5)
                    seen += resp.read_stdout(timeout=0) or ""
                return seen
            finally:
                resp.close()

        assert await in_thread(interact) == "round trip\n"


async def test_tls_kubeconfig_and_http2_peers(tmp_path: Path) -> None:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    async with open_kubesim(token=TOKEN, tls=context, ca_pem=ca.cert_pem.bytes()) as sim:
        assert sim.url.startswith("https://127.0.0.1:")
        core = client.CoreV1Api(api_client(sim, tmp_path))
        namespaces = await in_thread(core.list_namespace)
        assert {"default", "kube-system"} <= {n.metadata.name for n in namespaces.items}
        root_ca = await sim.store.wait_for(lambda: sim.store.find(
            sim.store.kind("", "configmaps"), "default", "kube-root-ca.crt"))
        assert root_ca["data"]["ca.crt"] == ca.cert_pem.bytes().decode()
        assert sim.requests[-1].http_version == "1.1"  # urllib3 speaks HTTP/1.1 even over TLS
