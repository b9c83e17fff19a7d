"""The forward key of a request one replica passes to another: its agent id is checked like any id
a peer sends (a whole number, 1 to 2**63-1), refused as a protocol error naming it otherwise."""

from __future__ import annotations

import pytest

from routing.peers import FORWARD_KEY, forwarded_request
from wire.errors import RemoteProtocolError

pytestmark = pytest.mark.timeout(5)


@pytest.mark.parametrize("agent_id", [0, -1, True, "7", 7.0, 2**63, 2**64 - 1, None])
def test_a_forward_key_without_a_valid_agent_id_is_refused(agent_id: object) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        forwarded_request({"method": "GET", FORWARD_KEY: {"agent_id": agent_id, "from": "a:1"}})
    assert f"{FORWARD_KEY}.agent_id" in caught.value.message


def test_a_valid_forward_key_names_its_agent() -> None:
    assert forwarded_request({"method": "GET", FORWARD_KEY: {"agent_id": 2**63 - 1, "from": "a:1"}}) \
        == (2**63 - 1, "a:1", {"method": "GET"})
