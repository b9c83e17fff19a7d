"""The RBAC the daemon tests' clusters start with.

kubesim enforces RBAC for every impersonated identity (as kube-apiserver does), so a test whose
requests reach it as `alice` (agentd's proxy tests) or as a CI job (`access_as: {ci_job: {}}`) runs
against a cluster where an operator has bound those to cluster-admin: `open_kubesim(objects=TRUSTED)`.
"""

from __future__ import annotations

from kubesim.rbac import cluster_role_binding

TRUSTED = (cluster_role_binding("tests-trusted-identities", "cluster-admin", users=("alice",),
                                groups=("gitlab:ci_job",)),)
