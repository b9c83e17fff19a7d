"""The well-known references between objects that are not ownerReferences: what a Pod uses, which
Services an Ingress routes to, what an HPA scales, which PV a claim binds, which Service an
EndpointSlice serves, and label selectors. Each reader is linear in the size of the object it reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from kasd.envgraph.identity import group_version, mapping, seq, text

__all__ = [
    "SERVICE_NAME_LABEL",
    "ingress_services",
    "pod_uses",
    "scale_target",
    "selector_string",
    "service_selector",
]

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def _named(kind: str, name: object) -> Iterator[tuple[str, str]]:
    if isinstance(name, str) and name:
        yield kind, name


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in seq(spec.get(field)):
            yield mapping(container)


def pod_uses(pod: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(Kind, name) of each ConfigMap, Secret, PersistentVolumeClaim and ServiceAccount the pod uses,
    in the pod's namespace: volumes (configMap, secret, persistentVolumeClaim, projected sources, and
    the claim an ephemeral volume makes, ``<pod>-<volume>``), env/envFrom of every container (init and
    ephemeral ones too), imagePullSecrets, and the service account. May repeat a pair."""
    spec = mapping(pod.get("spec"))
    pod_name = text(mapping(pod.get("metadata")).get("name"))
    for raw in seq(spec.get("volumes")):
        volume = mapping(raw)
        yield from _named("ConfigMap", mapping(volume.get("configMap")).get("name"))
        yield from _named("Secret", mapping(volume.get("secret")).get("secretName"))
        yield from _named("PersistentVolumeClaim",
                          mapping(volume.get("persistentVolumeClaim")).get("claimName"))
        if "ephemeral" in volume and text(volume.get("name")):
            yield "PersistentVolumeClaim", f"{pod_name}-{text(volume.get('name'))}"
        for source in seq(mapping(volume.get("projected")).get("sources")):
            yield from _named("ConfigMap", mapping(mapping(source).get("configMap")).get("name"))
            yield from _named("Secret", mapping(mapping(source).get("secret")).get("name"))
    for container in _containers(spec):
        for env in seq(container.get("env")):
            value_from = mapping(mapping(env).get("valueFrom"))
            yield from _named("ConfigMap", mapping(value_from.get("configMapKeyRef")).get("name"))
            yield from _named("Secret", mapping(value_from.get("secretKeyRef")).get("name"))
        for env_from in seq(container.get("envFrom")):
            yield from _named("ConfigMap", mapping(mapping(env_from).get("configMapRef")).get("name"))
            yield from _named("Secret", mapping(mapping(env_from).get("secretRef")).get("name"))
    for pull in seq(spec.get("imagePullSecrets")):
        yield from _named("Secret", mapping(pull).get("name"))
    yield from _named("ServiceAccount",
                      spec.get("serviceAccountName") or spec.get("serviceAccount"))


def ingress_services(ingress: Mapping[str, Any]) -> set[str]:
    """Names of the Services an Ingress routes to: the default backend and every rule's paths, in
    both networking.k8s.io/v1 (``backend.service.name``) and the old ``backend.serviceName``."""
    spec = mapping(ingress.get("spec"))
    backends = [mapping(spec.get("defaultBackend")), mapping(spec.get("backend"))]
    for rule in seq(spec.get("rules")):
        for path in seq(mapping(mapping(rule).get("http")).get("paths")):
            backends.append(mapping(mapping(path).get("backend")))
    names = set()
    for backend in backends:
        for name in (mapping(backend.get("service")).get("name"), backend.get("serviceName")):
            if isinstance(name, str) and name:
                names.add(name)
    return names


def scale_target(hpa: Mapping[str, Any]) -> tuple[str | None, str, str] | None:
    """(group or None when the reference names no apiVersion, Kind, name) of what an HPA scales."""
    ref = mapping(mapping(hpa.get("spec")).get("scaleTargetRef"))
    kind, name = text(ref.get("kind")), text(ref.get("name"))
    if not kind or not name:
        return None
    api_version = text(ref.get("apiVersion"))
    return (group_version(api_version)[0] if api_version else None), kind, name


def service_selector(service: Mapping[str, Any]) -> dict[str, str]:
    """A Service's pod selector; empty (selects nothing) when absent or not all strings."""
    selector = mapping(mapping(service.get("spec")).get("selector"))
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
        return {}
    return dict(selector)


# A label key (optional DNS-subdomain prefix, then a name of at most 63) and a label value, as the
# API server validates them: what goes into a labelSelector can then never be another term.
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def _label(key: object, value: object = "") -> bool:
    return (isinstance(key, str) and isinstance(value, str)
            and _LABEL_KEY.fullmatch(key) is not None and _LABEL_VALUE.fullmatch(value) is not None)


def selector_string(selector: Mapping[str, Any]) -> str | None:
    """A ``metav1.LabelSelector`` (matchLabels, matchExpressions) as a ``labelSelector`` query
    value; None when it has no term or one this cannot write (then nothing should be fetched by it:
    an empty selector would select everything), or a key or value the API server would refuse."""
    terms = []
    for key, value in sorted(mapping(selector.get("matchLabels")).items()):
        if not _label(key, value):
            return None
        terms.append(f"{key}={value}")
    for raw in seq(selector.get("matchExpressions")):
        expr = mapping(raw)
        key, operator = text(expr.get("key")), expr.get("operator")
        values = [v for v in seq(expr.get("values")) if isinstance(v, str)]
        if not _label(key) or not all(_label(key, v) for v in values):
            return None
        if operator in ("In", "NotIn") and values:
            terms.append(f"{key} {operator.lower()} ({','.join(sorted(values))})")
        elif operator == "Exists":
            terms.append(key)
        elif operator == "DoesNotExist":
            terms.append(f"!{key}")
        else:
            return None
    return ",".join(terms) or None
