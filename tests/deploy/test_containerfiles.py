"""deploy/containers: each daemon's image definition, read statically (no image builder runs in the
suite): two stages, the wheel of this tree built in the first and nothing else carried over but the
environment it was installed in, a base pinned by digest, a numeric non-root user, the daemon as
entrypoint and its default ports exposed."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(10)

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS = ROOT / "deploy" / "containers"
#: the daemon, and the ports it listens on by default (docs/kasd.md "Ports", docs/agentd.md); kasd's
#: REST API (8153) is off by default, on the port its documentation and examples use
DAEMONS = {"kasd": {8150, 8151, 8153, 8154, 8155}, "agentd": {8080}}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instruction in instructions(path):
        if instruction[0] == "FROM":
            result.append([])
        result[-1].append(instruction)
    return result


@pytest.mark.parametrize("daemon", sorted(DAEMONS))
def test_image_is_two_stages_on_a_base_pinned_by_digest(daemon: str) -> None:
    build, final = stages(CONTAINERS / f"{daemon}.Containerfile")
    for stage in (build, final):
        image = stage[0][1].split()[0]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", image), image
    assert build[0][1].split()[0] == final[0][1].split()[0]
    assert build[0][1].endswith(" AS build")
    # the tag the digest stands for is said in a comment
    tag = build[0][1].split("@")[0]
    assert f"Base image: {tag}," in (CONTAINERS / f"{daemon}.Containerfile").read_text()


@pytest.mark.parametrize("daemon", sorted(DAEMONS))
def test_the_first_stage_builds_the_wheel_of_every_package(daemon: str) -> None:
    build, final = stages(CONTAINERS / f"{daemon}.Containerfile")
    run = " ".join(args for word, args in build if word == "RUN")
    assert "pip wheel --no-deps --wheel-dir /wheels ." in run
    assert "/opt/kasd/bin/pip install /wheels/kasd-*.whl" in run
    copied = {name for word, args in build if word == "COPY" for name in shlex.split(args)[:-1]}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in packages} | {"pyproject.toml", "README.md"} == copied
    # the final stage takes only the installed environment from the first
    assert [args for word, args in final if word == "COPY"] == ["--from=build /opt/kasd /opt/kasd"]
    assert not any(word == "RUN" for word, _ in final)


def test_both_images_share_one_first_stage() -> None:
    kasd, agentd = (stages(CONTAINERS / f"{d}.Containerfile")[0] for d in ("kasd", "agentd"))
    assert kasd == agentd


@pytest.mark.parametrize("daemon", sorted(DAEMONS))
def test_the_image_runs_the_daemon_as_a_numeric_non_root_user(daemon: str) -> None:
    final = dict(stages(CONTAINERS / f"{daemon}.Containerfile")[-1])
    uid, _, gid = final["USER"].partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0
    assert final["ENTRYPOINT"] == f'["/opt/kasd/bin/{daemon}"]'
    assert {int(p) for p in final["EXPOSE"].split()} == DAEMONS[daemon]
