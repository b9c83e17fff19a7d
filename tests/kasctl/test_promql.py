"""``kasctl promql`` without a server: the REST call a command line makes, the table it prints, and
whose words an error is in."""

from __future__ import annotations

import argparse
import json

import pytest

from kasctl import promql
from kasctl.restclient import RestError

pytestmark = pytest.mark.timeout(5)

NOW = 1_800_000_000.0


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    promql.add_command(parser.add_subparsers())
    return parser.parse_args(["promql", *argv])


@pytest.mark.parametrize(("argv", "path"), [
    (("--agent", "1", "up"), "/api/kasd/v1/agents/1/promql?query=up"),
    (("--agent", "2", "--time", "1700000000", "--service", "thanos", "sum(up)"),
     "/api/kasd/v1/agents/2/promql?query=sum%28up%29&time=1700000000.000&service=thanos"),
    (("--agent", "1", "--start=-1h", "--end", "now", "--step", "1m", "up"),
     f"/api/kasd/v1/agents/1/promql?query=up&start={NOW - 3600:.3f}&end={NOW:.3f}&step=60"),
    (("--agent", "1", "--start", "2026-11-27T19:00:00Z", "--end", "2026-11-27T20:00:00Z", "--step", "15", "up"),
     "/api/kasd/v1/agents/1/promql?query=up&start=1795806000.000&end=1795809600.000&step=15"),
])
def test_a_command_line_is_one_promql_call(argv: tuple[str, ...], path: str) -> None:
    assert promql.call_path(_args(*argv), NOW) == path


@pytest.mark.parametrize(("argv", "message"), [
    (("--agent", "1", "--start", "1", "up"), "a range query needs --start, --end and --step"),
    (("--agent", "1", "--start", "1", "--end", "2", "--step", "0", "up"), "--step must be more than 0"),
    (("--agent", "1", "--time", "yesterday", "up"), "not a time"),
])
def test_a_wrong_command_line_says_what_and_exits_2(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(RestError) as caught:
        promql.call_path(_args(*argv), NOW)
    assert message in str(caught.value) and caught.value.code == 2


def test_a_vector_is_one_row_per_series_and_a_matrix_each_series_points() -> None:
    vector = {"resultType": "vector", "result": [
        {"metric": {"__name__": "up", "job": "kasd", "instance": "127.0.0.1:1"}, "value": [NOW, "1"]},
        {"metric": {}, "value": [NOW, "0.5"]}]}
    labels = 'up{instance="127.0.0.1:1", job="kasd"}'
    assert promql.table(vector) == [f"{'SERIES':<{len(labels)}}  VALUE", f"{labels}  1", f"{'{}':<{len(labels)}}  0.5"]
    matrix = {"resultType": "matrix", "result": [{"metric": {"job": "agentd"}, "values": [[NOW, "1"], [NOW + 15, "2"]]}]}
    assert promql.table(matrix) == ['{job="agentd"}', "  2027-01-15T08:00:00.000Z  1", "  2027-01-15T08:00:15.000Z  2"]
    assert promql.table({"resultType": "vector", "result": []}) == ["(no series)"]


def test_an_error_is_in_the_words_of_whoever_refused() -> None:
    prometheus = json.dumps({"status": "error", "errorType": "bad_data", "error": 'parse error: unexpected "}"'})
    assert promql.error_of(400, prometheus.encode()) == \
        'Prometheus refused the query (bad_data): parse error: unexpected "}"'
    assert promql.error_of(403, b'{"message":"403 Forbidden: user bob needs ..."}') == \
        "refused: 403 Forbidden: user bob needs ..."
    status = {"kind": "Status", "message": "agentd: service prometheus allows GET, HEAD", "code": 403}
    assert promql.error_of(403, json.dumps(status).encode()) == "refused (403): agentd: service prometheus allows GET, HEAD"


def test_a_scraped_pods_label_cannot_drive_the_terminal() -> None:
    """Any pod Prometheus scrapes writes label values; a value's escape sequence is shown, not acted on."""
    vector = {"resultType": "vector", "result": [{"metric": {"pod": "a\x1b[2J\x1b]52;c;cm0gLXJmIH4K\x07"},
                                                   "value": [1, "1\r"]}]}
    lines = promql.table(vector)
    assert all(line.isprintable() for line in lines) and r'pod="a\x1b[2J\x1b]52;c;cm0gLXJmIH4K\x07"' in lines[1]
    assert promql.error_of(400, b'{"status":"error","error":"bad\\u001b[2J"}').isprintable()
