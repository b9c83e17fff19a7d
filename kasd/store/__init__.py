"""What must outlive a kasd process (docs/kasd.md, "The store"): the jobs that are finished, whose
tokens kasd refuses until the last of them would have expired anyway; and which environment owns each
slug of a project (``environments``: the first name seen, as GitLab's database keeps slugs unique);
and the objects kasd made on the clusters (``made``: their UIDs), on which alone its marks are trusted;
and each environment's agents, namespaces and deployment history (``deployments``: the records, and
the ``DeploymentRecorder`` the proxy's pipeline tells of each CI job's requests).

``protocol`` is the seam (``Store``); ``finished`` the pure core (``FinishedJobs``: job id → until, in
memory, bounded; what every job token is checked against, a dict lookup); ``sqlite`` a lone kasd's
store (a file, stdlib sqlite3 off the event loop) and ``redis`` the replicas' (one sorted set, a
PUBLISH per change so every replica learns within a second); ``revocation`` the thin shell the REST
API calls and ``serve_kasd`` opens.

May import: ``kasd.config`` (the settings), ``kasd.authz.slugs`` (pure), ``routing.redisconn`` (how kasd talks to Redis), coredis,
trio, attrs, the standard library. Never the proxy, a front end or a listener.
"""
