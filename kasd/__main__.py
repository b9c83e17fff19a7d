"""``kasd``: serve (the default) or ``kasd hash-token``. Exit 2 on a configuration error, 1 when a
listener cannot bind; one line on stderr either way, never a traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import trio

from daemonkit import completion
from daemonkit.fatal import leaves, os_error_line
from daemonkit.logs import configure_logging
from daemonkit.settings import UsageError
from daemonkit.signals import run_until_signalled
from kasd.config import VERSION, Config, ConfigError, argument_parser, load_config_file
from kasd.seams import AccessDenied, parse_bearer
from kasd.server import Runtime, serve_kasd
from kasd.tokens import hash_token, token_from_text

log = logging.getLogger("kasd")


def hash_token_command(argv: Sequence[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(
            "usage: kasd hash-token < token-file\n\n"
            "Reads one agent token on stdin and prints its sha256 hex digest, the value for\n"
            "token_sha256: under agents: in kasd's config. Surrounding whitespace (newlines, blank\n"
            "lines) is ignored, as agentd ignores it in its --token-file, so an agent's token file can\n"
            "be piped as it is. CI job (ci:) and personal (pat:) tokens are signed, never stored: mint\n"
            "them with 'kasctl token ci|pat' (a whole ci:/pat: token on stdin gets a warning)."
        )
        return 0
    if argv:
        print("kasd hash-token: takes no arguments; pipe the token on stdin", file=sys.stderr)
        return 2
    token = token_from_text(sys.stdin.read())
    if not token:
        print("kasd hash-token: no token on stdin", file=sys.stderr)
        return 2
    if _is_bearer_token(token):
        kind = token.partition(":")[0]
        print(
            f"kasd hash-token: warning: this looks like a whole {kind}:<agent id>:<token> bearer token; "
            f"kasd stores no {kind}: tokens (they are signed: kasctl token {kind}); token_sha256 is for "
            "agent tokens. Hashing it as it is.",
            file=sys.stderr,
        )
    print(hash_token(token))
    return 0


def _is_bearer_token(token: str) -> bool:
    """Would the proxy port read ``token`` as ``ci:<agent id>:<secret>`` or ``pat:…``?"""
    try:
        parse_bearer(f"Bearer {token}")
    except AccessDenied:
        return False
    return True


async def _serve(config: Config, reread: Callable[[], tuple[Config, Path | None]], hangup: list[Callable[[], object]],
                 drain: trio.Event) -> None:
    """serve_kasd until ``drain`` is set (the first SIGTERM/SIGINT), then its graceful drain; SIGHUP
    (``hangup``) reloads the authorization configuration and the TLS files (and ``run_until_signalled`` the log settings)."""
    async with trio.open_nursery() as nursery:
        runtime: Runtime = await nursery.start(partial(serve_kasd, config, reread=reread))

        def reload() -> None:
            runtime.authority.request_reload("SIGHUP")
            runtime.reload_tls()

        hangup.append(reload)
        await drain.wait()
        runtime.request_shutdown()


def command_line() -> argparse.ArgumentParser:
    """kasd's whole command line, for shell completion: the flags, and the commands ``main`` reads first."""
    return completion.whole_command_line(argument_parser, "kasd", {
        "serve": "serve (the default when no command is given)",
        "hash-token": "print the token_sha256 of the agent token on stdin",
    }, with_flags=("serve",))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "hash-token":
        return hash_token_command(args[1:])
    if args and args[0] == "completion":
        return completion.completion_main(command_line, "kasd", args[1:])
    if args and args[0] == "serve":
        args = args[1:]
    try:
        config, _ = load_config_file(args, os.environ)
    except UsageError as exc:  # a wrong command line: argparse's usage and words
        argument_parser().print_usage(sys.stderr)
        print(f"kasd: error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"kasd: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, log_format=config.log_format)
    log.info("kasd starting version=%s", VERSION)
    hangup: list[Callable[[], object]] = []

    def on_hangup() -> None:
        if hangup:
            hangup[0]()

    def reread() -> tuple[Config, Path | None]:
        return load_config_file(args, os.environ)

    def log_settings() -> tuple[str, str]:
        again, _ = reread()
        return again.log_level, again.log_format

    code = 0
    try:
        trio.run(partial(run_until_signalled, partial(_serve, config, reread, hangup), log=log, on_hangup=on_hangup,
                         log_settings=log_settings))
    except* ConfigError as group:
        for err in leaves(group):
            print(f"kasd: configuration error: {err}", file=sys.stderr)
        code = 2
    except* OSError as group:
        for oserr in leaves(group):
            print(f"kasd: {os_error_line(oserr)}", file=sys.stderr)
        code = code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
