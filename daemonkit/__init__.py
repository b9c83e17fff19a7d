"""What a daemon (kasd, agentd) needs around its own work: telling its supervisor where it stands
(systemd's ``sd_notify``: ``READY=1``, ``STATUS=…``, ``STOPPING=1``, and a JSON ready file that tests
and scripts wait for), the log format both share (``logs``) and the one-line report of an error that
ends one (``fatal``).

May import: the standard library (and trio, attrs where a piece needs them). Imported by kasd and
agentd; imports neither.
"""
