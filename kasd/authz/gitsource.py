"""The agents' configuration read from Git (``authorization.config_git``): each config project's
``.gitlab/agents/<name>/config.yaml`` and ``environment_templates/*.yaml`` from the tree of a commit,
through dulwich (never a shell-out to ``git``, never the work tree).

Where the repositories are (``GitSource.repository``): when ``config_root`` is itself a Git
repository (bare, or a work tree with ``.git``), it is ONE repository whose tree holds every config
project at ``<project path>/``; otherwise each config project is its own repository, at
``<config_root>/<project path>.git`` (bare, as GitLab stores them) or ``<config_root>/<project path>``
(bare or not). The ref is ``config_git.ref`` (a branch, a tag, a full ``refs/…`` name), or each
repository's ``HEAD`` (its default branch, which is what GitLab reads an agent's configuration from).

What is read is bounded and stays in the tree, as for files (``agentconfig.read_config_text``): a
blob of the configuration at most ``MAX_CONFIG_BYTES`` (its size read from the object header before
anything is inflated), a tree on the way at most ``MAX_TREE_BYTES``; a symlink or a submodule on the
path is refused (a symlink is a path the committer chose: in a tree it can only name another path of
the same tree, but following it would make the Git and the files forms read different things, so
neither follows one out; kasd refuses them all); every error names the project, the ref and the path
(``GitConfigError``). Blocking: call everything here off the event loop.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import attrs

from daemonkit import yamldoc
from kasd.authz.agentconfig import (
    AgentConfig,
    AgentConfigError,
    LoadedAgentConfig,
    agent_config_path,
    parse_agent_config,
)

if TYPE_CHECKING:  # dulwich itself is imported when a repository is first opened (~0.3 s of imports
    # that kasctl and a kasd reading files never pay)
    from dulwich.objects import Blob, Tree
    from dulwich.repo import Repo

from kasd.authz.templates import (
    MAX_TEMPLATE_ENTRIES,
    EnvironmentTemplate,
    TemplateError,
    parse_template,
)

#: the largest blob of an agent's configuration (config.yaml, a template): as for files
MAX_CONFIG_BYTES = yamldoc.DEFAULT_BUDGET.max_bytes
#: the largest tree object on the way to it (a root tree of 20,000 entries is about 1 MiB)
MAX_TREE_BYTES = 4 * 1024 * 1024
#: how many annotated tags a ref may go through to its commit
MAX_TAG_DEPTH = 8
#: the largest commit or annotated tag object a ref may name (git's own are a few hundred bytes; a
#: message of 256 MiB, 250 KiB once compressed in a push, cost 3 s and 800 MB at every poll)
MAX_COMMIT_BYTES = 1024 * 1024
_HEX = re.compile(r"[0-9a-f]{40}")
#: tree entry names git never writes (``git fsck``: a path component that is empty, ``.``, ``..``,
#: ``.git``, or holds ``/``), and the modes it writes (and 100664, which old gits did)
_BAD_NAMES = frozenset({b"", b".", b"..", b".git"})
_GIT_MODES = frozenset({stat.S_IFREG | 0o644, stat.S_IFREG | 0o755, stat.S_IFREG | 0o664, stat.S_IFLNK,
                        stat.S_IFDIR, 0o160000})
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")


class GitConfigError(ValueError):
    """The repository does not give a configuration; ``str()`` names project, ref and path."""


@attrs.frozen(kw_only=True)
class ProjectCommit:
    """The commit one config project's configuration was read from."""

    project: str
    #: the ref as configured ("HEAD": the repository's default branch)
    ref: str
    commit: str


def check_ref(ref: str) -> str | None:
    """A problem with a configured ref name, or None."""
    if ref == "HEAD" or _HEX.fullmatch(ref):
        return None
    if not _REF.fullmatch(ref) or ".." in ref or "//" in ref or ref.endswith(("/", ".lock", ".")):
        return "must be a branch, a tag or a full refs/… name (letters, digits, '.', '_', '-', '/')"
    return None


@attrs.frozen(kw_only=True)
class GitSource:
    """Where the config projects' repositories are and which ref is read."""

    root: Path
    #: "HEAD" for each repository's default branch
    ref: str = "HEAD"

    def single(self) -> bool:
        """Whether ``root`` is one repository holding every config project."""
        return _is_repository(self.root)

    def repository(self, project: str) -> tuple[Path, str]:
        """The repository holding ``project``'s tree, and the tree path prefix of the project in it."""
        if self.single():
            return self.root, project.strip("/") + "/"
        real_root = os.path.realpath(self.root)
        for candidate in (self.root / f"{project}.git", self.root / project):
            real = os.path.realpath(candidate)
            if not (real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)):
                raise GitConfigError(f"{candidate}: refused: its real path is outside authorization.config_root "
                                     f"({self.root})")
            if _is_repository(candidate):
                return candidate, ""
        raise GitConfigError(f"config project {project}: no Git repository at {self.root / (project + '.git')} "
                             f"nor {self.root / project}")

    def head(self, project: str) -> str:
        """The commit the ref names now in ``project``'s repository (cheap: reads refs only)."""
        path, _ = self.repository(project)
        with _open(path, project) as repo:
            return _resolve(repo, self.ref, project)

    def heads(self, projects: list[str]) -> dict[str, str | None]:
        """Each project's commit now, None where it cannot be read (the reload then says why)."""
        out: dict[str, str | None] = {}
        for project in projects:
            try:
                out[project] = self.head(project)
            except Exception:  # (a corrupt repository: the reload that follows names the problem)
                out[project] = None
        return out


def _is_repository(path: Path) -> bool:
    return ((path / "HEAD").is_file() and (path / "objects").is_dir()) or (path / ".git").exists()


@contextmanager
def _open(path: Path, project: str) -> Iterator[Repo]:
    from dulwich.errors import NotGitRepository
    from dulwich.repo import Repo

    try:
        repo = Repo(str(path))
    except (NotGitRepository, OSError) as exc:
        raise GitConfigError(f"config project {project}: {path} is not a Git repository: {exc}") from None
    try:
        yield repo
    finally:
        repo.close()


def _resolve(repo: Repo, ref: str, project: str) -> str:
    """The commit ``ref`` names (peeling annotated tags)."""
    from dulwich.objects import Commit, Tag

    names = [ref.encode()] if ref == "HEAD" or ref.startswith("refs/") else \
        [f"refs/heads/{ref}".encode(), f"refs/tags/{ref}".encode()]
    sha: bytes | None = None
    for name in names:
        try:
            sha = repo.refs[name]  # type: ignore[index]
        except KeyError:
            continue
        break
    if sha is None and _HEX.fullmatch(ref):
        sha = ref.encode()
    if sha is None:
        raise GitConfigError(f"config project {project}: ref {ref!r} not found in its repository"
                             + (" (HEAD names no commit yet: an empty repository?)" if ref == "HEAD" else ""))
    for _ in range(MAX_TAG_DEPTH):
        size = _object_size(repo, sha)  # (None: not found, which the lookup below says)
        if size is not None and size > MAX_COMMIT_BYTES:
            raise GitConfigError(f"config project {project}: ref {ref!r} names {sha.decode()}: refused: an object of "
                                 f"{size} bytes (a commit or tag kasd reads is at most {MAX_COMMIT_BYTES})")
        try:
            obj = repo.object_store[sha]  # type: ignore[index]
        except KeyError:
            raise GitConfigError(f"config project {project}: ref {ref!r} names {sha.decode()}, which is not in "
                                 "the repository") from None
        if isinstance(obj, Tag):
            sha = obj.object[1]
            continue
        if not isinstance(obj, Commit):
            raise GitConfigError(f"config project {project}: ref {ref!r} names a {obj.type_name.decode()}, not a commit")
        return sha.decode()
    raise GitConfigError(f"config project {project}: ref {ref!r}: more than {MAX_TAG_DEPTH} tags to its commit")


def _object_size(repo: Repo, sha: bytes) -> int | None:
    """The inflated size of object ``sha`` from its header only (a loose object's first bytes, a
    packed one's entry header or delta header), None when it is not found."""
    store = repo.object_store
    loose = os.path.join(store.path, sha[:2].decode(), sha[2:].decode())
    try:
        with open(loose, "rb") as f:
            head = zlib.decompressobj().decompress(f.read(512), 64)
        _, _, size = head.split(b"\0", 1)[0].partition(b" ")
        return int(size)
    except FileNotFoundError:
        pass
    except (ValueError, zlib.error):
        return None
    for pack in store.packs:
        try:
            offset = pack.index.object_offset(cast(Any, sha))
        except KeyError:
            continue
        return _packed_size(os.fspath(pack.data.path), offset)
    return None


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        shift += 7
        i += 1
        if not byte & 0x80:
            return value, i


def _packed_size(path: str, offset: int) -> int | None:
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(64)
    byte = data[0]
    kind, size, shift, i = (byte >> 4) & 7, byte & 0x0F, 4, 1
    while byte & 0x80:
        byte = data[i]
        size |= (byte & 0x7F) << shift
        shift += 7
        i += 1
    if kind == 6:  # OFS_DELTA: a base offset, then the delta
        while data[i] & 0x80:
            i += 1
        i += 1
    elif kind == 7:  # REF_DELTA: a base id
        i += 20
    else:
        return size
    with open(path, "rb") as f:
        f.seek(offset + i)
        delta = zlib.decompressobj().decompress(f.read(256), 32)
    try:
        _, j = _varint(delta, 0)  # the base's size
        return _varint(delta, j)[0]  # the result's
    except IndexError:
        return None


class _Tree:
    """One project's tree at one commit, read with the bounds and refusals above."""

    def __init__(self, repo: Repo, project: str, ref: str, commit: str, prefix: str) -> None:
        self.repo, self.project, self.ref, self.commit, self.prefix = repo, project, ref, commit, prefix

    def where(self, path: str) -> str:
        return f"{self.project}@{self.ref} ({self.commit[:12]}):{path}"

    def _load(self, sha: bytes, path: str, limit: int, what: str) -> Blob | Tree:
        from dulwich.objects import Blob, Tree

        size = _object_size(self.repo, sha)
        if size is None:
            raise GitConfigError(f"{self.where(path)}: object {sha.decode()} is missing or unreadable")
        if size > limit:
            raise GitConfigError(f"{self.where(path)}: refused: a {what} of {size} bytes (kasd reads at most {limit})")
        obj = self.repo.object_store[sha]  # type: ignore[index]
        if not isinstance(obj, (Blob, Tree)):
            raise GitConfigError(f"{self.where(path)}: names a {obj.type_name.decode()}, not a file or directory")
        return obj

    def _check_tree(self, tree: Tree, walked: str, path: str) -> None:
        """GitConfigError unless ``tree`` is one git reads as dulwich does: its entries sorted as git
        sorts them, no name twice (git reads the first of two, dulwich kept the last: GitLab's page
        and a reviewer would see one ``config.yaml`` and kasd read another), no ``.``, ``..``, ``.git``,
        empty or ``/``-holding name, only git's modes. git's ``fsck`` refuses the same."""
        from dulwich.objects import parse_tree

        # (dulwich's own Tree.check() says the same but for a name given twice apart — a file and a
        # directory of one name sort apart — at 3x the cost: 1.3 s for a tree of 80,000 entries)
        try:
            entries = list(parse_tree(tree.as_raw_string(), sha_len=tree.object_format.oid_length))
        except ValueError as exc:
            problem = str(exc)[:200]
        else:
            keys = [name + b"/" if mode == stat.S_IFDIR else name for name, mode, _ in entries]
            bad = next(((name, mode) for name, mode, _ in entries if b"/" in name or name in _BAD_NAMES
                        or mode not in _GIT_MODES), None)
            if bad is not None:
                problem = f"an entry {bad[0][:40].decode('utf-8', 'replace')!r} of mode {bad[1]:o}"
            elif len(set(name for name, _, _ in entries)) != len(entries):
                problem = "a name given twice"
            elif any(a >= b for a, b in itertools.pairwise(keys)):
                problem = "entries not in git's order"
            else:
                return
        raise GitConfigError(f"{self.where(path)}: refused: {walked or 'the root tree'} is a malformed tree ({problem}; "
                             "git fsck refuses it too)")

    def entry(self, path: str) -> tuple[int, bytes] | None:
        """(mode, sha) of ``path`` (relative to the project) in the tree, None if it is not there."""
        from dulwich.objects import Commit, Tree

        commit = self.repo.object_store[self.commit.encode()]  # type: ignore[index]
        assert isinstance(commit, Commit)
        mode, sha = stat.S_IFDIR, commit.tree
        walked = ""
        for part in (self.prefix + path).strip("/").split("/"):
            tree = self._load(sha, walked or "/", MAX_TREE_BYTES, "tree")
            if not isinstance(tree, Tree):
                return None
            self._check_tree(tree, walked, path)
            walked = f"{walked}/{part}" if walked else part
            try:
                mode, sha = tree[part.encode()]
            except KeyError:
                return None
            if stat.S_ISLNK(mode):
                raise GitConfigError(f"{self.where(path)}: refused: {walked} is a symbolic link in the tree (kasd "
                                     "follows none; commit the file itself)")
            if mode & 0o170000 == 0o160000:
                raise GitConfigError(f"{self.where(path)}: refused: {walked} is a submodule (kasd reads only this "
                                     "repository's tree)")
        return mode, sha

    def text(self, path: str) -> str | None:
        """The UTF-8 text of the blob at ``path``, None if it is not there."""
        found = self.entry(path)
        if found is None:
            return None
        mode, sha = found
        if stat.S_ISDIR(mode):
            raise GitConfigError(f"{self.where(path)}: is a directory, not a file")
        blob = self._load(sha, path, MAX_CONFIG_BYTES, "file")
        if blob.type_name != b"blob":  # (a tree entry's mode and object disagree: a corrupt tree)
            raise GitConfigError(f"{self.where(path)}: its tree entry names a {blob.type_name.decode()}, not a file")
        if TYPE_CHECKING:
            assert isinstance(blob, Blob)
        try:
            return yamldoc.decode(blob.as_raw_string())
        except yamldoc.YamlError as exc:
            raise GitConfigError(f"{self.where(path)}: {exc.problem}") from None

    def names(self, path: str) -> list[str] | None:
        """The ``*.yaml`` names of directory ``path`` (sorted), None if there is no such directory."""
        found = self.entry(path)
        if found is None:
            return None
        mode, sha = found
        if not stat.S_ISDIR(mode):
            raise GitConfigError(f"{self.where(path)}: is not a directory")
        tree = self._load(sha, path, MAX_TREE_BYTES, "tree")
        if tree.type_name != b"tree":
            raise GitConfigError(f"{self.where(path)}: its tree entry names a {tree.type_name.decode()}, not a directory")
        if TYPE_CHECKING:
            assert isinstance(tree, Tree)
        self._check_tree(tree, path, path)
        if len(tree) > MAX_TEMPLATE_ENTRIES:
            raise GitConfigError(f"{self.where(path)}: more than {MAX_TEMPLATE_ENTRIES} entries")
        return sorted(e.path.decode("utf-8", "replace") for e in tree.iteritems()
                      if e.path.endswith(b".yaml") and len(e.path) > 5 and not stat.S_ISDIR(e.mode))


@attrs.frozen(kw_only=True)
class ReadAgent:
    loaded: LoadedAgentConfig
    templates: dict[str, EnvironmentTemplate]


def unreadable(project: str, exc: Exception) -> GitConfigError:
    """A ``GitConfigError`` for what dulwich (or the disk) raised reading ``project``'s repository:
    a corrupt object, a bad pack, an I/O error — the repository's problem, not kasd's."""
    return GitConfigError(f"config project {project}: cannot read its repository: "
                          f"{type(exc).__name__}: {str(exc)[:200]}")


class ProjectReader:
    """Reads the agents of one config project at one commit (``read_agent``)."""

    def __init__(self, source: GitSource, project: str) -> None:
        self.source, self.project = source, project
        path, self._prefix = source.repository(project)
        self._path = path
        self.commit = ""

    def __enter__(self) -> ProjectReader:
        self._cm = _open(self._path, self.project)
        repo = self._cm.__enter__()
        self.commit = _resolve(repo, self.source.ref, self.project)
        self._tree = _Tree(repo, self.project, self.source.ref, self.commit, self._prefix)
        return self

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(None, None, None)

    def read_agent(self, name: str) -> ReadAgent:
        """``.gitlab/agents/<name>/config.yaml`` (missing: the default configuration, with a warning)
        and its ``environment_templates``; ``GitConfigError``, ``AgentConfigError`` or ``TemplateError``."""
        agent_config_path(Path("/"), self.project, name)  # (checks the project path and the agent name)
        base = f".gitlab/agents/{name}"
        where = self._tree.where(f"{base}/config.yaml")
        text = self._tree.text(f"{base}/config.yaml")
        if text is None:
            loaded = LoadedAgentConfig(config=AgentConfig(source=where), warnings=(
                f"{where}: no such file: the agent has the default configuration (only CI/CD jobs of its config "
                f"project {self.project} may use it)",))
        else:
            loaded = parse_agent_config(text, where)
        templates: dict[str, EnvironmentTemplate] = {}
        for file in self._tree.names(f"{base}/environment_templates") or ():
            path = f"{base}/environment_templates/{file}"
            body = self._tree.text(path)
            if body is None:  # (listed a moment ago in the same tree: cannot happen)
                raise GitConfigError(f"{self._tree.where(path)}: missing")
            templates[file[:-5]] = parse_template(body, self._tree.where(path), file[:-5])
        return ReadAgent(loaded=loaded, templates=templates)


__all__ = [
    "MAX_COMMIT_BYTES",
    "MAX_CONFIG_BYTES",
    "MAX_TREE_BYTES",
    "AgentConfigError",
    "GitConfigError",
    "GitSource",
    "ProjectCommit",
    "ProjectReader",
    "ReadAgent",
    "TemplateError",
    "check_ref",
    "unreadable",
]
