"""ConfigMap, Secret and service-account token volumes are files in the container, as the
kubelet mounts them: what `kubectl exec … cat`/`ls` see (the container's shell over its
filesystem), and a pod whose ConfigMap is missing waits in ContainerCreating with the kubelet's
`FailedMount` event. In-process: the store and the controllers, no server."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kubesim.controllers import Controllers
from kubesim.shell import CapturedIO, run_command
from kubesim.store import Store

pytestmark = pytest.mark.timeout(10)

NS = "default"


def _pod(name: str, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]],
         **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "busybox:1.36", "volumeMounts": mounts}],
        "volumes": volumes, **spec}}


@pytest.fixture
def ctl() -> Controllers:
    store = Store()
    ctl = Controllers(store)
    ctl.reconcile()
    store.create(store.kind("", "configmaps"), NS, {"metadata": {"name": "hello"}, "data": {
        "greeting": "hello from the cluster", "other": "x"}})
    store.create(store.kind("", "secrets"), NS, {"metadata": {"name": "creds"}, "data": {
        "password": base64.b64encode(b"s3cret\n").decode()}})
    return ctl


def _run(ctl: Controllers, pod: dict[str, Any]) -> None:
    ctl.store.create(ctl.kinds["pods"], NS, pod)
    ctl.reconcile()


async def _sh(ctl: Controllers, pod: str, script: str) -> tuple[int, str, str]:
    fs = ctl.filesystem(NS, pod, "c")
    assert fs is not None, "the container is not running"
    io = CapturedIO()
    status = await run_command(["sh", "-c", script], io, {"PATH": "/bin"}, fs=fs)
    return status, io.stdout.decode(), io.stderr.decode()


async def test_configmap_keys_items_modes_and_a_secret_are_files(ctl: Controllers) -> None:
    _run(ctl, _pod("p", [
        {"name": "config", "configMap": {"name": "hello"}},
        {"name": "picked", "configMap": {"name": "hello", "defaultMode": 0o600,
                                         "items": [{"key": "greeting", "path": "sub/g.txt"},
                                                   {"key": "greeting", "path": "../../etc/passwd"},
                                                   {"key": "other", "path": "o", "mode": 0o400}]}},
        {"name": "creds", "secret": {"secretName": "creds"}},
    ], [{"name": "config", "mountPath": "/etc/hello", "readOnly": True},
        {"name": "picked", "mountPath": "/etc/picked"},
        {"name": "config", "mountPath": "/app/greeting.txt", "subPath": "greeting"},
        {"name": "creds", "mountPath": "/etc/creds"}]))
    assert await _sh(ctl, "p", "cat /etc/hello/greeting; echo; ls /etc/hello") == (
        0, "hello from the cluster\ngreeting\nother\n", "")
    assert await _sh(ctl, "p", "cat /etc/picked/sub/g.txt; echo; ls /etc/picked") == (
        0, "hello from the cluster\no\nsub\n", "")
    assert await _sh(ctl, "p", "cat /app/greeting.txt") == (0, "hello from the cluster", "")
    assert await _sh(ctl, "p", "cat /etc/creds/password") == (0, "s3cret\n", "")
    fs = ctl.filesystem(NS, "p", "c")
    assert fs is not None
    assert fs.stat("/etc/hello/greeting").mode & 0o777 == 0o644
    assert fs.stat("/etc/picked/sub/g.txt").mode & 0o777 == 0o600
    assert fs.stat("/etc/picked/o").mode & 0o777 == 0o400
    assert b"root:x:0:0" in fs.read_file("/etc/passwd")  # an item path cannot leave its mount
    status, _, err = await _sh(ctl, "p", "echo changed > /etc/hello/greeting")
    assert status == 1 and "Read-only file system" in err


async def test_the_service_account_token_is_mounted_unless_turned_off(ctl: Controllers) -> None:
    _run(ctl, _pod("p", [], []))
    directory = "/var/run/secrets/kubernetes.io/serviceaccount"
    status, out, _ = await _sh(ctl, "p", f"ls {directory}; cat {directory}/namespace")
    assert (status, out) == (0, "ca.crt\nnamespace\ntoken\ndefault")
    _, token, _ = await _sh(ctl, "p", f"cat {directory}/token")
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["sub"] == "system:serviceaccount:default:default"
    _, ca, _ = await _sh(ctl, "p", f"cat {directory}/ca.crt")
    assert ca.startswith("-----BEGIN CERTIFICATE-----")
    _run(ctl, _pod("q", [], [], automountServiceAccountToken=False))
    assert (await _sh(ctl, "q", f"ls {directory}"))[0] == 1


async def test_a_missing_configmap_keeps_the_pod_creating_with_the_kubelets_event(ctl: Controllers) -> None:
    _run(ctl, _pod("p", [{"name": "x", "configMap": {"name": "absent"}}], []))
    pod = ctl.store.get(ctl.kinds["pods"], NS, "p")
    assert pod["status"]["phase"] == "Pending"
    assert pod["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    events = [e for e in ctl.store.iter_objects("", "events", NS) if e["reason"] == "FailedMount"]
    assert [(e["type"], e["message"], e["involvedObject"]["name"]) for e in events] == [
        ("Warning", 'MountVolume.SetUp failed for volume "x" : configmap "absent" not found', "p")]
    ctl.reconcile()  # retried: the same failure is not recorded again and again
    assert len([e for e in ctl.store.iter_objects("", "events", NS) if e["reason"] == "FailedMount"]) == 1
    # Once it exists, the pod starts with it.
    ctl.store.create(ctl.kinds["configmaps"], NS, {"metadata": {"name": "absent"}, "data": {"k": "v"}})
    ctl.reconcile()
    assert ctl.store.get(ctl.kinds["pods"], NS, "p")["status"]["phase"] == "Running"
    # `optional: true` starts without it; a missing key of `items` fails the same way.
    _run(ctl, _pod("o", [{"name": "x", "configMap": {"name": "nope", "optional": True}}],
                   [{"name": "x", "mountPath": "/etc/x"}]))
    assert await _sh(ctl, "o", "ls /etc/x") == (0, "", "")
    _run(ctl, _pod("k", [{"name": "y", "configMap": {"name": "hello", "items": [{"key": "nokey", "path": "n"}]}}], []))
    messages = {e["message"] for e in ctl.store.iter_objects("", "events", NS) if e["reason"] == "FailedMount"}
    assert 'MountVolume.SetUp failed for volume "y" : configmap references non-existent config key: nokey' in messages


async def test_an_ephemeral_storage_limit_sizes_the_container_layer(ctl: Controllers) -> None:
    """`kubectl cp` of a file larger than kubesim's default 64 MiB layer fits in a pod that asks for
    the room (bench/portforward.py's 1 GiB copy); no limit, or one that is no quantity, keeps it."""
    big = {"containers": [{"name": "c", "image": "busybox:1.36",
                           "resources": {"limits": {"ephemeral-storage": "1.5Gi"}}}]}
    ctl.store.create(ctl.kinds["pods"], NS, {"metadata": {"name": "big"}, "spec": big})
    odd = {"containers": [{"name": "c", "image": "busybox:1.36", "resources": {"limits": {"ephemeral-storage": "lots"}}}]}
    ctl.store.create(ctl.kinds["pods"], NS, {"metadata": {"name": "odd"}, "spec": odd})
    _run(ctl, _pod("plain", [], []))
    ctl.reconcile()
    chunk = b"x" * (1 << 20)
    for name, room in (("big", True), ("plain", False), ("odd", False)):
        fs = ctl.filesystem(NS, name, "c")
        assert fs is not None
        status, _, err = await _sh(ctl, name, "touch /tmp/f")
        assert status == 0, err
        try:
            for _ in range(80):  # 80 MiB
                fs.write_file("/tmp/f", chunk, append=True)
        except OSError as exc:
            assert not room and "No space left on device" in str(exc.strerror), (name, exc)
        else:
            assert room, name
            assert fs.statistics().capacity == 3 * (1 << 29)
