"""``kasd``: serve (the default) or ``kasd hash-token``. Exit 2 on a configuration error."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence

import trio

from daemonstatus.logs import configure_logging
from kasd.config import Config, ConfigError, load_config
from kasd.server import Runtime, serve_kasd
from kasd.tokens import hash_token

log = logging.getLogger("kasd")


def hash_token_command(argv: Sequence[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(
            "usage: kasd hash-token < token-file\n\n"
            "Reads one token on stdin (a trailing newline is ignored) and prints its sha256 hex digest,\n"
            "the value for token_sha256: under agents: or access: in kasd's config. For ci:/pat: proxy\n"
            "tokens hash only the secret part, not the 'ci:<agent id>:' prefix."
        )
        return 0
    if argv:
        print("kasd hash-token: takes no arguments; pipe the token on stdin", file=sys.stderr)
        return 2
    token = sys.stdin.read()
    token = token[:-1] if token.endswith("\n") else token
    token = token[:-1] if token.endswith("\r") else token
    if not token:
        print("kasd hash-token: no token on stdin", file=sys.stderr)
        return 2
    print(hash_token(token))
    return 0


async def _serve(config: Config) -> None:
    """serve_kasd until SIGTERM/SIGINT; a second signal skips the rest of the drain."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            watching = trio.CancelScope()

            async def serve(task_status: trio.TaskStatus[Runtime] = trio.TASK_STATUS_IGNORED) -> None:
                try:
                    await serve_kasd(config, task_status=task_status)
                finally:
                    watching.cancel()

            runtime: Runtime = await nursery.start(serve)
            with watching:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if not runtime.shutdown_requested:
                        log.info("signal received signal=%s: shutting down gracefully", name)
                        runtime.request_shutdown()
                    else:
                        log.warning("second signal received signal=%s: stopping now", name)
                        nursery.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "hash-token":
        return hash_token_command(args[1:])
    if args and args[0] == "serve":
        args = args[1:]
    try:
        config = load_config(args, os.environ)
    except ConfigError as exc:
        print(f"kasd: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level)
    code = 0
    try:
        trio.run(_serve, config)
    except* ConfigError as group:
        for err in group.exceptions:
            print(f"kasd: configuration error: {err}", file=sys.stderr)
        code = 2
    except* OSError as group:
        for oserr in group.exceptions:
            print(f"kasd: {getattr(oserr, 'strerror', None) or oserr}", file=sys.stderr)
        code = code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
