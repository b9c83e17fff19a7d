"""Real Git repositories for tests, made with dulwich (never the ``git`` command): commits of whole
file sets on a branch, with symlinks and submodules (gitlinks) where a test needs them."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

import attrs
from dulwich.objects import Blob, Commit, Tree
from dulwich.pack import write_pack_objects
from dulwich.repo import Repo


@attrs.frozen
class Link:
    """A symbolic link in the tree, to ``target``."""

    target: str


@attrs.frozen
class Submodule:
    """A gitlink (a submodule's commit) in the tree."""

    commit: str = "1" * 40


Entry = bytes | str | Link | Submodule


class GitRepo:
    """A repository at ``path`` (bare, or with a work tree: then ``path/.git``); ``commit`` records a
    new commit on ``branch`` whose tree is the files so far updated with ``changes`` (None deletes)."""

    def __init__(self, path: Path, *, bare: bool = True, branch: str = "main") -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.repo = Repo.init_bare(str(path)) if bare else Repo.init(str(path))
        self.repo.refs.set_symbolic_ref(b"HEAD", f"refs/heads/{branch}".encode())
        self.files: dict[str, dict[str, Entry]] = {}

    def close(self) -> None:
        self.repo.close()

    def pack(self) -> None:
        """Every object into one pack, with deltas where dulwich finds them (as ``git gc`` would
        leave a repository), and the loose objects removed."""
        store = self.repo.object_store
        objects = [store[sha] for sha in list(store)]
        scratch = Path(store.path) / "scratch.pack"
        with open(scratch, "wb") as f:
            write_pack_objects(f, [(o, None) for o in objects], store.object_format, deltify=True)
        write, commit, _abort = store.add_pack()
        write.write(scratch.read_bytes())
        commit()
        scratch.unlink()
        for name in os.listdir(store.path):
            if len(name) == 2:
                shutil.rmtree(os.path.join(store.path, name))

    def commit(self, changes: dict[str, Entry | None], *, branch: str = "main", message: str = "change") -> str:
        files = dict(self.files.get(branch, {}))
        for name, entry in changes.items():
            if entry is None:
                files.pop(name, None)
            else:
                files[name] = entry
        self.files[branch] = files
        store = self.repo.object_store
        nested: dict[str, object] = {}
        for name, entry in files.items():
            *dirs, leaf = name.split("/")
            at = nested
            for d in dirs:
                at = at.setdefault(d, {})  # type: ignore[assignment]
            at[leaf] = entry

        def tree_of(node: dict[str, object]) -> bytes:
            tree = Tree()
            for key, value in node.items():
                if isinstance(value, dict):
                    tree.add(key.encode(), stat.S_IFDIR, tree_of(value))
                elif isinstance(value, Link):
                    blob = Blob.from_string(value.target.encode())
                    store.add_object(blob)
                    tree.add(key.encode(), stat.S_IFLNK, blob.id)
                elif isinstance(value, Submodule):
                    tree.add(key.encode(), 0o160000, value.commit.encode())
                else:
                    blob = Blob.from_string(value.encode() if isinstance(value, str) else value)  # type: ignore[union-attr]
                    store.add_object(blob)
                    tree.add(key.encode(), 0o100644, blob.id)
            store.add_object(tree)
            return tree.id

        ref = f"refs/heads/{branch}".encode()
        commit = Commit()
        commit.tree = tree_of(nested)
        commit.parents = [self.repo.refs[ref]] if ref in self.repo.refs else []
        commit.author = commit.committer = b"Test <test@example.com>"
        commit.author_time = commit.commit_time = int(time.time())
        commit.author_timezone = commit.commit_timezone = 0
        commit.message = message.encode()
        store.add_object(commit)
        self.repo.refs[ref] = commit.id
        return commit.id.decode()
