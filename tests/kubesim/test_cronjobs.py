"""CronJobs fire: real kubectl (every version found) against a kubesim whose clock the tests move
ahead (`KubeSim.advance_clock`) instead of waiting for the next minute."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest

from tests.kubesim.kubectl_harness import NamespacedKubectl, ServerThread, table_rows

pytestmark = pytest.mark.timeout(60)

_COUNTER = iter(range(10_000))


class K(NamespacedKubectl):

    async def advance(self, seconds: float) -> None:
        """Let `seconds` pass on the server's clock."""
        sim = self.server.sim
        assert sim is not None
        await self.server.acall(sim.advance_clock, seconds)

    async def cronjob(self, name: str, schedule: str, command: list[str], **spec: Any) -> dict[str, Any]:
        manifest = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name},
                    "spec": {"schedule": schedule, **spec, "jobTemplate": {"spec": {"template": {"spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "busybox", "command": command}]}}}}}}
        await self("create", "-f", "-", stdin=json.dumps(manifest).encode())
        return await self.json(f"cronjob/{name}")


@pytest.fixture
def k(kube_server: ServerThread, kubectl_bin: str) -> K:
    namespace = f"cron-{next(_COUNTER)}"
    kube_server.make_namespace(namespace)
    return K(kubectl_bin, kube_server, namespace)


def _stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _jobs(listing: dict[str, Any]) -> list[str]:
    return sorted(item["metadata"]["name"] for item in listing["items"])


def _complete(job: dict[str, Any]) -> bool:
    return any(c["type"] == "Complete" and c["status"] == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


async def test_create_job_from_cronjob_runs_its_command(k: K) -> None:
    # what users type to try a CronJob now
    made = await k.out("create", "cronjob", "hello", "--image=busybox", "--schedule=0 0 1 1 *",
                       "--", "sh", "-c", "echo hello from cron")
    assert made.strip() == "cronjob.batch/hello created"
    await k("create", "job", "manual", "--from=cronjob/hello")
    await k("wait", "--for=condition=Complete", "job/manual", "--timeout=15s")
    assert await k.out("logs", "job/manual") == "hello from cron\n"
    job = await k.json("job/manual")
    assert job["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"] == "manual"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
    # a completed Job the CronJob owns is its last success
    cj = await k.wait_until("cronjob/hello", lambda c: (c.get("status") or {}).get("lastSuccessfulTime"))
    assert cj["status"]["lastSuccessfulTime"] == job["status"]["completionTime"]
    assert "lastScheduleTime" not in cj["status"]  # not a scheduled run


async def test_every_minute_cronjob_fires_at_the_next_minute(k: K) -> None:
    cj = await k.cronjob("tick", "* * * * *", ["sh", "-c", "echo tick"])
    created = _stamp(cj["metadata"]["creationTimestamp"])
    await k.advance(61)
    cj = await k.wait_until("cronjob/tick", lambda c: (c.get("status") or {}).get("lastScheduleTime"))
    scheduled = _stamp(cj["status"]["lastScheduleTime"])
    assert scheduled > created and scheduled.second == 0
    name = f"tick-{int(scheduled.timestamp()) // 60}"  # as the real controller names it
    job = await k.wait_until(f"job/{name}", _complete)
    assert job["metadata"]["ownerReferences"][0]["name"] == "tick"
    assert job["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"] == \
        cj["status"]["lastScheduleTime"]
    assert await k.out("logs", f"job/{name}") == "tick\n"
    cj = await k.wait_until("cronjob/tick", lambda c: "active" not in c["status"]
                            and c["status"].get("lastSuccessfulTime"))
    row = {r[0]: r for r in table_rows(await k.out("get", "cronjob", "tick"))[1:]}["tick"]
    assert row[1:5] == ["* * * * *", "<none>", "False", "0"]
    events = await k.out("get", "events", "--field-selector", "involvedObject.kind=CronJob")
    assert f"Created job {name}" in events and f"Saw completed job: {name}, condition: Complete" in events


async def test_the_controller_wakes_at_the_scheduled_time_by_itself(k: K) -> None:
    # Two seconds before the next minute: the controller's own wake-up fires it (without it the
    # Job would come only with a change, or a minute later).
    await k.cronjob("onbeat", "* * * * *", ["echo", "beat"])
    sim = k.server.sim
    assert sim is not None
    moment = await k.server.acall(sim.clock.now)
    to_boundary = 60 - moment.second - moment.microsecond / 1e6
    await k.advance(max(0.0, to_boundary - 2))
    cj = await k.wait_until("cronjob/onbeat", lambda c: (c.get("status") or {}).get("lastScheduleTime"))
    boundary = moment.replace(second=0, microsecond=0) + timedelta(minutes=1)
    assert _stamp(cj["status"]["lastScheduleTime"]) == boundary


async def test_suspend_forbid_replace_and_history(k: K) -> None:
    await k.cronjob("paused", "* * * * *", ["echo", "no"], suspend=True)
    await k.cronjob("lonely", "* * * * *", ["sleep", "3600"], concurrencyPolicy="Forbid")
    await k.cronjob("fresh", "* * * * *", ["sleep", "3600"], concurrencyPolicy="Replace")
    await k.cronjob("brief", "* * * * *", ["echo", "done"], successfulJobsHistoryLimit=1)

    def owned(listing: dict[str, Any], owner: str) -> list[dict[str, Any]]:
        return [j for j in listing["items"]
                if j["metadata"]["ownerReferences"][0]["name"] == owner]

    await k.advance(61)
    first = await k.wait_until("jobs", lambda js: all(owned(js, o) for o in ("lonely", "fresh", "brief"))
                               and all(_complete(j) for j in owned(js, "brief")))
    assert not owned(first, "paused")
    await k.advance(60)
    second = await k.wait_until("jobs", lambda js: len(owned(js, "brief")) == 1
                                and owned(js, "brief") != owned(first, "brief")
                                and all(_complete(j) for j in owned(js, "brief"))
                                and owned(js, "fresh")[0]["metadata"]["name"]
                                != owned(first, "fresh")[0]["metadata"]["name"])
    assert not owned(second, "paused")
    # Forbid: the first run still runs, so no second one
    assert _jobs({"items": owned(second, "lonely")}) == _jobs({"items": owned(first, "lonely")})
    # Replace: the first run was deleted for the second
    assert len(owned(second, "fresh")) == 1
    lonely = await k.json("cronjob/lonely")
    assert [ref["name"] for ref in lonely["status"]["active"]] == _jobs({"items": owned(first, "lonely")})
    events = await k.out("get", "events", "--field-selector", "involvedObject.name=lonely")
    assert "Not starting job because prior execution is running and concurrency policy is Forbid" in events


async def test_bad_schedule_and_time_zone_are_invalid(k: K) -> None:
    bad = await k("create", "cronjob", "bad", "--image=busybox", "--schedule=61 * * * *", check=False)
    assert bad.returncode == 1
    # kubectl's create generators print the server's message after their own prefix
    assert bad.stderr == ('error: failed to create cronjob: CronJob.batch "bad" is invalid: '
                          'spec.schedule: Invalid value: "61 * * * *": end of range (61) above '
                          "maximum (59): 61\n")
    manifest = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "tz"},
                "spec": {"schedule": "0 9 * * *", "timeZone": "Mars/Olympus", "jobTemplate": {
                    "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                        {"name": "c", "image": "busybox"}]}}}}}}
    result = await k("create", "-f", "-", stdin=json.dumps(manifest).encode(), check=False)
    assert result.returncode == 1
    assert 'spec.timeZone: Invalid value: "Mars/Olympus": unknown time zone Mars/Olympus' in result.stderr
    manifest["spec"]["timeZone"] = "Europe/Berlin"
    await k("create", "-f", "-", stdin=json.dumps(manifest).encode())
    row = {r[0]: r for r in table_rows(await k.out("get", "cronjob", "tz"))[1:]}["tz"]
    assert row[1:3] == ["0 9 * * *", "Europe/Berlin"]
