"""CI and user authorization for kasd, without I/O: the pieces an Authority is built from.

GitLab's agent ``config.yaml`` grants CI jobs access through ``ci_access`` project and group entries;
kasd adds a ``rules:`` list to each entry (proposed upstream, never shipped). This package holds the
sans-I/O parts of that: ``regex`` (the RE2 subset ``=~`` uses, matched in linear time), ``expr`` (the
``rules:if`` expression language: parse once at config load, evaluate per request), ``expand``
(``$VAR`` expansion of ``namespace:`` templates and the DNS-1123 label check), ``slugs`` (GitLab's
``CI_ENVIRONMENT_SLUG`` and ``CI_COMMIT_REF_SLUG``), ``civars`` (a job's identity → its predefined CI
variables) and ``rules`` (a compiled rule list and its first-match decision).

Everything here is a pure function of its arguments: no clock, no sockets, no files, no logging.

May import: the standard library and attrs. Never trio, never the proxy (``kasd.k8sproxy``), never
``kasd.config`` (the loader builds on this package, not the other way round).
"""
