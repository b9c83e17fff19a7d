"""StaticAccess: who may use which agent, and the grants it remembers between requests."""

from __future__ import annotations

import pytest

from kasd import access
from kasd.access import StaticAccess
from kasd.config import AccessEntry
from kasd.seams import AccessDenied, Credentials, Grant, parse_bearer
from kasd.tokens import hash_token


async def _authorize(rules: StaticAccess, authorization: str | None) -> Grant:
    """What the pipeline does with a request's Authorization header: parse it, ask the authority."""
    credentials = parse_bearer(authorization)
    return await rules.authorize(credentials, credentials.agent_id)


def _access() -> StaticAccess:
    return StaticAccess(
        [
            AccessEntry(kind="ci", token_sha256=hash_token("job-secret"), agents=frozenset({1}), name="ci-jobs"),
            AccessEntry(kind="pat", token_sha256=hash_token("pat-secret"), agents=frozenset({1, 2, 3, 4}), name="ops"),
        ]
    )


async def test_a_remembered_grant_is_the_same_answer_as_the_first() -> None:
    rules = _access()
    first = await _authorize(rules, "Bearer ci:1:job-secret")
    again = await _authorize(rules, "Bearer ci:1:job-secret")
    assert again == first
    assert (again.kind, again.agent_id, again.subject) == ("ci", 1, "ci-jobs")


@pytest.mark.parametrize(
    ("other", "status"),
    [
        ("Bearer ci:2:job-secret", 403),  # the same token for an agent it may not use
        ("Bearer pat:1:job-secret", 401),  # the same secret under the wrong kind
    ],
)
async def test_a_remembered_grant_opens_nothing_else(other: str, status: int) -> None:
    rules = _access()
    await _authorize(rules, "Bearer ci:1:job-secret")
    with pytest.raises(AccessDenied) as denied:
        await _authorize(rules, other)
    assert denied.value.status == status


async def test_refusals_are_checked_every_time() -> None:
    rules = _access()
    for _ in range(2):
        with pytest.raises(AccessDenied) as denied:
            await _authorize(rules, "Bearer ci:1:wrong")
        assert denied.value.status == 401
    with pytest.raises(AccessDenied):
        await _authorize(rules, None)


async def test_the_remembered_grants_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access, "GRANT_CACHE_SIZE", 3)
    rules = _access()
    for agent in (1, 2, 3, 4):
        assert (await _authorize(rules, f"Bearer pat:{agent}:pat-secret")).agent_id == agent
    assert len(rules._granted) == 3
    oldest = Credentials(kind="pat", agent_id=1, secret="pat-secret")
    assert (oldest, 1) not in rules._granted  # the oldest went first
    assert (await _authorize(rules, "Bearer pat:1:pat-secret")).agent_id == 1
