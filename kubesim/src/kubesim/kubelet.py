"""The kubelet's part: pods are scheduled to the one node, start, run, crash-loop or complete,
with the container statuses, conditions and events `kubectl get` and `describe` show, and a
console (log + stdin) per running container.

Knobs, annotations on a pod (usually through its template):

- `kubesim.io/crash-loop: "true"`: the container keeps exiting with code 1 (`CrashLoopBackOff`).
- `kubesim.io/stall-rollout: "true"`: the pod runs but never becomes Ready.
- `kubesim.io/fail: "true"`: a Job's pod exits with code 1.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import trio

from kubesim.cluster import NODE_IP, NODE_NAME, Cluster
from kubesim.console import ContainerConsole
from kubesim.fs import FileSystem, container_tree
from kubesim.objects import annotation_true
from kubesim.processes import MainProcess, ProcessStdin, container_env, main_argv
from kubesim.shell import command_names
from kubesim.timefmt import now, parse, rfc3339

CRASH_LOOP = "kubesim.io/crash-loop"
STALL_ROLLOUT = "kubesim.io/stall-rollout"
FAIL = "kubesim.io/fail"
CRASH_RESTART_SECONDS = 5.0


def pod(ctl: Cluster, pod: dict[str, Any]) -> None:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    if meta.get("deletionTimestamp"):
        return
    status = pod.get("status") or {}
    kind = ctl.kinds["pods"]
    stamp = rfc3339(now())
    containers = spec.get("containers") or []
    if not spec.get("nodeName"):
        pod = copy.deepcopy(pod)
        pod["spec"]["nodeName"] = NODE_NAME
        ctl.update("pods", pod)
        pod = ctl.store.get(kind, meta["namespace"], meta["name"])
        ctl.event(kind, pod, "Scheduled",
                   f"Successfully assigned {meta['namespace']}/{meta['name']} to {NODE_NAME}",
                   component="default-scheduler")
        ctl.set_status("pods", pod, {
            "phase": "Pending", "qosClass": status.get("qosClass", "BestEffort"),
            "conditions": [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                            "lastTransitionTime": stamp}],
            "hostIP": NODE_IP, "hostIPs": [{"ip": NODE_IP}], "startTime": stamp,
            "containerStatuses": [
                {"name": c.get("name"), "image": c.get("image"), "imageID": "", "ready": False,
                 "restartCount": 0, "started": False,
                 "state": {"waiting": {"reason": "ContainerCreating"}}}
                for c in containers],
        })
        return
    phase = status.get("phase")
    if phase == "Pending":
        start(ctl, pod)
        return
    if phase == "Running":
        running(ctl, pod)

def start(ctl: Cluster, pod: dict[str, Any]) -> None:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    kind = ctl.kinds["pods"]
    ns, name = meta["namespace"], meta["name"]
    stamp = rfc3339(now())
    ip = (pod.get("status") or {}).get("podIP") or ctl.store.allocator.pod_ip()
    crash = annotation_true(pod, CRASH_LOOP)
    stall = annotation_true(pod, STALL_ROLLOUT)
    job_pod = "Job" in {ref.get("kind") for ref in meta.get("ownerReferences") or []}
    fail = annotation_true(pod, FAIL)
    statuses = []
    for container in spec.get("containers") or []:
        cname = container.get("name", "")
        image = container.get("image", "")
        field_path = f"spec.containers{{{cname}}}"
        ctl.event(kind, pod, "Pulled", f'Container image "{image}" already present on machine',
                   component="kubelet", field_path=field_path)
        ctl.event(kind, pod, "Created", f"Created container: {cname}", component="kubelet",
                   field_path=field_path)
        ctl.event(kind, pod, "Started", f"Started container {cname}", component="kubelet",
                   field_path=field_path)
        key = (ns, name, cname)
        argv = None if crash or ctl.nursery is None else main_argv(container, job_pod=job_pod, fail=fail)
        if argv is not None:
            if key not in ctl.processes:
                _spawn(ctl, pod, container, argv, pod_ip=ip)
        elif key not in ctl.consoles:
            ctl.filesystems[key] = _new_filesystem(pod, container, ip)
            console = ContainerConsole()
            console.log(f"kubesim: container {cname} started (image {image})")
            for line in _startup_lines(container):
                console.log(line)
            ctl.consoles[key] = console
        entry: dict[str, Any] = {
            "name": cname, "image": image,
            "imageID": f"docker.io/library/{image.split(':')[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
            "containerID": "containerd://" + hashlib.sha256(f"{meta['uid']}/{cname}".encode()).hexdigest(),
            "restartCount": 0, "started": True, "ready": not (crash or stall),
            "state": {"running": {"startedAt": stamp}},
        }
        if crash:
            entry.update(_crashed(stamp, 1))
        statuses.append(entry)
    all_ready = bool(statuses) and all(s["ready"] for s in statuses)
    ready_text = "True" if all_ready else "False"
    conditions = [
        {"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp},
        {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp},
        {"type": "Ready", "status": ready_text, "lastProbeTime": None, "lastTransitionTime": stamp},
        {"type": "ContainersReady", "status": ready_text, "lastProbeTime": None, "lastTransitionTime": stamp},
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp},
    ]
    if not all_ready:
        not_ready = ",".join(s["name"] for s in statuses if not s["ready"])
        for condition in conditions[2:4]:
            condition["reason"] = "ContainersNotReady"
            condition["message"] = f"containers with unready status: [{not_ready}]"
    status = {**(pod.get("status") or {}), "phase": "Running", "conditions": conditions,
              "podIP": ip, "podIPs": [{"ip": ip}], "containerStatuses": statuses}
    ctl.set_status("pods", pod, status)

def running(ctl: Cluster, pod: dict[str, Any]) -> None:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    owner_kinds = {ref.get("kind") for ref in meta.get("ownerReferences") or []}
    crash = annotation_true(pod, CRASH_LOOP)
    processes = {c.get("name", ""): ctl.processes.get((meta["namespace"], meta["name"], c.get("name", "")))
                 for c in spec.get("containers") or []}
    if not crash and any(p is not None for p in processes.values()):
        _sync_processes(ctl, pod, processes)
        return
    # Without processes (no nursery: reconcile outside `Controllers.run`), a Job's pod completes at once.
    completes = "Job" in owner_kinds and spec.get("restartPolicy") in ("Never", "OnFailure")
    if not (crash or completes):
        return  # steady state: nothing to do (and nothing to copy)
    status = copy.deepcopy(pod.get("status") or {})
    stamp = rfc3339(now())
    if crash:
        ctl.timed_work = True
        changed = False
        for entry in status.get("containerStatuses") or []:
            finished = parse(((entry.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
            backoff = CRASH_RESTART_SECONDS * min(2 ** entry.get("restartCount", 0), 8)
            if finished is None or (now() - finished).total_seconds() >= backoff:
                entry.update(_crashed(stamp, entry.get("restartCount", 0) + 1))
                ctl.event(ctl.kinds["pods"], pod, "BackOff", "Back-off restarting failed container "
                           f"{entry['name']} in pod {meta['name']}_{meta['namespace']}({meta['uid']})",
                           component="kubelet", type_="Warning",
                           field_path=f"spec.containers{{{entry['name']}}}")
                changed = True
        if changed:
            ctl.set_status("pods", pod, status)
        return
    if completes:
        failing = annotation_true(pod, FAIL)
        code = 1 if failing else 0
        for entry in status.get("containerStatuses") or []:
            started = ((entry.get("state") or {}).get("running") or {}).get("startedAt", stamp)
            entry["state"] = {"terminated": {"exitCode": code, "reason": "Error" if failing else "Completed",
                                             "startedAt": started, "finishedAt": stamp,
                                             "containerID": entry.get("containerID", "")}}
            entry["ready"] = False
            entry["started"] = False
        status["phase"] = "Failed" if failing else "Succeeded"
        for condition in status.get("conditions") or []:
            if condition["type"] in ("Ready", "ContainersReady"):
                condition.update({"status": "False", "reason": "PodCompleted", "lastTransitionTime": stamp})
                condition.pop("message", None)
        ctl.set_status("pods", pod, status)
        for (ns, name, _), console in list(ctl.consoles.items()):
            if ns == meta["namespace"] and name == meta["name"]:
                console.log("kubesim: main process exited" + (" with code 1" if failing else ""))

def close_stale_consoles(ctl: Cluster) -> None:
    pods = ctl.kinds["pods"]
    for key in list(ctl.consoles):
        ns, name, _ = key
        if not ctl.store.exists(pods, ns, name):
            ctl.consoles.pop(key).close()
            process = ctl.processes.pop(key, None)
            if process is not None:
                process.scope.cancel()
            ctl.previous_consoles.pop(key, None)
            ctl.backoffs.pop(key, None)
            ctl.filesystems.pop(key, None)


# -- main processes ------------------------------------------------------------------------------


def _spawn(ctl: Cluster, pod: dict[str, Any], container: dict[str, Any], argv: list[str],
           *, pod_ip: str = "") -> None:
    """Start a run of the container's main process; its console replaces the last run's."""
    assert ctl.nursery is not None
    key = (pod["metadata"]["namespace"], pod["metadata"]["name"], container.get("name", ""))
    console = ContainerConsole()
    stdin = ProcessStdin(open_=bool(container.get("stdin")), once=bool(container.get("stdinOnce")))
    console.pipe_stdin(stdin)
    # A run (the first or a restart) starts from the image: a fresh writable layer.
    filesystem = _new_filesystem(pod, container, pod_ip or (pod.get("status") or {}).get("podIP") or "")
    process = MainProcess(argv=argv, console=console, stdin=stdin, fs=filesystem)
    previous = ctl.consoles.get(key)
    if previous is not None:
        previous.close()
        ctl.previous_consoles[key] = previous
    ctl.consoles[key] = console
    ctl.processes[key] = process
    ctl.filesystems[key] = filesystem
    # The process (and what it starts) listens on the pod's ports: its task inherits this context.
    with ctl.network.commands_in(pod):
        ctl.nursery.start_soon(process.run, container_env(pod, key[2]), ctl.reconcile)


def _sync_processes(ctl: Cluster, pod: dict[str, Any],
                    processes: dict[str, MainProcess | None]) -> None:
    """Exits become `terminated`, restarts (with the kubelet's back-off) or a finished pod."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    ns, name = meta["namespace"], meta["name"]
    policy = spec.get("restartPolicy") or "Always"
    stall = annotation_true(pod, STALL_ROLLOUT)
    first_delay, max_delay = ctl.restart_backoff
    clock = trio.current_time()
    stamp = rfc3339(now())
    status = copy.deepcopy(pod.get("status") or {})
    containers = {c.get("name", ""): c for c in spec.get("containers") or []}
    for entry in status.get("containerStatuses") or []:
        cname = entry.get("name", "")
        key = (ns, name, cname)
        process = processes.get(cname)
        if process is None or process.exit_code is None or process.finished is None:
            continue
        if not process.seen_exit:
            process.seen_exit = True
            if policy == "Always" or (policy == "OnFailure" and process.exit_code != 0):
                delay = ctl.backoffs.get(key)
                if (process.finished - process.started).total_seconds() >= 2 * max_delay:
                    delay = None  # it ran long enough: the back-off starts over, as the kubelet's does
                    ctl.backoffs.pop(key, None)
                process.restart_at = clock if delay is None else clock + delay
        terminated = {"exitCode": process.exit_code,
                      "reason": "Completed" if process.exit_code == 0 else "Error",
                      "startedAt": rfc3339(process.started), "finishedAt": rfc3339(process.finished),
                      "containerID": entry.get("containerID", "")}
        field_path = f"spec.containers{{{cname}}}"
        if process.restart_at is None:
            entry.update({"state": {"terminated": terminated}, "ready": False, "started": False})
        elif clock >= process.restart_at:
            delay = ctl.backoffs.get(key)
            ctl.backoffs[key] = first_delay if delay is None else min(2 * delay, max_delay)
            _spawn(ctl, pod, containers.get(cname) or {"name": cname}, process.argv)
            entry.update({"state": {"running": {"startedAt": stamp}}, "ready": not stall, "started": True,
                          "restartCount": entry.get("restartCount", 0) + 1,
                          "lastState": {"terminated": terminated}})
            for reason, message in (("Pulled", f'Container image "{entry.get("image", "")}" already present on machine'),
                                    ("Created", f"Created container: {cname}"),
                                    ("Started", f"Started container {cname}")):
                ctl.event(ctl.kinds["pods"], pod, reason, message, component="kubelet", field_path=field_path)
        else:
            ctl.wake_by(process.restart_at)
            waiting = (entry.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") != "CrashLoopBackOff":
                delay_text = _go_duration(ctl.backoffs.get(key, first_delay))
                entry.update({"state": {"waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {delay_text} restarting failed container={cname} "
                               f"pod={name}_{ns}({meta['uid']})"}},
                    "ready": False, "started": False, "lastState": {"terminated": terminated}})
                ctl.event(ctl.kinds["pods"], pod, "BackOff", "Back-off restarting failed container "
                          f"{cname} in pod {name}_{ns}({meta['uid']})", component="kubelet",
                          type_="Warning", field_path=field_path)
    entries = status.get("containerStatuses") or []
    states = [entry.get("state") or {} for entry in entries]
    if entries and all("terminated" in state for state in states):
        status["phase"] = ("Succeeded" if all(state["terminated"].get("exitCode") == 0 for state in states)
                           else "Failed")
    ready = bool(entries) and all(entry.get("ready") for entry in entries)
    for condition in status.get("conditions") or []:
        if condition["type"] not in ("Ready", "ContainersReady"):
            continue
        wanted: dict[str, Any] = {"status": "True" if ready else "False"}
        if status.get("phase") in ("Succeeded", "Failed"):
            wanted["reason"] = "PodCompleted" if status["phase"] == "Succeeded" else "PodFailed"
        elif not ready:
            not_ready = ",".join(e.get("name", "") for e in entries if not e.get("ready"))
            wanted["reason"] = "ContainersNotReady"
            wanted["message"] = f"containers with unready status: [{not_ready}]"
        if condition.get("status") != wanted["status"]:
            condition["lastTransitionTime"] = stamp
        condition.pop("reason", None)
        condition.pop("message", None)
        condition.update(wanted)
    ctl.set_status("pods", pod, status)


def _new_filesystem(pod: dict[str, Any], container: dict[str, Any], pod_ip: str) -> FileSystem:
    meta = pod["metadata"]
    return container_tree(FileSystem(), image=str(container.get("image") or ""),
                          hostname=(pod.get("spec") or {}).get("hostname") or meta["name"],
                          namespace=meta["namespace"], pod_ip=pod_ip, commands=tuple(command_names()))


def _go_duration(seconds: float) -> str:
    """A whole-second duration as Go's time.Duration prints it (10s, 1m20s, 5m0s)."""
    minutes, secs = divmod(round(seconds, 3), 60)
    text = f"{secs:g}s"
    return f"{int(minutes)}m{text}" if minutes else text


def _crashed(stamp: str, restarts: int) -> dict[str, Any]:
    return {
        "ready": False, "started": False, "restartCount": restarts,
        "state": {"waiting": {"reason": "CrashLoopBackOff",
                              "message": "back-off restarting failed container"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": stamp,
                                     "finishedAt": stamp}},
    }


def _startup_lines(container: dict[str, Any]) -> list[str]:
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    lines = []
    if command:
        lines.append("kubesim: command: " + " ".join(command))
    for port in container.get("ports") or []:
        lines.append(f"kubesim: listening on :{port.get('containerPort')}/{port.get('protocol', 'TCP')}")
    lines.append("kubesim: ready")
    return lines
