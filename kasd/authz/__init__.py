"""Authorization of CI jobs and users in kasd: who a ``ci:``/``pat:`` bearer token says its holder
is (signed job and personal tokens, the keys that sign and verify them) and what GitLab's
``ci_access``/``user_access`` rules let that identity do with an agent.

May import: the standard library, attrs, the JOSE library (joserfc, with cryptography beneath it).
Never trio, the Kubernetes API proxy, a front end or a listener: the pipeline asks, this package answers.
"""
