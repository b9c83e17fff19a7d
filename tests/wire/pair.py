"""Two MuxConnections joined by a fake link, like h11's ``ConnectionPair``, plus a raw fake peer.

``ConnectionPair`` shuttles ``data_to_send()`` from one side to the other and returns the events each
side reported. ``RawPeer`` lets a test speak frames by hand to one real connection, for input a
well-behaved MuxConnection would never produce.
"""

from __future__ import annotations

from collections.abc import Iterable

from wire import codec
from wire.events import Event
from wire.frames import Frame, Hello
from wire.mux import MuxConnection
from wire.settings import PROTOCOL_VERSION, Limits, Settings


class ConnectionPair:
    def __init__(
        self,
        *,
        client_settings: Settings | None = None,
        server_settings: Settings | None = None,
        handshake: bool = True,
    ) -> None:
        self.client = MuxConnection(
            client=True, settings=client_settings, metadata={"role": "client"}
        )
        self.server = MuxConnection(
            client=False, settings=server_settings, metadata={"role": "server"}
        )
        self.now = 0.0
        if handshake:
            self.client.initiate()
            self.server.initiate()
            self.exchange()

    def peer(self, conn: MuxConnection) -> MuxConnection:
        return self.server if conn is self.client else self.client

    def send(self, sender: MuxConnection) -> list[Event]:
        """Deliver everything ``sender`` queued to its peer; return the peer's events."""
        data = sender.data_to_send()
        return self.peer(sender).receive_data(data, self.now) if data else []

    def exchange(self) -> tuple[list[Event], list[Event]]:
        """Shuttle bytes both ways until the link is quiet; (client events, server events)."""
        client_events: list[Event] = []
        server_events: list[Event] = []
        while self.client.outbound_size or self.server.outbound_size:
            server_events += self.send(self.client)
            client_events += self.send(self.server)
        return client_events, server_events


class RawPeer:
    """The far end of one real MuxConnection, speaking hand-made frames."""

    def __init__(
        self,
        conn: MuxConnection,
        *,
        settings: Settings | None = None,
        version: tuple[int, int] = PROTOCOL_VERSION,
        handshake: bool = True,
    ) -> None:
        self.conn = conn
        self.decoder = codec.FrameDecoder(Limits(max_frame_payload=16 * 1024 * 1024))
        self.settings = settings or Settings()
        self.version = version
        if handshake:
            conn.initiate()
            self.handshake()
            self.received()  # the connection's HELLO

    def handshake(self) -> list[Event]:
        major, minor = self.version
        return self.send(
            Hello(major=major, minor=minor, settings=self.settings.to_wire(), metadata={})
        )

    def send(self, *frames: Frame, now: float = 0.0) -> list[Event]:
        return self.send_bytes(b"".join(codec.encode(f) for f in frames), now=now)

    def send_bytes(self, data: bytes, now: float = 0.0) -> list[Event]:
        return self.conn.receive_data(data, now)

    def received(self) -> list[Frame]:
        """Frames the connection sent since the last call."""
        return self.decoder.feed(self.conn.data_to_send())


def kinds(items: Iterable[object]) -> list[str]:
    return [type(item).__name__ for item in items]
