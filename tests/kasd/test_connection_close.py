"""HTTP/1.1 ``Connection: close``: once the answer is flushed the connection closes — the client sees
EOF at once (plain and TLS, where no half-close exists) and its slot is free for its next
connection; kasd lingers (bounded) only where closing could reset the answer away: a request it
did not read whole."""

from __future__ import annotations

import pytest
import trio
import trustme

from tests.kasd.helpers import (
    CI_TOKEN,
    H1Client,
    bearer,
    fake_agent,
    http_request,
    make_config,
    running_kasd,
)
from tests.kasd.test_http2_tls import _tls_connect, tls_files  # noqa: F401 - a fixture

pytestmark = pytest.mark.timeout(20)

#: the old linger kept the connection 2 s; closing once flushed is far quicker
EOF_WITHIN = 1.0


async def _get_and_wait_for_eof(client: H1Client) -> int:
    await client.request("GET", "/api", [bearer(CI_TOKEN), ("connection", "close")])
    response = await client.response()
    await client.body()
    with trio.fail_after(EOF_WITHIN):
        assert await client.stream.receive_some(65536) == b""
    return response.status_code


async def test_connection_close_over_tls_ends_once_the_answer_is_flushed(
    tls_files: tuple[trustme.CA, dict[str, str]],  # noqa: F811
) -> None:
    ca, files = tls_files
    async with running_kasd(make_config(tls=files)) as kasd, fake_agent(kasd):
        tls = await _tls_connect(kasd.port("kubernetes_api"), ca, ["http/1.1"])
        assert await _get_and_wait_for_eof(H1Client(tls)) == 200
        await tls.aclose()


async def test_connection_close_frees_the_slot_while_the_client_still_holds_its_end() -> None:
    config = make_config(max_connections_per_source=1)
    async with running_kasd(config) as kasd, fake_agent(kasd):
        port = kasd.port("kubernetes_api")
        client = await H1Client.connect(port)
        assert await _get_and_wait_for_eof(client) == 200
        # The client has not closed its end; kasd has, so this source's one slot is free again.
        with trio.fail_after(EOF_WITHIN):
            assert (await http_request(port, "GET", "/api", [bearer(CI_TOKEN)])).status == 200
        await client.aclose()


async def test_an_error_before_the_body_was_read_lingers_so_the_client_can_finish_sending() -> None:
    """The case the linger is for: kasd answers 401 without reading a large body. Closing at once
    would reset the connection under the client's upload (and could take the 401 with it); kasd
    reads and drops the rest for a bounded while instead."""
    async with running_kasd() as kasd:
        client = await H1Client.connect(kasd.port("kubernetes_api"))
        uploaded = trio.Event()
        async with trio.open_nursery() as nursery:

            async def upload() -> None:
                await client.request("POST", "/api/v1/namespaces", [bearer("ci:1:wrong")], b"x" * (4 << 20))
                uploaded.set()

            nursery.start_soon(upload)
            response = await client.response()
            assert response.status_code == 401
            assert (b"connection", b"close") in response.headers
            with trio.fail_after(5):
                await uploaded.wait()  # not reset: the body was read to the end
        await client.aclose()
