"""kasd's authorization model, as GitLab's agent for Kubernetes has it: who may use which agent, and
as whom. It holds the identities kasd knows (``directory``: groups, projects, users and their roles,
agents), each agent's ``config.yaml`` (``agentconfig``: ``ci_access``, ``user_access``), and the
decision over both (``policy``: pure functions from a job or a user to an allowed or denied
``Decision`` with its impersonation identity). Nothing here does I/O beyond reading the agent
configuration files, and nothing here knows about trio, sockets or the proxy.

May import: ``tunnelhttp.head`` (the impersonation value the proxy sends), the standard library,
attrs, yaml. Never ``kasd.config`` (the config imports the directory's checks, not the reverse), the
proxy, a listener or ``routing``.
"""
