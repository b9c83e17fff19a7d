"""Defaulting and validation on create and update, as the API server's registry strategies do."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from kubesim import cron
from kubesim.errors import ApiError, invalid
from kubesim.resources import Kind

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_LABEL_NAMED = {"namespaces", "services"}


class Allocator:
    """Cluster IPs and pod IPs handed out in order."""

    def __init__(self) -> None:
        self._service = itertools.count(10)
        self._pod = itertools.count(5)
        self._load_balancer = itertools.count(200)
        self._node_port = itertools.count(30080)

    def cluster_ip(self) -> str:
        n = next(self._service)
        return f"10.96.{n // 250}.{n % 250 + 1}"

    def load_balancer_ip(self) -> str:
        """The next external address of a LoadBalancer Service (as MetalLB on a kind network)."""
        n = next(self._load_balancer)
        return f"172.18.{255 - n // 250}.{n % 250 + 1}"

    def node_port(self) -> int:
        return 30000 + (next(self._node_port) - 30000) % 2768

    def pod_ip(self) -> str:
        n = next(self._pod)
        return f"10.244.{n // 250}.{n % 250 + 1}"


#: RBAC objects are named by path segment (ValidateRBACName): `system:discovery` is a valid name.
_PATH_SEGMENT_NAMED = ("roles", "rolebindings", "clusterroles", "clusterrolebindings")


def validate_name(kind: Kind, name: str) -> None:
    if kind.plural in _PATH_SEGMENT_NAMED and kind.group == "rbac.authorization.k8s.io":
        bad = next((s for s in ("/", "%") if s in name), None)
        if name in (".", ".."):
            raise invalid(kind.kind, kind.group, name,
                          [("metadata.name", f'Invalid value: "{name}": may not be \'{name}\'')])
        if bad:
            raise invalid(kind.kind, kind.group, name,
                          [("metadata.name", f'Invalid value: "{name}": may not contain \'{bad}\'')])
        return
    if kind.plural in _LABEL_NAMED:
        ok = bool(_LABEL.match(name)) and len(name) <= 63
        message = _LABEL_MESSAGE
    else:
        ok = bool(_SUBDOMAIN.match(name)) and len(name) <= 253
        message = _SUBDOMAIN_MESSAGE
    if not ok:
        raise invalid(kind.kind, kind.group, name,
                      [("metadata.name", f'Invalid value: "{name}": {message}')])


def _image_pull_policy(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        return "IfNotPresent"
    if ":" not in last or last.endswith(":latest"):
        return "Always"
    return "IfNotPresent"


def _default_containers(spec: dict[str, Any]) -> None:
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or []:
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("imagePullPolicy", _image_pull_policy(container.get("image", "")))
            container.setdefault("resources", {})
            for port in container.get("ports") or []:
                port.setdefault("protocol", "TCP")


def default_pod_spec(spec: dict[str, Any]) -> None:
    _default_containers(spec)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    if "serviceAccountName" in spec or "serviceAccount" not in spec:
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("serviceAccount", spec["serviceAccountName"])


def _default_template(spec: dict[str, Any]) -> None:
    template = spec.setdefault("template", {})
    template.setdefault("metadata", {})
    default_pod_spec(template.setdefault("spec", {}))


def apply_defaults(kind: Kind, obj: dict[str, Any], allocator: Allocator) -> None:
    """Fill in the fields a real API server defaults (only what `kubectl` shows or reads)."""
    if kind.custom or kind.group not in ("", "apps", "batch", "autoscaling", "discovery.k8s.io", "networking.k8s.io"):
        return
    spec = obj.setdefault("spec", {}) if kind.plural not in _NO_SPEC else None
    match kind.plural:
        case "pods":
            assert spec is not None
            default_pod_spec(spec)
            spec.setdefault("enableServiceLinks", True)
            spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
            spec.setdefault("priority", 0)
            spec.setdefault("tolerations", [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
            ])
            obj.setdefault("status", {}).setdefault("phase", "Pending")
            obj["status"].setdefault("qosClass", "BestEffort")
        case "deployments":
            assert spec is not None
            spec.setdefault("replicas", 1)
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
            strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
            if strategy.get("type", "RollingUpdate") == "RollingUpdate":
                strategy.setdefault("type", "RollingUpdate")
                rolling = strategy.setdefault("rollingUpdate", {})
                rolling.setdefault("maxUnavailable", "25%")
                rolling.setdefault("maxSurge", "25%")
            _default_template(spec)
        case "replicasets":
            assert spec is not None
            spec.setdefault("replicas", 1)
            _default_template(spec)
        case "statefulsets":
            assert spec is not None
            spec.setdefault("replicas", 1)
            spec.setdefault("podManagementPolicy", "OrderedReady")
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
            spec.setdefault("persistentVolumeClaimRetentionPolicy",
                            {"whenDeleted": "Retain", "whenScaled": "Retain"})
            _default_template(spec)
        case "daemonsets":
            assert spec is not None
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {
                "maxUnavailable": 1, "maxSurge": 0}})
            _default_template(spec)
        case "jobs":
            assert spec is not None
            spec.setdefault("parallelism", 1)
            spec.setdefault("completions", 1)
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completionMode", "NonIndexed")
            spec.setdefault("suspend", False)
            spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
            spec.setdefault("manualSelector", False)
            _default_template(spec)
            spec["template"]["spec"].setdefault("restartPolicy", "Never")
        case "cronjobs":
            assert spec is not None
            spec.setdefault("concurrencyPolicy", "Allow")
            spec.setdefault("suspend", False)
            spec.setdefault("successfulJobsHistoryLimit", 3)
            spec.setdefault("failedJobsHistoryLimit", 1)
            job_spec = spec.setdefault("jobTemplate", {}).setdefault("spec", {})
            job_spec.setdefault("template", {}).setdefault("metadata", {})
            default_pod_spec(job_spec["template"].setdefault("spec", {}))
        case "services":
            assert spec is not None
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("sessionAffinity", "None")
            if spec.get("type") != "ExternalName" and spec.get("clusterIP") != "None":
                spec.setdefault("clusterIP", allocator.cluster_ip())
            if spec.get("clusterIP"):
                spec.setdefault("clusterIPs", [spec["clusterIP"]])
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
            spec.setdefault("internalTrafficPolicy", "Cluster")
            node_ports = spec.get("type") in ("NodePort", "LoadBalancer")
            if node_ports:
                spec.setdefault("externalTrafficPolicy", "Cluster")
            if spec.get("type") == "LoadBalancer":
                spec.setdefault("allocateLoadBalancerNodePorts", True)
            for port in spec.get("ports") or []:
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
                if node_ports and spec.get("allocateLoadBalancerNodePorts", True):
                    port.setdefault("nodePort", allocator.node_port())
            obj.setdefault("status", {}).setdefault("loadBalancer", {})
        case "persistentvolumeclaims":
            assert spec is not None
            spec.setdefault("volumeMode", "Filesystem")
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        case "horizontalpodautoscalers":
            assert spec is not None
            spec.setdefault("minReplicas", 1)
            if not spec.get("metrics"):
                # autoscaling/v2 defaulting: no metrics means 80% average CPU utilization.
                spec["metrics"] = [{"type": "Resource", "resource": {
                    "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]


_NO_SPEC = {"configmaps", "secrets", "events", "serviceaccounts", "endpointslices", "controllerrevisions"}


#: apimachinery's TotalAnnotationSizeLimitB: the sum of every annotation's key and value, in bytes
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024


def annotations_size(annotations: dict[str, Any]) -> int:
    """Bytes of keys and values (UTF-8, as Go's len of a string), as ValidateAnnotationsSize sums."""
    return sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())


def validate(kind: Kind, obj: dict[str, Any]) -> None:
    """The handful of semantic checks whose errors a user is likely to meet."""
    name = obj.get("metadata", {}).get("name", "")
    spec = obj.get("spec") or {}
    causes: list[tuple[str, str]] = []
    annotations = obj.get("metadata", {}).get("annotations") or {}
    if isinstance(annotations, dict) and annotations_size(annotations) > TOTAL_ANNOTATION_SIZE_LIMIT:
        # apimachinery ValidateAnnotationsSize: field.TooLong(metadata.annotations, "", limit)
        causes.append(("metadata.annotations",
                       f"Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"))
    if kind.plural == "pods":
        if not spec.get("containers"):
            causes.append(("spec.containers", "Required value"))
        for i, container in enumerate(spec.get("containers") or []):
            if not container.get("image"):
                causes.append((f"spec.containers[{i}].image", "Required value"))
            if not container.get("name"):
                causes.append((f"spec.containers[{i}].name", "Required value"))
    if kind.plural in ("deployments", "replicasets", "statefulsets", "daemonsets"):
        selector = spec.get("selector")
        labels = (spec.get("template", {}).get("metadata") or {}).get("labels") or {}
        if not selector:
            causes.append(("spec.selector", "Required value"))
        else:
            wanted = selector.get("matchLabels") or {}
            if any(labels.get(k) != v for k, v in wanted.items()):
                causes.append(("spec.template.metadata.labels",
                               f"Invalid value: {_go_map(labels)}: `selector` does not match template `labels`"))
        if not (spec.get("template", {}).get("spec") or {}).get("containers"):
            causes.append(("spec.template.spec.containers", "Required value"))
    if kind.plural == "cronjobs" and kind.group == "batch":
        causes.extend(_cronjob_causes(spec))
    if kind.plural == "configmaps" or kind.plural == "secrets":
        for key in [*(obj.get("data") or {}), *(obj.get("binaryData") or {})]:
            if not re.match(r"^[-._a-zA-Z0-9]+$", key):
                causes.append((f"data[{key}]", f'Invalid value: "{key}": a valid config key must consist of alphanumeric characters, \'-\', \'_\' or \'.\' (e.g. \'key.name\',  or \'KEY_NAME\',  or \'key-name\', regex used for validation is \'[-._a-zA-Z0-9]+\')'))
    if kind.group == "rbac.authorization.k8s.io":
        causes.extend(_rbac_causes(kind, obj))
    if causes:
        raise invalid(kind.kind, kind.group, name, causes)


_RBAC_GROUP = "rbac.authorization.k8s.io"


def _quoted(values: Any) -> str:
    return f"[]string{{{', '.join(json.dumps(str(v)) for v in values)}}}"


_STRING_LISTS = ("verbs", "apiGroups", "resources", "resourceNames", "nonResourceURLs")


def _decode_error(kind_name: str, field: str, value: Any, go_type: str) -> ApiError:
    """What the API server answers a body it cannot decode into the Go type (400, not 422)."""
    json_type = {str: "string", bool: "bool", int: "number", float: "number", list: "array",
                 dict: "object"}.get(type(value), "null")
    return ApiError(400, "BadRequest", f'{kind_name} in version "v1" cannot be handled as a {kind_name}: json: '
                    f"cannot unmarshal {json_type} into Go struct field {field} of type {go_type}")


def _rbac_types(kind_name: str, plural: str, obj: dict[str, Any]) -> None:
    """The shapes the Go types impose: a string where a list belongs is a decode error."""
    def strings(value: Any, field: str) -> None:
        if value is None:
            return
        if not isinstance(value, list):
            raise _decode_error(kind_name, field, value, "[]string")
        for item in value:
            if not isinstance(item, str):
                raise _decode_error(kind_name, field, item, "string")

    def mapping(value: Any, field: str, go_type: str) -> None:
        if value is not None and not isinstance(value, dict):
            raise _decode_error(kind_name, field, value, go_type)

    if plural in ("roles", "clusterroles"):
        rules = obj.get("rules")
        if rules is not None and not isinstance(rules, list):
            raise _decode_error(kind_name, f"{kind_name}.rules", rules, "[]v1.PolicyRule")
        for rule in rules or []:
            mapping(rule, f"{kind_name}.rules", "v1.PolicyRule")
            for field in _STRING_LISTS:
                strings((rule or {}).get(field), f"PolicyRule.rules.{field}")
        aggregation = obj.get("aggregationRule")
        mapping(aggregation, f"{kind_name}.aggregationRule", "v1.AggregationRule")
        selectors = (aggregation or {}).get("clusterRoleSelectors")
        if selectors is not None and not isinstance(selectors, list):
            raise _decode_error(kind_name, "AggregationRule.aggregationRule.clusterRoleSelectors", selectors,
                                "[]v1.LabelSelector")
        for selector in selectors or []:
            mapping(selector, "AggregationRule.aggregationRule.clusterRoleSelectors", "v1.LabelSelector")
            labels = (selector or {}).get("matchLabels")
            mapping(labels, "LabelSelector.aggregationRule.clusterRoleSelectors.matchLabels", "map[string]string")
            for value in (labels or {}).values():
                if not isinstance(value, str):
                    raise _decode_error(kind_name, "LabelSelector.aggregationRule.clusterRoleSelectors.matchLabels",
                                        value, "string")
            expressions = (selector or {}).get("matchExpressions")
            if expressions is not None and not isinstance(expressions, list):
                raise _decode_error(kind_name, "LabelSelector.aggregationRule.clusterRoleSelectors.matchExpressions",
                                    expressions, "[]v1.LabelSelectorRequirement")
            for expression in expressions or []:
                mapping(expression, "LabelSelector.aggregationRule.clusterRoleSelectors.matchExpressions",
                        "v1.LabelSelectorRequirement")
                strings((expression or {}).get("values"), "LabelSelectorRequirement.values")
        return
    mapping(obj.get("roleRef"), f"{kind_name}.roleRef", "v1.RoleRef")
    subjects = obj.get("subjects")
    if subjects is not None and not isinstance(subjects, list):
        raise _decode_error(kind_name, f"{kind_name}.subjects", subjects, "[]v1.Subject")
    for subject in subjects or []:
        mapping(subject, f"{kind_name}.subjects", "v1.Subject")
        for field in ("kind", "name", "namespace", "apiGroup"):
            value = (subject or {}).get(field)
            if value is not None and not isinstance(value, str):
                raise _decode_error(kind_name, f"Subject.subjects.{field}", value, "string")


def _rbac_causes(kind: Kind, obj: dict[str, Any]) -> list[tuple[str, str]]:
    """kube's rbac validation (pkg/apis/rbac/validation) for the mistakes one makes by hand, once
    ``_rbac_types`` found the shapes right (lists are lists; an item may still be null)."""
    plural = kind.plural
    _rbac_types(kind.kind, plural, obj)
    causes: list[tuple[str, str]] = []
    if plural in ("roles", "clusterroles"):
        for i, rule in enumerate(obj.get("rules") or []):
            where = f"rules[{i}]"
            if not isinstance(rule, dict):
                causes.append((where, "Invalid value: must be a PolicyRule object"))
                continue
            if not rule.get("verbs"):
                causes.append((f"{where}.verbs", "Required value: verbs must contain at least one value"))
            urls = rule.get("nonResourceURLs") or []
            if urls:
                if plural == "roles":
                    causes.append((f"{where}.nonResourceURLs", f"Invalid value: {_quoted(urls)}: namespaced "
                                   "rules cannot apply to non-resource URLs"))
                if rule.get("apiGroups") or rule.get("resources"):
                    causes.append((f"{where}.nonResourceURLs", f"Invalid value: {_quoted(urls)}: rules cannot "
                                   "apply to both regular resources and non-resource URLs"))
            else:
                if not rule.get("apiGroups"):
                    causes.append((f"{where}.apiGroups", "Required value: resource rules must supply at least "
                                   "one api group"))
                if not rule.get("resources"):
                    causes.append((f"{where}.resources", "Required value: resource rules must supply at least "
                                   "one resource"))
        return causes
    ref = obj.get("roleRef")
    if not isinstance(ref, dict):
        return [("roleRef.name", "Required value")]
    kinds = ("Role", "ClusterRole") if plural == "rolebindings" else ("ClusterRole",)
    if ref.get("apiGroup") != _RBAC_GROUP:
        causes.append(("roleRef.apiGroup", f'Unsupported value: {json.dumps(ref.get("apiGroup", ""))}: supported '
                       f'values: "{_RBAC_GROUP}"'))
    if ref.get("kind") not in kinds:
        causes.append(("roleRef.kind", f'Unsupported value: {json.dumps(ref.get("kind", ""))}: supported values: '
                       + ", ".join(f'"{k}"' for k in kinds)))
    if not ref.get("name"):
        causes.append(("roleRef.name", "Required value"))
    for i, subject in enumerate(obj.get("subjects") or []):
        where = f"subjects[{i}]"
        if not isinstance(subject, dict):
            causes.append((where, "Invalid value: must be a Subject object"))
            continue
        if not subject.get("name"):
            causes.append((f"{where}.name", "Required value"))
        subject_kind = subject.get("kind")
        if subject_kind not in ("ServiceAccount", "User", "Group"):
            causes.append((f"{where}.kind", f'Unsupported value: {json.dumps(subject_kind or "")}: supported values: '
                           '"ServiceAccount", "User", "Group"'))
        elif subject_kind == "ServiceAccount" and plural == "clusterrolebindings" and not subject.get("namespace"):
            causes.append((f"{where}.namespace", "Required value"))
    return causes


def _cronjob_causes(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """ValidateCronJobSpec's schedule and timeZone checks (pkg/apis/batch/validation)."""
    causes: list[tuple[str, str]] = []
    schedule = spec.get("schedule")
    if not schedule:
        causes.append(("spec.schedule", "Required value"))
    elif not isinstance(schedule, str):
        causes.append(("spec.schedule", f"Invalid value: {json.dumps(schedule)}: must be a string"))
    elif "TZ" in schedule:
        causes.append(("spec.schedule", f"Invalid value: {json.dumps(schedule)}: cannot use TZ or "
                       "CRON_TZ in schedule, use timeZone field instead"))
    else:
        try:
            cron.parse(schedule)
        except cron.ScheduleError as exc:
            causes.append(("spec.schedule", f"Invalid value: {json.dumps(schedule)}: {exc}"))
    zone = spec.get("timeZone")
    if zone is not None:
        if zone == "Local":
            causes.append(("spec.timeZone", 'Invalid value: "Local": timeZone must be an explicit '
                           "time zone as defined in https://www.iana.org/time-zones"))
        else:
            try:
                cron.zone(str(zone))
            except ValueError as exc:
                causes.append(("spec.timeZone", f"Invalid value: {json.dumps(zone)}: {exc}"))
    return causes


def validate_update(kind: Kind, old: dict[str, Any], new: dict[str, Any]) -> None:
    """What may not change once created (ValidateRoleBindingUpdate: a binding's roleRef)."""
    if kind.group == _RBAC_GROUP and kind.plural in ("rolebindings", "clusterrolebindings"):
        ref = new.get("roleRef") or {}
        if ref != (old.get("roleRef") or {}):
            text = (f'rbac.RoleRef{{APIGroup:"{ref.get("apiGroup", "")}", Kind:"{ref.get("kind", "")}", '
                    f'Name:"{ref.get("name", "")}"}}')
            raise invalid(kind.kind, kind.group, new.get("metadata", {}).get("name", ""),
                          [("roleRef", f"Invalid value: {text}: cannot change roleRef")])


def _go_map(labels: dict[str, str]) -> str:
    return "map[string]string{" + ", ".join(f'"{k}":"{v}"' for k, v in sorted(labels.items())) + "}"


__all__ = ["Allocator", "ApiError", "apply_defaults", "default_pod_spec", "validate", "validate_name", "validate_update"]
