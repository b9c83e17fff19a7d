"""The agents' configuration read from Git (``authorization.config_git``): real repositories made
with dulwich in a temporary directory; commits change access, a bad commit changes nothing, and what
kasd will not read (a symlink, a submodule, a huge blob, a missing ref) is refused, naming project,
ref and path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from kasctl.authsetup import AuthSetup
from kasd.authority import CiAuthority, LoadedAuthorization, LoadError, load_authorization
from kasd.authz import gitsource
from kasd.config import Config, config_from_mapping
from kasd.metrics import Metrics
from kasd.seams import AccessDenied, Grant, parse_bearer
from kasd.tokens import hash_token
from routing.local import TunnelRegistry
from tests.gitrepo import GitRepo, Link, Submodule

pytestmark = pytest.mark.timeout(30)

APP = "ci_access:\n  projects:\n    - id: acme/app\n"
OTHER = "ci_access:\n  projects:\n    - id: acme/other\n"
CONFIG = ".gitlab/agents/a1/config.yaml"


def _config(auth: AuthSetup, root: Path, **git: Any) -> Config:
    settings = auth.kasd_settings()
    settings["authorization"]["config_root"] = str(root)
    settings["authorization"]["config_git"] = {"enabled": True, **git}
    return config_from_mapping({
        "agents": [{"id": 1, "name": "a1", "config_project": "acme/infra", "token_sha256": hash_token("agent-1")}],
        "groups": [{"path": "acme", "id": 1}],
        "projects": [{"path": "acme/infra", "id": 10}, {"path": "acme/app", "id": 11}, {"path": "acme/other", "id": 12}],
        **settings,
    })


class _Load:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.loads = 0

    def __call__(self) -> LoadedAuthorization:
        self.loads += 1
        return load_authorization(self.config, None)


@pytest.fixture
def auth(tmp_path: Path) -> AuthSetup:
    return AuthSetup(tmp_path / "auth")


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    repo = GitRepo(tmp_path / "repos" / "acme" / "infra.git")
    repo.commit({CONFIG: APP})
    return repo


async def _allowed(authority: CiAuthority, auth: AuthSetup, project: str) -> bool:
    credentials = parse_bearer(f"Bearer ci:1:{auth.job_token(project)}")
    try:
        grant: Grant = await authority.authorize(credentials, 1)
    except AccessDenied:
        return False
    return grant.agent_id == 1


def _sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_a_commit_changes_access_at_a_refresh_and_a_bad_one_changes_nothing(
        tmp_path: Path, auth: AuthSetup, repo: GitRepo, caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics(TunnelRegistry())
    authority = CiAuthority(_Load(_config(auth, tmp_path / "repos", poll_interval=3600)), metrics)
    first = repo.repo.refs[b"refs/heads/main"].decode()
    assert await _allowed(authority, auth, "acme/app") and not await _allowed(authority, auth, "acme/other")
    assert _sample(metrics, "kasd_config_commit_info", project="acme/infra", commit=first) == 1
    async with trio.open_nursery() as nursery:
        nursery.start_soon(authority.watch)
        second = repo.commit({CONFIG: OTHER})
        with trio.fail_after(10):
            assert await authority.refresh()
        assert await _allowed(authority, auth, "acme/other") and not await _allowed(authority, auth, "acme/app")
        state = authority.config_state()
        assert state["source"] == "git"
        assert state["projects"] == [{"project": "acme/infra", "ref": "HEAD", "commit": second,
                                      "loaded_at": pytest.approx(state["projects"][0]["loaded_at"])}]  # type: ignore[index]
        assert _sample(metrics, "kasd_config_commit_info", project="acme/infra", commit=second) == 1
        assert _sample(metrics, "kasd_config_commit_info", project="acme/infra", commit=first) is None

        bad = repo.commit({CONFIG: "ci_access:\n  projects:\n    - id: [acme/app]\n"})
        with trio.fail_after(10):
            assert await authority.refresh()
        nursery.cancel_scope.cancel()
    assert await _allowed(authority, auth, "acme/other")  # the previous commit's configuration
    assert f"acme/infra@HEAD ({bad[:12]}):{CONFIG}:3:11: ci_access.projects[0].id: must be a string" in caplog.text
    assert "the previous configuration stays in force" in caplog.text
    assert _sample(metrics, "kasd_config_commit_info", project="acme/infra", commit=second) == 1
    assert _sample(metrics, "kasd_config_ref_commit_info", project="acme/infra", commit=bad) == 1
    assert _sample(metrics, "kasd_authz_config_ok") == 0


async def test_polling_notices_a_new_commit_and_refreshes_share_one_look(
        tmp_path: Path, auth: AuthSetup, repo: GitRepo) -> None:
    load = _Load(_config(auth, tmp_path / "repos", poll_interval=0.1))
    authority = CiAuthority(load)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(authority.watch)
        repo.commit({CONFIG: OTHER})
        with trio.fail_after(10):
            await authority.wait_reloaded()  # no refresh asked: the poll found it
        assert await _allowed(authority, auth, "acme/other")
        assert load.loads == 2
        # a crowd of refreshes with nothing new: one or two looks, no load
        looks = 0
        look = authority._look

        async def counted() -> None:
            nonlocal looks
            looks += 1
            await look()

        authority._look = counted  # type: ignore[method-assign]
        with trio.fail_after(10):
            async with trio.open_nursery() as crowd:
                for _ in range(50):
                    crowd.start_soon(authority.refresh)
        nursery.cancel_scope.cancel()
    assert load.loads == 2
    assert 1 <= looks <= 3  # (a poll may fall in between)


@pytest.mark.parametrize("layout", ["bare", "worktree", "one-repository"])
def test_each_layout_is_read_at_the_configured_ref(tmp_path: Path, auth: AuthSetup, layout: str) -> None:
    root = tmp_path / "repos"
    if layout == "bare":
        repo = GitRepo(root / "acme" / "infra.git")
        prefix = ""
    elif layout == "worktree":
        repo = GitRepo(root / "acme" / "infra", bare=False)
        prefix = ""
    else:
        repo = GitRepo(root, bare=False)
        prefix = "acme/infra/"
    repo.commit({prefix + CONFIG: APP})
    commit = repo.commit({prefix + CONFIG: OTHER}, branch="review")
    loaded = load_authorization(_config(auth, root, ref="review"), None)
    assert loaded.git is not None and loaded.git.commits[0].commit == commit
    entry = loaded.snapshot.agents[1].config.ci_access.projects[0]
    assert entry.id == "acme/other"
    assert loaded.snapshot.agents[1].config.source == f"acme/infra@review ({commit[:12]}):{CONFIG}"


TEMPLATE = ".gitlab/agents/a1/environment_templates/default.yaml"


@pytest.mark.parametrize(("change", "problem"), [
    ({CONFIG: Link("../../../../etc/passwd")}, f"acme/infra@HEAD (*):{CONFIG}: refused: {CONFIG} is a symbolic link"),
    ({".gitlab/agents": Submodule()}, f"acme/infra@HEAD (*):{CONFIG}: refused: .gitlab/agents is a submodule"),
    ({TEMPLATE: Link("../config.yaml")}, f"acme/infra@HEAD (*):{TEMPLATE}: refused: {TEMPLATE} is a symbolic link"),
    ({CONFIG: b"#" * (gitsource.MAX_CONFIG_BYTES + 1)},
     f"acme/infra@HEAD (*):{CONFIG}: refused: a file of {gitsource.MAX_CONFIG_BYTES + 1} bytes"),
])
@pytest.mark.parametrize("packed", [False, True])
def test_what_is_not_read_is_refused_naming_project_ref_and_path(
        tmp_path: Path, auth: AuthSetup, repo: GitRepo, change: dict[str, Any], problem: str, packed: bool) -> None:
    commit = repo.commit(change)
    if packed:
        repo.pack()
    with pytest.raises(LoadError) as refused:
        load_authorization(_config(auth, tmp_path / "repos"), None)
    assert str(refused.value).startswith(problem.replace("*", commit[:12]))


def test_sizes_are_read_from_object_headers_loose_packed_and_deltified(tmp_path: Path) -> None:
    """What the size limit reads before inflating anything is each object's true size, for a loose
    object, a packed one, and a delta (whose header gives the result's size, not the delta's)."""
    from dulwich.pack import OFS_DELTA

    repo = GitRepo(tmp_path / "r.git")
    text = "".join(f"- line {i} of a long enough configuration\n" for i in range(2000))
    repo.commit({CONFIG: text})
    repo.commit({CONFIG: text + "- one more\n"})
    objects = list(repo.repo.object_store)
    sizes = {sha: len(repo.repo.object_store[sha].as_raw_string()) for sha in objects}
    assert {sha: gitsource._object_size(repo.repo, sha) for sha in objects} == sizes
    repo.pack()
    reopened = GitRepo.__new__(GitRepo)
    from dulwich.repo import Repo
    reopened.repo = Repo(str(tmp_path / "r.git"))
    (pack,) = reopened.repo.object_store.packs
    assert OFS_DELTA in {entry.pack_type_num for entry in pack.data.iter_unpacked()}
    assert {sha: gitsource._object_size(reopened.repo, sha) for sha in objects} == sizes


def test_a_corrupt_object_is_a_named_load_error_not_a_crash(tmp_path: Path, auth: AuthSetup, repo: GitRepo) -> None:
    import os
    import zlib

    from dulwich.objects import Blob

    loose = repo.repo.object_store.path
    sha = Blob.from_string(APP.encode()).id.decode()
    path = os.path.join(loose, sha[:2], sha[2:])
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(zlib.compress(b"blob 40\0" + b"x" * 10)[:-3])  # truncated, and not what its name says
    with pytest.raises(LoadError, match=r"^config project acme/infra: cannot read its repository: ChecksumMismatch"):
        load_authorization(_config(auth, tmp_path / "repos"), None)
    assert gitsource.GitSource(root=tmp_path / "repos").heads(["acme/infra"]) == {
        "acme/infra": repo.repo.refs[b"refs/heads/main"].decode()}  # (the ref itself still reads)


def test_a_missing_file_ref_or_repository_says_which(tmp_path: Path, auth: AuthSetup, repo: GitRepo) -> None:
    repo.commit({CONFIG: None, "README.md": "hello"})
    loaded = load_authorization(_config(auth, tmp_path / "repos"), None)
    assert loaded.snapshot.agents[1].config.ci_access.projects == ()  # GitLab's default: no file, no ci_access
    assert "no such file: the agent has the default configuration" in loaded.snapshot.warnings[0]
    with pytest.raises(LoadError, match=r"config project acme/infra: ref 'nope' not found in its repository"):
        load_authorization(_config(auth, tmp_path / "repos", ref="nope"), None)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(LoadError, match=r"config project acme/infra: no Git repository at .*acme/infra.git"):
        load_authorization(_config(auth, tmp_path / "elsewhere"), None)


def test_a_bad_ref_setting_is_refused_at_start() -> None:
    with pytest.raises(Exception, match=r"authorization.config_git.ref: must be a branch"):
        config_from_mapping({"authorization": {"config_git": {"enabled": True, "ref": "main/../x"}}})


# --------------------------------------------------------------------------- the REST API


def _web_config(auth: AuthSetup, root: Path) -> Config:
    settings = auth.kasd_settings()
    settings["authorization"]["config_root"] = str(root)
    settings["authorization"]["config_git"] = {"enabled": True, "poll_interval": 3600}
    return config_from_mapping({
        "agents": [{"id": 1, "name": "a1", "config_project": "acme/infra", "token_sha256": hash_token("agent-1")}],
        "groups": [{"path": "acme", "id": 1}],
        "projects": [{"path": "acme/infra", "id": 10}, {"path": "acme/app", "id": 11}],
        "users": [{"username": "dev", "memberships": {"acme/infra": "developer", "acme/app": "maintainer"}},
                  {"username": "rep", "memberships": {"acme/infra": "reporter"}},
                  {"username": "stranger", "memberships": {"acme/app": "developer"}}],
        **settings,
    })


async def test_the_rest_api_shows_the_commit_and_a_member_refreshes_it(
        tmp_path: Path, auth: AuthSetup, repo: GitRepo) -> None:
    from starlette.applications import Starlette

    from kasd.web.app import _refused
    from kasd.web.auth import ApiRefusal
    from kasd.web.gitconfig import MAX_BODY, config_routes
    from tests.kasd.webfakes import call

    authority = CiAuthority(_Load(_web_config(auth, tmp_path / "repos")))
    app = Starlette(routes=config_routes(authority), exception_handlers={ApiRefusal: _refused})

    def token(user: str) -> list[tuple[str, str]]:
        return [("PRIVATE-TOKEN", auth.personal_token(user))]

    async def refresh(user: str, body: bytes) -> Any:
        return await call(app, "POST", "/api/kasd/v1/config/refresh", token(user), body=body)

    first = repo.repo.refs[b"refs/heads/main"].decode()
    shown = (await call(app, "GET", "/api/kasd/v1/config", token("rep"))).json()
    assert shown["source"] == "git" and [(p["project"], p["ref"], p["commit"]) for p in shown["projects"]] == [
        ("acme/infra", "HEAD", first)]
    assert shown["projects"][0]["loaded_at"].endswith("Z")
    assert (await call(app, "GET", "/api/kasd/v1/config", token("stranger"))).json()["projects"] == []
    assert (await call(app, "GET", "/api/kasd/v1/config")).status == 401

    async with trio.open_nursery() as nursery:
        nursery.start_soon(authority.watch)
        second = repo.commit({CONFIG: OTHER})
        with trio.fail_after(10):
            answer = await refresh("dev", b'{"project": "acme/infra"}')
        assert answer.status == 200 and answer.json()["projects"][0]["commit"] == second
        assert authority.snapshot.agents[1].config.ci_access.projects[0].id == "acme/other"
        # refused before kasd looks at anything
        assert (await refresh("rep", b'{"project": "acme/infra"}')).json() == {
            "message": "403 Forbidden: this needs the Developer role in acme/infra"}
        assert (await refresh("stranger", b'{"project": "acme/infra"}')).status == 404
        assert (await refresh("stranger", b'{"project": null}')).json() == {
            "message": "403 Forbidden: a refresh needs the Developer role in a config project"}
        assert (await refresh("dev", b'{"project": "acme/app"}')).json() == {
            "message": "404 Not Found: acme/app is no agent's config project"}
        assert (await refresh("dev", b"{" * (MAX_BODY + 1))).status == 413
        assert (await refresh("dev", b'["acme/infra"]')).status == 400
        assert (await refresh("dev", b"[" * (MAX_BODY - 1))).status == 400  # (deeper than json's stack: no 500)
        assert (await refresh("dev", b'{"project": "acme/\\ud800"}')).status in (400, 404)  # (not Unicode)
        assert (await call(app, "POST", "/api/kasd/v1/config/refresh", body=b"{}")).status == 401
        with trio.fail_after(10):
            assert (await refresh("dev", b"")).status == 200  # no body: every config project
        nursery.cancel_scope.cancel()


async def test_a_refresh_on_one_replica_reaches_the_others(redis_server: Any) -> None:
    from kasd.gitrefresh import refresh_fanout

    class Counting:
        def __init__(self) -> None:
            self.looks = 0
            self.looked = trio.Event()

        async def refresh(self, wait: float = 10.0) -> bool:
            self.looks += 1
            self.looked.set()
            return True

    here, there = Counting(), Counting()
    with trio.fail_after(20):
        async with refresh_fanout(here, redis_server.url, password=None, name="a", key_prefix="t") as mine, \
                refresh_fanout(there, redis_server.url, password=None, name="b", key_prefix="t"):
            assert await mine.refresh(1)
            await there.looked.wait()
    assert (here.looks, there.looks) == (1, 1)  # its own notice is not a second look here


def test_the_config_routes_are_in_the_openapi_document(tmp_path: Path, auth: AuthSetup, repo: GitRepo) -> None:
    from starlette.routing import Route

    from kasd.web.gitconfig import config_routes
    from kasd.web.openapi import document

    paths = document()["paths"]
    for route in config_routes(CiAuthority(_Load(_web_config(auth, tmp_path / "repos")))):
        assert isinstance(route, Route)
        assert set(m.lower() for m in route.methods or ()) - {"head"} <= set(paths[route.path]), route.path


# --------------------------------------------------------------------------- examples/hooks/post-receive


HOOK = Path(__file__).resolve().parents[2] / "examples" / "hooks" / "post-receive"


@pytest.mark.parametrize(("pushed", "env", "told"), [
    ("refs/heads/main", {"GL_PROJECT_PATH": "acme/infra"}, "notify --config-changed --project acme/infra"),
    ("refs/heads/feature", {"GL_PROJECT_PATH": "acme/infra"}, None),  # not the branch kasd reads
    ("refs/heads/review", {"KASD_CONFIG_REF": "review"}, "notify --config-changed"),
])
def test_the_post_receive_hook_tells_kasd_of_a_push_to_the_branch_it_reads(
        tmp_path: Path, pushed: str, env: dict[str, str], told: str | None) -> None:
    import subprocess

    fake = tmp_path / "bin" / "kasctl"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "called"}\necho "$KASCTL_TOKEN" > {tmp_path / "token"}\n')
    fake.chmod(0o755)
    (tmp_path / "token-file").write_text("the-token")
    done = subprocess.run([str(HOOK)], input=f"{'0' * 40} {'1' * 40} {pushed}\n", text=True, timeout=10,
                          capture_output=True, cwd=tmp_path, check=True,
                          env={"PATH": f"{fake.parent}:/usr/bin:/bin", "KASD_HOOK_TOKEN_FILE": str(tmp_path / "token-file"),
                               "GIT_DIR": str(tmp_path / "no-repository"), **env})
    assert done.returncode == 0
    if told is None:
        assert not (tmp_path / "called").exists()
    else:
        assert (tmp_path / "called").read_text().strip() == told
        assert (tmp_path / "token").read_text().strip() == "the-token"


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("via", ["commit", "tag"])
def test_a_huge_commit_or_tag_is_refused_before_it_is_inflated(
        tmp_path: Path, auth: AuthSetup, repo: GitRepo, packed: bool, via: str) -> None:
    """A commit's (or an annotated tag's) message compresses to almost nothing in a push: its size is
    read from the object header, as a blob's, at every poll and load, before anything is inflated."""
    from dulwich.objects import Commit, Tag

    huge = "x" * (gitsource.MAX_COMMIT_BYTES + 1)
    commit = repo.commit({CONFIG: OTHER}, message=huge if via == "commit" else "small")
    if via == "tag":
        tag = Tag()
        tag.name, tag.object, tag.tagger, tag.tag_time, tag.tag_timezone = b"v1", (Commit, commit.encode()), b"T <t@e>", 0, 0
        tag.message = huge.encode()
        repo.repo.object_store.add_object(tag)
        repo.repo.refs[b"refs/heads/main"] = tag.id  # type: ignore[index]
    if packed:
        repo.pack()
    with pytest.raises(LoadError, match=r"^config project acme/infra: ref 'HEAD' names [0-9a-f]{40}: refused: an "
                                        r"object of \d{7} bytes \(a commit or tag kasd reads is at most 1048576\)$"):
        load_authorization(_config(auth, tmp_path / "repos"), None)
    assert gitsource.GitSource(root=tmp_path / "repos").heads(["acme/infra"]) == {"acme/infra": None}


def _commit_with_raw_agent_tree(repo: GitRepo, raw: bytes) -> str:
    """A commit whose ``.gitlab/agents/a1`` is the tree object ``raw``, as a hand-made push would carry."""
    import stat as st

    from dulwich.objects import Commit, Tree

    store = repo.repo.object_store
    tree = Tree.from_raw_string(Tree.type_num, raw)
    store.add_object(tree)
    for name in (b"a1", b"agents", b".gitlab"):
        parent = Tree()
        parent.add(name, st.S_IFDIR, tree.id)
        store.add_object(parent)
        tree = parent
    commit = Commit()
    commit.tree, commit.parents = tree.id, [repo.repo.refs[b"refs/heads/main"]]  # type: ignore[index]
    commit.author = commit.committer = b"T <t@e>"
    commit.author_time = commit.commit_time = commit.author_timezone = commit.commit_timezone = 0
    commit.message = b"hand-made"
    store.add_object(commit)
    repo.repo.refs[b"refs/heads/main"] = commit.id  # type: ignore[index]
    return commit.id.decode()


@pytest.mark.parametrize("shape", ["duplicate", "duplicate-apart", "unsorted", "dot-dot"])
def test_a_tree_git_would_read_differently_is_refused(tmp_path: Path, auth: AuthSetup, repo: GitRepo,
                                                       shape: str) -> None:
    """git (and so GitLab's UI and a reviewer) reads the first of two entries of one name, and stops
    looking in an unsorted tree where the order says the name cannot be; dulwich kept the last. A
    config.yaml shown reviewed while kasd reads another is refused, as every malformed tree on the way."""
    from dulwich.objects import Blob, Commit

    store = repo.repo.object_store
    head = repo.repo[repo.repo.refs[b"refs/heads/main"]]  # type: ignore[index]
    assert isinstance(head, Commit)
    root = store[head.tree].sha().digest()
    shown, hidden = Blob.from_string(APP.encode()), Blob.from_string(OTHER.encode())
    store.add_object(shown)
    store.add_object(hidden)
    entry = {"shown": b"100644 config.yaml\0" + shown.sha().digest(),
             "hidden": b"100644 config.yaml\0" + hidden.sha().digest(),
             "between": b"100644 config.yaml-x\0" + shown.sha().digest(),
             "tree": b"40000 config.yaml\0" + root,
             "z": b"100644 z\0" + shown.sha().digest(),
             "dots": b"40000 ..\0" + root}
    raw = {"duplicate": entry["shown"] + entry["hidden"],
           "duplicate-apart": entry["shown"] + entry["between"] + entry["tree"],
           "unsorted": entry["z"] + entry["hidden"],
           "dot-dot": entry["dots"] + entry["shown"]}[shape]
    commit = _commit_with_raw_agent_tree(repo, raw)
    with pytest.raises(LoadError, match=rf"^acme/infra@HEAD \({commit[:12]}\):{CONFIG}: refused: "
                                        r".gitlab/agents/a1 is a malformed tree \("):
        load_authorization(_config(auth, tmp_path / "repos"), None)
