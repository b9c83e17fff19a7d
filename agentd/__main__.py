"""``agentd`` (or ``python -m agentd``): run the agent until SIGTERM/SIGINT, then drain and exit 0
(a second signal stops at once; SIGHUP reads the configuration again and applies its log_level and
log_format, and reads the TLS files again if they changed: kas_ca_file, the receptive listener's and
the health address's certificate, key and CA; nothing else).

Bad configuration prints ``agentd: error: …`` and exits 2 (a wrong command line, such as an unknown
flag, with the usage first, like argparse). A health port that cannot be bound prints ``agentd:
cannot listen on …`` and exits 1. See ``agentd --help`` and docs/agentd.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys
from collections.abc import Mapping, Sequence
from functools import partial

import trio

from agentd.agent import kas_ssl_context, kube_target_for, run_agent
from agentd.config import AgentdConfig, ConfigError, UsageError, build_parser, load_config
from agentd.kubeapi import KubeConfigError, KubeTarget
from daemonkit import completion
from daemonkit.fatal import leaves, os_error_line
from daemonkit.logs import configure_logging
from daemonkit.signals import run_until_signalled
from netio.tlsreload import TLSLoadError, reload_all

log = logging.getLogger("agentd")


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "completion":
        return completion.completion_main(command_line, "agentd", argv[1:])
    environ = os.environ if environ is None else environ
    try:
        config = load_config(argv, environ)
        target = kube_target_for(config)
    except (ConfigError, KubeConfigError) as exc:
        if isinstance(exc, UsageError):
            build_parser().print_usage(sys.stderr)
        print(f"agentd: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, log_format=config.log_format)

    def log_settings() -> tuple[str, str]:
        again = load_config(argv, environ)
        return again.log_level, again.log_format

    try:
        kas_tls = kas_ssl_context(config)  # (kas_ca_file read again on SIGHUP too)
    except TLSLoadError as exc:
        print(f"agentd: error: kas_ca_file: {exc}", file=sys.stderr)
        return 2
    # every TLS context agentd builds (run_agent adds the receptive listener's and the health address's)
    reloadable: list[ssl.SSLContext | None] = [kas_tls]
    code = 0
    try:
        trio.run(partial(run_until_signalled, partial(_run, config, target, kas_tls, reloadable), log=log,
                         log_settings=log_settings, on_hangup=lambda: reload_all(reloadable)))
    except* OSError as group:
        for oserr in leaves(group):
            print(f"agentd: {os_error_line(oserr)}", file=sys.stderr)
        code = 1
    return code


def command_line() -> argparse.ArgumentParser:
    """agentd's whole command line, for shell completion: its flags, and ``completion``."""
    return completion.whole_command_line(build_parser, "agentd", {})


async def _run(config: AgentdConfig, target: KubeTarget, kas_tls: ssl.SSLContext | None,
               reloadable: list[ssl.SSLContext | None], drain: trio.Event) -> None:
    await run_agent(config, kube_target=target, stop_event=drain, kas_tls=kas_tls, reloadable=reloadable)


if __name__ == "__main__":
    sys.exit(main())
