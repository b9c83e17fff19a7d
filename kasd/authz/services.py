"""Who may use which in-cluster service of an agent: the ``services:`` section of the agent's
``config.yaml`` (kasd's extension of GitLab's schema), and the decision.

```yaml
services:
  - name: prometheus
    ci_access:                         # CI jobs of these projects / groups (ci_access matching)
      projects: [{id: group/app, environments: [production]}]
      groups: [{id: group}]
    user_access:                       # Developer+ of these (user_access matching)
      projects: [{id: group/app}]
      groups: [{id: group}]
```

The agent's own ``ci_access`` and ``user_access`` grant no service: a service not listed here is
nobody's, and the implicit entry of the agent's config project does not apply (a service reaches
past the cluster's RBAC, so each one is granted by name). agentd's own allow-list still decides what
the service may be asked (kasd can ask, never decide: docs/services.md).

The values of the section; its walk is ``kasd.authz.agentconfig``'s reader (the same lists, bounds
and messages naming file, line, column and key as the agent's own ``ci_access``); the decision is
``kasd.authz.servicepolicy``'s.

May import: this package's ``marks``, attrs.
"""

from __future__ import annotations

import re
from typing import Literal

import attrs

from kasd.authz.marks import Mark

#: a service name: a DNS label, as agentd's allow-list names them (docs/services.md)
SERVICE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: services one agent's ``services:`` may list: each request looks its name up, and the file stays
#: within GitLab's ``AUTHORIZED_ENTITY_LIMIT``-sized lists per service
MAX_SERVICES = 64


@attrs.frozen(kw_only=True)
class ServiceCiEntry:
    """One ``services[].ci_access`` entry: a project or a group, and the environments it allows."""

    kind: Literal["project", "group"]
    id: str
    #: empty: any job, with or without an environment
    environments: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class ServiceAccess:
    """One ``services:`` entry: who may use the service ``name``."""

    name: str
    ci_projects: tuple[ServiceCiEntry, ...] = ()
    ci_groups: tuple[ServiceCiEntry, ...] = ()
    user_projects: tuple[str, ...] = ()
    user_groups: tuple[str, ...] = ()
    mark: Mark | None = None


__all__ = ["MAX_SERVICES", "SERVICE_NAME", "ServiceAccess", "ServiceCiEntry"]
