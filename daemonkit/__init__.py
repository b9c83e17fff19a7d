"""What a daemon (kasd, agentd) needs around its own work, written once for both:

- ``settings``: each setting declared once as an attrs field; one loader, file < environment < flags,
  whose errors blame the exact key, variable or flag (and the ``--help`` it generates);
- ``signals``: the signal loop (first SIGTERM/SIGINT drains, a second stops, SIGHUP is ignored);
- ``health``: the small HTTP server of the health/observability ports, routes supplied by the daemon;
- ``notify``: telling its supervisor where it stands (systemd's ``sd_notify`` and a JSON ready file
  that tests and scripts wait for);
- ``completion``: ``PROG completion bash|zsh|fish|tcsh``, the shell completion script of kasd,
  agentd and kasctl, written by shtab from their argparse parsers;
- ``logs``: the log format both share (``logfmt``: how a value is quoted in it); ``fatal``: the
  one-line report of an error that ends one.

May import: the standard library, trio, attrs, cattrs, PyYAML, h11, shtab and ``netio`` (the
connection caps of the health port). Imported by kasd and agentd (and ``completion`` by kasctl);
imports none of them.
"""
