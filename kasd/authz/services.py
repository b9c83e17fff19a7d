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

The file's walk is ``kasd.authz.agentconfig``'s reader (the same messages naming file, line,
column and key); the decision is ``kasd.authz.servicepolicy``'s.

May import: this package's ``directory``, and ``agentconfig`` for types only (it imports this module).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

import attrs

from kasd.authz.directory import full_path_problem

if TYPE_CHECKING:
    from yaml.nodes import Node

    from kasd.authz.agentconfig import Mark, _Reader

#: entries of one ``projects:`` or ``groups:`` list: ``kasd.authz.agentconfig.MAX_ENTRIES`` (GitLab's
#: ``AUTHORIZED_ENTITY_LIMIT``), the same bound as the agent's own lists
MAX_ENTRIES = 500

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


# --------------------------------------------------------------------------- the file


def read_services(reader: _Reader, node: Node, key: str) -> tuple[ServiceAccess, ...]:
    """``services:``: a list of distinct service names, each with its ``ci_access`` and
    ``user_access`` (the lists as in the agent's own, ``ids`` reused)."""
    items = reader.sequence(node, key, "services")
    if len(items) > MAX_SERVICES:
        reader.fail(items[MAX_SERVICES], f"{key}[{MAX_SERVICES}]", f"more than {MAX_SERVICES} services (kasd's limit)")
    out: list[ServiceAccess] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        here = f"{key}[{i}]"
        fields = reader.mapping(item, here, ("name", "ci_access", "user_access"))
        if "name" not in fields:
            reader.fail(item, f"{here}.name", "missing (the service's name in agentd's services: list)")
        name_node = fields["name"][1]
        name = reader.string(name_node, f"{here}.name")
        if not SERVICE_NAME.fullmatch(name):
            reader.fail(name_node, f"{here}.name", "is not a service name (lower-case letters, digits and '-', at most "
                                                   "63, as agentd's services: names them)")
        other = seen.setdefault(name, i)
        if other != i:
            reader.fail(name_node, f"{here}.name", f"{name!r} is already {key}[{other}].name")
        ci_projects: tuple[ServiceCiEntry, ...] = ()
        ci_groups: tuple[ServiceCiEntry, ...] = ()
        if "ci_access" in fields:
            ci_key = f"{here}.ci_access"
            ci = reader.mapping(fields["ci_access"][1], ci_key, ("projects", "groups"))
            ci_projects = reader.optional(ci, "projects", ci_key, lambda n, k: _ci_entries(reader, n, k, "project")) or ()
            ci_groups = reader.optional(ci, "groups", ci_key, lambda n, k: _ci_entries(reader, n, k, "group")) or ()
        user_projects: tuple[str, ...] = ()
        user_groups: tuple[str, ...] = ()
        if "user_access" in fields:
            user_key = f"{here}.user_access"
            users = reader.mapping(fields["user_access"][1], user_key, ("projects", "groups"))
            user_projects = reader.optional(users, "projects", user_key, reader.ids) or ()
            user_groups = reader.optional(users, "groups", user_key, reader.ids) or ()
        out.append(ServiceAccess(name=name, ci_projects=ci_projects, ci_groups=ci_groups, user_projects=user_projects,
                                 user_groups=user_groups, mark=reader.mark(item)))
    return tuple(out)


def _ci_entries(reader: _Reader, node: Node, key: str, kind: Literal["project", "group"]) -> tuple[ServiceCiEntry, ...]:
    """``projects:``/``groups:`` of a service's ``ci_access``: ``{id, environments}`` each, ids checked
    and counted as in the agent's own ``ci_access`` (at most ``MAX_ENTRIES``, full paths, no twice)."""
    items = reader.sequence(node, key, "{id: path} mappings")
    if len(items) > MAX_ENTRIES:
        reader.fail(items[MAX_ENTRIES], f"{key}[{MAX_ENTRIES}]", f"more than {MAX_ENTRIES} entries (GitLab's limit; it "
                    "would ignore the rest)")
    out: list[ServiceCiEntry] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        here = f"{key}[{i}]"
        fields = reader.mapping(item, here, ("id", "environments"))
        if "id" not in fields:
            reader.fail(item, f"{here}.id", f"missing (the {kind}'s full path, e.g. group/project)")
        path = reader.string(fields["id"][1], f"{here}.id")
        problem = full_path_problem(path)
        if problem:
            reader.fail(fields["id"][1], f"{here}.id", problem)
        other = seen.setdefault(path.lower(), i)
        if other != i:
            reader.fail(fields["id"][1], f"{here}.id", f"{path!r} is already {key}[{other}] (entries are never merged)")
        environments = reader.optional(fields, "environments", here, reader.environments) or ()
        out.append(ServiceCiEntry(kind=kind, id=path, environments=environments))
    return tuple(out)


__all__ = ["MAX_SERVICES", "SERVICE_NAME", "ServiceAccess", "ServiceCiEntry", "read_services"]
