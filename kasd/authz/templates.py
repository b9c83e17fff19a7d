"""Environment templates of GitLab-managed Kubernetes resources, read and rendered (sans-I/O).

An agent's ``.gitlab/agents/<agent>/environment_templates/<name>.yaml`` (``default.yaml`` replaces the
built-in default) lists ``objects:`` to create for an environment, with ``apply_resources: on_start``
and ``delete_resources: on_stop | never`` (GitLab's defaults). String values may hold GitLab's
template variables, ``{{ .environment.slug }}``, ``{{ .project.id }}`` and the rest of
``VARIABLES``; kasd supports exactly those references (GitLab's docs promise "limited variable
substitution"), checked when the file is read — anything else (a pipeline, a function, an unknown
variable) is an error naming file, line, column and the reference. Values are substituted after
the YAML is parsed, so a value can never change the document's structure. A template is read
through the one bounded YAML reader (``daemonkit.yamldoc``: its aliases cost what they expand to)
and kept expanded, so rendering one for a request walks a tree of bounded size, once.

Every rendered object gets GitLab's tracking labels (``agent.gitlab.com/id-<agent id>``,
``…/project_id-<project id>``, ``…/env-<slug>-<project id>-<agent id>``,
``…/environment_slug-<slug>``, all empty) and the ``agent.gitlab.com/env-<slug>-<project id>-<agent id>``
annotation (a JSON object describing the environment), plus kasd's own
``kasd.gitlab-agent.io/managed-by: kasd`` label: kasd deletes only what carries it.

``ManagedResources`` is what one job's verdict asks kasd to create before its first request through
an agent: the objects rendered for its environment (GitLab's form: ``resource_management`` and a
template) or the namespace a ``rules:`` entry resolved to (``rules_objects``). ``kasd.managed``
applies and deletes them; this module only decides what they are.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import yaml

from daemonkit import yamldoc
from kasd.authz.agentconfig import compose_yaml, read_config_text
from kasd.authz.expand import RoleRef

__all__ = [
    "ADMIN",
    "BUILTIN",
    "DEFAULT_TEMPLATE",
    "KINDS",
    "MANAGED_BY",
    "MANAGED_KINDS",
    "MAX_TEMPLATE_CHARS",
    "MAX_TEMPLATE_ENTRIES",
    "MAX_TEMPLATE_VALUES",
    "USED_BY",
    "VARIABLES",
    "EnvironmentTemplate",
    "ManagedKind",
    "ManagedResources",
    "TemplateError",
    "agent_label",
    "env_label",
    "load_templates",
    "parse_template",
    "project_label",
    "render",
    "rules_objects",
    "templates_dir",
]

#: GitLab's variables (docs: "Template variables"), by ``category.field``
VARIABLES = frozenset({
    "agent.id", "agent.name", "agent.url",
    "environment.id", "environment.name", "environment.slug", "environment.url", "environment.page_url",
    "environment.tier",
    "project.id", "project.slug", "project.path", "project.url",
    "ci_pipeline.id", "ci_job.id",
    "user.id", "user.username",
})
@attrs.frozen
class ManagedKind:
    """Where the API serves a kind a template may hold."""

    group: str  # "" is the core group (apiVersion v1)
    plural: str
    namespaced: bool = True


_SOURCE, _NOTIFY = "source.toolkit.fluxcd.io", "notification.toolkit.fluxcd.io"
#: the kinds GitLab applies (docs: "Supported Kubernetes resources"): what templates are checked
#: against and what ``kasd.managed`` sends them to
MANAGED_KINDS = {
    "Namespace": ManagedKind("", "namespaces", namespaced=False), "ServiceAccount": ManagedKind("", "serviceaccounts"),
    "RoleBinding": ManagedKind("rbac.authorization.k8s.io", "rolebindings"),
    "GitRepository": ManagedKind(_SOURCE, "gitrepositories"), "HelmRepository": ManagedKind(_SOURCE, "helmrepositories"),
    "HelmChart": ManagedKind(_SOURCE, "helmcharts"), "Bucket": ManagedKind(_SOURCE, "buckets"),
    "OCIRepository": ManagedKind(_SOURCE, "ocirepositories"),
    "Kustomization": ManagedKind("kustomize.toolkit.fluxcd.io", "kustomizations"),
    "HelmRelease": ManagedKind("helm.toolkit.fluxcd.io", "helmreleases"),
    "Alert": ManagedKind(_NOTIFY, "alerts"), "Provider": ManagedKind(_NOTIFY, "providers"),
    "Receiver": ManagedKind(_NOTIFY, "receivers"),
}
KINDS = frozenset(MANAGED_KINDS)


def agent_label(agent_id: int | str) -> str:
    return f"agent.gitlab.com/id-{agent_id}"


def project_label(project_id: int | str) -> str:
    return f"agent.gitlab.com/project_id-{project_id}"


def env_label(slug: str, project_id: int | str, agent_id: int | str) -> str:
    """GitLab's label (and annotation key) of one environment's objects on one agent."""
    return f"agent.gitlab.com/env-{slug}-{project_id}-{agent_id}"
#: kasd's mark on what it created (it deletes nothing without it)
MANAGED_BY = ("kasd.gitlab-agent.io/managed-by", "kasd")
#: kasd's record on a namespace it made of the environments that use it (``kasd.managed``): a JSON
#: list of ``<agent id>:<project id>:<environment slug>`` (``-`` for a job without environment)
USED_BY = "kasd.gitlab-agent.io/used-by"

#: what a managed namespace's binding grants unless a rule's ``roles:`` says otherwise
ADMIN = RoleRef("ClusterRole", "admin")

#: built in: the environment's namespace, and the job's environment group bound to ``admin`` in it
DEFAULT_TEMPLATE = """\
objects:
  - apiVersion: v1
    kind: Namespace
    metadata:
      name: '{{ .environment.slug }}-{{ .project.id }}-{{ .agent.id }}'
  - apiVersion: rbac.authorization.k8s.io/v1
    kind: RoleBinding
    metadata:
      name: 'bind-{{ .environment.slug }}-{{ .project.id }}-{{ .agent.id }}'
      namespace: '{{ .environment.slug }}-{{ .project.id }}-{{ .agent.id }}'
    subjects:
      - kind: Group
        apiGroup: rbac.authorization.k8s.io
        name: 'gitlab:project_env:{{ .project.id }}:{{ .environment.slug }}'
    roleRef:
      apiGroup: rbac.authorization.k8s.io
      kind: ClusterRole
      name: admin
apply_resources: on_start
delete_resources: on_stop
"""

_REFERENCE = re.compile(r"\{\{(.*?)\}\}")
_VARIABLE = re.compile(r"\s*\.([a-z_]+)\.([a-z_]+)\s*")


#: the most values (mappings, lists and scalars, every alias expanded) one template may hold, and
#: characters of its strings: a template is rendered for each job that needs it (a first request
#: through an agent, each ``GET /api/v4/job/allowed_agents``, a stop) on the event loop, and a
#: rendering walks the whole template. The YAML budget every file has (``daemonkit.yamldoc``, 100,000
#: nodes) bounds reading one; rendering a template that large cost 0.15 s of the event loop per
#: request. GitLab's default template is ~30 values, a Flux set with Helm values a few hundred.
MAX_TEMPLATE_VALUES = 2_000
MAX_TEMPLATE_CHARS = 128 * 1024


class TemplateError(ValueError):
    """The file is unusable: ``str()`` is ``<file>:<line>:<column>: <key>: <problem>``."""


@attrs.frozen(kw_only=True)
class EnvironmentTemplate:
    name: str
    source: str
    #: the objects as parsed (string values still holding ``{{ … }}``)
    objects: tuple[Mapping[str, Any], ...]
    apply_resources: Literal["on_start"] = "on_start"
    delete_resources: Literal["on_stop", "never"] = "on_stop"


def parse_template(text: str, source: str, name: str) -> EnvironmentTemplate:
    """Read and check a template (``source`` names it in messages)."""
    node = compose_yaml(text, source, TemplateError)
    if node is None or not isinstance(node, yaml.MappingNode):
        raise TemplateError(f"{source}: must be a mapping with objects:")
    fields: dict[str, yaml.Node] = {}
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.value not in ("objects", "apply_resources", "delete_resources"):
            name = _key_name(key)
            raise TemplateError(f"{_at(source, key)}: {name}: unknown key (expected objects, apply_resources, "
                                "delete_resources)")
        if key.value in fields:
            raise TemplateError(f"{_at(source, key)}: {key.value}: given twice")
        fields[key.value] = value
        _check_references(value, source, key.value)
    _check_size(node, source)
    try:
        document = _expanded(yamldoc.construct(node))
    except yamldoc.YamlError as exc:  # composed, but not constructed: an unhashable key, a tag
        hint = " (a {{ … }} reference must be quoted: '{{ .environment.slug }}')" if "unhashable" in exc.problem else ""
        raise TemplateError(f"{exc.at(source)}{hint}") from None
    _check_json(node, source)
    objects = document.get("objects")
    if not isinstance(objects, list) or not objects:
        raise TemplateError(f"{_at(source, fields.get('objects', node))}: objects: must be a non-empty list")
    for i, item in enumerate(objects):
        where = _at(source, fields["objects"].value[i])
        if not isinstance(item, dict) or not isinstance(item.get("metadata"), dict) or \
                not isinstance(item["metadata"].get("name"), str):
            raise TemplateError(f"{where}: objects[{i}]: needs apiVersion, kind and metadata.name")
        if item.get("kind") not in KINDS:
            raise TemplateError(f"{where}: objects[{i}].kind: {_shown(item.get('kind'))} is not one GitLab manages "
                                f"({', '.join(sorted(KINDS))})")
        api_version = item.get("apiVersion")
        if not isinstance(api_version, str):
            raise TemplateError(f"{where}: objects[{i}].apiVersion: missing")
        group = api_version.rpartition("/")[0]
        served = MANAGED_KINDS[item["kind"]].group
        if group != served or not api_version.rpartition("/")[2]:
            wanted = f"{served}/<version>" if served else "v1"
            raise TemplateError(f"{where}: objects[{i}].apiVersion: {_shown(api_version)} does not serve "
                                f"{item['kind']} (expected {wanted})")
        metadata = item["metadata"]
        for field in ("labels", "annotations"):
            value = metadata.get(field)
            if value is not None and (not isinstance(value, dict) or
                                      not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
                raise TemplateError(f"{where}: objects[{i}].metadata.{field}: must map strings to strings")
        namespace = metadata.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            raise TemplateError(f"{where}: objects[{i}].metadata.namespace: must be a string")
    apply = document.get("apply_resources", "on_start")
    delete = document.get("delete_resources", "on_stop")
    if apply != "on_start":
        raise TemplateError(f"{_at(source, fields['apply_resources'])}: apply_resources: must be on_start")
    if delete not in ("on_stop", "never"):
        raise TemplateError(f"{_at(source, fields['delete_resources'])}: delete_resources: must be on_stop or never")
    return EnvironmentTemplate(name=name, source=source, objects=tuple(objects), apply_resources=apply,
                               delete_resources=delete)


def _shown(value: object) -> str:
    """A value of the file in a message: a short excerpt of a string, else its type."""
    return yamldoc.excerpt(value) if isinstance(value, str) else yamldoc.describe(value)


def _key_name(key: yaml.Node) -> str:
    """A mapping key for a key path: as written when short and printable, else an excerpt or its type."""
    if not isinstance(key, yaml.ScalarNode):
        return yamldoc.describe(key)
    return key.value if len(key.value) <= 40 and key.value.isprintable() else yamldoc.excerpt(key.value)


def _check_size(node: yaml.Node, source: str) -> None:
    """``TemplateError`` for a template over ``MAX_TEMPLATE_VALUES`` or ``MAX_TEMPLATE_CHARS``, aliases
    expanded (the walk stops at the first value over: it costs no more than the limit)."""
    values = chars = 0
    stack = [node]
    while stack:
        item = stack.pop()
        values += 1
        if isinstance(item, yaml.ScalarNode):
            chars += len(item.value)
        elif isinstance(item, yaml.MappingNode):
            for k, v in item.value:
                stack += (k, v)
        else:
            stack += item.value
        if values > MAX_TEMPLATE_VALUES or chars > MAX_TEMPLATE_CHARS:
            what = f"{MAX_TEMPLATE_VALUES} values" if values > MAX_TEMPLATE_VALUES else f"{MAX_TEMPLATE_CHARS} characters"
            raise TemplateError(f"{_at(source, item)}: the template holds more than {what} once aliases are expanded "
                                "(it is rendered for every job that needs it)")


_JSON_SCALARS = {f"tag:yaml.org,2002:{kind}" for kind in ("str", "int", "float", "bool", "null")}
_MAP, _SEQ, _FLOAT = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq", "tag:yaml.org,2002:float"


def _check_json(node: yaml.Node, source: str) -> None:
    """``TemplateError`` for a value that is not JSON data: the objects are sent to the Kubernetes API
    as JSON, and a template that loaded with a date (``2024-01-01`` unquoted is one in YAML), bytes
    (``!!binary``), a set or a pair list failed every job that needed it, at its request. Keys must
    be strings, numbers finite."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, yaml.MappingNode):
            if item.tag != _MAP:
                raise TemplateError(f"{_at(source, item)}: a {_tag(item)} is not JSON data (use a mapping)")
            for key, value in item.value:
                if key.tag == "tag:yaml.org,2002:merge":
                    stack.append(value)
                    continue
                if not (isinstance(key, yaml.ScalarNode) and key.tag == "tag:yaml.org,2002:str"):
                    raise TemplateError(f"{_at(source, key)}: keys must be strings, got {yamldoc.describe(key)} "
                                        "(quote it)")
                stack.append(value)
        elif isinstance(item, yaml.SequenceNode):
            if item.tag != _SEQ:
                raise TemplateError(f"{_at(source, item)}: a {_tag(item)} is not JSON data (use a list)")
            stack += item.value
        elif isinstance(item, yaml.ScalarNode):
            if item.tag not in _JSON_SCALARS:
                raise TemplateError(f"{_at(source, item)}: a {_tag(item)} is not JSON data (quote it to make it a string)")
            if item.tag == _FLOAT and item.value.lower().lstrip("+-") in (".inf", ".nan"):
                raise TemplateError(f"{_at(source, item)}: {item.value} is not a JSON number (quote it to make it a string)")


def _tag(node: yaml.Node) -> str:
    tag = str(node.tag)
    return ("!!" + tag.rsplit(":", 1)[-1]) if tag.startswith("tag:yaml.org,2002:") else "value with a tag of its own"


def _expanded(value: Any) -> Any:
    """``value`` with no object shared between two places (PyYAML shares an aliased subtree): the
    form kept and rendered, its size the document's with aliases expanded (bounded by ``yamldoc``)."""
    if isinstance(value, dict):
        return {k: _expanded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expanded(v) for v in value]
    return value


def _at(source: str, node: yaml.Node) -> str:
    return f"{source}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def _check_references(node: yaml.Node, source: str, key: str) -> None:
    if isinstance(node, yaml.ScalarNode):
        for match in _REFERENCE.finditer(str(node.value)):
            variable = _VARIABLE.fullmatch(match.group(1))
            if variable is None:
                raise TemplateError(f"{_at(source, node)}: {key}: {yamldoc.excerpt(match.group())}: only variable references "
                                    "such as {{ .environment.slug }} are supported")
            if f"{variable.group(1)}.{variable.group(2)}" not in VARIABLES:
                raise TemplateError(f"{_at(source, node)}: {key}: {yamldoc.excerpt(match.group())}: unknown variable (one of: "
                                    f"{', '.join('.' + v for v in sorted(VARIABLES))})")
        if "{{" in _REFERENCE.sub("", str(node.value)):
            raise TemplateError(f"{_at(source, node)}: {key}: an unclosed {{{{")
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and "{{" in str(k.value):
                raise TemplateError(f"{_at(source, k)}: {key}: {yamldoc.excerpt(k.value)}: references are substituted in "
                                    "values only, not in keys")
            _check_references(v, source, f"{key}.{_key_name(k)}")
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _check_references(v, source, f"{key}[{i}]")


def _value_of(reference: re.Match[str], variables: Mapping[str, str]) -> str:
    variable = _VARIABLE.fullmatch(reference.group(1))
    assert variable is not None  # checked when the template was read
    return variables[f"{variable.group(1)}.{variable.group(2)}"]


def _substitute(value: Any, variables: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return _REFERENCE.sub(lambda m: _value_of(m, variables), value)
    if isinstance(value, dict):
        return {k: _substitute(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, variables) for v in value]
    return value


def render(template: EnvironmentTemplate, variables: Mapping[str, str | int]) -> list[dict[str, Any]]:
    """The objects for one environment: ``variables`` by ``category.field`` (all of ``VARIABLES``),
    substituted, with GitLab's labels and annotation and kasd's mark added. Without an environment
    (``environment.slug`` empty: a rules namespace of a job that deploys nowhere) only the agent's
    and project's labels and kasd's mark are added."""
    missing = VARIABLES - set(variables)
    if missing:
        raise ValueError(f"variables missing: {', '.join(sorted(missing))}")
    values = {k: str(v) for k, v in variables.items()}
    slug, project, agent = values["environment.slug"], values["project.id"], values["agent.id"]
    env_key = env_label(slug, project, agent)
    labels = {agent_label(agent): "", project_label(project): "",
              MANAGED_BY[0]: MANAGED_BY[1]}
    if slug:
        labels |= {env_key: "", f"agent.gitlab.com/environment_slug-{slug}": ""}
    annotation = json.dumps({
        "environment_id": values["environment.id"], "environment_name": values["environment.name"],
        "environment_slug": slug, "environment_url": values["environment.url"],
        "environment_page_url": values["environment.page_url"], "environment_tier": values["environment.tier"],
        "agent_id": agent, "agent_name": values["agent.name"], "agent_url": values["agent.url"],
        "project_id": project, "project_slug": values["project.slug"], "project_path": values["project.path"],
        "project_url": values["project.url"], "template_name": template.name,
    }, separators=(",", ":"))
    out = []
    for raw in template.objects:
        obj = _substitute(raw, values)
        metadata = obj.setdefault("metadata", {})
        metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
        if slug:
            metadata["annotations"] = {**(metadata.get("annotations") or {}), env_key: annotation}
        out.append(obj)
    return out


#: the built-in template, used where an agent has no ``environment_templates/default.yaml``
BUILTIN = parse_template(DEFAULT_TEMPLATE, "(built-in default template)", "default")


def templates_dir(agent_config_file: Path) -> Path:
    """``.gitlab/agents/<agent>/environment_templates`` beside the agent's config.yaml."""
    return agent_config_file.parent / "environment_templates"


#: entries of an ``environment_templates`` directory: more is an error (each file is read and
#: parsed at every load, and a listing is held whole to be sorted)
MAX_TEMPLATE_ENTRIES = 1024


class _Outside(Exception):
    pass


def _template_names(directory: Path, root: Path) -> list[str]:
    """The ``*.yaml`` names in ``directory`` (sorted), listed through a descriptor of the directory
    whose real path is checked on the descriptor itself: a directory swapped for a symlink after a
    path check cannot show kasd (nor its log) the names of another directory. ``_Outside`` for a
    directory outside ``root``; ``OSError`` (``FileNotFoundError`` included) as ``open`` raises it."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(directory)

    def inside(path: str) -> bool:
        return path == real_root or path.startswith(real_root.rstrip(os.sep) + os.sep)

    if not inside(real):
        raise _Outside
    fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # no /proc: the realpath check stands alone
            opened = real
        if not inside(opened):
            raise _Outside
        names: list[str] = []
        with os.scandir(fd) as listing:
            for count, entry in enumerate(listing, 1):
                if count > MAX_TEMPLATE_ENTRIES:
                    raise OSError(0, f"more than {MAX_TEMPLATE_ENTRIES} entries")
                if entry.name.endswith(".yaml") and len(entry.name) > 5 and not entry.is_dir():
                    names.append(entry.name)
    finally:
        os.close(fd)
    return sorted(names)


def load_templates(directory: Path, root: Path) -> dict[str, EnvironmentTemplate]:
    """Every ``<name>.yaml`` of an agent's ``environment_templates`` (none if there is no such
    directory); ``TemplateError`` for the first that cannot be used. Nothing is read, or listed,
    through a symlink leading out of ``root``, the real path of the agent's config project
    (``agentconfig.project_root``). Blocking: call it off the event loop."""
    try:
        names = _template_names(directory, root)
    except FileNotFoundError:
        return {}
    except _Outside:
        raise TemplateError(f"{directory}: refused: its real path is outside its config project ({root}); a "
                            "symlink there may point only to directories of the same project") from None
    except OSError as exc:
        raise TemplateError(f"{directory}: cannot read: {exc.strerror or exc}") from None
    paths = [directory / name for name in names]
    templates = {}
    for path in paths:
        try:
            text = read_config_text(root, path, TemplateError)
        except FileNotFoundError as exc:  # removed since the listing: the next look reloads
            raise TemplateError(f"{path}: cannot read: {exc.strerror or exc}") from None
        templates[path.stem] = parse_template(text, str(path), path.stem)
    return templates


@attrs.frozen(kw_only=True)
class ManagedResources:
    """The objects kasd creates for one job's environment (or rules namespace) on one agent, before
    the job's first request through it, and deletes (``delete_resources: on_stop``) when the
    environment stops. Equal plans are the same work: ``key`` names it."""

    agent_id: int
    project_id: int
    #: the environment's name and slug ("" and None for a rules namespace without environment)
    environment: str | None
    slug: str
    #: ``resource_management`` (a template's name) or ``rules`` (the namespace a rule resolved to)
    source: str
    #: the namespace the job's kubeconfig context selects
    namespace: str | None
    objects: tuple[Mapping[str, Any], ...] = attrs.field(hash=False, eq=False)
    delete_resources: Literal["on_stop", "never"] = "on_stop"

    @property
    def key(self) -> tuple[int, int, str, str]:
        return (self.agent_id, self.project_id, self.slug, self.namespace or "")

    @property
    def fingerprint(self) -> str:
        """What the plan creates, digested: two plans of one ``key`` may differ (rules that give one
        environment's jobs different ``roles:``, an edited template), and each is applied."""
        return hashlib.sha256(json.dumps(self.objects, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def rules_objects(namespace: str, subjects: Sequence[str], slug: str = "",
                  roles: Sequence[RoleRef] = ()) -> EnvironmentTemplate:
    """The rules form as a template: the namespace a rule resolved to and, when the job acts as
    itself (``ci_job``/``ci_user``), a RoleBinding in it for ``subjects`` (groups) per role the rule
    names (``roles``; without: ``admin``), per environment (environments may share a rules
    namespace): ``gitlab-job-access-<slug>`` for ``admin``, ``….clusterrole.<name>`` or
    ``….role.<name>`` for the others (a RoleBinding has one roleRef; ``.`` is in no slug)."""
    objects: list[Mapping[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}]
    if subjects:
        base = f"gitlab-job-access-{slug}" if slug else "gitlab-job-access"
        for role in dict.fromkeys(roles or (ADMIN,)):
            name = base if role == ADMIN else f"{base}.{role.kind.lower()}.{role.name}"
            objects.append({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": name, "namespace": namespace},
                "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": s} for s in subjects],
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role.kind, "name": role.name},
            })
    return EnvironmentTemplate(name="rules", source="(a rules: namespace)", objects=tuple(objects))
