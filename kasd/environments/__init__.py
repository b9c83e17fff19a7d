"""Environments, live: the shell that reads an environment's objects from its agent's cluster
(issue 27, part D). Discovery through the tunnel (``discover``: every listable namespaced kind,
CRDs included, by GitLab's labels ``app.gitlab.com/project_id`` and
``app.gitlab.com/environment_slug``, plus the unlabelled dependents), watch sets shared by every
viewer of one environment (``watching``), as the agent or the viewing user (``Viewer``), behind one
object per kasd process: ``EnvironmentViews`` (``views``).

- ``values``: what it answers with (``Viewer``, ``KindProblem``, ``Snapshot``, ``Update``) and its
  limits (``ViewLimits``);
- ``kinds``: which kinds to list, read from the discovery documents (pure);
- ``objects``: sanitizing (no Secret values ever leave), membership of unlabelled dependents (pure;
  the stand-in for ``kasd.envgraph``'s helpers until that part is merged);
- ``discover``, ``watching``, ``views``: the I/O, through ``kasd.agentclient``.

May import: ``kasd.agentclient``, ``kasd.seams``, ``tunnelhttp`` (the impersonation value),
``daemonkit.logs``, trio, attrs, the standard library. Never the proxy, a front end or the web app (they import this).
"""

from kasd.environments.values import (
    EnvironmentRef,
    EnvironmentSnapshot,
    KindProblem,
    Snapshot,
    Update,
    Viewer,
    ViewerTooSlow,
    ViewLimits,
)
from kasd.environments.views import EnvironmentViews, ViewsStatistics

__all__ = ["EnvironmentRef", "EnvironmentSnapshot", "EnvironmentViews", "KindProblem", "Snapshot", "Update", "ViewLimits", "Viewer",
           "ViewerTooSlow", "ViewsStatistics"]
