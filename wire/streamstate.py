"""The stream state machine as a table: (state, input) -> next state. A missing pair is an error.

The opener may send DATA and HALF_CLOSE right after OPEN, before ACCEPT arrives (saves a round trip
for a request body); the acceptor may send nothing before it accepts.
"""

from __future__ import annotations

import enum


class StreamState(enum.Enum):
    OPEN_SENT = "open-sent"  # we opened, not yet accepted; our side may still send
    OPEN_SENT_LOCAL_CLOSED = "open-sent/local-closed"  # … and we already half-closed
    OPEN_RECEIVED = "open-received"  # peer opened, we have not accepted yet
    OPEN_RECEIVED_REMOTE_CLOSED = "open-received/remote-closed"
    OPEN = "open"
    HALF_CLOSED_LOCAL = "half-closed-local"  # we sent HALF_CLOSE
    HALF_CLOSED_REMOTE = "half-closed-remote"  # peer sent HALF_CLOSE
    CLOSED = "closed"


class StreamInput(enum.Enum):
    SEND_OPEN = "send-open"
    RECV_OPEN = "recv-open"
    SEND_ACCEPT = "send-accept"
    RECV_ACCEPT = "recv-accept"
    SEND_REFUSE = "send-refuse"
    RECV_REFUSE = "recv-refuse"
    SEND_DATA = "send-data"
    RECV_DATA = "recv-data"
    SEND_HALF_CLOSE = "send-half-close"
    RECV_HALF_CLOSE = "recv-half-close"
    SEND_RESET = "send-reset"
    RECV_RESET = "recv-reset"


S = StreamState
I = StreamInput  # noqa: E741 - a table reads better with short names

TRANSITIONS: dict[tuple[StreamState | None, StreamInput], StreamState] = {
    (None, I.SEND_OPEN): S.OPEN_SENT,
    (None, I.RECV_OPEN): S.OPEN_RECEIVED,
    (S.OPEN_SENT, I.SEND_DATA): S.OPEN_SENT,
    (S.OPEN_SENT, I.SEND_HALF_CLOSE): S.OPEN_SENT_LOCAL_CLOSED,
    (S.OPEN_SENT, I.RECV_ACCEPT): S.OPEN,
    (S.OPEN_SENT, I.RECV_REFUSE): S.CLOSED,
    (S.OPEN_SENT_LOCAL_CLOSED, I.RECV_ACCEPT): S.HALF_CLOSED_LOCAL,
    (S.OPEN_SENT_LOCAL_CLOSED, I.RECV_REFUSE): S.CLOSED,
    (S.OPEN_RECEIVED, I.RECV_DATA): S.OPEN_RECEIVED,
    (S.OPEN_RECEIVED, I.RECV_HALF_CLOSE): S.OPEN_RECEIVED_REMOTE_CLOSED,
    (S.OPEN_RECEIVED, I.SEND_ACCEPT): S.OPEN,
    (S.OPEN_RECEIVED, I.SEND_REFUSE): S.CLOSED,
    (S.OPEN_RECEIVED_REMOTE_CLOSED, I.SEND_ACCEPT): S.HALF_CLOSED_REMOTE,
    (S.OPEN_RECEIVED_REMOTE_CLOSED, I.SEND_REFUSE): S.CLOSED,
    (S.OPEN, I.SEND_DATA): S.OPEN,
    (S.OPEN, I.RECV_DATA): S.OPEN,
    (S.OPEN, I.SEND_HALF_CLOSE): S.HALF_CLOSED_LOCAL,
    (S.OPEN, I.RECV_HALF_CLOSE): S.HALF_CLOSED_REMOTE,
    (S.HALF_CLOSED_LOCAL, I.RECV_DATA): S.HALF_CLOSED_LOCAL,
    (S.HALF_CLOSED_LOCAL, I.RECV_HALF_CLOSE): S.CLOSED,
    (S.HALF_CLOSED_REMOTE, I.SEND_DATA): S.HALF_CLOSED_REMOTE,
    (S.HALF_CLOSED_REMOTE, I.SEND_HALF_CLOSE): S.CLOSED,
}
# Either side may abort any stream that is not yet closed.
for _state in StreamState:
    if _state is not S.CLOSED:
        TRANSITIONS[(_state, I.SEND_RESET)] = S.CLOSED
        TRANSITIONS[(_state, I.RECV_RESET)] = S.CLOSED

#: states in which this side may still send DATA (and so may receive WINDOW_UPDATE)
LOCAL_OPEN = frozenset({S.OPEN_SENT, S.OPEN, S.HALF_CLOSED_REMOTE})
#: states in which the peer may still send DATA (and so this side grants credit)
REMOTE_OPEN = frozenset({S.OPEN_RECEIVED, S.OPEN, S.HALF_CLOSED_LOCAL})


def next_state(state: StreamState | None, event: StreamInput) -> StreamState | None:
    """The state after ``event``, or None when the pair is not in the table (the caller's error)."""
    return TRANSITIONS.get((state, event))
