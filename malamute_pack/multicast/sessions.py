"""
The sessions through which the broker model meets its multicast bridges
(L{malamute_pack.broker.session}); the model treats them as it treats
local clients, with no branch for them inside it:

- L{OutboundSession}: an outbound bridge on the broker's own stream, a
  reader of it with the bridge's pattern (so the pack forwards to it what
  peers' writers write), handing every record to its L{Publisher}. When the
  socket's queue is full it refuses the delivery, and the model serves it
  from the journal once the queue drains, as it does a slow client: a
  burst is published late rather than lost.
- L{InboundSession}: an inbound bridge, the writer of the records it
  receives into its local stream.

Tests: ``tests/unit/test_multicast_outbound.py``, ``tests/unit/test_multicast_inbound.py``.
"""

from __future__ import annotations

from twisted.logger import Logger

from malamute_pack.broker.broker import Broker
from malamute_pack.broker.session import PartySession
from malamute_pack.multicast.publisher import Publisher
from malamute_pack.protocol.records import StreamRecord

_log = Logger()


class _BridgeSession(PartySession):
    """What every bridge's session has in common: refusals are logged."""

    def error(self, code: int, reason: str) -> None:
        _log.warn("{bridge}: {code} {reason}", bridge=self, code=code, reason=reason)


class OutboundSession(_BridgeSession):
    """
    The model's view of one outbound bridge: a reader of one stream.

    @ivar gaps: times retention removed records before the bridge sent them
        (receivers see the loss, and hear of it when they repair).
    """

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self.gaps = 0

    def __repr__(self) -> str:
        publisher = self.publisher
        return f"<multicast bridge of {publisher.stream!r} ({publisher.pattern})>"

    def deliver_stream(self, record: StreamRecord) -> bool:
        return self.publisher.publish(
            record.seq, record.timestamp, record.sender, record.subject, record.content
        )

    def gap(self, stream: str, missed: int, available: int) -> None:
        self.gaps += 1

    def attach(self, broker: Broker) -> None:
        """Read the stream, from now on."""
        connection = broker.attach_internal(self)
        publisher = self.publisher
        broker.streams.subscribe(connection, publisher.stream, publisher.pattern)


class InboundSession(_BridgeSession):
    """The model's view of one inbound bridge: the writer of what it receives."""

    def __init__(self, stream: str, url: str) -> None:
        self.stream = stream
        self.url = url

    def __repr__(self) -> str:
        return f"<multicast bridge from {self.url} into {self.stream!r}>"
