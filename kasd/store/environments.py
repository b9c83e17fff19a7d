"""Which environment owns each slug of a project: the first name kasd saw with it, as GitLab's
database keeps an environment's slug unique in its project.

An environment's slug (``CI_ENVIRONMENT_SLUG``) is what kasd's and GitLab's names hang on: the
``gitlab:project_env:<project id>:<slug>`` group a ``ci_job`` identity holds, the
``agent.gitlab.com/env-<slug>-…`` labels, the built-in template's namespace and a managed
namespace's record of its users. GitLab's slug is not injective — ``production-`` slugs to
``production``, a name such as ``review-feat-x-o3skh8`` to itself, which is the slug of
``review/feat-x``, and its 6 base-36 digits of suffix can be brute-forced for any other name — GitLab
is safe because it stores each environment's slug and refuses a second environment with the same
one. Standalone kasd has no such database, so it keeps this record in its store: a job whose
environment's slug already belongs to another name of its project is refused, before it is given the
other environment's group, labels or namespace, and before its stop can touch them.

``EnvironmentSlugs.claim`` is what the job's first request (and an environment stop) awaits. A claim
never changes owner, so what the store answered is remembered here (bounded) and the per-request
cost is a dict lookup. Without a store (tests, embedders) claims live in this process only.
"""

from __future__ import annotations

from typing import Protocol

from kasd.authz.slugs import environment_slug
from kasd.store.protocol import StoreError

#: the most (project, slug) claims a store holds (≈ 100 bytes each); past it, new environments are
#: refused (503, saying so) rather than used unchecked
MAX_ENVIRONMENTS = 100_000
#: the most claims remembered in memory per replica (a claim never changes: a forgotten one costs a
#: store read, not a wrong answer)
REMEMBERED = 16_384


class SlugStore(Protocol):
    async def claim_environment(self, project_id: int, slug: str, name: str) -> str:
        """Record ``name`` as the owner of ``slug`` in project ``project_id`` unless one is already
        recorded; the owner's name either way. ``StoreError`` (unreachable, or full)."""
        ...


#: the longest environment name (GitLab's ``Environment`` validates ``name`` to 255 characters):
#: what a record holds stays small
MAX_NAME_LENGTH = 255


class EnvironmentRefused(Exception):
    """The environment cannot be used: ``str()`` says why, safe to show the job."""


class NameTooLong(EnvironmentRefused):
    def __init__(self, length: int) -> None:
        super().__init__(f"the environment's name has {length} characters; GitLab allows at most {MAX_NAME_LENGTH}")


class SlugTaken(EnvironmentRefused):
    """``name``'s slug belongs to ``owner``, another environment of the same project."""

    def __init__(self, name: str, slug: str, owner: str) -> None:
        super().__init__(f"environment {name!r} has the slug {slug!r} of environment {owner!r} of this project, "
                         "which kasd saw first (an environment's slug names its group, labels and namespace, and is "
                         "unique in its project, as in GitLab); give this environment another name")
        self.name, self.slug, self.owner = name, slug, owner


class MemorySlugs:
    """Claims in this process only (no store: tests, a kasd embedded without one)."""

    def __init__(self, max_entries: int = MAX_ENVIRONMENTS) -> None:
        self.max_entries = max_entries
        self._owners: dict[tuple[int, str], str] = {}

    async def claim_environment(self, project_id: int, slug: str, name: str) -> str:
        owner = self._owners.get((project_id, slug))
        if owner is None:
            if len(self._owners) >= self.max_entries:
                raise StoreError(too_many(self.max_entries))
            owner = self._owners[(project_id, slug)] = name
        return owner


def too_many(max_entries: int) -> str:
    return (f"kasd records at most {max_entries} environments (their slugs) and holds that many; a new "
            "environment cannot be checked")


class EnvironmentSlugs:
    """``claim(project_id, name)`` passes when ``name`` owns its slug in the project (the first to
    ask does); ``SlugTaken`` otherwise (``NameTooLong`` for a name GitLab would not take either),
    ``StoreError`` when the store cannot say."""

    def __init__(self, store: SlugStore | None = None) -> None:
        self.store: SlugStore = store if store is not None else MemorySlugs()
        self._known: dict[tuple[int, str], str] = {}

    async def claim(self, project_id: int, name: str) -> str:
        """``name``'s slug, once it is known to be ``name``'s own."""
        if len(name) > MAX_NAME_LENGTH:
            raise NameTooLong(len(name))
        slug = environment_slug(name)
        key = (project_id, slug)
        owner = self._known.get(key)
        if owner is None:
            owner = await self.store.claim_environment(project_id, slug, name)
            if len(self._known) >= REMEMBERED:
                del self._known[next(iter(self._known))]  # the oldest
            self._known[key] = owner
        if owner != name:
            raise SlugTaken(name, slug, owner)
        return slug


__all__ = ["MAX_ENVIRONMENTS", "MAX_NAME_LENGTH", "EnvironmentRefused", "EnvironmentSlugs", "MemorySlugs", "NameTooLong",
           "SlugStore", "SlugTaken"]
