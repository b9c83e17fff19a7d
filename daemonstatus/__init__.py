"""How a daemon (kasd, agentd) tells whoever supervises it where it stands.

systemd's ``sd_notify`` protocol (``READY=1``, ``STATUS=…``, ``STOPPING=1``) and a JSON ready file
that tests and scripts wait for. Standard library only; imported by kasd and agentd, imports neither.
"""
