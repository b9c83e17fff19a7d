"""Authorization of CI jobs and users in kasd, without network I/O: the pieces an Authority is built from.

Who a ``ci:``/``pat:`` bearer token says its holder is: ``keys`` (Ed25519 signing and verification
keys, by ``kid``) and ``jobtokens`` (signed, expiring job and personal tokens). Whom kasd knows:
``directory`` (groups, projects, users and their roles, agents). What an agent's GitLab
``config.yaml`` allows (``agentconfig``: ``ci_access``, ``user_access``) and the decision over both
(``policy``: a job or a user → an allowed or denied ``Decision`` with its impersonation identity),
and the answer an Authority gives (``verdict``: a ``Grant`` or an ``AccessDenied``, which ``kasd.seams``
re-exports; ``snapshot`` makes them).
The ``rules:`` list on each entry (proposed upstream, never shipped): ``regex`` (RE2, which ``=~``
uses as GitLab does, matched in linear time), ``expr`` (the ``rules:if`` language: parse once at config load,
evaluate per request), ``expand`` (``$VAR`` expansion of ``namespace:`` templates and the DNS-1123
label check), ``slugs`` (GitLab's ``CI_ENVIRONMENT_SLUG`` and ``CI_COMMIT_REF_SLUG``), ``civars`` (a
job → its predefined CI variables) and ``rules`` (a compiled rule list and its first-match decision).

Apart from reading key and configuration files, everything here is a pure function of its
arguments: no clock (time is an argument), no sockets, no logging.

May import: ``tunnelhttp.head`` (the impersonation value the proxy sends), ``wire.ids`` (the one id
check), ``daemonkit.yamldoc``
(the one bounded YAML reader, and its words for values that never quote them), the standard library,
attrs, PyYAML, the JOSE library (joserfc, with cryptography beneath it), google-re2 (only in
``regex``). Never trio, never the proxy
(``kasd.k8sproxy``), a front end, a listener or ``routing``, never ``kasd.config`` (the config imports
the directory's checks, not the reverse), never ``kasd.seams`` or ``kasd.store`` (both import this
package): the pipeline asks, this package answers.
"""
