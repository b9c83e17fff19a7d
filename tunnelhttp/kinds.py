"""The kinds of logical stream kasd and agentd open to each other: the ``kind`` key of an OPEN's
metadata, which the side that accepts it reads first to choose the handler (an unknown kind is
REFUSEd with ``TunnelCode.UNKNOWN_TARGET``). docs/protocol.md §12–13 describe each.

kasd → agentd:

- ``k8s-api``: an HTTP exchange with the cluster's Kubernetes API server (``head.RequestHead``).
- ``service``: an HTTP exchange with one in-cluster service of agentd's own allow-list
  (``RequestHead`` whose ``service`` names it; the target is relative to the service's URL).
- ``event``: one event pushed to the agent; agentd acts on it as its configuration says and
  answers how it went in the ACCEPT.

agentd → kasd:

- ``cluster-info``: agentd's report of what it found in its cluster (a JSON body).

May import: nothing.
"""

from __future__ import annotations

KIND_K8S_API = "k8s-api"
KIND_SERVICE = "service"
KIND_EVENT = "event"
KIND_CLUSTER_INFO = "cluster-info"

__all__ = ["KIND_CLUSTER_INFO", "KIND_EVENT", "KIND_K8S_API", "KIND_SERVICE"]
