"""The kubelet's part: pods are scheduled to the one node, start, run, crash-loop or complete,
with the container statuses, conditions and events `kubectl get` and `describe` show, and a
console (log + stdin) per running container.

Knobs, annotations on a pod (usually through its template):

- `kubesim.io/crash-loop: "true"`: the container keeps exiting with code 1 (`CrashLoopBackOff`).
- `kubesim.io/stall-rollout: "true"`: the pod runs but never becomes Ready.
- `kubesim.io/fail: "true"`: a Job's pod exits with code 1.
- `kubesim.io/oom-kill: "true"`: the container is killed for memory as it starts (exit code 137,
  `OOMKilled`), and crash-loops as `kubesim.io/crash-loop` does.
- `kubesim.io/ready-after: "3s"` (a Go duration): each container runs but is Ready only that long
  after it started (as with a readiness probe's `initialDelaySeconds`), so a rollout takes time.

And by the image reference: an image on a registry host under `.invalid` (RFC 6761: it never
resolves), e.g. `registry.invalid/app:1`, cannot be pulled: `ErrImagePull`, then `ImagePullBackOff`.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import re
from datetime import timedelta
from typing import Any

import trio

from kubesim.cluster import NODE_IP, NODE_NAME, Cluster, ImagePull
from kubesim.console import ContainerConsole
from kubesim.fs import FileSystem, container_tree
from kubesim.objects import annotation_true
from kubesim.processes import MainProcess, ProcessStdin, container_env, main_argv
from kubesim.satoken import PROJECTED_LIFETIME, service_account_token
from kubesim.shell import command_names
from kubesim.timefmt import now, parse, rfc3339

CRASH_LOOP = "kubesim.io/crash-loop"
STALL_ROLLOUT = "kubesim.io/stall-rollout"
FAIL = "kubesim.io/fail"
OOM_KILL = "kubesim.io/oom-kill"
READY_AFTER = "kubesim.io/ready-after"
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
        if not check_mounts(ctl, pod):
            return  # ContainerCreating, as the kubelet waits for its volumes
        if any(pull_error(c.get("image", "")) for c in containers) or _pull_waiting(status):
            pull_failed(ctl, pod)
            return
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
    oom = annotation_true(pod, OOM_KILL)
    crash = annotation_true(pod, CRASH_LOOP) or oom
    stall = annotation_true(pod, STALL_ROLLOUT) or ready_after(pod) is not None
    job_pod = "Job" in {ref.get("kind") for ref in meta.get("ownerReferences") or []}
    fail = annotation_true(pod, FAIL)
    statuses = []
    for container in spec.get("containers") or []:
        cname = container.get("name", "")
        image = container.get("image", "")
        field_path = f"spec.containers{{{cname}}}"
        _pull(ctl, pod, container)
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
            ctl.filesystems[key] = _new_filesystem(ctl, pod, container, ip)
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
            entry.update(_crashed(ctl, pod, cname, stamp, 1, oom=oom))
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
    oom = annotation_true(pod, OOM_KILL)
    crash = annotation_true(pod, CRASH_LOOP) or oom
    if not crash and _ready_after_elapsed(ctl, pod):
        pod = ctl.store.get(ctl.kinds["pods"], meta["namespace"], meta["name"])
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
                entry.update(_crashed(ctl, pod, entry["name"], stamp, entry.get("restartCount", 0) + 1,
                                      oom=oom))
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
    for key in [key for key in ctl.image_pulls if not ctl.store.exists(pods, key[0], key[1])]:
        del ctl.image_pulls[key]
    for pod_key in [key for key in ctl.mount_failures if not ctl.store.exists(pods, *key)]:
        del ctl.mount_failures[pod_key]
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
    filesystem = _new_filesystem(ctl, pod, container, pod_ip or (pod.get("status") or {}).get("podIP") or "")
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
    stall = annotation_true(pod, STALL_ROLLOUT) or ready_after(pod) is not None
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
            _pull(ctl, pod, containers.get(cname) or {"name": cname, "image": entry.get("image", "")})
            for reason, message in (("Created", f"Created container: {cname}"),
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


#: the most writable layer a container's ephemeral-storage limit buys (kubesim holds it in memory)
MAX_LAYER = 4 * 1024**3
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?")
_SUFFIX = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip


def layer_capacity(container: dict[str, Any]) -> int:
    """Bytes of file data the container's writable layer holds: its ``resources.limits``
    ``ephemeral-storage`` when it names one (at most ``MAX_LAYER``), else the FileSystem default.

    A departure: a real kubelet lets the layer fill the node's disk and evicts the pod past its
    limit; kubesim refuses the write past it with ENOSPC (a full disk), and without a limit keeps its
    own small default, as it holds every byte in memory. A quantity it cannot read is ignored."""
    limits = ((container.get("resources") or {}).get("limits") or {})
    match = _QUANTITY.fullmatch(str(limits.get("ephemeral-storage", "")).strip())
    if match is None:
        return FileSystem().capacity
    return min(MAX_LAYER, int(float(match.group(1)) * _SUFFIX[match.group(2)]))


def _new_filesystem(ctl: Cluster, pod: dict[str, Any], container: dict[str, Any], pod_ip: str) -> FileSystem:
    meta = pod["metadata"]
    filesystem = container_tree(FileSystem(capacity=layer_capacity(container)), image=str(container.get("image") or ""),
                                hostname=(pod.get("spec") or {}).get("hostname") or meta["name"],
                                namespace=meta["namespace"], pod_ip=pod_ip, commands=tuple(command_names()))
    _mount_volumes(ctl, pod, container, filesystem)
    return filesystem


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_MODE = 0o644


class MountError(Exception):
    """A volume the kubelet cannot set up yet (its message is the kubelet's, after the volume's name)."""


def volume_files(ctl: Cluster, pod: dict[str, Any], volume: dict[str, Any]) -> dict[str, tuple[bytes, int]] | None:
    """The files of a ConfigMap or Secret volume, path → (content, mode), as the kubelet's
    configmap/secret volume plugins write them: a file per key (or the `items`, each at its
    `path`, with its `mode`), in `defaultMode` (0644). None for a volume of another type; an empty
    dict for a missing `optional` object. MountError for a missing object or key otherwise."""
    namespace = pod["metadata"]["namespace"]
    if "configMap" in volume:
        source = volume.get("configMap") or {}
        name, what = str(source.get("name") or ""), "configmap"
        obj = ctl.store.find(ctl.kinds["configmaps"], namespace, name)
        data = {k: str(v).encode() for k, v in ((obj or {}).get("data") or {}).items()}
        data.update({k: _b64(v) for k, v in ((obj or {}).get("binaryData") or {}).items()})
        missing_key = "configmap references non-existent config key: {}"
    elif "secret" in volume:
        source = volume.get("secret") or {}
        name, what = str(source.get("secretName") or ""), "secret"
        obj = ctl.store.find(ctl.store.kind("", "secrets"), namespace, name)
        data = {k: _b64(v) for k, v in ((obj or {}).get("data") or {}).items()}
        data.update({k: str(v).encode() for k, v in ((obj or {}).get("stringData") or {}).items()})
        missing_key = "references non-existent secret key: {}"
    else:
        return None
    optional = bool(source.get("optional"))
    if obj is None:
        if optional:
            return {}
        raise MountError(f'{what} "{name}" not found')
    default_mode = _mode(source.get("defaultMode"), DEFAULT_MODE)
    items = source.get("items")
    if not items:
        return {key: (value, default_mode) for key, value in data.items()}
    files = {}
    for item in items:
        key, path = str(item.get("key") or ""), str(item.get("path") or "")
        if key not in data:
            if optional:
                continue
            raise MountError(missing_key.format(key))
        files[path] = (data[key], _mode(item.get("mode"), default_mode))
    return files


def _mode(value: Any, default: int) -> int:
    return value & 0o777 if isinstance(value, int) and not isinstance(value, bool) else default


def check_mounts(ctl: Cluster, pod: dict[str, Any]) -> bool:
    """Whether every ConfigMap and Secret volume of the pod can be set up; if not, the kubelet's
    `FailedMount` event (once per distinct failure: the kubelet repeats it as it retries, kubesim
    on the first pass after the object appears mounts it and starts the pod)."""
    meta = pod["metadata"]
    key = (meta["namespace"], meta["name"])
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        try:
            volume_files(ctl, pod, volume)
        except MountError as exc:
            message = f'MountVolume.SetUp failed for volume "{volume.get("name", "")}" : {exc}'
            if ctl.mount_failures.get(key) != message:
                ctl.mount_failures[key] = message
                ctl.event(ctl.kinds["pods"], pod, "FailedMount", message, component="kubelet",
                          type_="Warning")
            return False
    ctl.mount_failures.pop(key, None)
    return True


def _mount_volumes(ctl: Cluster, pod: dict[str, Any], container: dict[str, Any], filesystem: FileSystem) -> None:
    """The container's ConfigMap and Secret volumes as read-only files under their mount paths
    (`subPath`: the one file at the mount path), and the service-account token's directory, read
    when the container starts (each run reads them again: a changed ConfigMap shows after a
    restart, not at once as the kubelet's periodic sync would)."""
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    read_only = list(filesystem.read_only)
    for mount in container.get("volumeMounts") or []:
        try:
            files = volume_files(ctl, pod, volumes.get(mount.get("name")) or {})
        except MountError:
            continue  # checked before the pod started; gone since: nothing to mount
        if files is None:
            continue
        target = FileSystem.resolve(str(mount.get("mountPath") or "/"))
        sub_path = str(mount.get("subPath") or "")
        if sub_path:
            if sub_path in files:
                _write(filesystem, target, *files[sub_path])
            read_only.append(target)
            continue
        _clear(filesystem, target)
        for rel, (data, mode) in files.items():
            path = FileSystem.resolve(rel, target)
            # Only below the mount (an API server refuses an absolute or `..` item path; kubesim
            # does not validate pod specs, so the kubelet leaves such an item out).
            if path.startswith(target.rstrip("/") + "/") and not rel.startswith("/"):
                _write(filesystem, path, data, mode)
        read_only.append(target)
    if _automount(ctl, pod):
        namespace = pod["metadata"]["namespace"]
        spec = pod.get("spec") or {}
        account_name = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        account = ctl.store.find(ctl.kinds["serviceaccounts"], namespace, account_name) or {
            "metadata": {"name": account_name, "namespace": namespace}}
        token, _ = service_account_token(account, [], PROJECTED_LIFETIME)
        root_ca = ctl.store.find(ctl.kinds["configmaps"], namespace, "kube-root-ca.crt") or {}
        for name, data in (("token", token.encode()),
                           ("ca.crt", str((root_ca.get("data") or {}).get("ca.crt") or "").encode()),
                           ("namespace", namespace.encode())):
            _write(filesystem, f"{SERVICE_ACCOUNT_DIR}/{name}", data, DEFAULT_MODE)
        read_only.append(SERVICE_ACCOUNT_DIR)
    filesystem.read_only = tuple(read_only)


def _automount(ctl: Cluster, pod: dict[str, Any]) -> bool:
    """Whether the service-account admission plugin gives the pod its token volume: unless the
    pod, or else its service account, says `automountServiceAccountToken: false`."""
    spec = pod.get("spec") or {}
    if spec.get("automountServiceAccountToken") is not None:
        return bool(spec["automountServiceAccountToken"])
    name = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    account = ctl.store.find(ctl.kinds["serviceaccounts"], pod["metadata"]["namespace"], name) or {}
    return account.get("automountServiceAccountToken") is not False


def _clear(filesystem: FileSystem, path: str) -> None:
    """A mount hides what the image had at its path: an empty directory there."""
    try:
        if filesystem.exists(path):
            filesystem.remove(path, recursive=True)
        filesystem.mkdir(path, parents=True)
    except OSError:
        pass  # a path the image's tree does not allow (under /proc): left out


def _write(filesystem: FileSystem, path: str, data: bytes, mode: int) -> None:
    try:
        filesystem.mkdir(path.rsplit("/", 1)[0] or "/", parents=True)
        filesystem.write_file(path, data, mode=mode)
        filesystem.chmod(path, mode)
    except OSError:
        pass  # a path the image's tree does not allow (under /proc, or the filesystem is full): left out


def _b64(text: Any) -> bytes:
    try:
        return base64.b64decode(str(text))
    except ValueError:
        return b""


def _go_duration(seconds: float) -> str:
    """A whole-second duration as Go's time.Duration prints it (10s, 1m20s, 5m0s)."""
    minutes, secs = divmod(round(seconds, 3), 60)
    text = f"{secs:g}s"
    return f"{int(minutes)}m{text}" if minutes else text


def _crashed(ctl: Cluster, pod: dict[str, Any], cname: str, stamp: str, restarts: int, *,
             oom: bool = False) -> dict[str, Any]:
    """A container that exited (code 1, or 137 killed for memory) and waits to be restarted."""
    meta = pod["metadata"]
    delay = _go_duration(CRASH_RESTART_SECONDS * min(2 ** restarts, 8))
    return {
        "ready": False, "started": False, "restartCount": restarts,
        "state": {"waiting": {"reason": "CrashLoopBackOff",
                              "message": f"back-off {delay} restarting failed container={cname} "
                                         f"pod={meta['name']}_{meta['namespace']}({meta['uid']})"}},
        "lastState": {"terminated": {"exitCode": 137 if oom else 1,
                                     "reason": "OOMKilled" if oom else "Error",
                                     "startedAt": stamp, "finishedAt": stamp}},
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


def image_ref(image: str) -> str:
    """The image as the kubelet's image manager names it in events and messages: `:latest`
    added when it has neither tag nor digest (applyDefaultImageTag)."""
    last = image.rsplit("/", 1)[-1]
    return image if "@" in image or ":" in last else f"{image}:latest"


def _pull(ctl: Cluster, pod: dict[str, Any], container: dict[str, Any]) -> None:
    """The image manager's events before a container starts: `Pulling` and `Pulled` when the node
    pulls the image (not there yet, or `imagePullPolicy: Always`), else `Pulled` "already present"."""
    image = container.get("image", "")
    ref = image_ref(image)
    field_path = f"spec.containers{{{container.get('name', '')}}}"
    policy = container.get("imagePullPolicy") or "IfNotPresent"
    if policy == "Never" or (policy == "IfNotPresent" and image in ctl.node_images):
        ctl.event(ctl.kinds["pods"], pod, "Pulled", f'Container image "{ref}" already present on machine',
                  component="kubelet", field_path=field_path)
        return
    digest = hashlib.sha256(image.encode()).digest()
    took = _go_duration_precise(0.4 + int.from_bytes(digest[:2], "big") / 65535 * 2.5)
    size = 5_000_000 + int.from_bytes(digest[2:6], "big") % 70_000_000
    ctl.event(ctl.kinds["pods"], pod, "Pulling", f'Pulling image "{ref}"', component="kubelet",
              field_path=field_path)
    ctl.event(ctl.kinds["pods"], pod, "Pulled", f'Successfully pulled image "{ref}" in {took} '
              f"({took} including waiting). Image size: {size} bytes.", component="kubelet",
              field_path=field_path)
    ctl.node_images.add(image)


def _go_duration_precise(seconds: float) -> str:
    """A sub-minute duration as Go prints it with milliseconds: 1.532s, 812ms."""
    millis = round(seconds * 1000)
    return f"{millis}ms" if millis < 1000 else f"{millis / 1000:g}s"


# -- readiness after a delay (`kubesim.io/ready-after`) --------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float | None:
    """Seconds in a Go duration (`3s`, `1m30s`, `500ms`), as time.ParseDuration reads it; None when
    it does not parse or is negative."""
    text = text.strip()
    if text == "0":
        return 0.0
    total, at = 0.0, 0
    while at < len(text):
        match = _DURATION_PART.match(text, at)
        if match is None:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        at = match.end()
    return total if text else None


def ready_after(pod: dict[str, Any]) -> float | None:
    """The pod's `kubesim.io/ready-after` delay in seconds, or None (no knob, or not a duration)."""
    text = (pod.get("metadata", {}).get("annotations") or {}).get(READY_AFTER)
    return None if text is None else parse_go_duration(text)


def _ready_after_elapsed(ctl: Cluster, pod: dict[str, Any]) -> bool:
    """Make the running containers whose `ready-after` delay has passed Ready (and the pod, when
    all are), as a readiness probe's first success would; True when the pod changed."""
    delay = ready_after(pod)
    if delay is None or annotation_true(pod, STALL_ROLLOUT):
        return False
    status = copy.deepcopy(pod.get("status") or {})
    moment = now()
    changed = False
    for entry in status.get("containerStatuses") or []:
        started = parse(((entry.get("state") or {}).get("running") or {}).get("startedAt"))
        if entry.get("ready") or started is None:
            continue
        remaining = delay - (moment - started).total_seconds()
        if remaining <= 0:
            entry["ready"] = True
            changed = True
        else:
            ctl.timed_work = True
            try:
                ctl.wake_by(trio.current_time() + remaining)
            except RuntimeError:  # reconciled from outside Trio: the next pass will look again
                pass
    if not changed:
        return False
    entries = status.get("containerStatuses") or []
    ready = all(entry.get("ready") for entry in entries)
    stamp = rfc3339(moment)
    for condition in status.get("conditions") or []:
        if condition["type"] not in ("Ready", "ContainersReady"):
            continue
        condition.pop("reason", None)
        condition.pop("message", None)
        if ready:
            if condition.get("status") != "True":
                condition["lastTransitionTime"] = stamp
            condition["status"] = "True"
        else:
            not_ready = ",".join(e.get("name", "") for e in entries if not e.get("ready"))
            condition.update({"status": "False", "reason": "ContainersNotReady",
                              "message": f"containers with unready status: [{not_ready}]"})
    ctl.set_status("pods", pod, status)
    return True


# -- images that cannot be pulled -------------------------------------------------------------------

#: where the node's runtime asks names (kind's node: Docker's embedded DNS)
NODE_RESOLVER = "127.0.0.11:53"


def _image_parts(image: str) -> tuple[str, str, str]:
    """(registry host, repository path, tag or digest) of an image reference, normalized as the
    container runtime does (`nginx` → `docker.io`, `library/nginx`, `latest`)."""
    rest, _, digest = image.partition("@")
    first, _, remainder = rest.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        host, path = first, remainder
    else:
        host, path = "docker.io", rest if "/" in rest else f"library/{rest}"
    name, colon, tag = path.rpartition(":")
    if colon and "/" not in tag:
        path = name
    else:
        tag = ""
    return host, path, digest or tag or "latest"


def pull_error(image: str) -> str | None:
    """The container runtime's error for pulling `image`, when kubesim's node cannot pull it: a
    registry host under `.invalid` (RFC 6761 reserves it: it never resolves). None otherwise."""
    host, path, reference = _image_parts(image)
    hostname = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if not (hostname == "invalid" or hostname.endswith(".invalid")):
        return None
    separator = "@" if reference.startswith("sha256:") else ":"
    ref = f"{host}/{path}{separator}{reference}"
    return (f'rpc error: code = Unknown desc = failed to pull and unpack image "{ref}": failed to '
            f'resolve reference "{ref}": failed to do request: Head "https://{host}/v2/{path}/'
            f'manifests/{reference}": dial tcp: lookup {hostname} on {NODE_RESOLVER}: no such host')


def _pull_waiting(status: dict[str, Any]) -> bool:
    return any(((entry.get("state") or {}).get("waiting") or {}).get("reason") in ("ErrImagePull", "ImagePullBackOff")
               for entry in status.get("containerStatuses") or [])


def pull_failed(ctl: Cluster, pod: dict[str, Any]) -> None:
    """A pod whose image cannot be pulled stays Pending: each failed pull is `ErrImagePull` (events
    `Pulling`, `Failed`), the kubelet's next sync, a first back-off later, shows `ImagePullBackOff`
    (events `BackOff`, `Failed`), and the pull is tried again when the image back-off (the first
    delay doubled at each failure, at most the maximum: `restart_backoff`) has passed.

    kubesim does not start the pod's other containers meanwhile (a real kubelet does)."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    kind = ctl.kinds["pods"]
    containers = spec.get("containers") or []
    if not any(pull_error(c.get("image", "")) for c in containers):
        # The pod's image was changed to one that pulls: start it as usual.
        for key in [key for key in ctl.image_pulls if key[:2] == (meta["namespace"], meta["name"])]:
            del ctl.image_pulls[key]
        start(ctl, pod)
        return
    ctl.timed_work = True
    first_delay, max_delay = ctl.restart_backoff
    moment = now()
    stamp = rfc3339(moment)
    status = copy.deepcopy(pod.get("status") or {})
    ip = status.get("podIP") or ctl.store.allocator.pod_ip()
    old = {entry.get("name"): entry for entry in status.get("containerStatuses") or []}
    statuses = []
    for container in containers:
        cname, image = container.get("name", ""), container.get("image", "")
        ref = image_ref(image)
        field_path = f"spec.containers{{{cname}}}"
        entry = {"name": cname, "image": image, "imageID": "", "ready": False, "restartCount": 0,
                 "started": False, "state": {"waiting": {"reason": "ContainerCreating"}}}
        entry.update({k: v for k, v in (old.get(cname) or {}).items() if k == "state"})
        error = pull_error(image)
        key = (meta["namespace"], meta["name"], cname)
        pull = ctl.image_pulls.get(key)
        if error is None:
            statuses.append(entry)
            continue
        if pull is None or pull.image != image or moment >= pull.retry_at:
            failures = 1 if pull is None or pull.image != image else pull.failures + 1
            backoff = min(first_delay * 2 ** failures, max_delay)
            ctl.image_pulls[key] = ImagePull(image=image, failures=failures, failed_at=moment,
                                             retry_at=moment + timedelta(seconds=backoff))
            ctl.event(kind, pod, "Pulling", f'Pulling image "{ref}"', component="kubelet",
                      field_path=field_path)
            ctl.event(kind, pod, "Failed", f'Failed to pull image "{ref}": {error}', component="kubelet",
                      type_="Warning", field_path=field_path)
            ctl.event(kind, pod, "Failed", "Error: ErrImagePull", component="kubelet", type_="Warning",
                      field_path=field_path)
            entry["state"] = {"waiting": {"reason": "ErrImagePull", "message": error}}
        elif (moment >= pull.failed_at + timedelta(seconds=first_delay)
              and ((entry["state"].get("waiting") or {}).get("reason") != "ImagePullBackOff")):
            # The kubelet's next sync of the pod finds the image in back-off.
            ctl.event(kind, pod, "BackOff", f'Back-off pulling image "{ref}"', component="kubelet",
                      field_path=field_path)
            ctl.event(kind, pod, "Failed", "Error: ImagePullBackOff", component="kubelet",
                      type_="Warning", field_path=field_path)
            entry["state"] = {"waiting": {"reason": "ImagePullBackOff",
                                          "message": f'Back-off pulling image "{ref}": ErrImagePull: {error}'}}
        statuses.append(entry)
    not_ready = ",".join(entry["name"] for entry in statuses)
    conditions = []
    for kind_name in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"):
        previous = next((c for c in status.get("conditions") or [] if c.get("type") == kind_name), None)
        wanted: dict[str, Any] = {"type": kind_name, "status": "True", "lastProbeTime": None,
                                  "lastTransitionTime": stamp}
        if kind_name in ("Ready", "ContainersReady"):
            wanted.update({"status": "False", "reason": "ContainersNotReady",
                           "message": f"containers with unready status: [{not_ready}]"})
        if previous is not None and previous.get("status") == wanted["status"]:
            wanted["lastTransitionTime"] = previous.get("lastTransitionTime", stamp)
        conditions.append(wanted)
    status.update({"phase": "Pending", "conditions": conditions, "podIP": ip, "podIPs": [{"ip": ip}],
                   "containerStatuses": statuses})
    ctl.set_status("pods", pod, status)
