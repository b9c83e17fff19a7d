"""Containers run their command: real kubectl (every version found) against a kubesim whose
kubelet back-off is scaled down (0.2 s doubling to 1 s instead of 10 s to 5 min), so a crash
loop restarts within a test's time. Every test runs both straight at kubesim and through kasd and
agentd (the `routes` marker)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import trio

from tests.kubesim.kubectl_harness import NamespacedKubectl, ServerThread, table_rows

pytestmark = [pytest.mark.timeout(60), pytest.mark.routes]

_COUNTER = iter(range(10_000))


KUBESIM_OPTIONS = {"restart_backoff": (0.2, 1.0)}


K = NamespacedKubectl


@pytest.fixture
def k(kube_server: ServerThread, kubectl_bin: str) -> K:
    namespace = f"cmd-{next(_COUNTER)}"
    kube_server.make_namespace(namespace)
    return K(kubectl_bin, kube_server, namespace)


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase"))


async def test_run_echo_completes_with_its_output_as_log(k: K) -> None:
    await k("run", "hi", "--image=busybox", "--restart=Never", "--", "echo", "hi")
    pod = await k.wait_until("pod/hi", lambda p: _phase(p) in ("Succeeded", "Failed"))
    assert pod["spec"]["containers"][0]["args"] == ["echo", "hi"]
    assert _phase(pod) == "Succeeded"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    assert terminated["startedAt"] <= terminated["finishedAt"]
    assert await k.out("logs", "hi") == "hi\n"
    row = {r[0]: r for r in table_rows(await k.out("get", "pod", "hi"))[1:]}["hi"]
    assert row[1:3] == ["0/1", "Completed"]


async def test_run_failing_command_fails_the_pod_with_its_exit_code(k: K) -> None:
    await k("run", "bad", "--image=busybox", "--restart=Never", "--",
            "sh", "-c", "echo to stdout; echo to stderr >&2; exit 3")
    pod = await k.wait_until("pod/bad", lambda p: _phase(p) in ("Succeeded", "Failed"))
    assert _phase(pod) == "Failed"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"
    assert await k.out("logs", "bad") == "to stdout\nto stderr\n"
    row = {r[0]: r for r in table_rows(await k.out("get", "pod", "bad"))[1:]}["bad"]
    assert row[2] == "Error"


async def test_sleep_keeps_the_container_running_until_it_ends(k: K) -> None:
    await k("run", "nap", "--image=busybox", "--restart=Never", "--command", "--",
            "sh", "-c", "echo start; sleep 3; echo end")  # time for the checks below on a loaded machine
    await k("wait", "--for=condition=Ready", "pod/nap", "--timeout=10s")
    running = await k.json("pod/nap")
    assert _phase(running) == "Running" and "running" in running["status"]["containerStatuses"][0]["state"]
    await k("wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/nap", "--timeout=10s")
    assert await k.out("logs", "nap") == "start\nend\n"


async def test_failing_always_pod_crash_loops_with_back_off(k: K) -> None:
    await k("run", "loop", "--image=busybox", "--", "sh", "-c", "echo try; exit 2")
    pod = await k.wait_until("pod/loop", lambda p: any(
        s.get("restartCount", 0) >= 2 and ((s.get("state") or {}).get("waiting") or {}).get("reason")
        == "CrashLoopBackOff" for s in (p.get("status") or {}).get("containerStatuses") or []))
    status = pod["status"]["containerStatuses"][0]
    assert _phase(pod) == "Running"
    assert status["lastState"]["terminated"]["exitCode"] == 2
    assert status["lastState"]["terminated"]["reason"] == "Error"
    assert re.fullmatch(r"back-off \S+ restarting failed container=loop pod=loop_\S+",
                        status["state"]["waiting"]["message"])
    # kubectl's table of a pod in back-off (each back-off lasts about a second here: polled, bounded,
    # as a second kubectl call can come after the container started again)
    with trio.fail_after(20):
        while True:
            row = {r[0]: r for r in table_rows(await k.out("get", "pod", "loop"))[1:]}["loop"]
            if row[2] == "CrashLoopBackOff":
                break
            await trio.sleep(0.05)
    assert row[1:3] == ["0/1", "CrashLoopBackOff"]
    assert re.fullmatch(r"[2-9]\d* \(\d+s ago\)", row[3])
    assert await k.out("logs", "loop", "--previous") == "try\n"
    events = await k.out("get", "events", "--field-selector", "involvedObject.name=loop")
    assert "BackOff" in events


async def test_on_failure_does_not_restart_a_success(k: K) -> None:
    await k("run", "once", "--image=busybox", "--restart=OnFailure", "--", "true")
    pod = await k.wait_until("pod/once", lambda p: _phase(p) in ("Succeeded", "Failed"))
    assert _phase(pod) == "Succeeded"
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0


async def test_job_completes_by_its_pod(k: K) -> None:
    await k("create", "job", "calc", "--image=busybox", "--", "sh", "-c", "echo 42")
    await k("wait", "--for=condition=Complete", "job/calc", "--timeout=15s")
    job = await k.json("job/calc")
    assert job["status"]["succeeded"] == 1
    assert await k.out("logs", "job/calc") == "42\n"


async def test_job_fails_after_its_backoff_limit(k: K) -> None:
    manifest = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "doomed"},
                "spec": {"backoffLimit": 1, "template": {"spec": {"restartPolicy": "Never", "containers": [
                    {"name": "c", "image": "busybox", "command": ["sh", "-c", "exit 1"]}]}}}}
    await k("create", "-f", "-", stdin=json.dumps(manifest).encode())
    await k("wait", "--for=condition=Failed", "job/doomed", "--timeout=15s")
    job = await k.json("job/doomed")
    assert job["status"]["failed"] == 2
    reasons = {c["type"]: c["reason"] for c in job["status"]["conditions"]}
    assert reasons["Failed"] == "BackoffLimitExceeded"
    assert "succeeded" not in job["status"]


async def test_on_failure_job_fails_by_restart_count(k: K) -> None:
    manifest = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "flaky"},
                "spec": {"backoffLimit": 2, "template": {"spec": {"restartPolicy": "OnFailure", "containers": [
                    {"name": "c", "image": "busybox", "command": ["false"]}]}}}}
    await k("create", "-f", "-", stdin=json.dumps(manifest).encode())
    await k("wait", "--for=condition=Failed", "job/flaky", "--timeout=15s")
    job = await k.json("job/flaky")
    assert {c["type"]: c["reason"] for c in job["status"]["conditions"]}["Failed"] == "BackoffLimitExceeded"
    assert (await k.out("get", "pods", "-l", "job-name=flaky", "-o", "name")).strip() == ""




async def test_run_rm_i_cat_echoes_stdin_and_ends_when_it_closes(k: K) -> None:
    result = await k("run", "--rm", "-i", "--restart=Never", "--image=busybox", "echoer", "--", "cat",
                     stdin=b"first line\nsecond line\n")
    assert "first line\nsecond line\n" in result.stdout
    assert 'pod "echoer" deleted' in result.stdout + result.stderr
    gone = await k("get", "pod", "echoer", check=False)
    assert gone.returncode == 1 and "NotFound" in gone.stderr
