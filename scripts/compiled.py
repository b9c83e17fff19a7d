#!/usr/bin/env python3
"""A copy of the working tree whose hot path runs compiled (mypyc), for the test script's compiled pass.

    python scripts/compiled.py [TREE]     # prints TREE (default build/compiled-tree) when ready

The modules are the ones ``setup.py`` lists in ``COMPILED`` (the one list). They are built with
``python -m mypyc`` in a scratch copy of their packages, and the extension files are cached under
``build/mypyc/<hash>/`` (the newest only): the hash covers the sources of the packages they are in, setup.py, mypy's
version and the Python's, so an unchanged hot path is not built again (a build takes ~40 s of CPU on
one core; docs/dependencies.md). TREE is then the working tree as it is now (uncommitted edits too,
without .git, .venv and build/) with the extensions beside their sources; run Python with TREE as the
working directory, since the current directory comes first on ``sys.path``. Exit status 1, with the
compiler's output on stderr, when the build fails.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXCLUDED = {".git", ".venv", "build", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
            ".hypothesis", ".demo"}  # fmt: skip
# mypyc reads mypy's settings from the scratch copy; the project's own pyproject.toml is not copied
# there (setuptools older than the project's build requirement would refuse its metadata).
MYPY_CONFIG = '[tool.mypy]\nstrict = true\npython_version = "3.11"\nignore_missing_imports = true\n'


def compiled_modules(root: Path = ROOT) -> list[str]:
    """``setup.py``'s ``COMPILED``, read without running it."""
    tree = ast.parse((root / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "COMPILED" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise RuntimeError("setup.py has no COMPILED list")


def module_names(root: Path = ROOT) -> list[str]:
    """The dotted names of the compiled modules (``wire/codec.py`` → ``wire.codec``)."""
    return [path.removesuffix(".py").replace("/", ".") for path in compiled_modules(root)]


def runs_compiled(name: str) -> bool:
    """Whether module ``name`` is imported from a compiled extension rather than its ``.py``."""
    module = importlib.import_module(name)
    return (getattr(module, "__file__", None) or "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def _packages(modules: list[str]) -> list[str]:
    return sorted({m.split("/", 1)[0] for m in modules})


def _source_hash(modules: list[str]) -> str:
    import mypy.version

    digest = hashlib.sha256()
    digest.update(f"{mypy.version.__version__} {sys.version} {sysconfig.get_platform()}".encode())
    digest.update((ROOT / "setup.py").read_bytes())
    for package in _packages(modules):
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def build(modules: list[str]) -> Path:
    """The directory of built extension files for the sources as they are now (cached)."""
    cache = ROOT / "build" / "mypyc" / _source_hash(modules)
    if (cache / "DONE").exists():
        return cache
    with tempfile.TemporaryDirectory(prefix="kasd-mypyc-") as scratch:
        work = Path(scratch)
        for package in _packages(modules):
            shutil.copytree(ROOT / package, work / package, ignore=shutil.ignore_patterns("__pycache__"))
        (work / "pyproject.toml").write_text(MYPY_CONFIG)
        done = subprocess.run([sys.executable, "-m", "mypyc", *modules], cwd=work,
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            raise SystemExit(f"scripts/compiled.py: mypyc failed (exit status {done.returncode})")
        if cache.parent.exists():  # older sources' builds: only the newest is kept
            shutil.rmtree(cache.parent)
        cache.mkdir(parents=True)
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        for built in work.rglob(f"*{suffix}"):
            if "build" in built.relative_to(work).parts:
                continue
            target = cache / built.relative_to(work)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, target)
        (cache / "DONE").write_text("")
    return cache


def make_tree(tree: Path, built: Path) -> None:
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(ROOT, tree, ignore=lambda _dir, names: [n for n in names if n in EXCLUDED])
    for extension in built.rglob("*"):
        if extension.is_file() and extension.name != "DONE":
            shutil.copy2(extension, tree / extension.relative_to(built))


def main() -> None:
    tree = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT / "build" / "compiled-tree"
    modules = compiled_modules()
    make_tree(tree, build(modules))
    print(tree)


if __name__ == "__main__":
    main()
