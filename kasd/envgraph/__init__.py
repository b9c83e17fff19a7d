"""The pure core of environments (issue 27): what an environment's objects are to each other (the
dependency graph), how healthy each is (Argo CD's rules and words), and one verdict for all of them.

No I/O, no trio, no clock: objects in (whole, as the API answered), values out. ``kasd.environments``
(the shell: discovery and watches through the tunnel) feeds it; the REST API, the dashboard and
``kasctl env status`` read ``Graph.to_json()``. docs/environments.md, "The graph and health", is
the reference for every rule.

``identity``   node ids: ``"<group>/<Kind>/<namespace>/<name>"``
``health``     ``Health``, the six statuses, ``health_of(obj)`` (every rule and departure in its docstring)
``rollup``     ``rollup(healths)``: the worst, in Argo's order, naming the worst objects
``references`` the well-known references between objects (what a pod uses, ingress backends, …)
``graph``      ``build_graph``, ``Graph``/``Node``/``Edge``, ``tree_lines``
``dependents`` ``dependents_to_fetch``: the unlabelled objects discovery should fetch too

May import: attrs and the standard library. Nothing else of kasd; never trio or I/O.
"""

from kasd.envgraph.dependents import FetchRequest, dependents_to_fetch
from kasd.envgraph.graph import GITLAB_LABELS, RELATIONS, Edge, Graph, Node, build_graph, tree_lines
from kasd.envgraph.health import (
    DEGRADED,
    HEALTHY,
    MISSING,
    PROGRESSING,
    STATUSES,
    SUSPENDED,
    UNKNOWN,
    Health,
    health_of,
)
from kasd.envgraph.identity import node_id
from kasd.envgraph.rollup import rollup

__all__ = [
    "DEGRADED",
    "GITLAB_LABELS",
    "HEALTHY",
    "MISSING",
    "PROGRESSING",
    "RELATIONS",
    "STATUSES",
    "SUSPENDED",
    "UNKNOWN",
    "Edge",
    "FetchRequest",
    "Graph",
    "Health",
    "Node",
    "build_graph",
    "dependents_to_fetch",
    "health_of",
    "node_id",
    "rollup",
    "tree_lines",
]
