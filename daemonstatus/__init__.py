"""How a daemon (kasd, agentd) tells whoever supervises it where it stands.

systemd's ``sd_notify`` protocol (``READY=1``, ``STATUS=…``, ``STOPPING=1``) and a JSON ready file
that tests and scripts wait for; the log format both share (``logs``) and the one-line report of an
error that ends one (``fatal``). Standard library only; imported by kasd and agentd, imports neither.
"""
