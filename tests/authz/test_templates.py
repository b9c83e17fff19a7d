"""Environment templates of GitLab-managed resources: GitLab's own example rendered, GitLab's labels
and annotation, and every mistake at file:line:column."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kasd.authz.agentconfig import MAX_CONFIG_BYTES
from kasd.authz.templates import (
    DEFAULT_TEMPLATE,
    MANAGED_BY,
    VARIABLES,
    TemplateError,
    load_templates,
    parse_template,
    render,
)

VALUES: dict[str, str | int] = {
    "agent.id": 1, "agent.name": "prod", "agent.url": "https://gitlab.example/group/infra/-/cluster_agents/prod",
    "environment.id": 9, "environment.name": "review/feat-x", "environment.slug": "review-feat-x-abc123",
    "environment.url": "", "environment.page_url": "https://gitlab.example/group/app/-/environments/9",
    "environment.tier": "development",
    "project.id": 42, "project.slug": "app", "project.path": "group/app", "project.url": "https://gitlab.example/group/app",
    "ci_pipeline.id": 7, "ci_job.id": 1234, "user.id": 5, "user.username": "alice",
}


def test_the_default_template_is_gitlabs_namespace_and_rolebinding() -> None:
    template = parse_template(DEFAULT_TEMPLATE, "(default)", "default")
    assert (template.apply_resources, template.delete_resources) == ("on_start", "on_stop")
    namespace, binding = render(template, VALUES)
    assert namespace["kind"] == "Namespace" and namespace["metadata"]["name"] == "review-feat-x-abc123-42-1"
    assert binding["metadata"]["namespace"] == "review-feat-x-abc123-42-1"
    assert binding["subjects"] == [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io",
                                    "name": "gitlab:project_env:42:review-feat-x-abc123"}]
    assert binding["roleRef"]["name"] == "admin"
    labels = namespace["metadata"]["labels"]
    assert labels == {"agent.gitlab.com/id-1": "", "agent.gitlab.com/project_id-42": "",
                      "agent.gitlab.com/env-review-feat-x-abc123-42-1": "",
                      "agent.gitlab.com/environment_slug-review-feat-x-abc123": "", MANAGED_BY[0]: MANAGED_BY[1]}
    annotation = json.loads(namespace["metadata"]["annotations"]["agent.gitlab.com/env-review-feat-x-abc123-42-1"])
    assert annotation["environment_name"] == "review/feat-x" and annotation["template_name"] == "default"
    assert annotation["project_path"] == "group/app" and annotation["agent_name"] == "prod"


def test_a_value_is_substituted_after_parsing_so_it_cannot_add_structure() -> None:
    template = parse_template("objects:\n  - apiVersion: v1\n    kind: Namespace\n    metadata:\n"
                              "      name: 'ns-{{ .user.username }}'\n", "t.yaml", "t")
    (obj,) = render(template, {**VALUES, "user.username": "x\nkind: Secret"})
    assert obj["kind"] == "Namespace" and obj["metadata"]["name"] == "ns-x\nkind: Secret"


_WITH_SPEC = ("objects:\n  - apiVersion: kustomize.toolkit.fluxcd.io/v1\n    kind: Kustomization\n"
              "    metadata: {{name: n}}\n    spec: {}\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("objects: [\n", "t.yaml:2:1: not valid YAML"),
        ("objects: []\n", "t.yaml:1:10: objects: must be a non-empty list"),
        ("objects:\n  - {apiVersion: v1, kind: Secret, metadata: {name: s}}\n",
         "t.yaml:2:5: objects[0].kind: 'Secret' is not one GitLab manages"),
        ("objects:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: '{{ .project.name }}'}}\n",
         "t.yaml:2:56: objects[0].metadata.name: '{{ .project.name }}': unknown variable"),
        ("objects:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: '{{ .project.id | printf }}'}}\n",
         "only variable references such as {{ .environment.slug }} are supported"),
        ("objects:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: 'a-{{ .project.id'}}\n",
         "an unclosed {{"),
        ("objects:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: n}}\ndelete_resources: always\n",
         "t.yaml:3:19: delete_resources: must be on_stop or never"),
        ("objects:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: n}}\ncolour: red\n",
         "t.yaml:3:1: colour: unknown key"),
        # an unquoted reference is a YAML mapping used as a key: said where, with the fix
        ("objects:\n  - apiVersion: v1\n    kind: Namespace\n    metadata:\n      name: {{ .environment.slug }}\n",
         "t.yaml:5:14: not valid YAML: found unhashable key (a {{ … }} reference must be quoted"),
        ("objects:\n  - !!python/object:os.system {}\n", "t.yaml:2:5: not valid YAML: could not determine a constructor"),
        ("objects:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: n, labels: oops}}\n",
         "t.yaml:2:5: objects[0].metadata.labels: must map strings to strings"),
        ("objects:\n  - {apiVersion: apps/v1, kind: Namespace, metadata: {name: n}}\n",
         "t.yaml:2:5: objects[0].apiVersion: 'apps/v1' does not serve Namespace (expected v1)"),
        ("objects:\n  - {apiVersion: v1, kind: RoleBinding, metadata: {name: n}}\n",
         "objects[0].apiVersion: 'v1' does not serve RoleBinding (expected rbac.authorization.k8s.io/<version>)"),
        ("objects:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n"
         "objects:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: b}}\n", "t.yaml:3:1: objects: given twice"),
        ("objects:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: n, labels: {'{{ .project.id }}': x}}}\n",
         "references are substituted in values only, not in keys"),
        # what is not JSON data: it loaded, then failed each job that needed it when sent as JSON
        (_WITH_SPEC.format("{since: 2024-01-01}"), "t.yaml:5:19: a !!timestamp is not JSON data (quote it to make it a string)"),
        (_WITH_SPEC.format("{data: !!binary aGk=}"), "t.yaml:5:18: a !!binary is not JSON data"),
        (_WITH_SPEC.format("!!set {a}"), "t.yaml:5:11: a !!set is not JSON data (use a mapping)"),
        (_WITH_SPEC.format("!!omap [a: 1]"), "t.yaml:5:11: a !!omap is not JSON data (use a list)"),
        (_WITH_SPEC.format("{ratio: .nan}"), "t.yaml:5:19: .nan is not a JSON number"),
        (_WITH_SPEC.format("{1: a}"), "t.yaml:5:12: keys must be strings, got an int of 1 character (quote it)"),
        (_WITH_SPEC.format("{x: !custom a}"), "t.yaml:5:15: not valid YAML: could not determine a constructor"),
    ],
)
def test_mistakes_name_file_line_and_column(text: str, message: str) -> None:
    with pytest.raises(TemplateError) as info:
        parse_template(text, "t.yaml", "t")
    assert message in str(info.value), str(info.value)


def test_every_variable_gitlab_documents_is_known() -> None:
    assert set(VALUES) == VARIABLES
    with pytest.raises(ValueError, match=r"variables missing: user\.username"):
        render(parse_template(DEFAULT_TEMPLATE, "d", "default"), {k: v for k, v in VALUES.items() if k != "user.username"})


def test_template_files_are_read_as_config_yaml_is(tmp_path: Path) -> None:
    (tmp_path / "default.yaml").write_text(DEFAULT_TEMPLATE)
    (tmp_path / "notes.txt").write_text("not a template")
    assert list(load_templates(tmp_path, tmp_path)) == ["default"]
    assert load_templates(tmp_path / "absent", tmp_path) == {}
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(TemplateError, match=f"big.yaml: larger than {MAX_CONFIG_BYTES} bytes"):
        load_templates(tmp_path, tmp_path)
    big.write_bytes(b"objects: \xff\n")
    with pytest.raises(TemplateError, match=r"big.yaml: not UTF-8 text \(byte 9\)"):
        load_templates(tmp_path, tmp_path)


def test_a_template_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    """650 bytes that would expand to 10⁹ strings: refused by the reader's budget, naming the file."""
    text = ("objects:\n  - apiVersion: v1\n    kind: Namespace\n    metadata: {name: x}\n    x0: &a0 ['{{ .project.id }}', lol]\n"
            + "".join(f"    x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10)))
    assert len(text) < 800
    path = tmp_path / "default.yaml"
    path.write_text(text)
    with pytest.raises(TemplateError, match=rf"^{path}:\d+:\d+: more than 100000 YAML nodes once aliases are expanded"):
        load_templates(tmp_path, tmp_path)


def _fanned(levels: int, width: int = 9) -> str:
    """A Kustomization whose spec repeats one reference ``width ** levels`` times through aliases."""
    ref = ", ".join(["'{{ .project.id }}'"] * width)
    lines = ["objects:", "  - apiVersion: kustomize.toolkit.fluxcd.io/v1", "    kind: Kustomization",
             "    metadata: {name: n}", "    spec:", f"      a0: &a0 [{ref}]"]
    lines += [f"      a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n  - {apiVersion: v1, kind: Namespace, metadata: {name: n}}\n"


def test_a_template_is_rendered_per_job_so_it_holds_few_values() -> None:
    """A 600-byte template within every file's YAML budget (59,000 values expanded) cost 0.15 s of the
    event loop for each job's rendering (each GET allowed_agents): refused at load, naming the limit;
    one of a few hundred values renders in a millisecond or so."""
    text = _fanned(5)
    assert len(text) < 700
    with pytest.raises(TemplateError, match=r"^t:\d+:\d+: the template holds more than 2000 values once aliases "
                                            r"are expanded"):
        parse_template(text, "t", "default")
    with pytest.raises(TemplateError, match=r"more than 131072 characters"):
        parse_template(_fanned(1).replace("'{{ .project.id }}'", "'" + "x" * 20_000 + "'"), "t", "default")
    template = parse_template(_fanned(3), "t", "default")  # 729 references
    assert render(template, VALUES)[0]["spec"]["a2"][0][0][0] == "42"


def test_a_template_is_kept_expanded_and_renders_each_alias_as_its_own_copy() -> None:
    text = ("objects:\n  - apiVersion: v1\n    kind: Namespace\n    metadata:\n      name: n\n"
            "      labels: &l {team: '{{ .project.id }}'}\n      annotations: *l\n")
    (namespace,) = render(parse_template(text, "t", "t"), VALUES)
    metadata = namespace["metadata"]
    assert metadata["labels"]["team"] == "42" and metadata["annotations"]["team"] == "42"
    assert metadata["labels"] is not metadata["annotations"]  # one's added labels are not the other's


def test_nothing_is_read_through_a_symlink_leading_out_of_the_config_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    templates = root / "acme" / "infra" / ".gitlab" / "agents" / "a" / "environment_templates"
    templates.mkdir(parents=True)
    outside.mkdir()
    secret = outside / "secret.yaml"
    secret.write_text("s3cr3t-token-value\n")
    (templates / "default.yaml").symlink_to(secret)
    project = root / "acme" / "infra"
    with pytest.raises(TemplateError) as info:
        load_templates(templates, project)
    assert "outside its config project" in str(info.value) and "s3cr3t" not in str(info.value)
    (templates / "default.yaml").unlink()
    (project / "shared.yaml").write_text(DEFAULT_TEMPLATE)  # a symlink that stays inside is followed
    (templates / "default.yaml").symlink_to(project / "shared.yaml")
    assert list(load_templates(templates, project)) == ["default"]
    (root / "shared.yaml").write_text(DEFAULT_TEMPLATE)  # not one into the root beside the projects
    (templates / "default.yaml").unlink()
    (templates / "default.yaml").symlink_to(root / "shared.yaml")
    with pytest.raises(TemplateError, match=r"outside its config project"):
        load_templates(templates, project)
    linked = templates.parent / "linked"  # a whole directory leading out
    linked.symlink_to(outside)
    with pytest.raises(TemplateError, match=r"outside its config project"):
        load_templates(linked, project)


def test_a_templates_directory_is_listed_boundedly_and_through_its_own_descriptor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More than 1,024 entries is an error, not a listing held whole and every file parsed; and a
    directory on the way swapped for a symlink after the path was checked (a checkout racing the
    load) shows kasd, and its log, no name of the directory it now leads to."""
    project = tmp_path / "root" / "acme" / "infra"
    templates = project / ".gitlab" / "agents" / "a" / "environment_templates"
    templates.mkdir(parents=True)
    for i in range(1025):
        (templates / f"t{i}.yaml").touch()
    with pytest.raises(TemplateError, match=r"environment_templates: cannot read: more than 1024 entries"):
        load_templates(templates, project)
    for i in range(1025):
        (templates / f"t{i}.yaml").unlink()
    outside = tmp_path / "outside" / "agents" / "a" / "environment_templates"
    outside.mkdir(parents=True)
    (outside / "private-name-s3cr3t.yaml").write_text(DEFAULT_TEMPLATE)
    real_open = os.open

    def swapping_open(path: str, flags: int, *args: int) -> int:
        gitlab = project / ".gitlab"
        if gitlab.is_dir() and not gitlab.is_symlink():
            gitlab.rename(project / ".gitlab-old")
            gitlab.symlink_to(tmp_path / "outside")
        return real_open(path, flags, *args)

    monkeypatch.setattr("kasd.authz.templates.os.open", swapping_open)
    with pytest.raises(TemplateError) as info:
        load_templates(templates, project)
    assert "outside its config project" in str(info.value) and "s3cr3t" not in str(info.value)
