"""The isolation matrix at the door: signed tokens (good, expired, not yet valid, tampered, signed by
another key, for another audience, of the wrong kind) × agents × configurations, through the same
snapshot kasd's proxy asks — every cell asserted, denials outnumbering grants — and the client's own
``Impersonate-*`` headers in every access_as mode, through the real pipeline."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
import trio

from kasctl.authsetup import AuthSetup
from kasd.authority import CiAuthority, LoadedAuthorization, load_authorization
from kasd.authz.jobinfo import allowed_agents_response
from kasd.authz.jobtokens import JobClaims, mint_job_token, mint_personal_token
from kasd.authz.keys import SigningKey
from kasd.authz.snapshot import Snapshot
from kasd.authz.verdict import AccessDenied
from kasd.config import config_from_mapping
from kasd.tokens import hash_token
from routing.errors import AgentNotConnected
from tests.kasd.test_pipeline import FakeExchange, FakeRouter, pipeline, request

NOW = 1_900_000_000.0
HOUR = timedelta(hours=1)

# agent 1 "prod" (config project acme/infra): acme/web/shop's protected jobs as the job; the group
#   other (and below) as a fixed identity; alice and the acme/web developers by personal token
# agent 2 "review" (config project acme/infra): review/* environments of acme/web/shop as ci_user,
#   with rules; the instance as the agent (any project's jobs)
# agent 3 "locked" (config project other/infra): only its own project's jobs (GitLab's default)
CONFIGS = {
    "prod": """\
ci_access:
  projects:
    - id: acme/web/shop
      access_as: {ci_job: {}}
      protected_branches_only: true
  groups:
    - id: other
      access_as: {impersonate: {username: deployer, groups: [deployers]}}
user_access:
  access_as: {user: {}}
  groups:
    - id: acme/web
""",
    "review": """\
ci_access:
  projects:
    - id: acme/web/shop
      access_as: {ci_user: {}}
      environments: ["review/*"]
      rules:
        - if: '$CI_COMMIT_REF_NAME =~ /^wip-/'
          when: never
        - namespace: shop-$CI_ENVIRONMENT_SLUG
          on_overflow: truncate
  instance: {}
""",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Snapshot, AuthSetup]:
    auth = AuthSetup(tmp_path_factory.mktemp("isolation"))
    for name, text in CONFIGS.items():
        auth.agent_config("acme/infra", name, text)
    config = config_from_mapping({
        "agents": [
            {"id": 1, "name": "prod", "config_project": "acme/infra", "token_sha256": hash_token("a1")},
            {"id": 2, "name": "review", "config_project": "acme/infra", "token_sha256": hash_token("a2")},
            {"id": 3, "name": "locked", "config_project": "other/infra", "token_sha256": hash_token("a3")},
        ],
        "groups": [{"path": "acme", "id": 10}, {"path": "acme/web", "id": 11}, {"path": "other", "id": 20},
                   {"path": "other/sub", "id": 21}],
        "projects": [{"path": "acme/infra", "id": 40}, {"path": "acme/web/shop", "id": 41},
                     {"path": "acme/tools", "id": 42}, {"path": "other/infra", "id": 50},
                     {"path": "other/sub/app", "id": 51}],
        "users": [{"username": "alice", "memberships": {"acme/web": "developer"}},
                  {"username": "bob", "memberships": {"acme/web": "reporter"}},
                  {"username": "carol"}],
        **auth.kasd_settings(),
    })
    return load_authorization(config, None).snapshot, auth


OTHER_KEY = SigningKey.generate()


def _job(key: SigningKey, *, audience: str = "kasd", now: float = NOW, ttl: timedelta = HOUR, **claims: object) -> str:
    base: dict[str, object] = {"project": "acme/web/shop", "job_id": 9, "pipeline_id": 3, "user": "alice",
                               "ref": "main", "protected": True}
    return mint_job_token(key, JobClaims(**{**base, **claims}), ttl, audience=audience, now=now)  # type: ignore[arg-type]


def _tampered(token: str) -> str:
    head, payload, signature = token.split(".")
    return ".".join((head, payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1], signature))


# (case, kind, token maker, agent) → "allow <access_as> [<namespace>]" or "deny <status> <fragment>"
Token = Callable[[AuthSetup], str]
CELLS: list[tuple[str, str, Token, int, str]] = [
    ("protected shop job on prod", "ci", lambda a: _job(a.key), 1, "allow ci_job"),
    ("protected shop job on review (no environment)", "ci", lambda a: _job(a.key), 2,
     "deny 403 only in certain environments"),
    ("protected shop job on locked", "ci", lambda a: _job(a.key), 3, "deny 403 does not authorize project acme/web/shop"),
    ("unprotected shop job on prod", "ci", lambda a: _job(a.key, protected=False), 1,
     "deny 403 protected_branches_only"),
    ("review job on review", "ci", lambda a: _job(a.key, protected=False, ref="feat",
                                                   environment="review/feat"), 2, "allow ci_user shop-review-feat-"),
    ("review job from a wip- branch", "ci", lambda a: _job(a.key, ref="wip-x", environment="review/x"), 2,
     "deny 403 when: never"),
    ("production job on review", "ci", lambda a: _job(a.key, environment="production"), 2,
     "deny 403 in environment 'production'"),
    ("tools job on prod", "ci", lambda a: _job(a.key, project="acme/tools"), 1,
     "deny 403 does not authorize project acme/tools"),
    ("tools job on review (instance)", "ci", lambda a: _job(a.key, project="acme/tools"), 2, "allow agent"),
    ("other/sub job on prod (group other)", "ci", lambda a: _job(a.key, project="other/sub/app"), 1,
     "allow impersonate"),
    ("other/sub job on locked", "ci", lambda a: _job(a.key, project="other/sub/app"), 3,
     "deny 403 does not authorize project other/sub/app"),
    ("locked's own project's job", "ci", lambda a: _job(a.key, project="other/infra"), 3, "allow agent"),
    ("config project's job on prod (implicit)", "ci", lambda a: _job(a.key, project="acme/infra"), 1, "allow agent"),
    ("a job of a project kasd does not know", "ci", lambda a: _job(a.key, project="ghost/app"), 1,
     "deny 403 not known to kasd"),
    ("a job token for an agent kasd does not know", "ci", lambda a: _job(a.key), 9, "deny 403 agent 9 is not known"),
    ("expired", "ci", lambda a: _job(a.key, now=NOW - 2 * 3600), 1, "deny 401 expired"),
    ("not yet valid", "ci", lambda a: _job(a.key, now=NOW + 600), 1, "deny 401 not yet valid"),
    ("tampered", "ci", lambda a: _tampered(_job(a.key)), 1, "deny 401 bad signature"),
    ("signed by another key", "ci", lambda a: _job(OTHER_KEY), 1, "deny 401 signed by an unknown key"),
    ("for another audience", "ci", lambda a: _job(a.key, audience="gitlab"), 1, "deny 401 wrong audience"),
    ("a job token as a personal token", "pat", lambda a: _job(a.key), 1, "deny 401 not a personal token"),
    ("a personal token as a job token", "ci", lambda a: mint_personal_token(a.key, "alice", HOUR, now=NOW), 1,
     "deny 401 not a job token"),
    ("alice (developer of acme/web) on prod", "pat", lambda a: mint_personal_token(a.key, "alice", HOUR, now=NOW), 1,
     "allow user"),
    ("alice on review (no user_access)", "pat", lambda a: mint_personal_token(a.key, "alice", HOUR, now=NOW), 2,
     "deny 403 not configured for user access"),
    ("bob (reporter) on prod", "pat", lambda a: mint_personal_token(a.key, "bob", HOUR, now=NOW), 1,
     "deny 403 needs at least the Developer role"),
    ("carol (no membership) on prod", "pat", lambda a: mint_personal_token(a.key, "carol", HOUR, now=NOW), 1,
     "deny 403 needs at least the Developer role"),
    ("a user kasd does not know", "pat", lambda a: mint_personal_token(a.key, "mallory", HOUR, now=NOW), 1,
     "deny 403 not known to kasd"),
    ("alice's expired personal token", "pat",
     lambda a: mint_personal_token(a.key, "alice", HOUR, now=NOW - 2 * 3600), 1, "deny 401 expired"),
    ("alice's personal token by another key", "pat", lambda a: mint_personal_token(OTHER_KEY, "alice", HOUR, now=NOW),
     1, "deny 401 signed by an unknown key"),
]


@pytest.mark.parametrize(("case", "kind", "token", "agent", "expected"), CELLS, ids=[c[0] for c in CELLS])
def test_every_cell(world: tuple[Snapshot, AuthSetup], case: str, kind: str, token: Token, agent: int,
                    expected: str) -> None:
    snapshot, auth = world
    verdict_word, _, rest = expected.partition(" ")
    if verdict_word == "allow":
        mode, _, namespace = rest.partition(" ")
        verdict = snapshot.authorize(kind, token(auth), agent, now=NOW)
        assert verdict.access_as == mode, case
        if namespace:
            assert verdict.namespace is not None and verdict.namespace.startswith(namespace), verdict.namespace
    else:
        status, _, fragment = rest.partition(" ")
        with pytest.raises(AccessDenied) as info:
            snapshot.authorize(kind, token(auth), agent, now=NOW)
        assert info.value.status == int(status) and fragment in info.value.message, (case, info.value.message)


def test_denials_outnumber_grants() -> None:
    grants = sum(1 for *_, expected in CELLS if expected.startswith("allow"))
    assert len(CELLS) - grants > 2 * grants


MODES = {  # agent id, token (kind, maker), the mode it grants
    "agent": (2, "ci", lambda a: _job(a.key, project="acme/tools")),
    "impersonate": (1, "ci", lambda a: _job(a.key, project="other/sub/app")),
    "ci_job": (1, "ci", lambda a: _job(a.key)),
    "ci_user": (2, "ci", lambda a: _job(a.key, protected=False, ref="feat", environment="review/feat")),
    "user": (1, "pat", lambda a: mint_personal_token(a.key, "alice", HOUR, now=NOW)),
}


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_client_impersonation_is_smuggled_through_no_mode_but_agent(
    world: tuple[Snapshot, AuthSetup], mode: str
) -> None:
    """kubectl --as, in each mode: passed (as the stream's impersonation) only where the agent acts
    as itself; 400 in every other mode, before anything is routed."""
    snapshot, auth = world
    agent, kind, make = MODES[mode]
    authority = CiAuthority(lambda: LoadedAuthorization(snapshot=snapshot), clock=lambda: NOW)
    token = f"{kind}:{agent}:{make(auth)}"
    for header in ("impersonate-user", "impersonate-group", "impersonate-uid", "impersonate-extra-scopes"):
        headers = (("impersonate-user", "system:admin"),) if header == "impersonate-user" else \
            (("impersonate-user", "system:admin"), (header, "x"))
        router = FakeRouter(failure=AgentNotConnected(agent, 0))
        async with trio.open_nursery() as nursery:
            ex = FakeExchange(request(token, headers=headers), nursery)
            await pipeline(router, authority).serve(ex)
        if mode == "agent":
            assert len(router.opened) == 1 and ex.status == 503, (mode, header)  # passed on (no tunnel)
        else:
            assert ex.status == 400 and "Impersonate-* headers are not allowed" in ex.json()["message"], (mode, header)
            assert router.opened == []


def test_the_modes_are_the_five(world: tuple[Snapshot, AuthSetup]) -> None:
    snapshot, auth = world
    for mode, (agent, kind, make) in MODES.items():
        assert snapshot.authorize(kind, make(auth), agent, now=NOW).access_as == mode


def test_the_allowed_agents_of_a_job_are_the_cells_it_is_allowed_in(world: tuple[Snapshot, AuthSetup]) -> None:
    """GET /api/v4/job/allowed_agents lists exactly the agents the matrix allows for that job."""
    snapshot, auth = world
    review = _job(auth.key, protected=False, ref="feat", environment="review/feat", environment_tier="development")
    claims, allowed = snapshot.allowed_agents(review, now=NOW)
    body = allowed_agents_response(snapshot, claims, allowed)
    assert [a["id"] for a in body["allowed_agents"]] == [2]  # prod wants protected refs; locked, its own project
    (agent,) = body["allowed_agents"]
    # the ci_access entry as written (GitLab's ``configuration``), without its id
    assert agent["configuration"] == {
        "access_as": {"ci_user": {}}, "environments": ["review/*"],
        "rules": [{"if": "$CI_COMMIT_REF_NAME =~ /^wip-/", "when": "never"},
                  {"namespace": "shop-$CI_ENVIRONMENT_SLUG", "on_overflow": "truncate"}]}
    assert agent["kasd"]["context"] == "acme/infra:review" and agent["kasd"]["namespace"].startswith("shop-review-feat-")
    assert body["environment"] == {"slug": agent["kasd"]["namespace"].removeprefix("shop-"), "tier": "development"}
    assert body["project"] == {"id": 41, "path_with_namespace": "acme/web/shop", "groups": [{"id": 10}, {"id": 11}]}
    protected = snapshot.allowed_agents(_job(auth.key), now=NOW)[1]
    assert [v.agent_id for v in protected] == [1]
    with pytest.raises(AccessDenied) as info:
        snapshot.allowed_agents(_tampered(review), now=NOW)
    assert info.value.status == 401
