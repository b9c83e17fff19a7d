"""The conformance table: real kubectl (every version found) against kubesim, asserting what a
user would see. One TLS server per module; every row works in a namespace of its own. The streaming
rows (get -w, logs -f, exec, attach) also run through kasd and agentd (the `routes` marker)."""

from __future__ import annotations

import base64
import functools
import json
import re
import subprocess
from pathlib import Path

import pytest
import trio

from tests.kubesim.kubectl_harness import (
    TOKEN,
    TUNNEL_USER,
    Kubectl,
    ServerThread,
    table_rows,
)

MANIFESTS = Path(__file__).with_name("manifests")
ALL_KINDS = MANIFESTS / "all-kinds.yaml"

pytestmark = pytest.mark.timeout(30)


_COUNTER = iter(range(10_000))


def header(text: str) -> list[str]:
    return table_rows(text)[0]


def rows_by_name(text: str) -> dict[str, list[str]]:
    return {row[0]: row for row in table_rows(text)[1:]}


# -- get and describe every kind ----------------------------------------------------------------

EXPECTED_COLUMNS = {
    "configmaps": (["NAME", "DATA", "AGE"], "app-config"),
    "secrets": (["NAME", "TYPE", "DATA", "AGE"], "app-secret"),
    "serviceaccounts": (["NAME", "SECRETS", "AGE"], "app-sa"),
    "persistentvolumeclaims": (["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS MODES", "STORAGECLASS",
                                "VOLUMEATTRIBUTESCLASS", "AGE"], "app-data"),
    "deployments": (["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"], "app"),
    "replicasets": (["NAME", "DESIRED", "CURRENT", "READY", "AGE"], "app-"),
    "pods": (["NAME", "READY", "STATUS", "RESTARTS", "AGE"], "db-0"),
    "services": (["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"], "app"),
    "endpointslices": (["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"], "app-"),
    "statefulsets": (["NAME", "READY", "AGE"], "db"),
    "daemonsets": (["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR",
                    "AGE"], "agent"),
    "jobs": (["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"], "once"),
    "cronjobs": (["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST SCHEDULE", "AGE"], "nightly"),
    "ingresses": (["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"], "app"),
    "poddisruptionbudgets": (["NAME", "MIN AVAILABLE", "MAX UNAVAILABLE", "ALLOWED DISRUPTIONS", "AGE"], "app"),
    "networkpolicies": (["NAME", "POD-SELECTOR", "AGE"], "app"),
    "horizontalpodautoscalers": (["NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS", "AGE"], "app"),
    "events": (["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], ""),
}


async def test_get_and_describe_every_kind(k: Kubectl) -> None:
    applied = await k.out("apply", "-f", str(ALL_KINDS))
    assert "deployment.apps/app created" in applied
    await k("rollout", "status", "deployment/app", "--timeout=10s")
    await k("rollout", "status", "statefulset/db", "--timeout=10s")
    await k("wait", "--for=condition=complete", "job/once", "--timeout=10s")

    async def check(plural: str) -> None:
        columns, name = EXPECTED_COLUMNS[plural]
        text = await k.out("get", plural)
        assert header(text) == columns, text
        names = [row[0] for row in table_rows(text)[1:]]
        assert any(n.startswith(name) for n in names), text
        described = await k.out("describe", plural)
        assert re.search(rf"^Name:\s+{re.escape(name)}", described, re.M), described

    async with trio.open_nursery() as nursery:
        for plural in EXPECTED_COLUMNS:
            nursery.start_soon(check, plural)

    pods = rows_by_name(await k.out("get", "pods"))
    assert pods["db-0"][1:3] == ["1/1", "Running"]
    job_pod = next(row for name, row in pods.items() if name.startswith("once-"))
    assert job_pod[2] == "Completed"
    deployments = rows_by_name(await k.out("get", "deployments"))
    assert deployments["app"][1:4] == ["2/2", "2", "2"]
    jobs = rows_by_name(await k.out("get", "jobs"))
    assert jobs["once"][1:3] == ["Complete", "1/1"]
    pvc = rows_by_name(await k.out("get", "pvc"))
    assert pvc["app-data"][1] == "Bound"
    assert rows_by_name(await k.out("get", "pdb"))["app"][1:3] == ["1", "N/A"]
    assert rows_by_name(await k.out("get", "netpol"))["app"][1] == "app=app"


async def test_cluster_scoped_kinds(k: Kubectl) -> None:
    namespaces = await k.out("get", "namespaces", namespaced=False)
    assert header(namespaces) == ["NAME", "STATUS", "AGE"]
    assert rows_by_name(namespaces)[k.namespace][1] == "Active"
    nodes = await k.out("get", "nodes", namespaced=False)
    assert header(nodes) == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert rows_by_name(nodes)["kubesim-node"][1] == "Ready"
    node = await k.out("describe", "node", "kubesim-node", namespaced=False)
    assert re.search(r"^Roles:\s+control-plane", node, re.M)
    described = await k.out("describe", "namespace", k.namespace, namespaced=False)
    assert re.search(rf"^Name:\s+{k.namespace}", described, re.M)
    assert re.search(r"^Status:\s+Active", described, re.M)


async def test_get_all_namespaces_labels_and_fields(k: Kubectl) -> None:
    await k("apply", "-f", str(ALL_KINDS))
    await k("rollout", "status", "deployment/app", "--timeout=10s")
    everywhere = await k.out("get", "pods", "-A", namespaced=False)
    assert header(everywhere)[:3] == ["NAMESPACE", "NAME", "READY"]
    assert any(row[0] == k.namespace and row[1].startswith("app-") for row in table_rows(everywhere)[1:])
    labelled = await k.out("get", "pods", "-l", "app=app", "-o", "name")
    assert len(labelled.split()) == 2 and all(n.startswith("pod/app-") for n in labelled.split())
    set_based = await k.out("get", "pods", "-l", "app in (db,agent)", "-o", "name")
    assert sorted(set_based.split())[-2:] == ["pod/db-0", "pod/db-1"]
    by_field = await k.out("get", "pods", "--field-selector", "metadata.name=db-1", "-o", "name")
    assert by_field.split() == ["pod/db-1"]
    succeeded = await k.out("get", "pods", "--field-selector", "status.phase=Succeeded", "-o", "name")
    assert [n for n in succeeded.split() if n.startswith("pod/once-")]
    assert "db-0" not in succeeded
    chunked = await k.out("get", "pods", "--chunk-size=1", "-o", "name")
    assert len(chunked.split()) >= 5


async def test_output_formats(k: Kubectl) -> None:
    await k("apply", "-f", str(ALL_KINDS))
    await k("rollout", "status", "deployment/app", "--timeout=10s")
    as_yaml = await k.out("get", "deployment", "app", "-o", "yaml")
    assert "apiVersion: apps/v1" in as_yaml and "kind: Deployment" in as_yaml
    assert re.search(r"^  resourceVersion: \"\d+\"", as_yaml, re.M)
    assert re.search(r"^  uid: [0-9a-f-]{36}", as_yaml, re.M)
    as_json = json.loads(await k.out("get", "deployment", "app", "-o", "json"))
    assert as_json["metadata"]["generation"] == 1
    assert as_json["status"]["availableReplicas"] == 2
    pod_list = json.loads(await k.out("get", "pods", "-o", "json"))
    assert pod_list["kind"] == "List" and pod_list["items"][0]["kind"] == "Pod"
    wide = await k.out("get", "pods", "-o", "wide")
    assert header(wide) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE",
                            "NOMINATED NODE", "READINESS GATES"]
    assert "kubesim-node" in wide
    jsonpath = await k.out("get", "pods", "-l", "app=app", "-o",
                           "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}")
    assert jsonpath.split() == ["Running", "Running"]
    rs = json.loads(await k.out("get", "rs", "-o", "json"))["items"][0]
    assert rs["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    assert rs["metadata"]["ownerReferences"][0]["uid"] == as_json["metadata"]["uid"]
    custom = await k.out("get", "deploy", "-o", "custom-columns=NAME:.metadata.name,REPLICAS:.spec.replicas")
    assert table_rows(custom) == [["NAME", "REPLICAS"], ["app", "2"]]


# -- creating -----------------------------------------------------------------------------------

POD = """apiVersion: v1
kind: Pod
metadata:
  name: solo
  labels: {app: solo}
spec:
  containers:
  - name: main
    image: busybox:1.36
    env: [{name: GREETING, value: hello}]
"""


async def test_create_from_file_and_stdin(k: Kubectl) -> None:
    created = await k.out("create", "-f", "-", stdin=POD.encode())
    assert created.strip() == "pod/solo created"
    again = await k("create", "-f", "-", stdin=POD.encode(), check=False)
    assert again.returncode == 1
    assert 'pods "solo" already exists' in again.stderr
    await k("wait", "--for=condition=Ready", "pod/solo", "--timeout=10s")
    assert rows_by_name(await k.out("get", "pod", "solo"))["solo"][1:3] == ["1/1", "Running"]


async def test_create_rejects_unknown_fields(k: Kubectl) -> None:
    bad = POD.replace("    image: busybox:1.36\n", "    image: busybox:1.36\n    imagge: typo\n")
    result = await k("create", "-f", "-", stdin=bad.encode(), check=False)
    assert result.returncode == 1
    assert 'unknown field "spec.containers[0].imagge"' in result.stderr


async def test_apply_of_an_object_too_big_for_its_annotation_is_invalid(k: Kubectl,
                                                                     tmp_path: Path) -> None:
    # ~300 KiB of data: `create` stores it (a ConfigMap may hold 1 MiB), but `apply` copies the
    # whole object into the last-applied-configuration annotation, past the 256 KiB that all of an
    # object's annotations may hold — a real server refuses that with 422 Invalid.
    manifest = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
                           "data": {"blob": "x" * (300 * 1024)}})
    applied = await k("apply", "-f", "-", stdin=manifest.encode(), check=False)
    assert applied.returncode == 1
    assert ('The ConfigMap "big" is invalid: metadata.annotations: Too long: may not be more than '
            "262144 bytes") in applied.stderr
    assert "metadata.annotations: metadata.annotations" not in applied.stderr
    gone = await k("get", "configmap", "big", check=False)
    assert gone.returncode == 1 and "NotFound" in gone.stderr
    created = await k.out("create", "-f", "-", stdin=manifest.encode())
    assert created.strip() == "configmap/big created"
    # an update and a patch that would pass the limit are refused the same way; just under it fits
    stored = json.loads(await k.out("get", "configmap", "big", "-o", "json"))
    stored["metadata"]["annotations"] = {"a": "y" * (257 * 1024)}
    replaced = await k("replace", "-f", "-", stdin=json.dumps(stored).encode(), check=False)
    assert replaced.returncode == 1
    assert "metadata.annotations: Too long: may not be more than 262144 bytes" in replaced.stderr
    patch = tmp_path / "patch.json"
    patch.write_text(json.dumps({"metadata": {"annotations": {"a": "y" * (257 * 1024)}}}))
    patched = await k("patch", "configmap", "big", "--type=merge", "--patch-file", str(patch),
                      check=False)
    assert patched.returncode == 1
    assert "metadata.annotations: Too long: may not be more than 262144 bytes" in patched.stderr
    patch.write_text(json.dumps({"metadata": {"annotations": {"a": "y" * (256 * 1024 - 1)}}}))
    await k("patch", "configmap", "big", "--type=merge", "--patch-file", str(patch))


async def test_apply_create_change_unchanged(k: Kubectl) -> None:
    manifest = (MANIFESTS / "all-kinds.yaml").read_text().split("---")[4]  # the Deployment
    first = await k.out("apply", "-f", "-", stdin=manifest.encode())
    assert first.strip() == "deployment.apps/app created"
    await k("rollout", "status", "deployment/app", "--timeout=10s")
    changed = manifest.replace("nginx:1.27", "nginx:1.28").replace("replicas: 2", "replicas: 3")
    second = await k.out("apply", "-f", "-", stdin=changed.encode())
    assert second.strip() == "deployment.apps/app configured"
    status = await k.out("rollout", "status", "deployment/app", "--timeout=10s")
    assert 'deployment "app" successfully rolled out' in status
    third = await k.out("apply", "-f", "-", stdin=changed.encode())
    assert third.strip() == "deployment.apps/app unchanged"
    deployment = json.loads(await k.out("get", "deployment", "app", "-o", "json"))
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.28"
    assert deployment["metadata"]["generation"] == 2
    assert "kubectl.kubernetes.io/last-applied-configuration" in deployment["metadata"]["annotations"]
    replicasets = rows_by_name(await k.out("get", "rs"))
    assert sorted(row[1] for row in replicasets.values()) == ["0", "3"]
    history = await k.out("rollout", "history", "deployment/app")
    assert re.search(r"^1\s", history, re.M) and re.search(r"^2\s", history, re.M)
    # Removing a container env var through apply deletes it (strategic merge with merge keys).
    with_env = changed.replace("ports: [{containerPort: 80}]",
                               "ports: [{containerPort: 80}]\n        env: [{name: A, value: '1'}, {name: B, value: '2'}]")
    await k("apply", "-f", "-", stdin=with_env.encode())
    without_b = with_env.replace(", {name: B, value: '2'}", "")
    await k("apply", "-f", "-", stdin=without_b.encode())
    env = json.loads(await k.out("get", "deployment", "app", "-o", "jsonpath={.spec.template.spec.containers[0].env}"))
    assert env == [{"name": "A", "value": "1"}]
    server_side = await k("apply", "--server-side", "-f", "-", stdin=without_b.encode(), check=False)
    assert server_side.returncode == 1
    assert "kubesim does not implement server-side apply" in server_side.stderr


async def test_patch_three_types_label_and_scale(k: Kubectl) -> None:
    await k("apply", "-f", "-", stdin=(MANIFESTS / "all-kinds.yaml").read_text().split("---")[4].encode())
    strategic = await k.out("patch", "deployment", "app", "-p",
                            '{"spec":{"template":{"spec":{"containers":[{"name":"main","env":[{"name":"X","value":"y"}]}]}}}}')
    assert strategic.strip() == "deployment.apps/app patched"
    merge = await k.out("patch", "deployment", "app", "--type=merge", "-p", '{"metadata":{"annotations":{"team":"blue"}}}')
    assert merge.strip() == "deployment.apps/app patched"
    json_patch = await k.out("patch", "deployment", "app", "--type=json", "-p",
                             '[{"op":"replace","path":"/spec/replicas","value":3}]')
    assert json_patch.strip() == "deployment.apps/app patched"
    noop = await k.out("patch", "deployment", "app", "--type=merge", "-p", '{"metadata":{"annotations":{"team":"blue"}}}')
    assert noop.strip() == "deployment.apps/app patched (no change)"
    labelled = await k.out("label", "deployment", "app", "tier=web")
    assert labelled.strip() == "deployment.apps/app labeled"
    deployment = json.loads(await k.out("get", "deployment", "app", "-o", "json"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "nginx:1.27" and container["env"] == [{"name": "X", "value": "y"}]
    assert deployment["metadata"]["annotations"]["team"] == "blue"
    assert deployment["metadata"]["labels"] == {"app": "app", "tier": "web"}
    assert deployment["spec"]["replicas"] == 3
    scaled = await k.out("scale", "deployment", "app", "--replicas=1")
    assert scaled.strip() == "deployment.apps/app scaled"
    await k("rollout", "status", "deployment/app", "--timeout=10s")
    assert rows_by_name(await k.out("get", "deployment", "app"))["app"][1] == "1/1"
    bad = await k("patch", "deployment", "app", "--type=json", "-p",
                  '[{"op":"test","path":"/spec/replicas","value":7}]', check=False)
    assert bad.returncode == 1


async def test_rollout_status_and_wait(k: Kubectl) -> None:
    await k("apply", "-f", "-", stdin=(MANIFESTS / "all-kinds.yaml").read_text().split("---")[4].encode())
    status = await k.out("rollout", "status", "deployment/app", "--timeout=10s")
    assert 'deployment "app" successfully rolled out' in status
    waited = await k.out("wait", "--for=condition=Available", "deployment/app", "--timeout=10s")
    assert waited.strip() == "deployment.apps/app condition met"
    await k("set", "image", "deployment/app", "main=nginx:1.29")
    status = await k.out("rollout", "status", "deployment/app", "--timeout=10s")
    assert 'deployment "app" successfully rolled out' in status
    undo = await k.out("rollout", "undo", "deployment/app")
    assert "rolled back" in undo
    await k("rollout", "status", "deployment/app", "--timeout=10s")
    image = await k.out("get", "deployment", "app", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
    assert image == "nginx:1.27"


async def test_stalled_rollout_and_crash_loop(k: Kubectl) -> None:
    manifest = (MANIFESTS / "all-kinds.yaml").read_text().split("---")[4]
    stalled = manifest.replace("replicas: 2", "replicas: 2\n  progressDeadlineSeconds: 1").replace(
        "metadata: {labels: {app: app}}",
        "metadata: {labels: {app: app}, annotations: {kubesim.io/stall-rollout: 'true'}}")
    await k("apply", "-f", "-", stdin=stalled.encode())
    result = await k("rollout", "status", "deployment/app", "--timeout=10s", check=False)
    assert result.returncode == 1
    assert 'deployment "app" exceeded its progress deadline' in result.stderr
    pods = rows_by_name(await k.out("get", "pods"))
    assert [row[1:3] for row in pods.values()] == [["0/1", "Running"]] * 2
    await k("run", "crasher", "--image=busybox:1.36", "--annotations=kubesim.io/crash-loop=true")
    crashed = rows_by_name(await k.out("get", "pod", "crasher"))
    assert crashed["crasher"][1:3] == ["0/1", "CrashLoopBackOff"]
    assert re.fullmatch(r"[1-9]\d* \(\d+s ago\)", crashed["crasher"][3])
    assert "kubesim: ready" in await k.out("logs", "crasher", "--previous")
    refused = await k("exec", "crasher", "--", "echo", "hi", check=False)
    assert refused.returncode == 1 and 'container not found ("crasher")' in refused.stderr
    healthy = next(name for name in pods)
    no_previous = await k("logs", healthy, "--previous", check=False)
    assert no_previous.returncode == 1
    assert f'previous terminated container "main" in pod "{healthy}" not found' in no_previous.stderr


async def test_delete_and_namespace_cascade(k: Kubectl) -> None:
    await k("apply", "-f", str(ALL_KINDS))
    await k("rollout", "status", "deployment/app", "--timeout=10s")
    deleted = await k.out("delete", "deployment", "app")
    assert deleted.startswith('deployment.apps "app" deleted')
    remaining = await k.out("get", "rs,pods", "-l", "app=app")
    assert remaining.strip() == ""
    by_label = await k.out("delete", "pods", "-l", "app=db", "--wait=false")
    assert "pod \"db-0\" deleted" in by_label
    missing = await k("get", "deployment", "app", check=False)
    assert missing.returncode == 1
    assert 'Error from server (NotFound): deployments.apps "app" not found' in missing.stderr
    gone = await k.out("delete", "namespace", k.namespace, namespaced=False)
    assert gone.startswith(f'namespace "{k.namespace}" deleted')
    after = await k("get", "configmaps", check=False)
    assert "No resources found" in after.stdout + after.stderr
    namespaces = await k.out("get", "namespaces", "-o", "name", namespaced=False)
    assert f"namespace/{k.namespace}" not in namespaces.split()


@pytest.mark.routes
async def test_get_watch_sees_a_concurrent_change(k: Kubectl) -> None:
    await k("create", "-f", "-", stdin=POD.encode())
    async with trio.open_nursery() as nursery:
        process = await nursery.start(functools.partial(
            trio.run_process, [k.binary, "-n", k.namespace, "get", "pods", "-w", "--request-timeout=0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=k.server.env(), check=False))
        lines: list[str] = []
        buffer = b""

        async def read_until(text: str) -> None:
            nonlocal buffer
            with trio.fail_after(10):
                while text not in buffer.decode():
                    chunk = await process.stdout.receive_some()
                    if not chunk:
                        raise AssertionError(f"watch ended early: {buffer.decode()}")
                    buffer += chunk

        await read_until("solo")
        await k("label", "pod", "solo", "seen=yes")
        await k("delete", "pod", "solo", "--wait=false")
        await read_until("Terminating")
        process.kill()
        lines = buffer.decode().splitlines()
    assert lines[0].split()[:3] == ["NAME", "READY", "STATUS"]
    assert any("Terminating" in line for line in lines[1:])
    assert sum(1 for line in lines if line.startswith("solo")) >= 2


# -- logs and exec ------------------------------------------------------------------------------


@pytest.mark.routes
async def test_logs_and_follow(k: Kubectl) -> None:
    await k("create", "-f", "-", stdin=POD.encode())
    await k("wait", "--for=condition=Ready", "pod/solo", "--timeout=10s")
    logs = await k.out("logs", "solo")
    assert "kubesim: container main started (image busybox:1.36)" in logs
    tail = await k.out("logs", "solo", "--tail=1", "--timestamps")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z kubesim: ready\n", tail)
    server = k.server

    def log_line(text: str) -> None:
        sim = server.sim
        assert sim is not None
        console = sim.console(k.namespace, "solo", "main")
        assert console is not None
        console.log(text)

    async with trio.open_nursery() as nursery:
        process = await nursery.start(functools.partial(
            trio.run_process, [k.binary, "-n", k.namespace, "logs", "-f", "solo", "--tail=1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=server.env(), check=False))
        buffer = b""
        with trio.fail_after(10):
            while b"kubesim: ready" not in buffer:
                buffer += await process.stdout.receive_some()
            await server.acall(log_line, "a line written while following")
            while b"while following" not in buffer:
                buffer += await process.stdout.receive_some()
        process.kill()
    assert buffer.decode().splitlines() == ["kubesim: ready", "a line written while following"]
    missing = await k("logs", "solo", "-c", "nope", check=False)
    assert missing.returncode == 1 and "container nope is not valid for pod solo" in missing.stderr


@pytest.mark.routes
async def test_exec_with_and_without_stdin(k: Kubectl) -> None:
    await k("create", "-f", "-", stdin=POD.encode())
    await k("wait", "--for=condition=Ready", "pod/solo", "--timeout=10s")
    echoed = await k.out("exec", "solo", "--", "echo", "hello", "world")
    assert echoed == "hello world\n"
    env = await k.out("exec", "solo", "--", "env")
    assert "GREETING=hello" in env.splitlines() and "HOSTNAME=solo" in env.splitlines()
    piped = await k.out("exec", "-i", "solo", "--", "cat", stdin=b"line one\nline two\n")
    assert piped == "line one\nline two\n"
    shell = await k("exec", "solo", "--", "sh", "-c", "echo out; echo err >&2; exit 3", check=False)
    assert shell.returncode == 3
    assert shell.stdout == "out\n"
    assert "err" in shell.stderr and "command terminated with exit code 3" in shell.stderr


@pytest.fixture(scope="module")
def spdy_off_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    server = ServerThread(tmp_path_factory.mktemp("kubesim-nospdy"), spdy=False).start()
    try:
        yield server
    finally:
        server.stop()


async def test_spdy_and_port_forward_say_what_kubesim_supports_with_spdy_switched_off(
        spdy_off_server: ServerThread, kubectl_bin: str) -> None:
    # kubectl falls back to SPDY when told to, or (port-forward) when the WebSocket is refused; it
    # then shows only the SPDY answer, which must say plainly what kubesim does not do. With
    # KUBESIM_SPDY=0 (hyperraw's switch) kubesim serves no SPDY at all (test_spdy_serve.py: on).
    namespace = f"spdy-off-{next(_COUNTER)}"
    await trio.to_thread.run_sync(spdy_off_server.make_namespace, namespace)
    k = Kubectl(kubectl_bin, spdy_off_server, namespace)
    await k("create", "-f", "-", stdin=POD.encode())
    await k("wait", "--for=condition=Ready", "pod/solo", "--timeout=10s")
    spdy_env = {**k.server.env(), "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"}
    for args, env, message in [
        (["exec", "solo", "--", "echo", "hi"], spdy_env,
         "kubesim does not support SPDY: exec works over WebSocket only, kubectl's default since 1.30"),
        (["attach", "solo"], spdy_env, "kubesim does not support SPDY: attach works over WebSocket only"),
        # Port-forward is served now (test_port_forward.py), over WebSocket even with SPDY off:
        # only a forced SPDY port-forward is refused.
        (["port-forward", "pod/solo", "0:80"], {**k.server.env(), "KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"},
         "kubesim does not support SPDY: port-forward works over WebSocket only, kubectl's default since 1.31"),
    ]:
        with trio.fail_after(15):
            result = await trio.run_process([k.binary, "-n", k.namespace, *args], env=env, check=False,
                                            capture_stdout=True, capture_stderr=True)
        stderr = result.stderr.decode()
        assert result.returncode == 1, (args, stderr)
        assert message in stderr, (args, stderr)
        assert "Upgrade request required" not in stderr


async def test_api_resources_and_versions(k: Kubectl) -> None:
    resources = await k.out("api-resources", namespaced=False)
    rows = {row[0]: row for row in table_rows(resources)[1:]}
    assert header(resources) == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert rows["deployments"] == ["deployments", "deploy", "apps/v1", "true", "Deployment"]
    assert rows["pods"] == ["pods", "po", "v1", "true", "Pod"]
    assert rows["namespaces"] == ["namespaces", "ns", "v1", "false", "Namespace"]
    for plural in ("endpointslices", "statefulsets", "daemonsets", "jobs", "cronjobs", "configmaps",
                   "secrets", "events", "ingresses", "persistentvolumeclaims", "serviceaccounts",
                   "horizontalpodautoscalers", "customresourcedefinitions", "services", "replicasets"):
        assert plural in rows, plural
    versions = await k.out("api-versions", namespaced=False)
    assert {"v1", "apps/v1", "batch/v1", "autoscaling/v2"} <= set(versions.split())
    version = json.loads(await k.out("version", "-o", "json", namespaced=False))
    assert version["serverVersion"]["gitVersion"] == "v1.32.0"
    explained = await k.out("explain", "deployment.spec.replicas", namespaced=False)
    assert "FIELD: replicas <integer>" in explained and "Number of desired pods" in explained


CRD = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {{plural: {plural}, singular: {singular}, kind: {kind}, shortNames: [{short}]}}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {{type: integer}}
              color: {{type: string}}
    additionalPrinterColumns:
    - {{name: Size, type: integer, jsonPath: .spec.size}}
    - {{name: Age, type: date, jsonPath: .metadata.creationTimestamp}}
"""


async def test_custom_resources(k: Kubectl) -> None:
    suffix = k.namespace.rsplit("-", 1)[-1]
    kind, plural = f"Widget{suffix}", f"widgets{suffix}"
    crd = CRD.format(plural=plural, singular=f"widget{suffix}", kind=kind, short=f"wd{suffix}")
    created = await k.out("apply", "-f", "-", stdin=crd.encode(), namespaced=False)
    assert created.strip() == f"customresourcedefinition.apiextensions.k8s.io/{plural}.example.com created"
    await k("wait", "--for=condition=Established", f"crd/{plural}.example.com", "--timeout=10s", namespaced=False)
    crds = await k.out("get", "crd", f"{plural}.example.com", namespaced=False)
    assert header(crds) == ["NAME", "CREATED AT"]
    described_crd = await k.out("describe", "crd", f"{plural}.example.com", namespaced=False)
    assert re.search(rf"^Name:\s+{plural}.example.com", described_crd, re.M)
    widget = f"apiVersion: example.com/v1\nkind: {kind}\nmetadata: {{name: w1}}\nspec: {{size: 3, color: red}}\n"
    assert (await k.out("apply", "-f", "-", stdin=widget.encode())).strip() == f"{kind.lower()}.example.com/w1 created"
    changed = widget.replace("size: 3", "size: 4")
    assert (await k.out("apply", "-f", "-", stdin=changed.encode())).strip() == f"{kind.lower()}.example.com/w1 configured"
    listed = await k.out("get", f"wd{suffix}")
    assert header(listed) == ["NAME", "SIZE", "AGE"]
    assert rows_by_name(listed)["w1"][1] == "4"
    assert re.fullmatch(r"\d+s", rows_by_name(listed)["w1"][2])
    described = await k.out("describe", plural, "w1")
    assert re.search(r"^Name:\s+w1", described, re.M) and re.search(r"Size:\s+4", described)
    await k("patch", plural, "w1", "--type=merge", "-p", '{"spec":{"color":"blue"}}')
    assert await k.out("get", plural, "w1", "-o", "jsonpath={.spec.color}") == "blue"
    bad = await k("apply", "-f", "-", stdin=changed.replace("color: red", "colour: red").encode(), check=False)
    assert bad.returncode == 1 and 'unknown field "spec.colour"' in bad.stderr
    await k("delete", "crd", f"{plural}.example.com", namespaced=False)
    gone = await k("get", plural, check=False)
    assert gone.returncode == 1


async def test_generators_send_protobuf(k: Kubectl) -> None:
    created = await k.out("create", "deployment", "gen", "--image=nginx:1.27", "--replicas=2")
    assert created.strip() == "deployment.apps/gen created"
    await k("rollout", "status", "deployment/gen", "--timeout=10s")
    configmap = await k.out("create", "configmap", "settings", "--from-literal=a=1", "--from-literal=b=2")
    assert configmap.strip() == "configmap/settings created"
    assert rows_by_name(await k.out("get", "configmap", "settings"))["settings"][1] == "2"
    secret = await k.out("create", "secret", "generic", "creds", "--from-literal=user=admin")
    assert secret.strip() == "secret/creds created"
    service = await k.out("create", "service", "clusterip", "gen", "--tcp=80:8080")
    assert service.strip() == "service/gen created"
    job = await k.out("create", "job", "oneshot", "--image=busybox:1.36", "--", "echo", "hi")
    assert job.strip() == "job.batch/oneshot created"
    namespace = f"{k.namespace}-made"
    made = await k.out("create", "namespace", namespace, namespaced=False)
    assert made.strip() == f"namespace/{namespace} created"
    assert rows_by_name(await k.out("get", "deployment", "gen"))["gen"][1] == "2/2"


@pytest.mark.routes
async def test_attach_with_stdin(k: Kubectl) -> None:
    await k("create", "-f", "-", stdin=POD.encode())
    await k("wait", "--for=condition=Ready", "pod/solo", "--timeout=10s")
    attached = await k("attach", "-i", "solo", stdin=b"typed into the container\n")
    assert "typed into the container" in attached.stdout
    logs = await k.out("logs", "solo", "--tail=1")
    assert logs == "typed into the container\n"


async def test_requests_are_recorded_with_token_and_impersonation(k: Kubectl) -> None:
    # kubesim's token may impersonate anyone; alice, bound to nothing, may not list pods.
    denied = await k("get", "pods", "--as", "alice", "--as-group", "devs", check=False)
    assert denied.returncode == 1
    assert (f'Error from server (Forbidden): pods is forbidden: User "alice" cannot list resource '
            f'"pods" in API group "" in the namespace "{k.namespace}"') in denied.stderr
    sim = k.server.sim
    assert sim is not None
    requests = await k.server.acall(lambda: list(sim.requests))
    mine = [r for r in requests if r.path == f"/api/v1/namespaces/{k.namespace}/pods"]
    assert mine, requests[-5:]
    last = mine[-1]
    assert last.method == "GET"
    assert last.bearer_token == TOKEN
    assert last.impersonate == {"impersonate-user": "alice", "impersonate-group": "devs"}
    assert last.user_agent.startswith("kubectl/v1.")
    assert last.http_version == "2"  # kubectl speaks HTTP/2 over TLS (ALPN h2)


@pytest.mark.routes
async def test_the_route_is_what_kubesim_sees(k: Kubectl) -> None:
    # Through the tunnel kubesim sees agentd (with its own token from its cluster kubeconfig)
    # impersonating the identity kasd gave the CI job's token; straight, kubectl itself.
    whoami = json.loads(await k.out("auth", "whoami", "-o", "json", namespaced=False))
    user = whoami["status"]["userInfo"]["username"]
    if k.server.route == "tunnel":
        assert user == TUNNEL_USER
    else:
        assert user != TUNNEL_USER


async def test_wrong_token_is_unauthorized(k: Kubectl) -> None:
    result = await k("get", "pods", "--token", "not-the-token", check=False)
    assert result.returncode == 1
    assert "You must be logged in to the server" in result.stderr


async def test_autoscale_and_auth(k: Kubectl) -> None:
    await k("apply", "-f", "-", stdin=(MANIFESTS / "all-kinds.yaml").read_text().split("---")[4].encode())
    autoscaled = await k.out("autoscale", "deployment", "app", "--max=4", "--min=2")
    assert autoscaled.strip() == "horizontalpodautoscaler.autoscaling/app autoscaled"
    hpa = rows_by_name(await k.out("get", "hpa"))["app"]
    assert hpa[1:6] == ["Deployment/app", "cpu: <unknown>/80%", "2", "4", "2"]
    assert (await k.out("auth", "can-i", "create", "pods")).strip() == "yes"
    whoami = await k.out("auth", "whoami", namespaced=False)
    assert re.search(r"^Username\s+kubesim-admin", whoami, re.M)
    token = (await k.out("create", "token", "default", "--duration=10m")).strip()
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["sub"] == f"system:serviceaccount:{k.namespace}:default"
    assert claims["exp"] - claims["iat"] == 600
