"""Agent config.yaml files: GitLab's schema read whole, every mistake named by file:line:column and
key path, unknown keys kept out and warned of once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kasd.authz.agentconfig import (
    AccessAs,
    AgentConfigError,
    ImpersonateConfig,
    Mark,
    agent_config_path,
    load_agent_config,
    parse_agent_config,
)

pytestmark = pytest.mark.timeout(10)

SRC = "/repos/acme/infra/.gitlab/agents/prod/config.yaml"

FULL = """\
gitops:
  manifest_projects: [{id: acme/manifests}]
observability: {logging: {level: debug}}
remote_development: {enabled: true}
ci_access:
  projects:
    - id: acme/web/shop
      default_namespace: shop
      access_as:
        ci_job: {}
      environments: [production, "review/*"]
      protected_branches_only: true
      resource_management: {enabled: true}
      rules:
        - if: '$CI_COMMIT_BRANCH == "main"'
          namespace: shop-$CI_ENVIRONMENT_SLUG
          when: always
          on_overflow: truncate
        - when: never
  groups:
    - id: acme
      access_as:
        impersonate:
          username: deployer
          uid: "1000"
          groups: [deployers, auditors]
          extra:
            - key: example.com/team
              val: [platform, web]
    - id: acme/data
      access_as: {ci_user: {}}
  instance:
    access_as: {agent: {}}
    environments: [sandbox]
user_access:
  access_as: {user: {}}
  projects: [{id: acme/infra}]
  groups: [{id: acme/web}]
"""


def test_the_whole_schema() -> None:
    loaded = parse_agent_config(FULL, SRC)
    assert loaded.warnings == ()  # gitops, observability, remote_development are GitLab's: no warning
    ci = loaded.config.ci_access
    (shop,) = ci.projects
    assert (shop.kind, shop.id, shop.default_namespace) == ("project", "acme/web/shop", "shop")
    assert shop.access_as == AccessAs(mode="ci_job")
    assert shop.environments == ("production", "review/*")
    assert shop.protected_branches_only and shop.resource_management
    first, second = shop.rules
    assert first.if_text == '$CI_COMMIT_BRANCH == "main"'
    assert first.if_mark == Mark(file=SRC, line=15, column=15) and first.if_style == "'"
    assert (first.namespace, first.when, first.on_overflow) == ("shop-$CI_ENVIRONMENT_SLUG", "always", "truncate")
    assert (second.if_text, second.if_mark, second.when, second.on_overflow) == (None, None, "never", "fail")
    acme, data = ci.groups
    assert acme.access_as == AccessAs(mode="impersonate", impersonate=ImpersonateConfig(
        username="deployer", uid="1000", groups=("deployers", "auditors"),
        extra=(("example.com/team", ("platform", "web")),)))
    assert acme.environments == () and not acme.protected_branches_only and acme.rules == ()
    assert data.access_as.mode == "ci_user"
    assert ci.instance is not None and ci.instance.environments == ("sandbox",) and ci.instance.id is None
    user_access = loaded.config.user_access
    assert user_access is not None
    assert (user_access.access_as, user_access.projects, user_access.groups) == ("user", ("acme/infra",), ("acme/web",))


@pytest.mark.parametrize(("text", "mode"), [
    ("ci_access: {projects: [{id: a/b}]}", "agent"),
    ("ci_access: {projects: [{id: a/b, access_as: {}}]}", "agent"),
    ("ci_access: {projects: [{id: a/b, access_as: {agent: {}}}]}", "agent"),
    ("ci_access: {projects: [{id: a/b, access_as: {agent: }}]}", "agent"),
    ("ci_access: {projects: [{id: a/b, access_as: {ci_job: {}}}]}", "ci_job"),
])
def test_access_as_defaults_to_agent(text: str, mode: str) -> None:
    assert parse_agent_config(text, SRC).config.ci_access.projects[0].access_as.mode == mode


@pytest.mark.parametrize("text", ["", "# nothing\n", "ci_access:\n", "ci_access: {projects: }"])
def test_empty_is_the_default_configuration(text: str) -> None:
    loaded = parse_agent_config(text, SRC)
    assert loaded.config.ci_access.projects == () and loaded.config.ci_access.instance is None
    assert loaded.config.user_access is None and loaded.warnings == ()


@pytest.mark.parametrize(("text", "message"), [
    ("ci_access:\n  projects:\n    - id: 42\n",
     "3:11: ci_access.projects[0].id: must be a string, got an int of 2 characters"),
    ("ci_access:\n  projects:\n    - default_namespace: x\n",
     "3:7: ci_access.projects[0].id: missing"),
    ("ci_access:\n  projects:\n    - id: a/b\n    - id: A/B\n",
     "4:7: ci_access.projects[1].id: 'A/B' is already ci_access.projects[0] (entries are never merged)"),
    ("ci_access:\n  groups:\n    - id: ../etc\n",
     "3:11: ci_access.groups[0].id: '../etc' is not a path"),
    ("ci_access:\n  projects:\n    - id: a/b\n      access_as:\n        agent: {}\n        ci_job: {}\n",
     "6:9: ci_access.projects[0].access_as.ci_job: access_as takes exactly one of agent, impersonate, ci_job, "
     "ci_user; agent is given too"),
    ("ci_access:\n  projects:\n    - id: a/b\n      access_as:\n        root: {}\n",
     "5:9: ci_access.projects[0].access_as.root: unknown key (expected one of: agent, impersonate, ci_job, ci_user)"),
    ("ci_access:\n  projects:\n    - id: a/b\n      access_as: ci_job\n",
     "4:18: ci_access.projects[0].access_as: must be a mapping, got a string of 6 characters"),
    ("ci_access:\n  groups:\n    - id: a\n      access_as:\n        impersonate: {groups: [x]}\n",
     "5:22: ci_access.groups[0].access_as.impersonate.username: missing (impersonation needs a username)"),
    ("ci_access:\n  groups:\n    - id: a\n      access_as:\n        impersonate: {username: u, group: [x]}\n",
     "5:36: ci_access.groups[0].access_as.impersonate.group: unknown key (did you mean groups? expected one of: username, uid, groups, extra)"),
    ("ci_access:\n  groups:\n    - id: a\n      access_as:\n        impersonate: {username: u, extra: {k: [v]}}\n",
     "5:43: ci_access.groups[0].access_as.impersonate.extra: must be a list of {key, val} mappings, got a mapping"),
    ("ci_access:\n  groups:\n    - id: a\n      access_as:\n        impersonate:\n          username: u\n"
     "          extra: [{key: k, val: [1]}]\n",
     "7:34: ci_access.groups[0].access_as.impersonate.extra[0].val[0]: must be a string, got an int of 1 character"),
    ("ci_access:\n  projects:\n    - id: a/b\n      environments: production\n",
     "4:21: ci_access.projects[0].environments: must be a list of strings, got a string of 10 characters"),
    ("ci_access:\n  projects:\n    - id: a/b\n      protected_branches_only: 'yes'\n",
     "4:32: ci_access.projects[0].protected_branches_only: must be true or false, got a string of 3 characters"),
    ("ci_access:\n  projects:\n    - id: a/b\n      resource_management: {enabled: 1}\n",
     "4:38: ci_access.projects[0].resource_management.enabled: must be true or false, got an int of 1 character"),
    ("ci_access:\n  projects:\n    - id: a/b\n      default_namespace: Prod_NS\n",
     "4:26: ci_access.projects[0].default_namespace: a string of 7 characters that is not a Kubernetes namespace name"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - if: 42\n",
     "5:15: ci_access.projects[0].rules[0].if: must be a string, got an int of 2 characters"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - when: sometimes\n",
     "5:17: ci_access.projects[0].rules[0].when: must be one of always, never, got a string of 9 characters"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - on_overflow: wrap\n",
     "5:24: ci_access.projects[0].rules[0].on_overflow: must be one of fail, truncate, got a string of 4 characters"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - iff: x\n",
     "5:11: ci_access.projects[0].rules[0].iff: unknown key (did you mean if? expected one of: if, namespace, when, on_overflow, "
     "roles)"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {namespace: n, roles: []}\n",
     "5:33: ci_access.projects[0].rules[0].roles: must list 1 to 16 roles (leave it out for admin)"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {namespace: n, roles: [Binding/x]}\n",
     "5:34: ci_access.projects[0].rules[0].roles[0]: 'Binding' is not a kind of role (write <name> or "
     "ClusterRole/<name> for a ClusterRole, Role/<name> for a Role in the managed namespace)"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {namespace: n, roles: ['x%2F..', Role/]}\n",
     "5:34: ci_access.projects[0].rules[0].roles[0]: 'x%2F..' is not a role name (a letter or digit, then "
     "letters, digits, ':', '.', '_' and '-')"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {namespace: n, roles: [Role/]}\n",
     "5:34: ci_access.projects[0].rules[0].roles[0]: 'Role/' names no role"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {namespace: n, roles: [edit, edit]}\n",
     "5:40: ci_access.projects[0].rules[0].roles[1]: 'edit' is already ci_access.projects[0].rules[0].roles[0]"),
    ("ci_access:\n  projects:\n    - id: a/b\n      rules:\n        - {roles: [edit]}\n",
     "5:12: ci_access.projects[0].rules[0].roles: needs namespace: (the roles are granted in the namespace the "
     "rule resolves to)"),
    ("ci_access:\n  projects:\n    - id: a/b\n    - id: a/c\n      id: a/d\n",
     "5:7: ci_access.projects[1].id: appears twice in one mapping"),
    ("user_access:\n  access_as: {ci_job: {}}\n",
     "2:15: user_access.access_as.ci_job: unknown key (expected one of: agent, user)"),
    ("user_acess:\n  projects: [{id: a/b}]\n",
     "1:1: user_acess: unknown key (did you mean user_access? expected one of: ci_access, user_access, services)"),
    ("ci_access:\n  project:\n    - id: a/b\n",
     "2:3: ci_access.project: unknown key (did you mean projects? expected one of: projects, groups, instance)"),
    ("ci_access:\n  projects:\n    - id: a/b\n      enviroments: [production]\n",
     "4:7: ci_access.projects[0].enviroments: unknown key (did you mean environments?"),
    ("user_access:\n  access_as: {agent: {}}\n  group: [{id: a}]\n",
     "3:3: user_access.group: unknown key (did you mean groups? expected one of: access_as, projects, groups)"),
    ("ci_access:\n  projects:\n    - id: a/b\n      access_as: {ci_job: {verbose: true}}\n",
     "4:28: ci_access.projects[0].access_as.ci_job.verbose: unknown key (this mapping takes no keys)"),
    ("- just\n- a list\n", "1:1: (top level): must be a mapping, got a list"),
    ("ci_access: [unclosed\n", "2:1: not valid YAML: "),
    ("ci_access:\n  projects:\n\t- id: a\n", "3:1: not valid YAML"),
])
def test_mistakes_name_file_line_column_and_key(text: str, message: str) -> None:
    with pytest.raises(AgentConfigError) as info:
        parse_agent_config(text, SRC)
    assert str(info.value).startswith(f"{SRC}:{message}"), str(info.value)


def test_gitlabs_top_level_keys_kasd_does_not_use_are_ignored_by_name() -> None:
    text = ("ci_access: {projects: [{id: a/b}]}\ngitops: {manifest_projects: [{id: x/y}]}\nflux: {}\n"
            "container_scanning: {cadence: '0 0 * * *'}\nworkspaces: {anything: [goes]}\nstarboard: 1\n")
    loaded = parse_agent_config(text, SRC)
    assert loaded.warnings == () and [p.id for p in loaded.config.ci_access.projects] == ["a/b"]


@pytest.mark.parametrize("text", [
    "user_access:\n  projects: [{id: a/b}]\n",
    "user_access:\n  access_as: {}\n  projects: [{id: a/b}]\n",
    "user_access:\n  access_as:\n  projects: [{id: a/b}]\n",
])
def test_user_access_without_access_as_acts_as_the_agent(text: str) -> None:
    """GitLab 18.3: ``access_as`` is optional in ``user_access`` and defaults to the agent."""
    user_access = parse_agent_config(text, SRC).config.user_access
    assert user_access is not None and (user_access.access_as, user_access.projects) == ("agent", ("a/b",))


def test_a_yaml_alias_bomb_is_refused_before_it_is_walked() -> None:
    # 300 entries × one aliased list of 1,000 names: 300,000 values from a 10 KB file
    head = "x: &e [" + ", ".join(["n"] * 1000) + "]\nci_access:\n  projects:\n"
    text = head + "".join(f"    - id: a/p{i}\n      environments: *e\n" for i in range(300))
    with pytest.raises(AgentConfigError, match=rf"^{SRC}:\d+:\d+: more than 100000 YAML nodes once aliases are "
                                               "expanded"):
        parse_agent_config(text, SRC)
    small = head + "    - id: a/p\n      environments: *e\n"
    # (an alias the schema does not read is refused too: x is not a key kasd knows)
    with pytest.raises(AgentConfigError, match="1:1: x: unknown key"):
        parse_agent_config(small, SRC)
    ok = "ci_access:\n  projects:\n    - id: a/p\n      environments: &e [" + ", ".join(["n"] * 100) + "]\n" \
         "    - id: a/q\n      environments: *e\n"
    assert len(parse_agent_config(ok, SRC).config.ci_access.projects[1].environments) == 100


def test_billion_laughs_is_refused_at_once() -> None:
    """650 bytes that would expand to 10⁹ values: refused after the budget, in well under a second."""
    text = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    assert len(text) < 700
    with pytest.raises(AgentConfigError, match="more than 100000 YAML nodes"):
        parse_agent_config(text, SRC)


def test_files_are_found_under_the_config_root(tmp_path: Path) -> None:
    path = agent_config_path(tmp_path, "acme/infra", "prod")
    assert path == tmp_path / "acme" / "infra" / ".gitlab" / "agents" / "prod" / "config.yaml"
    missing = load_agent_config(tmp_path, "acme/infra", "prod")
    assert missing.config.ci_access.projects == () and missing.config.user_access is None
    assert missing.warnings == (f"{path}: no such file: the agent has the default configuration (only CI/CD jobs "
                                "of its config project acme/infra may use it)",)
    path.parent.mkdir(parents=True)
    path.write_text("ci_access:\n  projects:\n    - id: acme/web\n      access_as: {ci_job: {}}\n")
    loaded = load_agent_config(tmp_path, "acme/infra", "prod")
    assert loaded.config.source == str(path) and loaded.config.ci_access.projects[0].access_as.mode == "ci_job"
    path.write_text("ci_access:\n  projects:\n    - id: [acme]\n")
    with pytest.raises(AgentConfigError, match=rf"^{path}:3:11: ci_access\.projects\[0\]\.id: must be a string"):
        load_agent_config(tmp_path, "acme/infra", "prod")
    path.write_bytes(b"ci_access: \xff\n")
    with pytest.raises(AgentConfigError, match="not UTF-8"):
        load_agent_config(tmp_path, "acme/infra", "prod")


@pytest.mark.parametrize(("project", "name"), [("../etc", "prod"), ("acme/infra", "../../x"), ("acme/infra", "Prod"),
                                               ("/abs", "prod"), ("acme/infra", "")])
def test_paths_cannot_step_outside_the_root(tmp_path: Path, project: str, name: str) -> None:
    with pytest.raises(AgentConfigError):
        agent_config_path(tmp_path, project, name)


def test_each_ci_access_entry_is_kept_as_written_without_its_id() -> None:
    """GitLab's ``allowed_agents`` answers the entry as written (``configuration``): every key,
    unknown ones too, with YAML's types; an alias bomb under a key kasd does not read is bounded
    by the same node budget."""
    ci = parse_agent_config(FULL, SRC).config.ci_access
    assert ci.projects[0].written == {
        "default_namespace": "shop", "access_as": {"ci_job": {}}, "environments": ["production", "review/*"],
        "protected_branches_only": True, "resource_management": {"enabled": True},
        "rules": [{"if": '$CI_COMMIT_BRANCH == "main"', "namespace": "shop-$CI_ENVIRONMENT_SLUG", "when": "always",
                   "on_overflow": "truncate"}, {"when": "never"}],
    }
    assert ci.groups[0].written["access_as"]["impersonate"]["uid"] == "1000"  # a string stays a string
    assert ci.instance is not None and ci.instance.written == {"access_as": {"agent": {}}, "environments": ["sandbox"]}
    # an unknown key is a load error (issue 25: a typo must not pass), so nothing unread is kept
    with pytest.raises(AgentConfigError, match=r"future_key: unknown key"):
        parse_agent_config("ci_access:\n  projects:\n    - id: a/b\n      future_key: {n: 0x10}\n", SRC)
    head = "x: &e [" + ", ".join(["n"] * 1000) + "]\nci_access:\n  projects:\n"
    bomb = head + "".join(f"    - id: a/p{i}\n      environments: *e\n" for i in range(300))
    with pytest.raises(AgentConfigError, match=r"YAML"):
        parse_agent_config(bomb, SRC)


SECRET = "glagent-s3cr3t-Zq9xWv7Tb2"


def _agent_dir(root: Path) -> Path:
    directory = agent_config_path(root, "acme/infra", "prod").parent
    directory.mkdir(parents=True)
    return directory


def test_a_config_yaml_symlinked_out_of_the_config_root_is_refused_unread(tmp_path: Path) -> None:
    """A committer of the config project cannot make kasd read (and quote) another file of kasd's."""
    root, outside = tmp_path / "root", tmp_path / "etc"
    outside.mkdir()
    (outside / "token").write_text(SECRET + "\n")
    directory = _agent_dir(root)
    (directory / "config.yaml").symlink_to(outside / "token")
    with pytest.raises(AgentConfigError) as info:
        load_agent_config(root, "acme/infra", "prod")
    assert "outside its config project" in str(info.value)
    assert SECRET not in str(info.value) and "Zq9x" not in str(info.value)
    # nor through a directory on the way, nor a relative link climbing out, nor a dangling one
    (directory / "config.yaml").unlink()
    (directory / "config.yaml").symlink_to("../../../../../../etc/token")
    with pytest.raises(AgentConfigError, match=r"outside its config project"):
        load_agent_config(root, "acme/infra", "prod")
    (directory / "config.yaml").unlink()
    (directory / "config.yaml").symlink_to(outside / "absent")
    with pytest.raises(AgentConfigError, match=r"outside its config project"):
        load_agent_config(root, "acme/infra", "prod")
    (root / "other").symlink_to(outside)
    with pytest.raises(AgentConfigError, match=r"outside authorization\.config_root"):
        load_agent_config(root, "other", "prod")


def test_a_config_yaml_symlinked_into_another_project_is_refused_unquoted(tmp_path: Path) -> None:
    """Another project's checkout under the same config root (or any file there that is no project's)
    is not the committer's to read: an error would quote it (an unknown key's name, an alias's), so
    it is refused unread, whatever it holds."""
    root = tmp_path / "root"
    directory = _agent_dir(root)
    other = root / "acme" / "secrets"
    other.mkdir(parents=True)
    (other / "token.yaml").write_text(f"{SECRET}: x\n")  # a mapping: its key would be quoted
    (root / "shared.yaml").write_text(f"*{SECRET}\n")  # an undefined alias: its name would be quoted
    for target in ("../../../../secrets/token.yaml", "../../../../../shared.yaml", str(other / "token.yaml")):
        (directory / "config.yaml").unlink(missing_ok=True)
        (directory / "config.yaml").symlink_to(target)
        with pytest.raises(AgentConfigError) as info:
            load_agent_config(root, "acme/infra", "prod")
        assert "outside its config project" in str(info.value), target
        assert SECRET[:6] not in str(info.value), target


def test_a_symlink_that_stays_inside_the_config_project_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    directory = _agent_dir(root)
    (root / "acme" / "infra" / "shared.yaml").write_text("ci_access: {projects: [{id: acme/web}]}\n")
    (directory / "config.yaml").symlink_to("../../../shared.yaml")
    assert load_agent_config(root, "acme/infra", "prod").config.ci_access.projects[0].id == "acme/web"
    linked_root = tmp_path / "root-link"  # the root itself may be a symlink (the operator's choice)
    linked_root.symlink_to(root)
    assert load_agent_config(linked_root, "acme/infra", "prod").config.ci_access.projects[0].id == "acme/web"
    # and so may a project's checkout, inside the root (git-sync's layout: a link to the revision)
    (root / "acme" / "infra").rename(root / "acme" / ".infra-rev1")
    (root / "acme" / "infra").symlink_to(".infra-rev1")
    assert load_agent_config(root, "acme/infra", "prod").config.ci_access.projects[0].id == "acme/web"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    directory = _agent_dir(tmp_path)
    os.mkfifo(directory / "config.yaml")
    with pytest.raises(AgentConfigError, match="cannot read: not a regular file"):
        load_agent_config(tmp_path, "acme/infra", "prod")


@pytest.mark.parametrize("text", [SECRET, f"'{SECRET}'", f"|\n  {SECRET}\n", f"- {SECRET}\n",
                                  f"ci_access: {{projects: [{{id: a/b, default_namespace: {SECRET}}}]}}\n",
                                  f"ci_access: {{projects: [{{id: a/b, access_as: {{impersonate: {SECRET}}}}}]}}\n",
                                  f"ci_access: *{SECRET}\n", f"ci_access: !{SECRET} x\n"])
def test_no_error_quotes_a_value_whole(text: str) -> None:
    """A file that is one scalar (a token, a key) is described by type and size, never quoted. (An
    unknown key is named, cut to 40 characters: the key path is how every message names its place.)"""
    with pytest.raises(AgentConfigError) as info:
        parse_agent_config(text, SRC)
    assert SECRET not in str(info.value), str(info.value)


@pytest.mark.parametrize("section", ["ci_access:\n  projects", "ci_access:\n  groups", "user_access:\n  projects",
                                     "user_access:\n  groups"])
def test_at_most_500_projects_and_500_groups_as_gitlab(section: str) -> None:
    """GitLab's AUTHORIZED_ENTITY_LIMIT; GitLab ignores the rest, kasd says so. Every job's request
    walks the entries: 25,000 project and 5,000 group entries cost 18 ms per agent per job."""
    def text(n: int) -> str:
        return f"{section}:\n" + "".join(f"    - id: acme/p{i}\n" for i in range(n))

    parse_agent_config(text(500), "c")
    with pytest.raises(AgentConfigError) as info:
        parse_agent_config(text(501), "c")
    key = section.replace(":\n  ", ".")
    assert str(info.value) == f"c:503:7: {key}[500]: more than 500 entries (GitLab's limit; it would ignore the rest)"


def test_an_entry_names_at_most_100_environments() -> None:
    """A job's environment is matched against each pattern of its entry, per request: 25,000
    patterns (inside the YAML budget) cost 60 ms."""
    def text(n: int) -> str:
        return "ci_access:\n  projects:\n    - id: acme/web\n      environments:\n" + "".join(
            f"        - review/*-{i}\n" for i in range(n))

    assert len(parse_agent_config(text(100), "c").config.ci_access.projects[0].environments) == 100
    with pytest.raises(AgentConfigError) as info:
        parse_agent_config(text(101), "c")
    assert str(info.value) == "c:105:11: ci_access.projects[0].environments[100]: more than 100 environments (kasd's limit)"
