"""Each agent's ``config.yaml``, in GitLab's schema: who may use the agent (``ci_access``,
``user_access``) and as whom (``access_as``).

kasd reads it from ``<config root>/<config project path>/.gitlab/agents/<agent name>/config.yaml``
(``agent_config_path``), a checkout of the agent's config project. The file is parsed with PyYAML's
node API so that every problem names its place: ``AgentConfigError`` reads
``…/config.yaml:12:7: ci_access.projects[0].id: must be a string, got an int of 2 characters``;
no message quotes a value of the file whole (``daemonkit.yamldoc.describe``: its type and size).

Top-level keys of GitLab's agent configuration that kasd does not use (``GITLAB_KEYS_IGNORED``:
``gitops``, ``observability``, ``remote_development``, …) are ignored by name, their contents
unread. Any other unknown key, at any level, is an error naming file, line, column and key (with
the closest known key): a typo (``user_acess:``) would otherwise take access away, or grant it,
without a word. Environment templates (``.gitlab/agents/<agent>/environment_templates/<name>.yaml``)
are not parsed here, but read through the same ``read_config_text``: nothing is read through a
symlink that leads out of the agent's own config project (``project_root``), so a committer of one
project can make kasd read, and quote in an error, only files of that project, which they can read
anyway: not another project's checkout under the same config root, nor anything else kasd can read.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, NoReturn, Protocol, TypeVar, cast

import attrs
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from daemonkit import yamldoc
from kasd.authz.directory import full_path_problem
from kasd.authz.expand import role_template_problem
from kasd.authz.marks import Mark
from kasd.authz.services import MAX_SERVICES, SERVICE_NAME, ServiceAccess, ServiceCiEntry

Mode = Literal["agent", "impersonate", "ci_job", "ci_user"]
EntryKind = Literal["project", "group", "instance", "implicit"]
When = Literal["always", "never"]
OnOverflow = Literal["fail", "truncate"]

#: a larger config.yaml (or template) is refused before it is parsed: the budget of every YAML document
MAX_CONFIG_BYTES = yamldoc.DEFAULT_BUDGET.max_bytes
#: YAML nodes one file may make kasd look at, aliases expanded (``daemonkit.yamldoc``)
MAX_NODES = yamldoc.DEFAULT_BUDGET.max_nodes
#: roles one rule's ``roles:`` may name (one RoleBinding each)
MAX_ROLES = 16
#: entries of one ``projects:`` or ``groups:`` list (``ci_access`` and ``user_access``): GitLab's
#: ``AUTHORIZED_ENTITY_LIMIT`` (17.0). GitLab ignores the entries after it; kasd refuses the file (a
#: setting that does nothing must not look as if it did). Each request walks them on the event loop:
#: 25,000 project and 5,000 group entries (a file inside the YAML budget) cost 18 ms per agent per job.
MAX_ENTRIES = 500
#: names or ``*`` patterns in one entry's ``environments:`` (kasd's limit; GitLab has none): a job of
#: the entry's projects is matched against each, per request: 25,000 patterns cost 60 ms
MAX_ENVIRONMENTS = 100

#: GitLab's agent names: a DNS label
_AGENT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: a Kubernetes namespace name (RFC 1123 label)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

#: top-level keys of GitLab's agent configuration that kasd does not use: ignored by name, unread
GITLAB_KEYS_IGNORED = (
    "gitops", "observability", "cilium", "starboard", "container_scanning", "remote_development", "flux",
    "workspaces",
)


# --------------------------------------------------------------------------- the values


@attrs.frozen(kw_only=True)
class ImpersonateConfig:
    """``access_as: {impersonate: …}``: a fixed identity."""

    username: str
    uid: str | None = None
    groups: tuple[str, ...] = ()
    #: GitLab's ``extra: [{key, val: [..]}]``, in the file's order
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@attrs.frozen(kw_only=True)
class AccessAs:
    """``access_as``: exactly one of ``agent`` (the default), ``impersonate``, ``ci_job``, ``ci_user``."""

    mode: Mode = "agent"
    #: only with mode ``impersonate``
    impersonate: ImpersonateConfig | None = None


@attrs.frozen(kw_only=True)
class RawRule:
    """One ``rules:`` entry as written, for the rules engine to compile (kasd.authz.rules).

    ``if_mark`` is where the ``if:`` value starts in the file; ``if_style`` is its YAML style (None
    plain, ``'`` or ``"`` quoted, ``|`` or ``>`` block): for a plain or quoted one-line value, an
    expression column c is file column ``if_mark.column + c - 1`` (plus 1 when quoted).
    """

    if_text: str | None
    if_mark: Mark | None
    if_style: str | None = None
    namespace: str | None = None
    when: When = "always"
    #: kasd's extension: a namespace template that expands past 63 characters fails the rule, or is cut
    on_overflow: OnOverflow = "fail"
    #: kasd's extension: the roles the managed namespace's binding grants (``kasd.authz.expand``); ()
    #: is ``admin``
    roles: tuple[str, ...] = ()
    #: where the rule starts
    mark: Mark | None = None


@attrs.frozen(kw_only=True)
class CiAccessEntry:
    """One ``ci_access`` entry; never merged with another (the most specific one decides)."""

    kind: EntryKind
    #: the project or group full path as written; None for ``instance`` and the implicit entry
    id: str | None = None
    default_namespace: str | None = None
    access_as: AccessAs = AccessAs()
    #: empty: any job, with or without an environment
    environments: tuple[str, ...] = ()
    protected_branches_only: bool = False
    resource_management: bool = False
    rules: tuple[RawRule, ...] = ()
    mark: Mark | None = None
    #: the entry as written in config.yaml, without ``id``, as plain JSON data: what GitLab's
    #: ``allowed_agents`` answers as the agent's ``configuration``
    written: Mapping[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.frozen(kw_only=True)
class CiAccess:
    projects: tuple[CiAccessEntry, ...] = ()
    groups: tuple[CiAccessEntry, ...] = ()
    instance: CiAccessEntry | None = None


@attrs.frozen(kw_only=True)
class UserAccess:
    """``user_access``: members (Developer or more) of these projects and groups may use the agent."""

    access_as: Literal["agent", "user"]
    projects: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    mark: Mark | None = None


@attrs.frozen(kw_only=True)
class AgentConfig:
    #: the file it was read from (for messages)
    source: str
    ci_access: CiAccess = CiAccess()
    #: None: no ``user_access:``, no personal tokens
    user_access: UserAccess | None = None
    #: ``services:`` (kasd's extension): who may use which in-cluster service (``kasd.authz.services``)
    services: tuple[ServiceAccess, ...] = ()


@attrs.frozen(kw_only=True)
class LoadedAgentConfig:
    config: AgentConfig
    #: notes for the log (a missing file); the caller logs them once
    warnings: tuple[str, ...] = ()


class AgentConfigError(ValueError):
    """The file is unusable: ``str()`` is ``<file>:<line>:<column>: <key>: <problem>``."""

    def __init__(self, message: str, *, mark: Mark | None = None, key: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.mark = mark
        self.key = key
        self.problem = problem or message


# --------------------------------------------------------------------------- finding and reading


def agent_config_path(config_root: Path, config_project: str, agent_name: str) -> Path:
    """``<config_root>/<config_project>/.gitlab/agents/<agent_name>/config.yaml``; a project path or
    an agent name that could step outside ``config_root`` raises ``AgentConfigError``."""
    problem = full_path_problem(config_project)
    if problem:
        raise AgentConfigError(f"agent config project {config_project!r}: {problem}")
    if not _AGENT_NAME.fullmatch(agent_name):
        raise AgentConfigError(
            f"agent name {agent_name!r} is not a GitLab agent name (lower-case letters, digits and '-', "
            "at most 63), so it names no .gitlab/agents/ directory"
        )
    return config_root / config_project / ".gitlab" / "agents" / agent_name / "config.yaml"


def load_agent_config(config_root: Path, config_project: str, agent_name: str) -> LoadedAgentConfig:
    """Read and check one agent's ``config.yaml``. A missing file is an empty configuration (as in
    GitLab: only jobs of the config project itself may use the agent), reported as a warning."""
    path = agent_config_path(config_root, config_project, agent_name)
    try:
        text = read_config_text(project_root(config_root, config_project, AgentConfigError), path, AgentConfigError)
    except FileNotFoundError:
        return LoadedAgentConfig(
            config=AgentConfig(source=str(path)),
            warnings=(f"{path}: no such file: the agent has the default configuration (only CI/CD jobs "
                      f"of its config project {config_project} may use it)",),
        )
    return parse_agent_config(text, str(path))


def project_root(config_root: Path, config_project: str, error: type[ValueError]) -> Path:
    """The real path of the config project's checkout, ``<config_root>/<config_project>``: what every
    file of its agents' configuration must be inside (``read_config_text``). The operator may make
    it (or ``config_root``) a symlink, as long as it stays inside ``config_root``; ``error`` otherwise."""
    real_root = os.path.realpath(config_root)
    real = os.path.realpath(config_root / config_project)
    if not _inside(real, real_root):
        raise error(f"{config_root / config_project}: refused: its real path is outside authorization.config_root "
                    f"({config_root})")
    return Path(real)


def read_config_text(root: Path, path: Path, error: type[ValueError]) -> str:
    """The text of a file of an agent's configuration (``config.yaml``, a template) under ``root``,
    the real path of its config project's checkout (``project_root``): at most ``MAX_CONFIG_BYTES``,
    UTF-8, a regular file whose real path is inside ``root`` — a symlink (the file's or a
    directory's on the way) that stays inside the project is followed, one that leads out of it
    (to another project's checkout under the same config root, or anywhere else) is refused, so
    that a config project's committer cannot make kasd read, and quote, a file they could not read
    themselves. ``error`` naming the path otherwise (never the target). ``FileNotFoundError`` is
    the caller's to read (a missing ``config.yaml`` is the default configuration). Blocking: call
    it off the event loop."""
    try:
        fd = _open_within(root, path)
    except FileNotFoundError:
        raise
    except _Outside:
        raise error(f"{path}: refused: its real path is outside its config project ({root}); a symlink there "
                    "may point only to files of the same project") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    try:
        return yamldoc.decode(data)
    except yamldoc.YamlError as exc:
        raise error(f"{path}: {exc.problem}") from None


class _Outside(Exception):
    pass


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _open_within(root: Path, path: Path) -> int:
    """A descriptor of ``path`` opened for reading, if its real path is inside ``root`` and it is a
    regular file (opened without blocking: a FIFO would wait for a writer)."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if not _inside(real, real_root):
        raise _Outside
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
        # What the kernel opened: a directory on the way swapped for a symlink after realpath shows here.
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # no /proc: the realpath check stands alone
            opened = real
        if not _inside(opened, real_root):
            raise _Outside
    except BaseException:
        os.close(fd)
        raise
    return fd


def compose_yaml(text: str, source: str, error: type[ValueError] = ValueError) -> Node | None:
    """The YAML node tree of ``text`` (None for an empty document) through ``daemonkit.yamldoc``, the
    one bounded reader (node, alias, depth and time budget); ``error`` raised as
    ``<source>:<line>:<column>: <problem>`` (never quoting the file)."""
    try:
        return yamldoc.compose(text)
    except yamldoc.YamlError as exc:
        raise error(exc.at(source)) from None


def parse_agent_config(text: str, source: str) -> LoadedAgentConfig:
    """Check the text of a ``config.yaml``; ``source`` names it in messages."""
    node = compose_yaml(text, source, AgentConfigError)
    reader = _Reader(source)
    if node is None or _is_null(node):
        return LoadedAgentConfig(config=AgentConfig(source=source))
    return LoadedAgentConfig(config=reader.config(node))


# --------------------------------------------------------------------------- the walk

_STR = "tag:yaml.org,2002:str"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
#: reads a plain scalar (bool, null, int, float) as YAML 1.1 does
_SCALARS = SafeConstructor()

T = TypeVar("T")


class _Identified(Protocol):
    @property
    def id(self) -> str | None: ...


#: an entry of a ``projects:``/``groups:`` list: the agent's own ``ci_access``'s, or a service's
_Entry = TypeVar("_Entry", bound=_Identified)


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _NULL


_describe = yamldoc.describe


def _shown(name: str) -> str:
    """A key as written, for a key path: cut short, and escaped when it holds control characters."""
    if len(name) <= 40 and name.isprintable():
        return name
    return yamldoc.excerpt(name)


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    # ------------------------------------------------------------------- typed reads

    def mark(self, node: Node) -> Mark:
        return Mark(file=self.source, line=node.start_mark.line + 1, column=node.start_mark.column + 1)

    def fail(self, node: Node, key: str, problem: str) -> NoReturn:
        mark = self.mark(node)
        raise AgentConfigError(f"{mark}: {key or '(top level)'}: {problem}", mark=mark, key=key, problem=problem)

    def unknown(self, node: Node, key: str, name: str, known: tuple[str, ...]) -> NoReturn:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        self.fail(node, key, f"unknown key ({hint}" + (f"expected one of: {', '.join(known)})" if known else
                                                         "this mapping takes no keys)"))

    def mapping(self, node: Node, key: str, known: tuple[str, ...], *, strict: bool = True,
                ignored: tuple[str, ...] = ()) -> dict[str, tuple[Node, Node]]:
        """The mapping's known keys → (key node, value node); an unknown key is an error (``strict``
        is kept for the callers that say so: every mapping is), ``ignored`` ones are skipped unread;
        null is an empty mapping. (The document's size is bounded when composed: ``yamldoc``.)"""
        if _is_null(node):
            return {}
        if not isinstance(node, MappingNode):
            self.fail(node, key, f"must be a mapping, got {_describe(node)}")
        out: dict[str, tuple[Node, Node]] = {}
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not (isinstance(key_node, ScalarNode) and key_node.tag == _STR):
                self.fail(key_node, key, f"keys must be strings, got {_describe(key_node)}")
            name = key_node.value
            here = f"{key}.{_shown(name)}" if key else _shown(name)
            if name in seen:
                self.fail(key_node, here, "appears twice in one mapping")
            seen.add(name)
            if name in known:
                out[name] = (key_node, value_node)
            elif name not in ignored:
                self.unknown(key_node, here, name, known)
        return out

    def sequence(self, node: Node, key: str, what: str) -> list[Node]:
        if _is_null(node):
            return []
        if not isinstance(node, SequenceNode):
            self.fail(node, key, f"must be a list of {what}, got {_describe(node)}")
        return list(node.value)

    def string(self, node: Node, key: str, *, empty: bool = False) -> str:
        if not (isinstance(node, ScalarNode) and node.tag == _STR):
            self.fail(node, key, f"must be a string, got {_describe(node)}")
        if not empty and not node.value:
            self.fail(node, key, "must not be empty")
        return cast(str, node.value)

    def boolean(self, node: Node, key: str) -> bool:
        if not (isinstance(node, ScalarNode) and node.tag == _BOOL):
            self.fail(node, key, f"must be true or false, got {_describe(node)}")
        return cast(str, node.value).lower() in ("true", "yes", "on", "y")

    def choice(self, node: Node, key: str, choices: tuple[str, ...]) -> str:
        text = self.string(node, key)
        if text not in choices:
            self.fail(node, key, f"must be one of {', '.join(choices)}, got {_describe(node)}")
        return text

    def strings(self, node: Node, key: str) -> tuple[str, ...]:
        return tuple(self.string(item, f"{key}[{i}]") for i, item in enumerate(self.sequence(node, key, "strings")))

    def optional(self, fields: dict[str, tuple[Node, Node]], name: str, key: str,
                 read: Callable[[Node, str], T]) -> T | None:
        """``read`` of the field ``name`` if present and not null."""
        if name not in fields or _is_null(fields[name][1]):
            return None
        return read(fields[name][1], f"{key}.{name}" if key else name)

    # ------------------------------------------------------------------- the schema

    def config(self, node: Node) -> AgentConfig:
        top = self.mapping(node, "", ("ci_access", "user_access", "services"), ignored=GITLAB_KEYS_IGNORED)
        ci_access = self.optional(top, "ci_access", "", self.ci_access) or CiAccess()
        user_access = self.optional(top, "user_access", "", self.user_access)
        services = self.optional(top, "services", "", self.services) or ()
        return AgentConfig(source=self.source, ci_access=ci_access, user_access=user_access, services=services)

    def ci_access(self, node: Node, key: str) -> CiAccess:
        fields = self.mapping(node, key, ("projects", "groups", "instance"))
        projects = self.optional(fields, "projects", key, lambda n, k: self.entries(n, k, "project", self.entry)) or ()
        groups = self.optional(fields, "groups", key, lambda n, k: self.entries(n, k, "group", self.entry)) or ()
        instance = None
        if "instance" in fields:  # `instance: {}` (or null) authorizes every project
            instance = self.entry(fields["instance"][1], f"{key}.instance", "instance")
        return CiAccess(projects=projects, groups=groups, instance=instance)

    def entries(self, node: Node, key: str, kind: EntryKind, read: Callable[[Node, str, EntryKind], _Entry],
                what: str | None = None) -> tuple[_Entry, ...]:
        """A ``projects:``/``groups:`` list: at most ``MAX_ENTRIES``, each read by ``read`` (``entry``
        for the agent's own ``ci_access``, ``service_ci_entry`` for a service's), no id twice (any case)."""
        out: list[_Entry] = []
        seen: dict[str, int] = {}
        items = self.sequence(node, key, what or f"{kind}s")
        if len(items) > MAX_ENTRIES:
            self.fail(items[MAX_ENTRIES], f"{key}[{MAX_ENTRIES}]", f"more than {MAX_ENTRIES} entries (GitLab's limit; it "
                      "would ignore the rest)")
        for i, item in enumerate(items):
            entry = read(item, f"{key}[{i}]", kind)
            assert entry.id is not None
            other = seen.setdefault(entry.id.lower(), i)
            if other != i:
                self.fail(item, f"{key}[{i}].id", f"{yamldoc.excerpt(entry.id)} is already {key}[{other}] (entries are never merged)")
            out.append(entry)
        return tuple(out)

    def entry_id(self, fields: Mapping[str, tuple[Node, Node]], node: Node, key: str, kind: EntryKind) -> str:
        """An entry's ``id``: a project's or group's full path."""
        if "id" not in fields:
            self.fail(node, f"{key}.id", f"missing (the {kind}'s full path, e.g. group/project)")
        entry_id = self.string(fields["id"][1], f"{key}.id")
        problem = full_path_problem(entry_id)
        if problem:
            self.fail(fields["id"][1], f"{key}.id", problem)
        return entry_id

    _ENTRY_KEYS = ("default_namespace", "access_as", "environments", "protected_branches_only",
                   "resource_management", "rules")

    def entry(self, node: Node, key: str, kind: EntryKind) -> CiAccessEntry:
        known = self._ENTRY_KEYS if kind == "instance" else ("id", *self._ENTRY_KEYS)
        fields = self.mapping(node, key, known)
        entry_id = None if kind == "instance" else self.entry_id(fields, node, key, kind)
        namespace = self.optional(fields, "default_namespace", key, self.namespace_name)
        access_as = self.optional(fields, "access_as", key, self.ci_access_as) or AccessAs()
        environments = self.optional(fields, "environments", key, self.environments) or ()
        protected = self.optional(fields, "protected_branches_only", key, self.boolean) or False
        resource_management = self.optional(fields, "resource_management", key, self.resource_management) or False
        rules = self.optional(fields, "rules", key, self.rules) or ()
        return CiAccessEntry(
            kind=kind, id=entry_id, default_namespace=namespace, access_as=access_as,
            environments=environments, protected_branches_only=protected,
            resource_management=resource_management, rules=rules, mark=self.mark(node),
            written={name: self.plain(value, f"{key}.{name}") for name, value in self.pairs(node) if name != "id"},
        )

    def services(self, node: Node, key: str) -> tuple[ServiceAccess, ...]:
        """``services:`` (kasd's extension, ``kasd.authz.services``): a list of distinct service names,
        each with its ``ci_access`` and ``user_access`` (the lists as in the agent's own)."""
        items = self.sequence(node, key, "services")
        if len(items) > MAX_SERVICES:
            self.fail(items[MAX_SERVICES], f"{key}[{MAX_SERVICES}]", f"more than {MAX_SERVICES} services (kasd's limit)")
        out: list[ServiceAccess] = []
        seen: dict[str, int] = {}
        for i, item in enumerate(items):
            here = f"{key}[{i}]"
            fields = self.mapping(item, here, ("name", "ci_access", "user_access"))
            if "name" not in fields:
                self.fail(item, f"{here}.name", "missing (the service's name in agentd's services: list)")
            name_node = fields["name"][1]
            name = self.string(name_node, f"{here}.name")
            if not SERVICE_NAME.fullmatch(name):
                self.fail(name_node, f"{here}.name", "is not a service name (lower-case letters, digits and '-', at "
                                                     "most 63, as agentd's services: names them)")
            other = seen.setdefault(name, i)
            if other != i:
                self.fail(name_node, f"{here}.name", f"{name!r} is already {key}[{other}].name")
            ci_projects: tuple[ServiceCiEntry, ...] = ()
            ci_groups: tuple[ServiceCiEntry, ...] = ()
            if "ci_access" in fields:
                ci_key = f"{here}.ci_access"
                ci = self.mapping(fields["ci_access"][1], ci_key, ("projects", "groups"))
                ci_projects = self.optional(ci, "projects", ci_key, lambda n, k: self.entries(
                    n, k, "project", self.service_ci_entry, "{id: path} mappings")) or ()
                ci_groups = self.optional(ci, "groups", ci_key, lambda n, k: self.entries(
                    n, k, "group", self.service_ci_entry, "{id: path} mappings")) or ()
            user_projects: tuple[str, ...] = ()
            user_groups: tuple[str, ...] = ()
            if "user_access" in fields:
                user_key = f"{here}.user_access"
                users = self.mapping(fields["user_access"][1], user_key, ("projects", "groups"))
                user_projects = self.optional(users, "projects", user_key, self.ids) or ()
                user_groups = self.optional(users, "groups", user_key, self.ids) or ()
            out.append(ServiceAccess(name=name, ci_projects=ci_projects, ci_groups=ci_groups,
                                     user_projects=user_projects, user_groups=user_groups, mark=self.mark(item)))
        return tuple(out)

    def service_ci_entry(self, node: Node, key: str, kind: EntryKind) -> ServiceCiEntry:
        """One entry of a service's ``ci_access``: ``{id, environments}``."""
        assert kind in ("project", "group")
        fields = self.mapping(node, key, ("id", "environments"))
        entry_id = self.entry_id(fields, node, key, kind)
        environments = self.optional(fields, "environments", key, self.environments) or ()
        return ServiceCiEntry(kind=kind, id=entry_id, environments=environments)

    def pairs(self, node: Node) -> list[tuple[str, Node]]:
        """A mapping's entries in the file's order, every key (null: none)."""
        if not isinstance(node, MappingNode):
            return []
        return [(str(self.plain(key_node, "")), value) for key_node, value in node.value]

    def plain(self, node: Node, key: str) -> Any:
        """``node`` as JSON data (mappings, lists, strings, numbers, booleans, null), as YAML reads
        it. The reader already counted every value against the file's YAML budget (``daemonkit.yamldoc``:
        an alias counts its whole subtree), so this walk is bounded by it."""
        if isinstance(node, MappingNode):
            return {name: self.plain(value, f"{key}.{name}") for name, value in self.pairs(node)}
        if isinstance(node, SequenceNode):
            return [self.plain(item, f"{key}[{i}]") for i, item in enumerate(node.value)]
        if node.tag in (_BOOL, _NULL, _INT, _FLOAT):
            value = _SCALARS.construct_object(node)
            if not (isinstance(value, float) and not math.isfinite(value)):
                return value
        return node.value

    def namespace_name(self, node: Node, key: str) -> str:
        name = self.string(node, key)
        if not _NAMESPACE.fullmatch(name):
            self.fail(node, key, f"{_describe(node)} that is not a Kubernetes namespace name (lower-case "
                                 "letters, digits and '-', at most 63)")
        return name

    def resource_management(self, node: Node, key: str) -> bool:
        fields = self.mapping(node, key, ("enabled",))
        return self.optional(fields, "enabled", key, self.boolean) or False

    def _one_of(self, node: Node, key: str, modes: tuple[str, ...]) -> tuple[str, Node] | None:
        fields = self.mapping(node, key, modes, strict=True)
        if len(fields) > 1:
            names = list(fields)
            self.fail(fields[names[1]][0], f"{key}.{names[1]}",
                      f"access_as takes exactly one of {', '.join(modes)}; {names[0]} is given too")
        if not fields:
            return None
        name, (_, value) = next(iter(fields.items()))
        return name, value

    def ci_access_as(self, node: Node, key: str) -> AccessAs:
        chosen = self._one_of(node, key, ("agent", "impersonate", "ci_job", "ci_user"))
        if chosen is None:  # `access_as: {}`: GitLab's default
            return AccessAs()
        mode, value = chosen
        if mode == "impersonate":
            return AccessAs(mode="impersonate", impersonate=self.impersonate(value, f"{key}.impersonate"))
        self.mapping(value, f"{key}.{mode}", ())  # `{}` (or null)
        return AccessAs(mode=cast(Mode, mode))

    def impersonate(self, node: Node, key: str) -> ImpersonateConfig:
        if _is_null(node):
            self.fail(node, f"{key}.username", "missing (impersonation needs a username)")
        fields = self.mapping(node, key, ("username", "uid", "groups", "extra"), strict=True)
        if "username" not in fields:
            self.fail(node, f"{key}.username", "missing (impersonation needs a username)")
        username = self.string(fields["username"][1], f"{key}.username")
        uid = self.optional(fields, "uid", key, self.string)
        groups = self.optional(fields, "groups", key, self.strings) or ()
        extra = self.optional(fields, "extra", key, self.extra) or ()
        return ImpersonateConfig(username=username, uid=uid, groups=groups, extra=extra)

    def extra(self, node: Node, key: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
        out: list[tuple[str, tuple[str, ...]]] = []
        seen: dict[str, int] = {}
        for i, item in enumerate(self.sequence(node, key, "{key, val} mappings")):
            here = f"{key}[{i}]"
            fields = self.mapping(item, here, ("key", "val"), strict=True)
            if "key" not in fields:
                self.fail(item, f"{here}.key", "missing (GitLab's extra is a list of {key: …, val: [...]})")
            name = self.string(fields["key"][1], f"{here}.key")
            other = seen.setdefault(name, i)
            if other != i:
                self.fail(fields["key"][1], f"{here}.key", f"the same as {key}[{other}].key")
            values = self.optional(fields, "val", here, self.strings) or ()
            out.append((name, values))
        return tuple(out)

    def rules(self, node: Node, key: str) -> tuple[RawRule, ...]:
        out: list[RawRule] = []
        for i, item in enumerate(self.sequence(node, key, "rules")):
            here = f"{key}[{i}]"
            fields = self.mapping(item, here, ("if", "namespace", "when", "on_overflow", "roles"), strict=True)
            if_text = if_mark = if_style = None
            if "if" in fields:
                value = fields["if"][1]
                if_text = self.string(value, f"{here}.if")
                if_mark = self.mark(value)
                if_style = cast(ScalarNode, value).style
            namespace = self.optional(fields, "namespace", here, self.string)
            when = self.optional(fields, "when", here, lambda n, k: self.choice(n, k, ("always", "never")))
            overflow = self.optional(fields, "on_overflow", here, lambda n, k: self.choice(n, k, ("fail", "truncate")))
            roles = self.optional(fields, "roles", here, self.roles) or ()
            if roles and namespace is None:
                self.fail(fields["roles"][0], f"{here}.roles", "needs namespace: (the roles are granted in the "
                                                                "namespace the rule resolves to)")
            out.append(RawRule(
                if_text=if_text, if_mark=if_mark, if_style=if_style, namespace=namespace,
                when=cast(When, when or "always"), on_overflow=cast(OnOverflow, overflow or "fail"),
                roles=roles, mark=self.mark(item),
            ))
        return tuple(out)

    def environments(self, node: Node, key: str) -> tuple[str, ...]:
        """``environments:``: at most ``MAX_ENVIRONMENTS`` names or ``*`` patterns."""
        items = self.sequence(node, key, "strings")
        if len(items) > MAX_ENVIRONMENTS:
            self.fail(items[MAX_ENVIRONMENTS], f"{key}[{MAX_ENVIRONMENTS}]",
                      f"more than {MAX_ENVIRONMENTS} environments (kasd's limit)")
        return self.strings(node, key)

    def roles(self, node: Node, key: str) -> tuple[str, ...]:
        """``roles:``: 1 to ``MAX_ROLES`` distinct ``<name>``, ``ClusterRole/<name>`` or ``Role/<name>``."""
        items = self.sequence(node, key, "roles")
        if not items or len(items) > MAX_ROLES:
            self.fail(node, key, f"must list 1 to {MAX_ROLES} roles (leave it out for admin)")
        out: list[str] = []
        for i, item in enumerate(items):
            role = self.string(item, f"{key}[{i}]")
            problem = role_template_problem(role)
            if problem:
                self.fail(item, f"{key}[{i}]", problem)
            if role in out:
                self.fail(item, f"{key}[{i}]", f"{role!r} is already {key}[{out.index(role)}]")
            out.append(role)
        return tuple(out)

    def user_access(self, node: Node, key: str) -> UserAccess:
        fields = self.mapping(node, key, ("access_as", "projects", "groups"))
        mode = "agent"  # GitLab 18.3: user_access without access_as (or with {}) acts as the agent
        if "access_as" in fields:
            chosen = self._one_of(fields["access_as"][1], f"{key}.access_as", ("agent", "user"))
            if chosen is not None:
                mode, value = chosen
                self.mapping(value, f"{key}.access_as.{mode}", ())
        projects = self.optional(fields, "projects", key, self.ids) or ()
        groups = self.optional(fields, "groups", key, self.ids) or ()
        return UserAccess(access_as=cast(Literal["agent", "user"], mode), projects=projects, groups=groups,
                          mark=self.mark(node))

    def ids(self, node: Node, key: str) -> tuple[str, ...]:
        out: list[str] = []
        items = self.sequence(node, key, "{id: path} mappings")
        if len(items) > MAX_ENTRIES:
            self.fail(items[MAX_ENTRIES], f"{key}[{MAX_ENTRIES}]", f"more than {MAX_ENTRIES} entries (GitLab's limit; it "
                      "would ignore the rest)")
        for i, item in enumerate(items):
            fields = self.mapping(item, f"{key}[{i}]", ("id",))
            if "id" not in fields:
                self.fail(item, f"{key}[{i}].id", "missing (a full path, e.g. group/project)")
            path = self.string(fields["id"][1], f"{key}[{i}].id")
            problem = full_path_problem(path)
            if problem:
                self.fail(fields["id"][1], f"{key}[{i}].id", problem)
            out.append(path)
        return tuple(out)


__all__ = [
    "GITLAB_KEYS_IGNORED",
    "MAX_ENTRIES",
    "AccessAs",
    "AgentConfig",
    "AgentConfigError",
    "CiAccess",
    "CiAccessEntry",
    "ImpersonateConfig",
    "LoadedAgentConfig",
    "Mark",
    "Mode",
    "RawRule",
    "UserAccess",
    "agent_config_path",
    "compose_yaml",
    "load_agent_config",
    "parse_agent_config",
    "project_root",
    "read_config_text",
]
