"""The build's one hook: the sans-I/O hot path compiled with mypyc when it can be (docs/dependencies.md).

Everything else about the distribution is in pyproject.toml. When mypyc and a C compiler are there
and ``KASD_NO_COMPILE`` is unset, the modules in ``COMPILED`` are built as C extensions next to
their sources (which still ship, and are what runs where the extension is absent); otherwise the
wheel is pure Python. One line on stderr says which.

``COMPILED`` is the one list: ``scripts/compiled.py`` (the test script's compiled pass) reads it from
here, and ``tests/conftest.py`` checks under ``KASD_EXPECT_COMPILED=1`` that each of them runs as an
extension.
"""

from __future__ import annotations

import os
import sys
import sysconfig

from setuptools import setup

# What a profile of bench/e2e.py shows hot, sans-I/O only (no trio, no h2 internals: the fenced
# h2trio/lean.py stays interpreted). Each must pass `mypy --strict` and the tests compiled. Not here:
# modules of attrs classes only (wire/frames.py, wire/events.py, wire/flow.py): mypyc leaves attrs
# classes as ordinary Python classes, so compiling them gains nothing, and it checks a class-level
# `x: T = attrs.field(...)` against T at import, which attrs' field markers fail.
COMPILED = [
    "wire/codec.py",
    "wire/errors.py",
    "wire/settings.py",
    "wire/ids.py",
    "wire/streamstate.py",
    "wire/mux.py",
    "http11/framing.py",
    "tunnelhttp/head.py",
    "tunnelhttp/watchbounds.py",
]


#: the setup.py commands that build extensions (a wheel, or by hand)
_BUILDS = {"bdist_wheel", "build", "build_ext"}


def _why_not_compiled() -> str | None:
    """None when mypyc can build here, else the reason the wheel is pure Python."""
    if os.environ.get("KASD_NO_COMPILE"):
        return "KASD_NO_COMPILE is set"
    if "editable_wheel" in sys.argv or not _BUILDS.intersection(sys.argv):
        # An editable install (and pip's questions before any build: egg_info, dist_info) runs the
        # sources: extensions built into the source tree would shadow them for every later run;
        # scripts/compiled.py builds a compiled copy for the tests instead.
        return "an editable install, or no build, runs the sources"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed (pip install mypy)"
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python.h in {include} (the Python development headers)"
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    executable = getattr(compiler, "compiler", None) or ["cc"]
    from shutil import which

    if which(executable[0]) is None:
        return f"no C compiler ({executable[0]} not found)"
    return None


def _ext_modules() -> list[object]:
    reason = _why_not_compiled()
    if reason is not None:
        print(f"kasd build: pure Python ({reason})", file=sys.stderr)
        return []
    from mypyc.build import mypycify

    print(f"kasd build: compiling {len(COMPILED)} modules with mypyc", file=sys.stderr)
    return mypycify(COMPILED, opt_level="3", debug_level="0")


if __name__ == "__main__":
    setup(ext_modules=_ext_modules())
