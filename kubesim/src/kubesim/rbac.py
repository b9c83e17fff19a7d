"""Who may do what: kube-apiserver's impersonation filter and its RBAC authorizer, for kubesim.

A request reaches here authenticated as a `UserInfo`: kubesim's own token is `kubesim-admin` in
`system:masters`, which no authorizer is asked about (as on a real cluster); a token kubesim's
TokenRequest API issued is its service account. `Impersonate-*` headers are then checked as the
real filter checks them (staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go): the
caller needs `impersonate` on `users` (or on the `serviceaccounts` named), `groups`, `uids` and
`userextras/<key>`; the request then runs as the impersonated user, and RBAC (plugin/pkg/auth/
authorizer/rbac) decides from the stored Roles, ClusterRoles and their bindings. The 403 texts are
the server's own (apiserver/pkg/endpoints/handlers/responsewriters/errors.go, forbiddenMessage).

`bootstrap` stores the ClusterRoles a fresh cluster has — `cluster-admin`, the aggregated `admin`,
`edit` and `view`, and the discovery and self-review roles every authenticated user is bound to.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote

import attrs

from kubesim.errors import ApiError
from kubesim.selectors import selector_from_match_labels

RBAC_GROUP = "rbac.authorization.k8s.io"
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"


@attrs.frozen(kw_only=True)
class UserInfo:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)

    def document(self) -> dict[str, Any]:
        """The `userInfo` of a SelfSubjectReview."""
        doc: dict[str, Any] = {"username": self.username}
        if self.uid:
            doc["uid"] = self.uid
        if self.groups:
            doc["groups"] = list(self.groups)
        if self.extra:
            doc["extra"] = {k: list(v) for k, v in self.extra.items()}
        return doc


#: Whoever holds kubesim's own token.
ADMIN = UserInfo(username="kubesim-admin", groups=(MASTERS, AUTHENTICATED))
#: A request without credentials (allowed only where kubesim lets one through at all).
ANONYMOUS = UserInfo(username="system:anonymous", groups=(UNAUTHENTICATED,))


def service_account_user(namespace: str, name: str, uid: str) -> UserInfo:
    return UserInfo(username=f"system:serviceaccount:{namespace}:{name}", uid=uid,
                    groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                            AUTHENTICATED))


@attrs.frozen(kw_only=True)
class Attributes:
    """What a request asks to do, as kube-apiserver's RequestInfo names it."""

    verb: str
    resource_request: bool
    path: str = ""
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


_CONNECT = ("exec", "attach", "portforward")
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


def _name_from_field_selector(selector: str) -> str:
    """``metadata.name=<x>`` (or ``==``) as the only term of a field selector: ``x``."""
    terms = [t for t in selector.split(",") if t]
    if len(terms) != 1:
        return ""
    for op in ("==", "="):
        key, sep, value = terms[0].partition(op)
        if sep and key.strip() == "metadata.name" and not key.endswith("!"):
            return value.strip()
    return ""


def request_attributes(method: str, path: str, query_string: str) -> Attributes:
    """The RequestInfo of a request (apiserver/pkg/endpoints/request/requestinfo.go)."""
    method = method.upper()
    parts = [p for p in path.strip("/").split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return Attributes(verb=method.lower(), resource_request=False, path=path)
    verb = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete"}.get(method, method.lower())
    if rest[0] == "watch":
        verb, rest = "watch", rest[1:]
        if not rest:
            return Attributes(verb=method.lower(), resource_request=False, path=path)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        # /namespaces/<name>/status and /finalize are the namespace's own subresources
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if not name:
        query = parse_qs(query_string)
        if verb == "get":
            watch = (query.get("watch") or [""])[0].lower() in ("1", "true")
            verb = "watch" if watch else "list"
        elif verb == "delete":
            verb = "deletecollection"
        if verb in ("list", "watch"):
            # a list or watch of one object by name is authorized as that object (resourceNames)
            name = _name_from_field_selector((query.get("fieldSelector") or [""])[0])
    if resource == "pods" and subresource in _CONNECT:
        # Since 1.31 a WebSocket (GET) exec, attach or port-forward needs `create` as SPDY's POST
        # does (the AuthorizePodWebsocketUpgradeCreatePermission gate, on by default).
        verb = "create"
    return Attributes(verb=verb, resource_request=True, path=path, api_group=group,
                      resource=resource, subresource=subresource, namespace=namespace, name=name)


# -- rules ------------------------------------------------------------------------------------


def _has(values: Iterable[str], wanted: str) -> bool:
    return any(v == "*" or v == wanted for v in values)


def _resource_matches(rule: Mapping[str, Any], attrs_: Attributes) -> bool:
    combined = f"{attrs_.resource}/{attrs_.subresource}" if attrs_.subresource else attrs_.resource
    for resource in rule.get("resources") or ():
        if resource in ("*", combined):
            return True
        if attrs_.subresource and resource == f"*/{attrs_.subresource}":
            return True
    return False


def rule_allows(rule: Mapping[str, Any], attrs_: Attributes) -> bool:
    if not isinstance(rule, Mapping) or not _has(rule.get("verbs") or (), attrs_.verb):
        return False
    if not attrs_.resource_request:
        for url in rule.get("nonResourceURLs") or ():
            if url == attrs_.path or (url.endswith("*") and attrs_.path.startswith(url[:-1])):
                return True
        return False
    if not _has(rule.get("apiGroups") or (), attrs_.api_group):
        return False
    if not _resource_matches(rule, attrs_):
        return False
    names = rule.get("resourceNames") or ()
    return not names or attrs_.name in names


def _subject_applies(subject: Any, user: UserInfo, binding_namespace: str) -> bool:
    if not isinstance(subject, Mapping):
        return False
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return bool(name == user.username)
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user.username == f"system:serviceaccount:{namespace}:{name}"
    return False


@attrs.frozen
class Grant:
    """One binding that applies to a user, with the rules its role holds."""

    binding: str  # `RoleBinding "name/namespace"` or `ClusterRoleBinding "name"`
    role: str  # `ClusterRole "admin"` or `Role "name"`
    subject: str  # `User "alice"`, `Group "x"`
    rules: tuple[Mapping[str, Any], ...]


class Authorizer:
    """RBAC over a kubesim store's Roles, ClusterRoles and bindings, read at each question."""

    def __init__(self, store: Any) -> None:
        self.store = store
        # aggregated rules by role name, with the ClusterRoles' versions they were computed from
        self._aggregated: dict[str, tuple[tuple[tuple[str, str], ...], tuple[Mapping[str, Any], ...]]] = {}

    def _objects(self, plural: str, namespace: str | None = None) -> Iterator[dict[str, Any]]:
        yield from self.store.iter_objects(RBAC_GROUP, plural, namespace)

    def cluster_role_rules(self, name: str) -> tuple[Mapping[str, Any], ...]:
        roles = {r["metadata"]["name"]: r for r in self._objects("clusterroles")}
        role = roles.get(name)
        if role is None:
            return ()
        aggregation = role.get("aggregationRule")
        if not isinstance(aggregation, dict) or not aggregation:
            return tuple(role.get("rules") or ())
        versions = tuple(sorted((n, str(r["metadata"].get("resourceVersion", ""))) for n, r in roles.items()))
        cached = self._aggregated.get(name)
        if cached is not None and cached[0] == versions:
            return cached[1]
        rules = self._aggregate(name, aggregation, roles)
        self._aggregated[name] = (versions, rules)
        return rules

    @staticmethod
    def _aggregate(name: str, aggregation: Mapping[str, Any],
                   roles: Mapping[str, dict[str, Any]]) -> tuple[Mapping[str, Any], ...]:
        # What the clusterrole-aggregation controller keeps in `rules`, computed when asked.
        selectors = [selector_from_match_labels(s) for s in aggregation.get("clusterRoleSelectors") or ()
                     if isinstance(s, dict)]
        rules: list[Mapping[str, Any]] = []
        for other_name in sorted(roles):
            other = roles[other_name]
            if other_name != name and any(match(other) for match in selectors):
                rules.extend(r for r in other.get("rules") or () if r not in rules)
        return tuple(rules)

    def _role_rules(self, ref: Mapping[str, Any], namespace: str) -> tuple[Mapping[str, Any], ...]:
        if ref.get("kind") == "ClusterRole":
            return self.cluster_role_rules(str(ref.get("name")))
        if ref.get("kind") == "Role" and namespace:
            role = self.store.find(self.store.kind(RBAC_GROUP, "roles"), namespace, ref.get("name"))
            return tuple((role or {}).get("rules") or ())
        return ()

    def grants(self, user: UserInfo, namespace: str) -> Iterator[Grant]:
        """The bindings that apply to `user` for a request in `namespace` ("" if cluster-wide)."""
        sources = [("ClusterRoleBinding", b) for b in self._objects("clusterrolebindings")]
        if namespace:
            sources += [("RoleBinding", b) for b in self._objects("rolebindings", namespace)]
        for kind, binding in sources:
            meta = binding["metadata"]
            where = meta.get("namespace", "") if kind == "RoleBinding" else ""
            for subject in binding.get("subjects") or ():
                if _subject_applies(subject, user, where):
                    ref = binding.get("roleRef") if isinstance(binding.get("roleRef"), dict) else {}
                    label = f'{meta["name"]}/{where}' if where else meta["name"]
                    who = subject.get("name")
                    if subject.get("kind") == "ServiceAccount":
                        who = f'{who}/{subject.get("namespace") or where}'
                    yield Grant(binding=f'{kind} "{label}"',
                                role=f'{ref.get("kind")} "{ref.get("name")}"',
                                subject=f'{subject.get("kind")} "{who}"',
                                rules=self._role_rules(ref, where))
                    break

    def authorize(self, user: UserInfo, attrs_: Attributes) -> tuple[bool, str]:
        """(allowed, reason) as the RBAC authorizer reports them."""
        if MASTERS in user.groups:
            return True, ""
        for grant in self.grants(user, attrs_.namespace):
            if any(rule_allows(rule, attrs_) for rule in grant.rules):
                return True, f"RBAC: allowed by {grant.binding} of {grant.role} to {grant.subject}"
        return False, ""

    def rules_review(self, user: UserInfo, namespace: str) -> dict[str, Any]:
        """The `status` of a SelfSubjectRulesReview."""
        if MASTERS in user.groups:
            return {"resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                    "incomplete": False}
        resource_rules: list[dict[str, Any]] = []
        non_resource_rules: list[dict[str, Any]] = []
        for grant in self.grants(user, namespace):
            for rule in grant.rules:
                if rule.get("nonResourceURLs"):
                    entry = {"verbs": list(rule.get("verbs") or ()),
                             "nonResourceURLs": list(rule["nonResourceURLs"])}
                    if entry not in non_resource_rules:
                        non_resource_rules.append(entry)
                else:
                    entry = {k: list(rule[k]) for k in ("verbs", "apiGroups", "resources", "resourceNames")
                             if rule.get(k)}
                    if entry not in resource_rules:
                        resource_rules.append(entry)
        return {"resourceRules": resource_rules, "nonResourceRules": non_resource_rules,
                "incomplete": False}

    def access_review(self, user: UserInfo, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The `status` of a SelfSubjectAccessReview."""
        resource = spec.get("resourceAttributes")
        if resource:
            attrs_ = Attributes(verb=str(resource.get("verb", "")), resource_request=True,
                                api_group=str(resource.get("group", "")),
                                resource=str(resource.get("resource", "")),
                                subresource=str(resource.get("subresource", "")),
                                namespace=str(resource.get("namespace", "")),
                                name=str(resource.get("name", "")))
        else:
            other = spec.get("nonResourceAttributes") or {}
            attrs_ = Attributes(verb=str(other.get("verb", "")), resource_request=False,
                                path=str(other.get("path", "")))
        allowed, reason = self.authorize(user, attrs_)
        status: dict[str, Any] = {"allowed": allowed}
        if reason:
            status["reason"] = reason
        return status


# -- the 403 texts ----------------------------------------------------------------------------


def forbidden(user: UserInfo, attrs_: Attributes) -> ApiError:
    """The Forbidden Status kube-apiserver answers when authorization says no."""
    if not attrs_.resource_request:
        return ApiError(403, "Forbidden",
                        f'forbidden: User "{user.username}" cannot {attrs_.verb} path "{attrs_.path}"',
                        details={})
    resource = f"{attrs_.resource}/{attrs_.subresource}" if attrs_.subresource else attrs_.resource
    group_resource = f"{attrs_.resource}.{attrs_.api_group}" if attrs_.api_group else attrs_.resource
    subject = f'{group_resource} "{attrs_.name}"' if attrs_.name else group_resource
    scope = f'in the namespace "{attrs_.namespace}"' if attrs_.namespace else "at the cluster scope"
    message = (f'{subject} is forbidden: User "{user.username}" cannot {attrs_.verb} resource '
               f'"{resource}" in API group "{attrs_.api_group}" {scope}')
    details: dict[str, Any] = {"kind": attrs_.resource}
    if attrs_.name:
        details["name"] = attrs_.name
    if attrs_.api_group:
        details["group"] = attrs_.api_group
    return ApiError(403, "Forbidden", message, details=details)


# -- impersonation ----------------------------------------------------------------------------


def impersonate(authorizer: Authorizer, caller: UserInfo, headers: Sequence[tuple[str, str]]) -> UserInfo:
    """The user a request runs as: `caller`, or whom its Impersonate-* headers name if allowed.
    `headers`: (lower-cased name, value) as sent — each Impersonate-Group or -Extra-* header is one
    value, commas and all, as the real filter reads them."""
    asked = [(n, v) for n, v in headers if n.startswith("impersonate-")]
    if not asked:
        return caller
    username = next((v for n, v in asked if n == "impersonate-user"), "")
    uid = next((v for n, v in asked if n == "impersonate-uid"), "")
    groups = [v for n, v in asked if n == "impersonate-group"]
    extra: dict[str, tuple[str, ...]] = {}
    for name, value in asked:
        if name.startswith("impersonate-extra-"):
            key = unquote(name[len("impersonate-extra-"):]).lower()
            extra[key] = (*extra.get(key, ()), value)
    if not username:
        raise ApiError(500, "InternalError", "Internal error occurred: requested impersonation "
                       "of groups, extra or uid without impersonating a user")
    checks: list[Attributes] = []
    sa_prefix = "system:serviceaccount:"
    if username.startswith(sa_prefix) and username.count(":") == 3:
        namespace, account = username[len(sa_prefix):].split(":")
        checks.append(Attributes(verb="impersonate", resource_request=True,
                                 resource="serviceaccounts", namespace=namespace, name=account))
        if not groups:
            groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    else:
        checks.append(Attributes(verb="impersonate", resource_request=True, resource="users",
                                 name=username))
    checks += [Attributes(verb="impersonate", resource_request=True, resource="groups", name=g)
               for g in groups]
    for key, values in extra.items():
        checks += [Attributes(verb="impersonate", resource_request=True,
                              api_group="authentication.k8s.io", resource="userextras",
                              subresource=key, name=v) for v in values]
    if uid:
        checks.append(Attributes(verb="impersonate", resource_request=True,
                                 api_group="authentication.k8s.io", resource="uids", name=uid))
    for check in checks:
        allowed, _ = authorizer.authorize(caller, check)
        if not allowed:
            raise forbidden(caller, check)
    if username == "system:anonymous":
        if UNAUTHENTICATED not in groups:
            groups.append(UNAUTHENTICATED)
    elif AUTHENTICATED not in groups and UNAUTHENTICATED not in groups:
        groups.append(AUTHENTICATED)
    return UserInfo(username=username, uid=uid, groups=tuple(groups), extra=extra)


# -- the roles a fresh cluster has ------------------------------------------------------------

_READ = ["get", "list", "watch"]
_WRITE = ["create", "delete", "deletecollection", "patch", "update"]
_ALL = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _rule(verbs: list[str], groups: list[str], resources: list[str]) -> dict[str, Any]:
    return {"verbs": verbs, "apiGroups": groups, "resources": resources}


def _aggregate_labels(*roles: str) -> dict[str, str]:
    return {f"{RBAC_GROUP}/aggregate-to-{r}": "true" for r in roles}


_VIEW_RULES = [
    _rule(_READ, [""], ["configmaps", "endpoints", "persistentvolumeclaims",
                        "persistentvolumeclaims/status", "pods", "replicationcontrollers",
                        "replicationcontrollers/scale", "serviceaccounts", "services",
                        "services/status"]),
    _rule(_READ, [""], ["bindings", "events", "limitranges", "namespaces/status", "pods/log",
                        "pods/status", "replicationcontrollers/status", "resourcequotas",
                        "resourcequotas/status"]),
    _rule(_READ, [""], ["namespaces"]),
    _rule(_READ, ["discovery.k8s.io"], ["endpointslices"]),
    _rule(_READ, ["apps"], ["controllerrevisions", "daemonsets", "daemonsets/status", "deployments",
                            "deployments/scale", "deployments/status", "replicasets",
                            "replicasets/scale", "replicasets/status", "statefulsets",
                            "statefulsets/scale", "statefulsets/status"]),
    _rule(_READ, ["autoscaling"], ["horizontalpodautoscalers", "horizontalpodautoscalers/status"]),
    _rule(_READ, ["batch"], ["cronjobs", "cronjobs/status", "jobs", "jobs/status"]),
    _rule(_READ, ["policy"], ["poddisruptionbudgets", "poddisruptionbudgets/status"]),
    _rule(_READ, ["networking.k8s.io"], ["ingresses", "ingresses/status", "networkpolicies"]),
]
_EDIT_RULES = [
    _rule(_READ, [""], ["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets",
                        "services/proxy"]),
    _rule(["impersonate"], [""], ["serviceaccounts"]),
    _rule(_WRITE, [""], ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"]),
    _rule(["create"], [""], ["pods/eviction"]),
    _rule(_WRITE, [""], ["configmaps", "events", "persistentvolumeclaims", "replicationcontrollers",
                         "replicationcontrollers/scale", "secrets", "serviceaccounts", "services",
                         "services/proxy"]),
    _rule(["create"], [""], ["serviceaccounts/token"]),
    _rule(_WRITE, ["apps"], ["daemonsets", "deployments", "deployments/rollback", "deployments/scale",
                             "replicasets", "replicasets/scale", "statefulsets",
                             "statefulsets/scale"]),
    _rule(_WRITE, ["autoscaling"], ["horizontalpodautoscalers"]),
    _rule(_WRITE, ["batch"], ["cronjobs", "jobs"]),
    _rule(_WRITE, ["policy"], ["poddisruptionbudgets"]),
    _rule(_WRITE, ["networking.k8s.io"], ["ingresses", "networkpolicies"]),
    _rule(_ALL, ["coordination.k8s.io"], ["leases"]),
]
_ADMIN_RULES = [
    _rule(["create"], ["authorization.k8s.io"], ["localsubjectaccessreviews"]),
    _rule(_ALL, [RBAC_GROUP], ["rolebindings", "roles"]),
]
_DISCOVERY_URLS = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                   "/openapi/*", "/readyz", "/version", "/version/"]
_PUBLIC_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]


def _cluster_role(name: str, rules: list[dict[str, Any]], *, labels: dict[str, str] | None = None,
                  aggregate_from: str = "") -> dict[str, Any]:
    labels = {"kubernetes.io/bootstrapping": "rbac-defaults", **(labels or {})}
    role: dict[str, Any] = {"metadata": {"name": name, "labels": labels,
                                         "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
                            "rules": rules}
    if aggregate_from:
        role["aggregationRule"] = {"clusterRoleSelectors": [
            {"matchLabels": {f"{RBAC_GROUP}/aggregate-to-{aggregate_from}": "true"}}]}
    return role


def _binding(name: str, role: str, groups: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                         "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups]}


def bootstrap_objects() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(ClusterRoles, ClusterRoleBindings) of kube-apiserver's bootstrap policy, the parts kubesim serves."""
    user_facing = {"kubernetes.io/bootstrapping": "rbac-defaults"}
    roles = [
        _cluster_role("cluster-admin", [_rule(["*"], ["*"], ["*"]),
                                        {"verbs": ["*"], "nonResourceURLs": ["*"]}]),
        _cluster_role("admin", [], aggregate_from="admin", labels=user_facing),
        _cluster_role("edit", [], aggregate_from="edit",
                      labels=_aggregate_labels("admin")),
        _cluster_role("view", [], aggregate_from="view",
                      labels=_aggregate_labels("admin", "edit")),
        _cluster_role("system:aggregate-to-admin", _ADMIN_RULES, labels=_aggregate_labels("admin")),
        _cluster_role("system:aggregate-to-edit", _EDIT_RULES, labels=_aggregate_labels("admin", "edit")),
        _cluster_role("system:aggregate-to-view", _VIEW_RULES,
                      labels=_aggregate_labels("admin", "edit", "view")),
        _cluster_role("system:discovery", [{"verbs": ["get"], "nonResourceURLs": _DISCOVERY_URLS}]),
        _cluster_role("system:public-info-viewer", [{"verbs": ["get"], "nonResourceURLs": _PUBLIC_URLS}]),
        _cluster_role("system:basic-user", [
            _rule(["create"], ["authentication.k8s.io"], ["selfsubjectreviews"]),
            _rule(["create"], ["authorization.k8s.io"], ["selfsubjectaccessreviews",
                                                         "selfsubjectrulesreviews"])]),
    ]
    bindings = [
        _binding("cluster-admin", "cluster-admin", [MASTERS]),
        _binding("system:discovery", "system:discovery", [AUTHENTICATED]),
        _binding("system:basic-user", "system:basic-user", [AUTHENTICATED]),
        _binding("system:public-info-viewer", "system:public-info-viewer",
                 [AUTHENTICATED, "system:unauthenticated"]),
    ]
    return roles, bindings


def cluster_role_binding(name: str, role: str, *, users: Iterable[str] = (),
                         groups: Iterable[str] = ()) -> dict[str, Any]:
    """A ClusterRoleBinding of `role` to users and groups (for `serve_kubesim(objects=...)`)."""
    subjects = [{"apiGroup": RBAC_GROUP, "kind": "User", "name": u} for u in users]
    subjects += [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups]
    return {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
            "subjects": subjects}


def bootstrap(store: Any) -> None:
    """Store the bootstrap ClusterRoles and bindings (aggregated roles get their rules filled)."""
    roles, bindings = bootstrap_objects()
    role_kind = store.kind(RBAC_GROUP, "clusterroles")
    for role in roles:
        store.create(role_kind, None, role)
    authorizer = Authorizer(store)
    for role in roles:
        if role.get("aggregationRule"):
            stored = store.get(role_kind, None, role["metadata"]["name"])
            stored["rules"] = [dict(r) for r in authorizer.cluster_role_rules(role["metadata"]["name"])]
            store.update(role_kind, None, role["metadata"]["name"], stored)
    binding_kind = store.kind(RBAC_GROUP, "clusterrolebindings")
    for binding in bindings:
        store.create(binding_kind, None, binding)


def check(authorizer: Authorizer, user: UserInfo, method: str, path: str, query_string: str) -> None:
    """Raise the server's 403 unless `user` may make this request."""
    attrs_ = request_attributes(method, path, query_string)
    allowed, _ = authorizer.authorize(user, attrs_)
    if not allowed:
        raise forbidden(user, attrs_)


__all__ = ["ADMIN", "ANONYMOUS", "Attributes", "Authorizer", "UserInfo", "bootstrap", "check",
           "cluster_role_binding",
           "forbidden", "impersonate", "request_attributes", "service_account_user"]
