"""The kinds whose protobuf bodies kubesim decodes: (apiVersion, kind) of the envelope -> message.

Hand-kept: adding a kind here and running ``kubesim/tools/gen_protobuf_tables.py`` adds the
tables of its message and of every message it reaches to ``protobuf_tables.json``.
"""

from __future__ import annotations

KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "core/v1.Namespace",
    ("v1", "Pod"): "core/v1.Pod",
    ("v1", "PodTemplate"): "core/v1.PodTemplate",
    ("v1", "Service"): "core/v1.Service",
    ("v1", "ConfigMap"): "core/v1.ConfigMap",
    ("v1", "Secret"): "core/v1.Secret",
    ("v1", "ServiceAccount"): "core/v1.ServiceAccount",
    ("v1", "PersistentVolumeClaim"): "core/v1.PersistentVolumeClaim",
    ("v1", "ReplicationController"): "core/v1.ReplicationController",
    ("v1", "ResourceQuota"): "core/v1.ResourceQuota",
    ("v1", "LimitRange"): "core/v1.LimitRange",
    ("v1", "Endpoints"): "core/v1.Endpoints",
    ("v1", "Binding"): "core/v1.Binding",
    ("v1", "DeleteOptions"): "meta/v1.DeleteOptions",
    ("meta.k8s.io/v1", "DeleteOptions"): "meta/v1.DeleteOptions",
    ("v1", "Status"): "meta/v1.Status",
    ("apps/v1", "Deployment"): "apps/v1.Deployment",
    ("apps/v1", "StatefulSet"): "apps/v1.StatefulSet",
    ("apps/v1", "DaemonSet"): "apps/v1.DaemonSet",
    ("apps/v1", "ReplicaSet"): "apps/v1.ReplicaSet",
    ("batch/v1", "Job"): "batch/v1.Job",
    ("batch/v1", "CronJob"): "batch/v1.CronJob",
    ("networking.k8s.io/v1", "Ingress"): "networking/v1.Ingress",
    ("networking.k8s.io/v1", "IngressClass"): "networking/v1.IngressClass",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networking/v1.NetworkPolicy",
    ("autoscaling/v1", "HorizontalPodAutoscaler"): "autoscaling/v1.HorizontalPodAutoscaler",
    ("autoscaling/v1", "Scale"): "autoscaling/v1.Scale",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "autoscaling/v2.HorizontalPodAutoscaler",
    ("discovery.k8s.io/v1", "EndpointSlice"): "discovery/v1.EndpointSlice",
    ("policy/v1", "PodDisruptionBudget"): "policy/v1.PodDisruptionBudget",
    ("policy/v1", "Eviction"): "policy/v1.Eviction",
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): "authorization/v1.SelfSubjectAccessReview",
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): "authorization/v1.SelfSubjectRulesReview",
    ("authentication.k8s.io/v1", "SelfSubjectReview"): "authentication/v1.SelfSubjectReview",
    ("rbac.authorization.k8s.io/v1", "Role"): "rbac/v1.Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rbac/v1.RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "rbac/v1.ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "rbac/v1.ClusterRoleBinding",
    ("scheduling.k8s.io/v1", "PriorityClass"): "scheduling/v1.PriorityClass",
    ("authentication.k8s.io/v1", "TokenRequest"): "authentication/v1.TokenRequest",
    ("coordination.k8s.io/v1", "Lease"): "coordination/v1.Lease",
}
