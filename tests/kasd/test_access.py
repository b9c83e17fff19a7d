"""StaticAccess: who may use which agent, and the grants it remembers between requests."""

from __future__ import annotations

import pytest

from kasd import access
from kasd.access import AccessDenied, StaticAccess
from kasd.config import AccessEntry
from kasd.tokens import hash_token


def _access() -> StaticAccess:
    return StaticAccess(
        [
            AccessEntry(kind="ci", token_sha256=hash_token("job-secret"), agents=frozenset({1}), name="ci-jobs"),
            AccessEntry(kind="pat", token_sha256=hash_token("pat-secret"), agents=frozenset({1, 2, 3, 4}), name="ops"),
        ]
    )


def test_a_remembered_grant_is_the_same_answer_as_the_first() -> None:
    rules = _access()
    first = rules.authorize("Bearer ci:1:job-secret")
    again = rules.authorize("Bearer ci:1:job-secret")
    assert again == first
    assert (again.kind, again.agent_id, again.subject) == ("ci", 1, "ci-jobs")


@pytest.mark.parametrize(
    ("other", "status"),
    [
        ("Bearer ci:2:job-secret", 403),  # the same token for an agent it may not use
        ("Bearer pat:1:job-secret", 401),  # the same secret under the wrong kind
    ],
)
def test_a_remembered_grant_opens_nothing_else(other: str, status: int) -> None:
    rules = _access()
    rules.authorize("Bearer ci:1:job-secret")
    with pytest.raises(AccessDenied) as denied:
        rules.authorize(other)
    assert denied.value.status == status


def test_refusals_are_checked_every_time() -> None:
    rules = _access()
    for _ in range(2):
        with pytest.raises(AccessDenied) as denied:
            rules.authorize("Bearer ci:1:wrong")
        assert denied.value.status == 401
    with pytest.raises(AccessDenied):
        rules.authorize(None)


def test_the_remembered_grants_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access, "GRANT_CACHE_SIZE", 3)
    rules = _access()
    for agent in (1, 2, 3, 4):
        assert rules.authorize(f"Bearer pat:{agent}:pat-secret").agent_id == agent
    assert len(rules._granted) == 3
    assert "Bearer pat:1:pat-secret" not in rules._granted  # the oldest went first
    assert rules.authorize("Bearer pat:1:pat-secret").agent_id == 1
