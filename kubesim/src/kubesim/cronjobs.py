"""The CronJob controller: Jobs from `batch/v1` CronJobs on their schedule.

Mirrors pkg/controller/cronjob (cronjob_controllerv2.go, syncCronJob and cleanupFinishedJobs, 1.32):

- the Job for a scheduled time is named `<cronjob>-<scheduled time in minutes since the epoch>`,
  carries the template's labels and annotations plus `batch.kubernetes.io/cronjob-scheduled-timestamp`
  (the time, RFC 3339 in the CronJob's time zone) and a controller reference to the CronJob;
- only the most recent missed time is started (earlier ones are skipped), counted from
  `status.lastScheduleTime` (else the CronJob's creation) — and not before now minus
  `startingDeadlineSeconds` when set (a time later than its deadline: `MissSchedule`);
- `status.active` lists the running Jobs it started; a finished one leaves the list
  (`SawCompletedJob`), a vanished one too (`MissingJob`); `status.lastSuccessfulTime` is the
  latest `completionTime` of a completed Job it owns (a `kubectl create job --from=cronjob/x`
  counts, being owned by the CronJob too);
- `suspend` stops new Jobs; `concurrencyPolicy` Allow / Forbid (`JobAlreadyActive`, the time is
  retried while still due) / Replace (the running Jobs are deleted first);
- finished Jobs beyond `successfulJobsHistoryLimit` / `failedJobsHistoryLimit` are deleted, oldest
  first (`SuccessfulDelete`).

Time is the server's clock (`timefmt.now`), which a test moves ahead with `KubeSim.advance_clock`;
the controller asks the loop to wake at the next scheduled time.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

import trio

from kubesim import cron
from kubesim.cluster import Cluster
from kubesim.errors import ApiError
from kubesim.objects import owned_by, owner_ref
from kubesim.timefmt import now, parse, rfc3339

SCHEDULED_ANNOTATION = "batch.kubernetes.io/cronjob-scheduled-timestamp"
COMPONENT = "cronjob-controller"


def job_name(cronjob: str, scheduled: datetime) -> str:
    """getJobName: the scheduled time in minutes since the epoch, so a time makes one Job."""
    return f"{cronjob}-{int(scheduled.timestamp()) // 60}"


def _finished(job: dict[str, Any]) -> str | None:
    """The finishing condition's type (Complete or Failed), or None while it runs."""
    for entry in (job.get("status") or {}).get("conditions") or []:
        if entry.get("type") in ("Complete", "Failed") and entry.get("status") == "True":
            return str(entry["type"])
    return None


def cronjob(ctl: Cluster, cj: dict[str, Any]) -> None:
    meta, spec = cj["metadata"], cj.get("spec") or {}
    namespace, kind, jobs_kind = meta["namespace"], ctl.kinds["cronjobs"], ctl.kinds["jobs"]
    status = copy.deepcopy(cj.get("status") or {})
    moment = now()
    jobs = {j["metadata"]["name"]: j for j in ctl.objects("jobs", namespace)
            if owned_by(j, meta["uid"])}
    by_uid = {j["metadata"]["uid"]: j for j in jobs.values()}

    # The active list: drop what finished or vanished.
    active = []
    for ref in status.get("active") or []:
        job = by_uid.get(ref.get("uid", ""))
        if job is None:
            ctl.event(kind, cj, "MissingJob", f"Active job went missing: {ref.get('name')}",
                      component=COMPONENT)
            continue
        finished = _finished(job)
        if finished:
            ctl.event(kind, cj, "SawCompletedJob",
                      f"Saw completed job: {job['metadata']['name']}, condition: {finished}",
                      component=COMPONENT)
            continue
        active.append(ref)
    status["active"] = active
    last_success = parse(status.get("lastSuccessfulTime"))
    for job in jobs.values():
        done = parse((job.get("status") or {}).get("completionTime"))
        if _finished(job) == "Complete" and done and (last_success is None or done > last_success):
            last_success = done
    if last_success is not None:
        status["lastSuccessfulTime"] = rfc3339(last_success)

    if not meta.get("deletionTimestamp") and not spec.get("suspend"):
        _schedule(ctl, cj, status, moment, jobs)
    if not status.get("active"):
        status.pop("active", None)
    ctl.set_status("cronjobs", cj, status)
    _clean_history(ctl, cj, [j for j in jobs.values()
                             if ctl.store.exists(jobs_kind, namespace, j["metadata"]["name"])])


def _schedule(ctl: Cluster, cj: dict[str, Any], status: dict[str, Any], moment: datetime,
              jobs: dict[str, dict[str, Any]]) -> None:
    meta, spec = cj["metadata"], cj.get("spec") or {}
    kind = ctl.kinds["cronjobs"]
    try:
        schedule = cron.parse(str(spec.get("schedule", "")))
        zone = cron.zone(spec.get("timeZone"))
    except ValueError:
        return  # refused when stored; an older object that does not parse never fires
    earliest = parse(status.get("lastScheduleTime")) or parse(meta.get("creationTimestamp")) or moment
    deadline = spec.get("startingDeadlineSeconds")
    if isinstance(deadline, int):
        earliest = max(earliest, moment - timedelta(seconds=deadline))
    _wake_at_next(ctl, schedule, moment, zone)
    scheduled = schedule.most_recent(earliest, moment, zone)
    if scheduled is None:
        return
    if isinstance(deadline, int) and scheduled + timedelta(seconds=deadline) < moment:
        _once(ctl, cj, scheduled, "MissSchedule", "Missed scheduled time to start a job: "
              + scheduled.strftime("%a, %d %b %Y %H:%M:%S +0000"), type_="Warning")
        return
    name = job_name(meta["name"], scheduled)
    if name in jobs:  # made already (the status update did not land): just remember it
        status["lastScheduleTime"] = rfc3339(scheduled)
        return
    policy = spec.get("concurrencyPolicy", "Allow")
    if policy == "Forbid" and status.get("active"):
        _once(ctl, cj, scheduled, "JobAlreadyActive", "Not starting job because prior execution "
              "is running and concurrency policy is Forbid")
        return
    if policy == "Replace":
        for ref in status.get("active") or []:
            _delete_job(ctl, cj, ref["name"])
        status["active"] = []
    job = _new_job(ctl, cj, name, scheduled, zone)
    ctl.event(kind, cj, "SuccessfulCreate", f"Created job {name}", component=COMPONENT)
    status.setdefault("active", []).append({
        "kind": "Job", "namespace": meta["namespace"], "name": name,
        "uid": job["metadata"]["uid"], "apiVersion": "batch/v1",
        "resourceVersion": job["metadata"]["resourceVersion"]})
    status["lastScheduleTime"] = rfc3339(scheduled)


#: events reported once per CronJob and scheduled time (the loop passes on every change, where
#: the real controller syncs once per due time); bounded by clearing it when full
_REPORTED: dict[str, str] = {}
_REPORTED_MAX = 10_000


def _once(ctl: Cluster, cj: dict[str, Any], scheduled: datetime, reason: str, message: str,
          *, type_: str = "Normal") -> None:
    key, note = cj["metadata"]["uid"], f"{reason}@{scheduled.isoformat()}"
    if _REPORTED.get(key) == note:
        return
    if len(_REPORTED) >= _REPORTED_MAX:
        _REPORTED.clear()
    _REPORTED[key] = note
    ctl.event(ctl.kinds["cronjobs"], cj, reason, message, component=COMPONENT, type_=type_)


def _new_job(ctl: Cluster, cj: dict[str, Any], name: str, scheduled: datetime,
             zone: tzinfo) -> dict[str, Any]:
    """getJobFromTemplate2."""
    template = (cj.get("spec") or {}).get("jobTemplate") or {}
    template_meta = template.get("metadata") or {}
    annotations = dict(template_meta.get("annotations") or {})
    annotations[SCHEDULED_ANNOTATION] = scheduled.astimezone(zone).isoformat().replace("+00:00", "Z")
    job = {"metadata": {"name": name, "labels": dict(template_meta.get("labels") or {}),
                        "annotations": annotations,
                        "ownerReferences": [owner_ref(ctl.kinds["cronjobs"], cj)]},
           "spec": copy.deepcopy(template.get("spec") or {})}
    if not job["metadata"]["labels"]:
        del job["metadata"]["labels"]
    return ctl.store.create(ctl.kinds["jobs"], cj["metadata"]["namespace"], job)


def _delete_job(ctl: Cluster, cj: dict[str, Any], name: str) -> None:
    try:
        ctl.store.delete(ctl.kinds["jobs"], cj["metadata"]["namespace"], name,
                         propagation="Background")
    except ApiError:
        return
    ctl.event(ctl.kinds["cronjobs"], cj, "SuccessfulDelete", f"Deleted job {name}",
              component=COMPONENT)


def _clean_history(ctl: Cluster, cj: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
    spec = cj.get("spec") or {}
    for outcome, field in (("Complete", "successfulJobsHistoryLimit"),
                           ("Failed", "failedJobsHistoryLimit")):
        limit = spec.get(field)
        if not isinstance(limit, int):
            continue
        finished = [j for j in jobs if _finished(j) == outcome]
        if len(finished) <= limit:
            continue

        def started(job: dict[str, Any]) -> datetime:
            stamp = (job.get("status") or {}).get("startTime") or job["metadata"].get("creationTimestamp")
            return parse(stamp) or datetime.min.replace(tzinfo=UTC)

        finished.sort(key=lambda j: (started(j), j["metadata"]["name"]))
        for job in finished[:len(finished) - limit]:
            _delete_job(ctl, cj, job["metadata"]["name"])


def _wake_at_next(ctl: Cluster, schedule: cron.Schedule, moment: datetime, zone: tzinfo) -> None:
    upcoming = schedule.next_after(moment, zone)
    if upcoming is None:
        return
    try:
        ctl.wake_by(trio.current_time() + (upcoming - moment).total_seconds() + 0.01)
    except RuntimeError:  # reconciled outside a Trio run: nothing to wake
        pass
