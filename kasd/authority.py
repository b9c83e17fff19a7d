"""kasd's ``Authority`` (``kasd.seams``): signed CI job and personal tokens, checked against the
directory in kasd's config and each agent's GitLab ``config.yaml`` (``ci_access``, ``user_access``,
``rules:``).

The decision itself is ``kasd.authz.snapshot`` (pure); this module keeps the snapshot in force,
replaces it on reload, and remembers recent grants:

- ``reload()`` builds a whole new snapshot from the files, in a worker thread (the event loop goes
  on answering readiness, requests and signals) and within ``LOAD_TIME_LIMIT`` (every YAML document
  within one budget, ``daemonkit.yamldoc``); if any file cannot be used, or the load takes too long,
  the previous snapshot stays in force, the failure is logged (file, line, column, problem) and
  counted (``kasd_authz_reloads{result="failed"}``, ``kasd_authz_config_ok 0``). Tunnels and
  requests in flight are never touched: a request is authorized once, at its start.
- ``watch()`` reloads when one of the files changes (kasd's config, the agents' config.yaml files,
  the verification keys; polled once a second: stat calls, no reading), and when
  ``request_reload()`` asks (SIGHUP): one reload at a time.
- A client sends the same token with every request, so the grants of the last ``GRANT_CACHE_SIZE``
  (token, agent) pairs are remembered until the token expires or the snapshot is replaced.
  Refusals are not: every bad token costs a full check.
"""

from __future__ import annotations

import itertools
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import attrs
import trio

from daemonkit import yamldoc
from kasd.authz.agentconfig import AgentConfig, AgentConfigError, agent_config_path
from kasd.authz.directory import DirectoryError
from kasd.authz.gitsource import GitConfigError, GitSource, ProjectCommit
from kasd.authz.keys import KeyFileError, KeySet
from kasd.authz.snapshot import (
    CompiledAgent,
    Snapshot,
    TokenChecks,
    load_agents,
    load_agents_from_git,
)
from kasd.authz.templates import TemplateError, templates_dir
from kasd.config import AgentEntry, Config, ConfigError, directory_of
from kasd.metrics import Metrics
from kasd.seams import AccessDenied, Credentials, Grant
from kasd.store.environments import EnvironmentRefused, EnvironmentSlugs
from kasd.store.finished import FinishedJobs
from kasd.store.protocol import StoreError
from netio.fastio import cancel_point

log = logging.getLogger("kasd.authority")

#: how many (token, agent) grants are remembered
GRANT_CACHE_SIZE = 1024
#: how often ``watch`` looks at the files' metadata
WATCH_INTERVAL = 1.0
#: seconds one load of the configuration may take: past it the reload fails (the reading thread
#: stops at its next YAML node; the event loop stops waiting for it a moment later in any case)
LOAD_TIME_LIMIT = 10.0
#: entries of a watched directory looked at each time (one symlinked elsewhere costs no more)
MAX_WATCHED_ENTRIES = 1024
#: how much longer than ``LOAD_TIME_LIMIT`` the event loop waits for the thread before abandoning it
LOAD_GRACE = 1.0


class LoadError(ConfigError):
    """The files do not make a configuration; ``str()`` names the file (and where) and the problem."""


@attrs.frozen(kw_only=True)
class LoadedAuthorization:
    """What one load of the authorization files gives (``daemonkit.settings.Loaded`` is one settings
    file's value and where each key came from; this is the decision's snapshot and the files to watch)."""

    snapshot: Snapshot
    #: the agents of kasd's config (with their tunnel token hashes) as read with it
    agents: tuple[AgentEntry, ...] = ()
    #: every file the snapshot was read from (kasd's config, config.yaml files, key files): ``watch``
    #: reloads when one of them changes, appears or goes away
    files: tuple[Path, ...] = ()
    #: read from Git (``authorization.config_git``): where, how often to look, and the commits read
    git: GitState | None = None


@attrs.frozen(kw_only=True)
class GitState:
    source: GitSource
    poll_interval: float
    #: the commit of each config project the snapshot was read from
    commits: tuple[ProjectCommit, ...] = ()

    def heads(self) -> dict[str, str | None]:
        """What each config project's ref names now (blocking: reads refs)."""
        return self.source.heads([c.project for c in self.commits])

    def read(self) -> dict[str, str | None]:
        return {c.project: c.commit for c in self.commits}


def load_authorization(config: Config, config_file: Path | None) -> LoadedAuthorization:
    """The snapshot ``config`` (read from ``config_file``) and the agents' files make; ``LoadError``."""
    settings = config.authorization
    files: list[Path] = [config_file] if config_file is not None else []
    try:
        directory = directory_of(config)
        tokens = settings.tokens
        files += tokens.public_keys
        keyset = KeySet.from_pem_files(tokens.public_keys) if tokens.public_keys else None
        git: GitState | None = None
        if settings.config_git.enabled:
            if settings.config_root is None:
                raise LoadError("authorization.config_git.enabled: needs authorization.config_root (where the "
                                "repositories are)")
            source = GitSource(root=settings.config_root, ref=settings.config_git.ref)
            agents, warnings, commits = load_agents_from_git(directory, source)
            git = GitState(source=source, poll_interval=settings.config_git.poll_interval, commits=tuple(commits))
        elif settings.config_root is not None:
            agents, warnings = load_agents(directory, settings.config_root)
            for a in directory.agents:
                config_file = agent_config_path(settings.config_root, a.config_project, a.name)
                templates = templates_dir(config_file)
                # the directory too: a template added or removed changes its stamp
                files += [config_file, templates, *(Path(t.source) for t in agents[a.id].templates.values())]
        else:  # GitLab's default for every agent: only its config project's jobs, as the agent
            agents = {a.id: CompiledAgent(config=AgentConfig(source="(no authorization.config_root)"))
                      for a in directory.agents}
            warnings = []
    except (AgentConfigError, TemplateError, KeyFileError, DirectoryError, GitConfigError) as exc:
        raise LoadError(str(exc)) from None
    snapshot = Snapshot(
        directory=directory,
        tokens=TokenChecks(keyset=keyset, audience=tokens.audience, issuer=tokens.issuer,
                             leeway=timedelta(seconds=tokens.leeway), revoked=tokens.revoked,
                             max_job_lifetime=timedelta(seconds=tokens.max_job_token_lifetime)),
        agents=agents, warnings=tuple(warnings),
    )
    return LoadedAuthorization(snapshot=snapshot, agents=config.agents, files=tuple(files), git=git)


#: what a reload does not apply (read at start only): named in a warning when the file changed them
#: (log_level and log_format: SIGHUP applies them, see daemonkit.signals)
RESTART_ONLY = ("listeners", "routing", "agent_wait_timeout", "shutdown_timeout")


def restart_only_changes(running: Config, read: Config) -> list[str]:
    """The settings ``read`` changes that only a restart applies."""
    return [name for name in RESTART_ONLY if getattr(running, name) != getattr(read, name)]


def config_loader(read: Callable[[], tuple[Config, Path | None]], running: Config | None = None) -> Callable[[], LoadedAuthorization]:
    """A ``load`` for ``CiAuthority`` that reads kasd's configuration again each time; with
    ``running`` (the configuration kasd started with), a reload that finds other settings changed
    says they wait for a restart."""
    def load() -> LoadedAuthorization:
        try:
            config, path = read()
        except ConfigError as exc:
            raise LoadError(str(exc)) from None
        loaded = load_authorization(config, path)
        changed = restart_only_changes(running, config) if running is not None else []
        if changed:
            log.warning("configuration reload: %s changed; only a restart applies them (the authorization "
                        "part is reloaded)", ", ".join(changed))
        return loaded
    return load


def _load_within_limit(load: Callable[[], LoadedAuthorization]) -> tuple[LoadedAuthorization, dict[Path, Stamp]]:
    """``load()`` under the YAML time limit, and the stamps of the files it read (blocking)."""
    with yamldoc.time_limit(LOAD_TIME_LIMIT):
        loaded = load()
    return loaded, _stamps(loaded.files)


async def _load_off_loop(load: Callable[[], LoadedAuthorization]) -> tuple[LoadedAuthorization, dict[Path, Stamp]]:
    """``_load_within_limit`` in a worker thread; ``LoadError`` when it takes too long (the thread is
    left to stop at its next YAML node, its result unused). Cancellable at once."""
    with trio.move_on_after(LOAD_TIME_LIMIT + LOAD_GRACE):
        return await trio.to_thread.run_sync(_load_within_limit, load, abandon_on_cancel=True)
    raise LoadError(f"reading the configuration took longer than {LOAD_TIME_LIMIT:g} s")


class CiAuthority:
    """Authorizes ``ci:`` and ``pat:`` tokens; ``load()`` gives the current files' snapshot or raises
    ``LoadError``. The first load happens in the constructor, or, given as ``loaded``, in ``open()``
    off the event loop (kasd does not start on a bad file)."""

    def __init__(self, load: Callable[[], LoadedAuthorization], metrics: Metrics | None = None, *,
                 clock: Callable[[], float] = time.time, loaded: tuple[LoadedAuthorization, dict[Path, Stamp]] | None = None,
                 finished: FinishedJobs | None = None, environments: EnvironmentSlugs | None = None) -> None:
        # ``finished``: the jobs kasd's store says are over; every snapshot checks job tokens
        # against it, and a change forgets the remembered grants (one of them may be that job's)
        self.finished = finished if finished is not None else FinishedJobs()
        # which environment owns each slug of a project (``serve_kasd`` passes kasd's store's): a job
        # whose environment's slug is another's is refused before anything hangs on that slug
        self.environments = environments if environments is not None else EnvironmentSlugs()
        self._load: Callable[[], LoadedAuthorization] = lambda: _checking_finished(load(), self.finished)
        self._clock = clock
        self._metrics = metrics
        self._granted: dict[tuple[str, str, int], tuple[Grant, int]] = {}
        self._granted_at = self.finished.version
        if loaded is not None:
            self.loaded, self._stamps = _checking_finished(loaded[0], self.finished), loaded[1]
        else:
            self.loaded, self._stamps = _load_within_limit(self._load)
        self._log_warnings(self.loaded)
        #: what each config project's ref named at the last look (a bad commit is reported once)
        self._heads: dict[str, str | None] = {}
        self._last_poll = trio.current_time() if _in_trio() else 0.0
        #: when each (config project, commit) in force was first put in force
        self._since: dict[tuple[str, str], float] = {}
        self._note_commits()
        #: refresh requests (``refresh``): one look at a time, the callers of one round share it
        self._refresh_wanted = False
        self._next_round = trio.Event()
        self.generation = 1
        self._reloaded = trio.Event()
        self._reloading = trio.Lock()
        self._wake = trio.Event()
        self._requested: str | None = None
        if metrics is not None:
            metrics.authz_config_ok.set(1)
            metrics.authz_reloads.labels(result="ok").inc(0)
            metrics.authz_reloads.labels(result="failed").inc(0)

    @classmethod
    async def open(cls, load: Callable[[], LoadedAuthorization], metrics: Metrics | None = None, *,
                   clock: Callable[[], float] = time.time, finished: FinishedJobs | None = None,
                   environments: EnvironmentSlugs | None = None) -> CiAuthority:
        """The authority, its first load read off the event loop (signals are answered meanwhile)."""
        return cls(load, metrics, clock=clock, loaded=await _load_off_loop(load), finished=finished,
                   environments=environments)

    @property
    def snapshot(self) -> Snapshot:
        return self.loaded.snapshot

    async def authorize(self, credentials: Credentials, agent_id: int) -> Grant:
        # A cancel point that yields only every so often (netio.fastio's rule): a full yield here
        # was one more trip through the scheduler for every request, for a grant that is cached.
        await cancel_point()
        now = self._clock()
        key = (credentials.kind, credentials.secret, agent_id)
        if self._granted_at != self.finished.version:
            self._granted, self._granted_at = {}, self.finished.version
        cached = self._granted.get(key)
        if cached is not None and cached[1] > now:
            return cached[0]
        grant = self.snapshot.authorize(credentials.kind, credentials.secret, agent_id, now=now)
        await self._check_slug(grant)
        assert grant.expires_at is not None  # (the snapshot's grants say until when)
        granted = self._granted
        if len(granted) >= GRANT_CACHE_SIZE:
            del granted[next(iter(granted))]  # the oldest
        granted[key] = (grant, grant.expires_at)
        return grant

    async def _check_slug(self, grant: Grant) -> None:
        """The job's environment owns its slug in its project (``kasd.store.environments``)."""
        job, name = grant.job, grant.environment
        if grant.kind != "ci" or job is None or name is None:
            return
        project = self.snapshot.directory.project(job.project)
        if project is None:
            return  # (a grant is only given for a project kasd knows)
        principal = grant.subject
        try:
            await self.environments.claim(project.id, name)
        except EnvironmentRefused as exc:
            raise AccessDenied(403, f"forbidden: {exc}", principal=principal) from None
        except StoreError as exc:
            raise AccessDenied(503, f"cannot check that environment {name!r} owns its slug: {exc}",
                               principal=principal) from None

    async def reload(self, why: str) -> bool:
        """Read every file again, off the event loop and within ``LOAD_TIME_LIMIT``; the new snapshot
        replaces the old only if all of it loads. One reload at a time."""
        async with self._reloading:
            return await self._reload(why)

    async def _reload(self, why: str) -> bool:
        try:
            loaded, stamps = await _load_off_loop(self._load)
        except Exception as exc:  # a LoadError names file and problem; anything else is a kasd bug
            problem = str(exc) if isinstance(exc, LoadError) else f"unexpected {type(exc).__name__}: {exc}"
            log.error("authorization reload failed (%s); the previous configuration stays in force: %s", why, problem,
                      exc_info=not isinstance(exc, LoadError))
            if self._metrics is not None:
                self._metrics.authz_reloads.labels(result="failed").inc()
                self._metrics.authz_config_ok.set(0)
            return False
        self.loaded = loaded
        self._granted = {}
        self._stamps = stamps
        self._note_commits()
        self.generation += 1
        self._reloaded.set()
        self._reloaded = trio.Event()
        self._log_warnings(loaded)
        if self._metrics is not None:
            self._metrics.authz_reloads.labels(result="ok").inc()
            self._metrics.authz_config_ok.set(1)
        log.info("authorization reloaded (%s) agents=%d generation=%d", why, len(loaded.snapshot.agents),
                 self.generation)
        return True

    def _note_commits(self) -> None:
        """Remember when each config project's commit came into force; tell the metrics."""
        git = self.loaded.git
        commits = git.commits if git is not None else ()
        now = self._clock()
        self._since = {(c.project, c.commit): self._since.get((c.project, c.commit), now) for c in commits}
        self._heads = git.read() if git is not None else {}
        if self._metrics is not None:
            self._metrics.set_config_commits([(c.project, c.commit) for c in commits])
            self._metrics.set_config_commits([(c.project, c.commit) for c in commits], at_ref=True)

    def config_state(self) -> dict[str, object]:
        """``GET /api/kasd/v1/config``: the source and each config project's commit in force."""
        git = self.loaded.git
        if git is None:
            return {"source": "files", "projects": []}
        return {"source": "git", "projects": [
            {"project": c.project, "ref": c.ref, "commit": c.commit, "loaded_at": self._since.get((c.project, c.commit))}
            for c in git.commits]}

    async def refresh(self, wait: float = 10.0) -> bool:
        """Look for a new commit (and changed files) now, as ``watch``'s next round, and wait up to
        ``wait`` seconds for that round; every caller while one round is pending shares it (cost
        bounded: at most one look running and one pending, whatever the number of callers). True
        when the round finished in time."""
        done = self._next_round
        self._refresh_wanted = True
        self._wake.set()
        with trio.move_on_after(wait):
            await done.wait()
            return True
        return False

    async def _look(self) -> None:
        """One look at the files' stamps and the Git refs; a reload when something changed."""
        now = await trio.to_thread.run_sync(_stamps, self.loaded.files)
        changed: list[str] = []
        if now != self._stamps:  # (a bad save is reported once: its stamps are kept either way)
            changed = sorted(str(p) for p in set(now) | set(self._stamps) if now.get(p) != self._stamps.get(p))
            self._stamps = now
        git = self.loaded.git
        if git is not None:
            self._last_poll = trio.current_time()
            heads = await trio.to_thread.run_sync(git.heads)
            if heads != self._heads:  # (a bad commit is reported once: its head is kept either way)
                moved = [f"{p} {(self._heads.get(p) or '-')[:12]}→{(c or '-')[:12]}" for p, c in sorted(heads.items())
                         if c != self._heads.get(p)]
                self._heads = heads
                if self._metrics is not None:
                    self._metrics.set_config_commits([(p, c) for p, c in heads.items() if c is not None], at_ref=True)
                changed += [f"new commit: {m}" for m in moved]
        if changed:
            await self.reload("changed: " + ", ".join(changed[:3]) + (" …" if len(changed) > 3 else ""))

    def _log_warnings(self, loaded: LoadedAuthorization) -> None:
        for warning in loaded.snapshot.warnings:
            log.warning("agent configuration: %s", warning)

    async def wait_reloaded(self) -> None:
        """Until the next successful reload."""
        await self._reloaded.wait()

    def request_reload(self, why: str) -> None:
        """Ask ``watch`` to reload now (SIGHUP); it does, off the event loop, one reload at a time."""
        self._requested = why
        self._wake.set()

    async def watch(self, interval: float = WATCH_INTERVAL) -> None:
        """Reload when a file the snapshot came from changes (its size, mtime or inode), or when
        ``request_reload`` asks."""
        while True:
            git = self.loaded.git
            wait = interval if git is None else \
                max(0.0, min(interval, self._last_poll + git.poll_interval - trio.current_time()))
            with trio.move_on_after(wait):
                await self._wake.wait()
            if self._wake.is_set():
                self._wake = trio.Event()
                if self._refresh_wanted:  # (a refresh: one look for every caller since the last)
                    self._refresh_wanted = False
                    done, self._next_round = self._next_round, trio.Event()
                    try:
                        await self._look()
                    finally:
                        done.set()
                if self._requested is not None:
                    why, self._requested = self._requested, None
                    await self.reload(why)
                continue
            git = self.loaded.git
            if git is not None and trio.current_time() - self._last_poll >= git.poll_interval:
                await self._look()  # (the files' stamps too)
                continue
            now = await trio.to_thread.run_sync(_stamps, self.loaded.files)
            if now != self._stamps:  # (a bad save is reported once: its stamps are kept either way)
                changed = sorted(str(p) for p in set(now) | set(self._stamps) if now.get(p) != self._stamps.get(p))
                self._stamps = now
                await self.reload("changed: " + ", ".join(changed[:3]) + (" …" if len(changed) > 3 else ""))


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def _checking_finished(loaded: LoadedAuthorization, finished: FinishedJobs) -> LoadedAuthorization:
    snapshot = loaded.snapshot
    return attrs.evolve(loaded, snapshot=attrs.evolve(snapshot, tokens=attrs.evolve(snapshot.tokens, finished=finished)))


Stamp = tuple[int, int, int] | None


def _stamps(files: Sequence[Path]) -> dict[Path, Stamp]:
    """Each file's (inode, size, mtime); a directory's (inode, its entries' stamps, mtime), so a file
    added to it is noticed, and so is an edit in place of one a failed load never got to list."""
    out: dict[Path, Stamp] = {}
    for path in files:
        try:
            st = os.stat(path)
            if stat.S_ISDIR(st.st_mode):
                entries = []
                with os.scandir(path) as listing:  # (a templates directory is small: a few entries looked at)
                    for entry in sorted(itertools.islice(listing, MAX_WATCHED_ENTRIES), key=lambda e: e.name):
                        est = entry.stat()
                        entries.append((entry.name, est.st_ino, est.st_size, est.st_mtime_ns))
                out[path] = (st.st_ino, hash(tuple(entries)), st.st_mtime_ns)
                continue
        except OSError:
            out[path] = None
        else:
            out[path] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


__all__ = ["GRANT_CACHE_SIZE", "LOAD_TIME_LIMIT", "RESTART_ONLY", "CiAuthority", "LoadError", "LoadedAuthorization", "config_loader",
           "load_authorization", "restart_only_changes"]
