"""``kasctl promql``: a PromQL query of an in-cluster Prometheus, through kasd and the agent's
tunnel (``GET /api/kasd/v1/agents/<id>/promql``, docs/services.md): an instant query, or a range
query with ``--start --end --step``, printed as a table (one row per series; a range query's points
under each series) or as Prometheus's JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import urlencode

from kasctl.envstatus import TOKEN_VARIABLE, rest_token
from kasctl.kubeconfig import API_VARIABLE, CA_VARIABLE, api_url, read_ca
from kasctl.kubeconfig import TOKEN_VARIABLE as JOB_TOKEN_VARIABLE
from kasctl.restclient import RestError, rest_answer, shown

#: bytes of an answer kasctl reads at most (a range query of many series and points)
MAX_ANSWER = 64 * 1024 * 1024

HELP = f"""\
Ask an in-cluster Prometheus a PromQL query through kasd and the agent's tunnel (kasd's
GET /api/kasd/v1/agents/<id>/promql, which forwards to the service's /api/v1/query or
/api/v1/query_range). The agent's config.yaml must list you under services: (docs/services.md),
and agentd's own services: list must allow the service's /api/v1/ paths.

  export {TOKEN_VARIABLE}="$(kasctl token pat ...)"     # or --token-file FILE; in CI, ${JOB_TOKEN_VARIABLE}
  export {API_VARIABLE}=https://kasd.example:8153
  kasctl promql --agent 1 'up'
  kasctl promql --agent 1 --time 2026-11-27T19:00:00Z 'sum by (job) (up)'
  kasctl promql --agent 1 --start=-1h --end now --step 1m 'rate(kasd_requests_total[5m])'
  kasctl promql --agent 1 --service thanos --output json 'up'

Times: RFC 3339, seconds since the epoch, "now", or now minus a duration ("-1h", "-90s"); the
step a duration (15s, 1m) or seconds (write --start=-1h: a value starting with "-" needs the "="). Table: one row per series (its labels and value); a range
query prints each series' points under it. Exit status: 0 with an answer, 1 when Prometheus, kasd
or agentd refuse (their message printed), 2 for a wrong command line.
"""


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = commands.add_parser("promql", help="a PromQL query of an in-cluster Prometheus, through the tunnel",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    cmd.add_argument("query", metavar="QUERY", help="the PromQL expression")
    cmd.add_argument("--agent", metavar="ID", required=True, type=_agent_id, help="the agent's id")
    cmd.add_argument("--service", metavar="NAME", default="prometheus",
                     help="the service's name in the agent's services: (default prometheus)")
    cmd.add_argument("--time", metavar="T", help="an instant query's time (default: now, Prometheus's)")
    cmd.add_argument("--start", metavar="S", help="a range query's start (with --end and --step)")
    cmd.add_argument("--end", metavar="E", help="a range query's end")
    cmd.add_argument("--step", metavar="STEP", help="a range query's resolution: 15s, 1m, or seconds")
    cmd.add_argument("-o", "--output", choices=("table", "json"), default="table", help="table (default) or json")
    cmd.add_argument("--token-file", metavar="FILE",
                     help=f"file holding your personal token (default ${TOKEN_VARIABLE}, else ${JOB_TOKEN_VARIABLE})")
    cmd.add_argument("--api-url", metavar="URL", help=f"kasd's REST API (default ${API_VARIABLE})")
    cmd.add_argument("--certificate-authority", metavar="FILE",
                     help=f"CA (PEM) of kasd's certificate (default ${CA_VARIABLE}; else the system's)")
    cmd.set_defaults(run=run)


def _agent_id(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < len(text) <= 19 and int(text) > 0):
        raise argparse.ArgumentTypeError(f"must be an agent id (a positive whole number), got {text[:20]!r}")
    return int(text)


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def seconds(text: str) -> float:
    """A duration (``90s``, ``5m``, ``1h``, ``1d``) or plain seconds; ``ValueError`` otherwise."""
    for unit in sorted(_UNITS, key=len, reverse=True):
        if text.endswith(unit) and text[:-len(unit)]:
            return float(text[:-len(unit)]) * _UNITS[unit]
    return float(text)


def timestamp(text: str, now: float) -> str:
    """A time for Prometheus (seconds since the epoch, as text): RFC 3339, seconds, ``now`` or ``-<duration>``."""
    try:
        if text == "now":
            return f"{now:.3f}"
        if text.startswith("-"):
            return f"{now - seconds(text[1:]):.3f}"
        try:
            return f"{float(text):.3f}"
        except ValueError:
            return f"{datetime.fromisoformat(text.replace('Z', '+00:00')).timestamp():.3f}"
    except ValueError:
        raise RestError(f"not a time (RFC 3339, seconds since the epoch, now, or -1h): {text[:40]!r}", 2) from None


def call_path(args: argparse.Namespace, now: float) -> str:
    """The REST path (and query) of this command line; ``RestError`` (2) for a wrong one."""
    ranged = [args.start, args.end, args.step]
    params: dict[str, str] = {"query": args.query}
    if any(v is not None for v in ranged):
        if not all(v is not None for v in ranged):
            raise RestError("a range query needs --start, --end and --step", 2)
        if args.time is not None:
            raise RestError("--time is for an instant query; a range query takes --start, --end and --step", 2)
        try:
            step = seconds(args.step)
        except ValueError:
            raise RestError(f"--step is not a duration (15s, 1m) or seconds: {args.step[:40]!r}", 2) from None
        if step <= 0:
            raise RestError("--step must be more than 0", 2)
        params.update(start=timestamp(args.start, now), end=timestamp(args.end, now), step=f"{step:g}")
    elif args.time is not None:
        params["time"] = timestamp(args.time, now)
    if args.service != "prometheus":
        params["service"] = args.service
    return f"/api/kasd/v1/agents/{args.agent}/promql?{urlencode(params)}"


def error_of(status: int, body: bytes) -> str:
    """What went wrong, in the words of whoever said it: Prometheus (``error``), kasd (``message``)
    or agentd (a ``Status``'s ``message``)."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if isinstance(answer, dict):
        if answer.get("status") == "error" and answer.get("error"):
            kind = f" ({answer['errorType']})" if answer.get("errorType") else ""
            return shown(f"Prometheus refused the query{kind}: {str(answer['error'])[:1000]}")
        if answer.get("message"):
            said = shown(str(answer["message"])[:1000])
            return f"refused: {said}" if said.startswith(f"{status} ") else f"refused ({status}): {said}"
    return f"refused ({status}): {shown(body[:200].decode('utf-8', 'replace')) or 'no answer'}"


def _labels(metric: Mapping[str, str]) -> str:
    name = metric.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return shown(f"{name}{{{rest}}}" if rest or not name else name)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def table(data: Mapping[str, Any]) -> list[str]:
    """Prometheus's ``data`` as lines: a vector one row per series (labels, value), a matrix each
    series then its points (time, value), a scalar or string its value."""
    kind, result = data.get("resultType"), data.get("result")
    if kind == "vector":
        rows = [(_labels(s.get("metric", {})), shown(s["value"][1])) for s in result or ()]
        if not rows:
            return ["(no series)"]
        width = max(len("SERIES"), *(len(r[0]) for r in rows))
        return [f"{'SERIES':<{width}}  VALUE", *(f"{labels:<{width}}  {value}" for labels, value in rows)]
    if kind == "matrix":
        lines: list[str] = []
        for series in result or ():
            lines.append(_labels(series.get("metric", {})))
            lines.extend(f"  {_when(float(ts))}  {shown(value)}" for ts, value in series.get("values", ()))
        return lines or ["(no series)"]
    if kind in ("scalar", "string") and isinstance(result, list) and len(result) == 2:
        return [f"{_when(float(result[0]))}  {shown(result[1])}"]
    return [json.dumps(data)]


def run(args: argparse.Namespace, out: TextIO = sys.stdout, environ: Mapping[str, str] | None = None,
        now: float | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        path = call_path(args, now if now is not None else datetime.now(UTC).timestamp())
        header, token = rest_token(args.token_file, environ, job=True)
        api = api_url(args, dict(environ))
        status, body = rest_answer(api, path, token, read_ca(args.certificate_authority or environ.get(CA_VARIABLE)),
                                   token_header=header, max_bytes=MAX_ANSWER)
        if status != 200:
            raise RestError(error_of(status, body))
        try:
            answer = json.loads(body)
            data = answer["data"]
        except (ValueError, KeyError, TypeError):
            raise RestError("the service's answer is not Prometheus's JSON (is --service a Prometheus?)") from None
    except RestError as exc:
        print(f"kasctl promql: {exc}", file=sys.stderr)
        return exc.code
    if args.output == "json":
        print(json.dumps(answer, indent=2), file=out)
    else:
        print("\n".join(table(data)), file=out)
    return 0


__all__ = ["add_command", "call_path", "error_of", "run", "table"]
