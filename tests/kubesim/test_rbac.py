"""kubesim enforces RBAC for impersonated identities and its own service-account tokens, as
kube-apiserver does: the caller needs `impersonate`, then Roles, ClusterRoles and bindings decide,
with the server's 403 texts; `kubectl auth can-i` and `kubectl auth whoami` answer for the
impersonated user. kubesim's own token stays all-powerful (every other kubesim test relies on it).
"""

from __future__ import annotations

import json

import pytest
import trio
import yaml

from kubesim import rbac
from kubesim.errors import ApiError
from kubesim.store import Store
from tests.kubesim.kubectl_harness import Kubectl

pytestmark = pytest.mark.timeout(60)

RBAC = "rbac.authorization.k8s.io"


def _binding_doc(name: str, role: str, subjects: list[dict[str, str]], *, kind: str = "RoleBinding",
                 role_kind: str = "ClusterRole", namespace: str = "") -> dict[str, object]:
    meta: dict[str, str] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": f"{RBAC}/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": RBAC, "kind": role_kind, "name": role}, "subjects": subjects}


def _user(name: str) -> dict[str, str]:
    return {"apiGroup": RBAC, "kind": "User", "name": name}


# -- the authorizer, on a store ---------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    ("GET", "/api/v1/namespaces/ns/pods", "", ("list", "", "pods", "", "ns", "")),
    ("GET", "/api/v1/namespaces/ns/pods", "watch=true", ("watch", "", "pods", "", "ns", "")),
    ("GET", "/api/v1/watch/namespaces/ns/pods", "", ("watch", "", "pods", "", "ns", "")),
    ("GET", "/api/v1/namespaces/ns/pods/web", "", ("get", "", "pods", "", "ns", "web")),
    ("GET", "/api/v1/namespaces/ns/pods/web/log", "", ("get", "", "pods", "log", "ns", "web")),
    ("GET", "/api/v1/namespaces/ns/pods/web/exec", "command=sh", ("create", "", "pods", "exec", "ns", "web")),
    ("POST", "/apis/apps/v1/namespaces/ns/deployments", "", ("create", "apps", "deployments", "", "ns", "")),
    ("PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale", "", ("patch", "apps", "deployments", "scale", "ns", "d")),
    ("DELETE", "/api/v1/namespaces/ns/configmaps", "", ("deletecollection", "", "configmaps", "", "ns", "")),
    ("DELETE", "/api/v1/namespaces/ns", "", ("delete", "", "namespaces", "", "ns", "ns")),
    ("GET", "/api/v1/nodes", "", ("list", "", "nodes", "", "", "")),
    ("GET", "/api/v1/namespaces/dev/status", "", ("get", "", "namespaces", "status", "dev", "dev")),
    ("PUT", "/api/v1/namespaces/dev/finalize", "", ("update", "", "namespaces", "finalize", "dev", "dev")),
    ("GET", "/api/v1/namespaces/ns/pods", "fieldSelector=metadata.name%3Dweb&watch=1",
     ("watch", "", "pods", "", "ns", "web")),
    ("GET", "/api/v1/namespaces/ns/pods", "fieldSelector=metadata.name%3Dweb,status.phase%3DRunning",
     ("list", "", "pods", "", "ns", "")),
])
def test_request_attributes_name_what_kube_apiserver_names(
        method: str, path: str, query: str, expected: tuple[str, ...]) -> None:
    a = rbac.request_attributes(method, path, query)
    assert a.resource_request
    assert (a.verb, a.api_group, a.resource, a.subresource, a.namespace, a.name) == expected


def test_non_resource_requests_use_the_lowercased_method_as_verb() -> None:
    a = rbac.request_attributes("GET", "/apis", "")
    assert (a.resource_request, a.verb, a.path) == (False, "get", "/apis")


def test_admin_aggregates_edit_and_view_and_a_new_labelled_role_joins() -> None:
    store = Store()
    authorizer = rbac.Authorizer(store)
    view = authorizer.cluster_role_rules("view")
    edit = authorizer.cluster_role_rules("edit")
    admin = authorizer.cluster_role_rules("admin")
    assert view and all(rule in edit for rule in view) and all(rule in admin for rule in edit)
    assert not any("roles" in r.get("resources", ()) for r in edit)
    assert any("rolebindings" in r.get("resources", ()) for r in admin)
    # The stored object carries the aggregated rules, as the aggregation controller writes them.
    stored = store.get(store.kind(RBAC, "clusterroles"), None, "admin")
    assert len(stored["rules"]) == len(admin)
    store.create(store.kind(RBAC, "clusterroles"), None, {
        "metadata": {"name": "widgets-view", "labels": {f"{RBAC}/aggregate-to-view": "true"}},
        "rules": [{"verbs": ["get"], "apiGroups": ["example.com"], "resources": ["widgets"]}]})
    assert {"verbs": ["get"], "apiGroups": ["example.com"], "resources": ["widgets"]} in \
        authorizer.cluster_role_rules("view")


def test_rules_match_verbs_groups_subresources_names_and_urls() -> None:
    store = Store()
    store.create(store.kind("", "namespaces"), None, {"metadata": {"name": "ns"}})
    store.create(store.kind(RBAC, "roles"), "ns", {"metadata": {"name": "narrow"}, "rules": [
        {"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["app"]},
        {"verbs": ["get"], "apiGroups": [""], "resources": ["*/status"]},
        {"verbs": ["*"], "apiGroups": ["apps"], "resources": ["deployments/scale"]}]})
    store.create(store.kind(RBAC, "rolebindings"), "ns",
                 _binding_doc("narrow", "narrow", [_user("bob")], role_kind="Role"))
    store.create(store.kind(RBAC, "clusterroles"), None, {"metadata": {"name": "metrics"}, "rules": [
        {"verbs": ["get"], "nonResourceURLs": ["/metrics", "/logs/*"]}]})
    store.create(store.kind(RBAC, "clusterrolebindings"), None,
                 _binding_doc("metrics", "metrics", [_user("bob")], kind="ClusterRoleBinding"))
    bob = rbac.UserInfo(username="bob", groups=("system:authenticated",))
    authorizer = rbac.Authorizer(store)

    def may(method: str, path: str) -> bool:
        return authorizer.authorize(bob, rbac.request_attributes(method, path, ""))[0]

    assert may("GET", "/api/v1/namespaces/ns/configmaps/app")
    assert not may("GET", "/api/v1/namespaces/ns/configmaps/other")
    assert not may("GET", "/api/v1/namespaces/ns/configmaps")  # a list names no resource
    assert may("GET", "/api/v1/namespaces/ns/pods/web/status")
    assert not may("GET", "/api/v1/namespaces/ns/pods/web")
    assert may("PUT", "/apis/apps/v1/namespaces/ns/deployments/web/scale")
    assert not may("PUT", "/apis/apps/v1/namespaces/ns/deployments/web")
    assert not may("GET", "/api/v1/namespaces/other/configmaps/app")  # a Role binds one namespace
    assert may("GET", "/metrics") and may("GET", "/logs/kubelet.log")
    assert not may("POST", "/metrics") and not may("GET", "/logsx")
    assert may("GET", "/apis")  # system:discovery, bound to every authenticated user
    _, reason = authorizer.authorize(bob, rbac.request_attributes("GET", "/api/v1/namespaces/ns/configmaps/app", ""))
    assert reason == 'RBAC: allowed by RoleBinding "narrow/ns" of Role "narrow" to User "bob"'


def test_forbidden_texts_are_the_servers() -> None:
    alice = rbac.UserInfo(username="alice")

    def message(method: str, path: str) -> str:
        return rbac.forbidden(alice, rbac.request_attributes(method, path, "")).message

    assert message("GET", "/api/v1/namespaces/ns/pods") == \
        'pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "ns"'
    assert message("GET", "/apis/apps/v1/namespaces/ns/deployments/web") == \
        ('deployments.apps "web" is forbidden: User "alice" cannot get resource "deployments" in API '
         'group "apps" in the namespace "ns"')
    assert message("POST", "/api/v1/namespaces/ns/pods/web/exec") == \
        ('pods "web" is forbidden: User "alice" cannot create resource "pods/exec" in API group "" '
         'in the namespace "ns"')
    assert message("GET", "/api/v1/nodes") == \
        'nodes is forbidden: User "alice" cannot list resource "nodes" in API group "" at the cluster scope'
    assert message("GET", "/metrics") == 'forbidden: User "alice" cannot get path "/metrics"'
    status = rbac.forbidden(alice, rbac.request_attributes("GET", "/apis/apps/v1/namespaces/ns/deployments/web", "")).status()
    assert (status["code"], status["reason"], status["details"]) == \
        (403, "Forbidden", {"name": "web", "group": "apps", "kind": "deployments"})


# -- real kubectl, impersonating --------------------------------------------------------------


async def _apply(k: Kubectl, *docs: dict[str, object]) -> None:
    await k("apply", "-f", "-", stdin=yaml.safe_dump_all(docs).encode(), namespaced=False)


async def test_bindings_decide_for_an_impersonated_user(k: Kubectl) -> None:
    ns, other = k.namespace, f"{k.namespace}-other"
    await trio.to_thread.run_sync(k.server.make_namespace, other)
    as_alice = ("--as", "alice")
    assert (await k("auth", "can-i", "create", "deployments", *as_alice, check=False)).stdout.strip() == "no"
    denied = await k("create", "deployment", "web", "--image=nginx", *as_alice, check=False)
    assert denied.returncode == 1
    assert (f'deployments.apps is forbidden: User "alice" cannot create resource "deployments" in '
            f'API group "apps" in the namespace "{ns}"') in denied.stderr
    await _apply(k, _binding_doc("alice-edit", "edit", [_user("alice")], namespace=ns))
    assert (await k("auth", "can-i", "create", "deployments", *as_alice)).stdout.strip() == "yes"
    await k("create", "deployment", "web", "--image=nginx", *as_alice)
    await k("get", "deployment", "web", *as_alice)
    # edit grants no RBAC objects, and the binding holds in its namespace only
    assert (await k("auth", "can-i", "create", "rolebindings", *as_alice, check=False)).stdout.strip() == "no"
    elsewhere = await k("-n", other, "get", "pods", *as_alice, namespaced=False, check=False)
    assert (f'pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the '
            f'namespace "{other}"') in elsewhere.stderr
    listed = await k("auth", "can-i", "--list", *as_alice)
    assert "deployments.apps" in listed.stdout and "rolebindings" not in listed.stdout
    # kubesim's own token is all-powerful, impersonating nobody
    assert (await k("auth", "can-i", "create", "clusterroles", namespaced=False)).stdout.strip() == "yes"


async def test_whoami_and_group_bindings_answer_for_the_impersonated_identity(k: Kubectl) -> None:
    who = json.loads(await k.out("auth", "whoami", "-o", "json", "--as", "gitlab:ci_job:7",
                                 "--as-group", "gitlab:ci_job", "--as-group", "gitlab:project:3",
                                 "--as-uid", "job-7", namespaced=False))
    assert who["status"]["userInfo"] == {
        "username": "gitlab:ci_job:7", "uid": "job-7",
        "groups": ["gitlab:ci_job", "gitlab:project:3", "system:authenticated"]}
    group = {"apiGroup": RBAC, "kind": "Group", "name": "gitlab:project:3"}
    await _apply(k, _binding_doc("project-admin", "admin", [group], namespace=k.namespace))
    job = ("--as", "gitlab:ci_job:7", "--as-group", "gitlab:project:3")
    assert (await k("auth", "can-i", "create", "rolebindings", *job)).stdout.strip() == "yes"
    assert (await k("auth", "can-i", "create", "rolebindings", "--as", "gitlab:ci_job:7",
                    check=False)).stdout.strip() == "no"


async def test_a_service_account_token_needs_impersonate_rights(k: Kubectl) -> None:
    ns = k.namespace
    await k("create", "serviceaccount", "deployer")
    token = (await k.out("create", "token", "deployer")).strip()
    sa = f"system:serviceaccount:{ns}:deployer"
    own = await k("--token", token, "get", "pods", check=False)
    assert f'pods is forbidden: User "{sa}" cannot list resource "pods"' in own.stderr
    refused = await k("--token", token, "get", "pods", "--as", "alice", check=False)
    assert (f'users "alice" is forbidden: User "{sa}" cannot impersonate resource "users" in API '
            f'group "" at the cluster scope') in refused.stderr
    await _apply(k, {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole",
                     "metadata": {"name": f"{ns}-impersonate-users"},
                     "rules": [{"verbs": ["impersonate"], "apiGroups": [""], "resources": ["users"],
                                "resourceNames": ["alice"]}]},
                 _binding_doc(f"{ns}-impersonate-users", f"{ns}-impersonate-users",
                              [{"kind": "ServiceAccount", "name": "deployer", "namespace": ns}],
                              kind="ClusterRoleBinding"),
                 _binding_doc("alice-view", "view", [_user("alice")], namespace=ns))
    await k("--token", token, "get", "pods", "--as", "alice")
    other_user = await k("--token", token, "get", "pods", "--as", "mallory", check=False)
    assert 'users "mallory" is forbidden' in other_user.stderr
    with_group = await k("--token", token, "get", "pods", "--as", "alice", "--as-group", "admins",
                         check=False)
    assert (f'groups "admins" is forbidden: User "{sa}" cannot impersonate resource "groups" in API '
            f'group "" at the cluster scope') in with_group.stderr
    # a token kubesim did not issue is no one's
    forged = await k("--token", token[:-3] + "xyz", "get", "pods", check=False)
    assert "Unauthorized" in forged.stderr


def test_malformed_rbac_objects_are_refused_as_the_server_refuses_them() -> None:
    store = Store()
    bindings = store.kind(RBAC, "clusterrolebindings")
    with pytest.raises(ApiError) as refused:
        store.create(bindings, None, {"metadata": {"name": "x"}, "roleRef": {"kind": "Role", "name": "", "apiGroup": ""},
                                      "subjects": [{"kind": "User"}, {"kind": "Robot", "name": "r"},
                                                   {"kind": "ServiceAccount", "name": "sa"}]})
    message = refused.value.message
    for cause in ('roleRef.apiGroup: Unsupported value: "": supported values: "rbac.authorization.k8s.io"',
                  'roleRef.kind: Unsupported value: "Role": supported values: "ClusterRole"',
                  "roleRef.name: Required value", "subjects[0].name: Required value",
                  'subjects[1].kind: Unsupported value: "Robot"', "subjects[2].namespace: Required value"):
        assert cause in message, message
    # A value of the wrong JSON type does not decode: 400, as the server says it
    for plural, body, field in (
        ("clusterrolebindings", {"subjects": ["alice"]}, "ClusterRoleBinding.subjects of type v1.Subject"),
        ("clusterroles", {"rules": [{"verbs": "*", "apiGroups": ["*"], "resources": ["*"]}]},
         "PolicyRule.rules.verbs of type []string"),
        ("clusterroles", {"aggregationRule": {"clusterRoleSelectors": [{"matchLabels": "x"}]}},
         "LabelSelector.aggregationRule.clusterRoleSelectors.matchLabels of type map[string]string"),
    ):
        with pytest.raises(ApiError) as undecodable:
            store.create(store.kind(RBAC, plural), None, {"metadata": {"name": "y"}, **body})
        assert undecodable.value.code == 400
        assert f"json: cannot unmarshal string into Go struct field {field}" in undecodable.value.message
    # and a binding's role is fixed once made
    store.create(bindings, None, _binding_doc("b", "view", [_user("u")], kind="ClusterRoleBinding"))
    changed = store.get(bindings, None, "b")
    changed["roleRef"]["name"] = "cluster-admin"
    with pytest.raises(ApiError) as fixed:
        store.update(bindings, None, "b", changed)
    assert fixed.value.message.endswith(
        'roleRef: Invalid value: rbac.RoleRef{APIGroup:"rbac.authorization.k8s.io", Kind:"ClusterRole", '
        'Name:"cluster-admin"}: cannot change roleRef')
    with pytest.raises(ApiError) as refused:
        store.create(store.kind(RBAC, "roles"), "default", {"metadata": {"name": "r"}, "rules": [
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}, {"verbs": ["get"], "resources": ["pods"]}]})
    message = refused.value.message
    assert 'rules[0].nonResourceURLs: Invalid value: []string{"/metrics"}: namespaced rules cannot apply' in message
    assert "rules[1].apiGroups: Required value: resource rules must supply at least one api group" in message
    assert refused.value.code == 422


async def test_impersonation_headers_are_read_as_the_real_filter_reads_them(k: Kubectl) -> None:
    who = json.loads(await k.out("auth", "whoami", "-o", "json", "--as", "bob", "--as-group", "a,b",
                                 namespaced=False))
    assert who["status"]["userInfo"]["groups"] == ["a,b", "system:authenticated"]  # one header, one group
    # asked to be unauthenticated, bob is not made authenticated: self-reviews are not his to make
    unauthenticated = await k("auth", "whoami", "--as", "bob", "--as-group", "system:unauthenticated",
                              namespaced=False, check=False)
    assert "the selfsubjectreviews API is not enabled in the cluster or you do not have permission" in \
        unauthenticated.stderr
    anonymous = await k("get", "--raw", "/version", "--as", "system:anonymous", namespaced=False)
    assert '"gitVersion"' in anonymous.stdout  # system:public-info-viewer holds for system:unauthenticated
