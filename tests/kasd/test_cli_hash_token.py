"""``kasd hash-token`` hashes exactly what agentd sends from the same token file, and warns when it is
given a whole ``ci:``/``pat:`` bearer token instead of the secret part its help asks for."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from agentd.connection import ConnectionManager
from kasd.tokens import hash_token
from tests.forkrun import run_module

pytestmark = pytest.mark.timeout(20)

TOKEN_FILES = ["abc", "abc\n", "abc\n\n", "abc\r\n", "  abc \t\n\n", "\nabc\n"]


def _hash_token(stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_module("kasd", "hash-token", *args, input=stdin, timeout=15)


async def _token_agentd_sends(token_file: Path) -> str:
    """Run agentd's tunnel manager on ``token_file`` with a dialer that records the token."""
    sent: list[str] = []

    @asynccontextmanager
    async def dial(url: str, token: str, metadata: object) -> AsyncIterator[object]:
        sent.append(token)
        raise OSError("recorded")
        yield  # pragma: no cover

    async def no_sleep(seconds: float) -> None:
        await trio.sleep_forever()

    manager = ConnectionManager(["http://kasd/tunnel"], token_file=token_file, handler=None,  # type: ignore[arg-type]
                                metadata={}, connections=1, dial=dial, sleep=no_sleep)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(manager.run)
            while not sent:
                await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    return sent[0]


@pytest.mark.parametrize("content", TOKEN_FILES)
async def test_hash_token_matches_what_agentd_sends(tmp_path: Path, content: str) -> None:
    token_file = tmp_path / "agent.token"
    token_file.write_bytes(content.encode())
    sent = await _token_agentd_sends(token_file)
    result = _hash_token(token_file.read_text())
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == hash_token(sent) + "\n"
    assert result.stdout == hash_token("abc") + "\n"


@pytest.mark.parametrize(("stdin", "kind"), [("ci:1:job-Zq7x\n", "ci"), ("pat:12:pers-Zq7x", "pat")])
def test_a_whole_bearer_token_gets_a_warning(stdin: str, kind: str) -> None:
    result = _hash_token(stdin)
    assert result.returncode == 0
    assert result.stdout == hash_token(stdin.strip()) + "\n"  # still hashed as given
    assert result.stderr == (
        f"kasd hash-token: warning: this looks like a whole {kind}:<agent id>:<token> bearer token; "
        f"kasd stores no {kind}: tokens (they are signed: kasctl token {kind}); token_sha256 is for agent tokens. "
        "Hashing it as it is.\n"
    )
    assert "Zq7x" not in result.stderr  # the token is never echoed


@pytest.mark.parametrize("stdin", ["job-secret", "glagent-abc:def", "ci:x:y", "ci:1:"])
def test_a_secret_gets_no_warning(stdin: str) -> None:
    result = _hash_token(stdin)
    assert result.returncode == 0 and result.stderr == ""


def test_help_says_what_is_hashed() -> None:
    result = _hash_token("", "--help")
    assert result.returncode == 0
    assert "tokens are signed, never stored" in result.stdout and "kasctl token ci|pat" in result.stdout
    assert "as agentd ignores it in its --token-file" in result.stdout
    assert "a trailing newline" not in result.stdout


def test_only_whitespace_is_no_token() -> None:
    result = _hash_token("\n \n")
    assert result.returncode == 2
    assert result.stderr == "kasd hash-token: no token on stdin\n"
