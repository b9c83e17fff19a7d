"""Server-side tables (`as=Table;g=meta.k8s.io;v=v1`): the columns `kubectl get` prints.

The columns and cell contents follow the API server's printers
(k8s.io/kubernetes/pkg/printers/internalversion), so a user sees the same NAME READY STATUS …
a real cluster shows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubesim.resources import Kind
from kubesim.selectors import field_value, selector_string
from kubesim.timefmt import age, now, parse, rfc3339

Column = tuple[str, str, str, int]  # name, type, format, priority
Row = Callable[[dict[str, Any], datetime], list[Any]]

_NAME: Column = ("Name", "string", "name", 0)
_AGE: Column = ("Age", "string", "", 0)


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("spec") or {}


def _status(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("status") or {}


def _age(obj: dict[str, Any], moment: datetime) -> str:
    return age(_meta(obj).get("creationTimestamp"), moment)


def _containers(template_spec: dict[str, Any]) -> tuple[str, str]:
    containers = template_spec.get("containers") or []
    return (",".join(c.get("name", "") for c in containers),
            ",".join(c.get("image", "") for c in containers))


def pod_status_reason(pod: dict[str, Any]) -> tuple[str, int, int, int, str]:
    """(STATUS, ready containers, total containers, restarts, last restart) as printPod does."""
    status = _status(pod)
    spec = _spec(pod)
    reason = status.get("reason") or status.get("phase") or "Pending"
    total = len(spec.get("containers") or [])
    ready = 0
    restarts = 0
    last_restart: datetime | None = None
    initializing = False
    for i, container in enumerate(status.get("initContainerStatuses") or []):
        restarts += container.get("restartCount", 0)
        state = container.get("state") or {}
        terminated = state.get("terminated")
        waiting = state.get("waiting")
        if terminated and terminated.get("exitCode", 0) == 0:
            continue
        if terminated:
            reason = "Init:" + (terminated.get("reason") or f"ExitCode:{terminated.get('exitCode')}")
        elif waiting and waiting.get("reason") and waiting["reason"] != "PodInitializing":
            reason = "Init:" + waiting["reason"]
        else:
            reason = f"Init:{i}/{len(spec.get('initContainers') or [])}"
        initializing = True
        break
    has_running = False
    for container in reversed(status.get("containerStatuses") or []):
        restarts += container.get("restartCount", 0)
        last = (container.get("lastState") or {}).get("terminated") or {}
        finished = parse(last.get("finishedAt"))
        if finished and (last_restart is None or finished > last_restart):
            last_restart = finished
        if initializing:
            continue
        state = container.get("state") or {}
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif state.get("terminated"):
            terminated = state["terminated"]
            reason = terminated.get("reason") or (
                f"Signal:{terminated['signal']}" if terminated.get("signal")
                else f"ExitCode:{terminated.get('exitCode', 0)}")
        elif container.get("ready") and "running" in state:
            has_running = True
            ready += 1
    if not initializing and reason == "Completed" and has_running:
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        reason = "Running" if conditions.get("Ready") == "True" else "NotReady"
    if _meta(pod).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    since = ""
    if last_restart is not None and restarts:
        since = age(rfc3339(last_restart))
    return reason, ready, total, restarts, since


def _pod_row(pod: dict[str, Any], moment: datetime) -> list[Any]:
    reason, ready, total, restarts, since = pod_status_reason(pod)
    status = _status(pod)
    gates = _spec(pod).get("readinessGates") or []
    if gates:
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        passing = sum(1 for g in gates if conditions.get(g.get("conditionType")) == "True")
        gates_cell = f"{passing}/{len(gates)}"
    else:
        gates_cell = "<none>"
    restarts_cell = f"{restarts} ({since} ago)" if since else str(restarts)
    return [_meta(pod).get("name"), f"{ready}/{total}", reason, restarts_cell, _age(pod, moment),
            status.get("podIP") or "<none>", _spec(pod).get("nodeName") or "<none>",
            status.get("nominatedNodeName") or "<none>", gates_cell]


def _ports_text(ports: list[dict[str, Any]]) -> str:
    if not ports:
        return "<none>"
    out = []
    for port in ports:
        text = f"{port.get('port')}"
        if port.get("nodePort"):
            text += f":{port['nodePort']}"
        out.append(f"{text}/{port.get('protocol', 'TCP')}")
    return ",".join(out)


def _service_row(svc: dict[str, Any], moment: datetime) -> list[Any]:
    spec = _spec(svc)
    ingress = (_status(svc).get("loadBalancer") or {}).get("ingress") or []
    external = ",".join(i.get("ip") or i.get("hostname", "") for i in ingress)
    if not external:
        external = ",".join(spec.get("externalIPs") or [])
        if not external:
            kind = spec.get("type", "ClusterIP")
            external = {"LoadBalancer": "<pending>", "ExternalName": spec.get("externalName", "")}.get(kind, "<none>")
    selector = spec.get("selector") or {}
    selector_text = ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "<none>"
    return [_meta(svc).get("name"), spec.get("type", "ClusterIP"), spec.get("clusterIP") or "<none>",
            external, _ports_text(spec.get("ports") or []), _age(svc, moment), selector_text]


def _endpointslice_row(eps: dict[str, Any], moment: datetime) -> list[Any]:
    ports = eps.get("ports") or []
    ports_text = ",".join(str(p.get("port")) for p in ports if p.get("port") is not None) or "<unset>"
    addresses = [a for e in eps.get("endpoints") or [] for a in e.get("addresses") or []]
    shown = ",".join(addresses[:3])
    if len(addresses) > 3:
        shown += f" + {len(addresses) - 3} more..."
    return [_meta(eps).get("name"), eps.get("addressType", ""), ports_text, shown or "<unset>",
            _age(eps, moment)]


def _deployment_row(dep: dict[str, Any], moment: datetime) -> list[Any]:
    spec, status = _spec(dep), _status(dep)
    names, images = _containers((spec.get("template") or {}).get("spec") or {})
    return [_meta(dep).get("name"), f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
            status.get("updatedReplicas", 0), status.get("availableReplicas", 0),
            _age(dep, moment), names, images, selector_string(spec.get("selector"))]


def _replicaset_row(rs: dict[str, Any], moment: datetime) -> list[Any]:
    spec, status = _spec(rs), _status(rs)
    names, images = _containers((spec.get("template") or {}).get("spec") or {})
    return [_meta(rs).get("name"), spec.get("replicas", 1), status.get("replicas", 0),
            status.get("readyReplicas", 0), _age(rs, moment), names, images,
            selector_string(spec.get("selector"))]


def _statefulset_row(sts: dict[str, Any], moment: datetime) -> list[Any]:
    spec, status = _spec(sts), _status(sts)
    names, images = _containers((spec.get("template") or {}).get("spec") or {})
    return [_meta(sts).get("name"), f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
            _age(sts, moment), names, images]


def _daemonset_row(ds: dict[str, Any], moment: datetime) -> list[Any]:
    spec, status = _spec(ds), _status(ds)
    template_spec = (spec.get("template") or {}).get("spec") or {}
    names, images = _containers(template_spec)
    node_selector = ",".join(f"{k}={v}" for k, v in sorted((template_spec.get("nodeSelector") or {}).items()))
    return [_meta(ds).get("name"), status.get("desiredNumberScheduled", 0),
            status.get("currentNumberScheduled", 0), status.get("numberReady", 0),
            status.get("updatedNumberScheduled", 0), status.get("numberAvailable", 0),
            node_selector or "<none>", _age(ds, moment), names, images,
            selector_string(spec.get("selector"))]


def _job_status_text(job: dict[str, Any]) -> str:
    conditions = {c.get("type"): c.get("status") for c in _status(job).get("conditions") or []}
    if conditions.get("Complete") == "True":
        return "Complete"
    if conditions.get("Failed") == "True":
        return "Failed"
    if _meta(job).get("deletionTimestamp"):
        return "Terminating"
    if conditions.get("Suspended") == "True":
        return "Suspended"
    if conditions.get("FailureTarget") == "True":
        return "FailureTarget"
    if conditions.get("SuccessCriteriaMet") == "True":
        return "SuccessCriteriaMet"
    return "Running"


def _job_row(job: dict[str, Any], moment: datetime) -> list[Any]:
    spec, status = _spec(job), _status(job)
    names, images = _containers((spec.get("template") or {}).get("spec") or {})
    completions = spec.get("completions")
    completions_text = f"{status.get('succeeded', 0)}/{completions}" if completions is not None else f"{status.get('succeeded', 0)}/1 of {spec.get('parallelism', 1)}"
    start = parse(status.get("startTime"))
    end = parse(status.get("completionTime")) or moment
    duration = age(rfc3339(start), end) if start else ""
    return [_meta(job).get("name"), _job_status_text(job), completions_text, duration,
            _age(job, moment), names, images, selector_string(spec.get("selector"))]


def _cronjob_row(cj: dict[str, Any], moment: datetime) -> list[Any]:
    spec, status = _spec(cj), _status(cj)
    template_spec = (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    names, images = _containers(template_spec)
    last = status.get("lastScheduleTime")
    return [_meta(cj).get("name"), spec.get("schedule", ""), spec.get("timeZone") or "<none>",
            "True" if spec.get("suspend") else "False", len(status.get("active") or []),
            age(last, moment) if last else "<none>", _age(cj, moment), names, images, "<none>"]


def _configmap_row(cm: dict[str, Any], moment: datetime) -> list[Any]:
    count = len(cm.get("data") or {}) + len(cm.get("binaryData") or {})
    return [_meta(cm).get("name"), count, _age(cm, moment)]


def _secret_row(secret: dict[str, Any], moment: datetime) -> list[Any]:
    count = len(secret.get("data") or {}) + len(secret.get("stringData") or {})
    return [_meta(secret).get("name"), secret.get("type", "Opaque"), count, _age(secret, moment)]


def _event_row(event: dict[str, Any], moment: datetime) -> list[Any]:
    involved = event.get("involvedObject") or {}
    first = event.get("firstTimestamp") or event.get("eventTime") or _meta(event).get("creationTimestamp")
    last = event.get("lastTimestamp") or first
    source = event.get("source") or {}
    source_text = source.get("component", "")
    if source.get("host"):
        source_text += f", {source['host']}"
    return [age(last, moment), event.get("type", ""), event.get("reason", ""),
            f"{involved.get('kind', '').lower()}/{involved.get('name', '')}",
            involved.get("fieldPath", ""), source_text, (event.get("message") or "").strip(),
            age(first, moment), event.get("count", 1), _meta(event).get("name")]


def _ingress_row(ing: dict[str, Any], moment: datetime) -> list[Any]:
    spec = _spec(ing)
    hosts = ",".join(r.get("host", "") for r in spec.get("rules") or [] if r.get("host")) or "*"
    lb = ((_status(ing).get("loadBalancer") or {}).get("ingress")) or []
    address = ",".join(i.get("ip") or i.get("hostname", "") for i in lb)
    ports = "80, 443" if spec.get("tls") else "80"
    return [_meta(ing).get("name"), spec.get("ingressClassName") or "<none>", hosts, address,
            ports, _age(ing, moment)]


def _networkpolicy_row(policy: dict[str, Any], moment: datetime) -> list[Any]:
    return [_meta(policy).get("name"), selector_string(_spec(policy).get("podSelector")),
            _age(policy, moment)]


def _pdb_row(pdb: dict[str, Any], moment: datetime) -> list[Any]:
    spec = _spec(pdb)
    # kubectl prints an unset bound as N/A (printPodDisruptionBudget)
    bound = {key: "N/A" if spec.get(key) is None else str(spec[key])
             for key in ("minAvailable", "maxUnavailable")}
    return [_meta(pdb).get("name"), bound["minAvailable"], bound["maxUnavailable"],
            _status(pdb).get("disruptionsAllowed", 0), _age(pdb, moment)]


def _pvc_row(pvc: dict[str, Any], moment: datetime) -> list[Any]:
    spec, status = _spec(pvc), _status(pvc)
    phase = "Terminating" if _meta(pvc).get("deletionTimestamp") else status.get("phase", "Pending")
    capacity = (status.get("capacity") or {}).get("storage", "")
    modes = _access_modes(status.get("accessModes") or [])
    return [_meta(pvc).get("name"), phase, spec.get("volumeName", ""), capacity, modes,
            spec.get("storageClassName") or "<unset>",
            spec.get("volumeAttributesClassName") or "<unset>", _age(pvc, moment),
            spec.get("volumeMode", "Filesystem")]


def _access_modes(modes: list[str]) -> str:
    short = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX",
             "ReadWriteOncePod": "RWOP"}
    return ",".join(short.get(m, m) for m in modes)


def _serviceaccount_row(sa: dict[str, Any], moment: datetime) -> list[Any]:
    return [_meta(sa).get("name"), len(sa.get("secrets") or []), _age(sa, moment)]


def _hpa_row(hpa: dict[str, Any], moment: datetime) -> list[Any]:
    spec, status = _spec(hpa), _status(hpa)
    ref = spec.get("scaleTargetRef") or {}
    targets = []
    current = {m.get("resource", {}).get("name"): m for m in status.get("currentMetrics") or []}
    if "targetCPUUtilizationPercentage" in spec:
        seen = status.get("currentCPUUtilizationPercentage")
        seen_text = f"{seen}%" if seen is not None else "<unknown>"
        targets.append(f"cpu: {seen_text}/{spec['targetCPUUtilizationPercentage']}%")
    for metric in spec.get("metrics") or []:
        if metric.get("type") == "Resource":
            resource = metric.get("resource") or {}
            target = resource.get("target") or {}
            wanted = target.get("averageUtilization")
            seen = ((current.get(resource.get("name")) or {}).get("resource") or {}).get("current", {}).get("averageUtilization")
            seen_text = f"{seen}%" if seen is not None else "<unknown>"
            targets.append(f"{resource.get('name')}: {seen_text}/{wanted}%")
        else:
            targets.append("<unknown>/<unknown>")
    return [_meta(hpa).get("name"), f"{ref.get('kind', '')}/{ref.get('name', '')}",
            ", ".join(targets) or "<none>", spec.get("minReplicas", 1), spec.get("maxReplicas", 0),
            status.get("currentReplicas", 0), _age(hpa, moment)]


def _namespace_row(ns: dict[str, Any], moment: datetime) -> list[Any]:
    return [_meta(ns).get("name"), _status(ns).get("phase", "Active"), _age(ns, moment)]


def _node_row(node: dict[str, Any], moment: datetime) -> list[Any]:
    conditions = {c.get("type"): c.get("status") for c in _status(node).get("conditions") or []}
    ready = "Ready" if conditions.get("Ready") == "True" else "NotReady"
    if _spec(node).get("unschedulable"):
        ready += ",SchedulingDisabled"
    labels = _meta(node).get("labels") or {}
    roles = ",".join(sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))) or "<none>"
    info = _status(node).get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in _status(node).get("addresses") or []}
    return [_meta(node).get("name"), ready, roles, _age(node, moment), info.get("kubeletVersion", ""),
            addresses.get("InternalIP", "<none>"), addresses.get("ExternalIP", "<none>"),
            info.get("osImage", ""), info.get("kernelVersion", ""), info.get("containerRuntimeVersion", "")]


def _crd_row(crd: dict[str, Any], moment: datetime) -> list[Any]:
    return [_meta(crd).get("name"), _meta(crd).get("creationTimestamp", "")]


def _controllerrevision_row(cr: dict[str, Any], moment: datetime) -> list[Any]:
    owner = next(iter(_meta(cr).get("ownerReferences") or []), None)
    controller = f"{owner['kind'].lower()}.apps/{owner['name']}" if owner else "<none>"
    return [_meta(cr).get("name"), controller, cr.get("revision", 0), _age(cr, moment)]


TABLES: dict[str, tuple[list[Column], Row]] = {
    "pods": ([_NAME, ("Ready", "string", "", 0), ("Status", "string", "", 0),
              ("Restarts", "string", "", 0), _AGE, ("IP", "string", "", 1),
              ("Node", "string", "", 1), ("Nominated Node", "string", "", 1),
              ("Readiness Gates", "string", "", 1)], _pod_row),
    "services": ([_NAME, ("Type", "string", "", 0), ("Cluster-IP", "string", "", 0),
                  ("External-IP", "string", "", 0), ("Port(s)", "string", "", 0), _AGE,
                  ("Selector", "string", "", 1)], _service_row),
    "endpointslices": ([_NAME, ("AddressType", "string", "", 0), ("Ports", "string", "", 0),
                        ("Endpoints", "string", "", 0), _AGE], _endpointslice_row),
    "deployments": ([_NAME, ("Ready", "string", "", 0), ("Up-to-date", "integer", "", 0),
                     ("Available", "integer", "", 0), _AGE, ("Containers", "string", "", 1),
                     ("Images", "string", "", 1), ("Selector", "string", "", 1)], _deployment_row),
    "replicasets": ([_NAME, ("Desired", "integer", "", 0), ("Current", "integer", "", 0),
                     ("Ready", "integer", "", 0), _AGE, ("Containers", "string", "", 1),
                     ("Images", "string", "", 1), ("Selector", "string", "", 1)], _replicaset_row),
    "statefulsets": ([_NAME, ("Ready", "string", "", 0), _AGE, ("Containers", "string", "", 1),
                      ("Images", "string", "", 1)], _statefulset_row),
    "daemonsets": ([_NAME, ("Desired", "integer", "", 0), ("Current", "integer", "", 0),
                    ("Ready", "integer", "", 0), ("Up-to-date", "integer", "", 0),
                    ("Available", "integer", "", 0), ("Node Selector", "string", "", 0), _AGE,
                    ("Containers", "string", "", 1), ("Images", "string", "", 1),
                    ("Selector", "string", "", 1)], _daemonset_row),
    "jobs": ([_NAME, ("Status", "string", "", 0), ("Completions", "string", "", 0),
              ("Duration", "string", "", 0), _AGE, ("Containers", "string", "", 1),
              ("Images", "string", "", 1), ("Selector", "string", "", 1)], _job_row),
    "cronjobs": ([_NAME, ("Schedule", "string", "", 0), ("Timezone", "string", "", 0),
                  ("Suspend", "boolean", "", 0), ("Active", "integer", "", 0),
                  ("Last Schedule", "string", "", 0), _AGE, ("Containers", "string", "", 1),
                  ("Images", "string", "", 1), ("Selector", "string", "", 1)], _cronjob_row),
    "configmaps": ([_NAME, ("Data", "string", "", 0), _AGE], _configmap_row),
    "secrets": ([_NAME, ("Type", "string", "", 0), ("Data", "string", "", 0), _AGE], _secret_row),
    "events": ([("Last Seen", "string", "", 0), ("Type", "string", "", 0),
                ("Reason", "string", "", 0), ("Object", "string", "", 0),
                ("Subobject", "string", "", 1), ("Source", "string", "", 1),
                ("Message", "string", "", 0), ("First Seen", "string", "", 1),
                ("Count", "string", "", 1), ("Name", "string", "", 1)], _event_row),
    "ingresses": ([_NAME, ("Class", "string", "", 0), ("Hosts", "string", "", 0),
                   ("Address", "string", "", 0), ("Ports", "string", "", 0), _AGE], _ingress_row),
    "networkpolicies": ([_NAME, ("Pod-Selector", "string", "", 0), _AGE], _networkpolicy_row),
    "poddisruptionbudgets": ([_NAME, ("Min Available", "string", "", 0),
                              ("Max Unavailable", "string", "", 0),
                              ("Allowed Disruptions", "integer", "", 0), _AGE], _pdb_row),
    "persistentvolumeclaims": ([_NAME, ("Status", "string", "", 0), ("Volume", "string", "", 0),
                                ("Capacity", "string", "", 0), ("Access Modes", "string", "", 0),
                                ("StorageClass", "string", "", 0),
                                ("VolumeAttributesClass", "string", "", 0), _AGE,
                                ("VolumeMode", "string", "", 1)], _pvc_row),
    "serviceaccounts": ([_NAME, ("Secrets", "string", "", 0), _AGE], _serviceaccount_row),
    "horizontalpodautoscalers": ([_NAME, ("Reference", "string", "", 0),
                                  ("Targets", "string", "", 0), ("MinPods", "string", "", 0),
                                  ("MaxPods", "string", "", 0), ("Replicas", "string", "", 0),
                                  _AGE], _hpa_row),
    "namespaces": ([_NAME, ("Status", "string", "", 0), _AGE], _namespace_row),
    "nodes": ([_NAME, ("Status", "string", "", 0), ("Roles", "string", "", 0), _AGE,
               ("Version", "string", "", 0), ("Internal-IP", "string", "", 1),
               ("External-IP", "string", "", 1), ("OS-Image", "string", "", 1),
               ("Kernel-Version", "string", "", 1), ("Container-Runtime", "string", "", 1)],
              _node_row),
    "customresourcedefinitions": ([_NAME, ("Created At", "date", "", 0)], _crd_row),
    "controllerrevisions": ([_NAME, ("Controller", "string", "", 0),
                             ("Revision", "integer", "", 0), _AGE], _controllerrevision_row),
}


_JSONPATH_STEP = re.compile(
    r"""\.(?P<name>[A-Za-z0-9_\-/]+)"""
    r"""|\[(?P<index>-?\d+|\*)\]"""
    r"""|\[\?\(@(?P<fpath>(?:\.[A-Za-z0-9_\-/]+)+)\s*(?P<op>==|!=)\s*(?P<lit>"[^"]*"|'[^']*'|-?\d+|true|false)\)\]""")


def _jsonpath_cell(obj: dict[str, Any], path: str) -> Any:
    """The first value a CRD printer column's JSONPath finds (as the API server's table convertor
    takes `results[0][0]`): fields, `[n]`, `[*]` and filters `[?(@.type=="Ready")]` (== and !=)."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    text = text if text.startswith((".", "[")) else "." + text
    nodes: list[Any] = [obj]
    at = 0
    while at < len(text):
        match = _JSONPATH_STEP.match(text, at)
        if match is None:
            return None
        at = match.end()
        found: list[Any] = []
        for node in nodes:
            if match.group("name") is not None:
                if isinstance(node, dict) and match.group("name") in node:
                    found.append(node[match.group("name")])
            elif match.group("index") is not None:
                if isinstance(node, list):
                    if match.group("index") == "*":
                        found.extend(node)
                    elif -len(node) <= int(match.group("index")) < len(node):
                        found.append(node[int(match.group("index"))])
            elif isinstance(node, list):
                wanted = json.loads(match.group("lit").replace("'", '"'))
                for item in node:
                    value = _jsonpath_cell(item, match.group("fpath")) if isinstance(item, dict) else None
                    if (value == wanted) == (match.group("op") == "=="):
                        found.append(item)
        nodes = found
    return nodes[0] if nodes else None


def _custom_columns(kind: Kind) -> tuple[list[Column], Row]:
    if not kind.printer_columns:
        return [_NAME, ("Age", "date", "", 0)], lambda obj, moment: [
            _meta(obj).get("name"), _age(obj, moment)]
    columns: list[Column] = [_NAME]
    for column in kind.printer_columns:
        columns.append((column.name, column.type, column.format, column.priority))

    def row(obj: dict[str, Any], moment: datetime) -> list[Any]:
        cells: list[Any] = [_meta(obj).get("name")]
        for column in kind.printer_columns:
            value = _jsonpath_cell(obj, column.json_path)
            if column.type == "date" and isinstance(value, str):
                value = age(value, moment)
            cells.append(value)
        return cells

    return columns, row


def columns_for(kind: Kind) -> tuple[list[Column], Row]:
    if kind.custom:
        return _custom_columns(kind)
    return TABLES.get(kind.plural) or ([_NAME, _AGE], lambda obj, moment: [
        _meta(obj).get("name"), _age(obj, moment)])


def partial_metadata(obj: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata") or {}}


def table(kind: Kind, objects: list[dict[str, Any]], *, resource_version: str = "",
          continue_token: str = "", include_object: str = "Metadata",
          include_columns: bool = True) -> dict[str, Any]:
    columns, row = columns_for(kind)
    moment = now()
    rows = []
    for obj in objects:
        entry: dict[str, Any] = {"cells": row(obj, moment)}
        if include_object == "Object":
            entry["object"] = obj
        elif include_object != "None":
            entry["object"] = partial_metadata(obj)
        rows.append(entry)
    metadata: dict[str, Any] = {}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    if continue_token:
        metadata["continue"] = continue_token
    definitions = [
        {"name": name, "type": type_, "format": format_, "description": _describe(name),
         "priority": priority}
        for name, type_, format_, priority in columns
    ] if include_columns else []
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
            "columnDefinitions": definitions, "rows": rows}


def _describe(name: str) -> str:
    if name == "Name":
        return ("Name must be unique within a namespace. Is required when creating resources, "
                "although some resources may allow a client to request the generation of an "
                "appropriate name automatically.")
    if name == "Age":
        return ("CreationTimestamp is a timestamp representing the server time when this object "
                "was created.")
    return name


__all__ = ["columns_for", "field_value", "partial_metadata", "pod_status_reason", "table"]
