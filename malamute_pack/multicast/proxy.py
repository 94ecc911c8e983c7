"""
A proxy's source: another broker's streams, read over TCP as an ordinary
MLM reader (protocol version 2, so records carry their sequence numbers)
and handed to the outbound bridges' L{Publisher}s.

The reader grants credit (L{WINDOW} records ahead) and grants more as
records are published, so records the socket cannot take yet wait here,
at most a window of them, and the source holds the rest. When the source
restarts, the client reconnects and reads on from the last sequence number
it got (the client library's resume), so nothing is skipped or repeated;
receivers repair from the source what multicast lost.

Tests: ``tests/system/test_multicast_proxy.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import zmq
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorFDSet, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.client.errors import ClientError
from malamute_pack.client.events import Delivery
from malamute_pack.client.options import ClientOptions
from malamute_pack.client.reactor_client import MalamuteClient
from malamute_pack.multicast.publisher import Publisher

_log = Logger()

# Records the source may send ahead of what is published.
WINDOW = 4_000
# Seconds between tries while the sockets' queues are full, and between
# connection attempts while the source is unreachable.
RETRY = 0.005
RECONNECT = 1.0


class ProxySource:
    """
    Reads the publishers' streams from C{source} and publishes them.

    @ivar client: the connection to the source, once made.
    @ivar received: records read from the source.
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]] | None,
        source: str,
        publishers: Sequence[Publisher],
        options: ClientOptions | None = None,
    ) -> None:
        self._reactor = reactor
        self._clock: IReactorTime = reactor  # type: ignore[assignment]
        self._context = context
        self._source = source
        self._options = options or ClientOptions()
        self._publishers: dict[str, Publisher] = {p.stream: p for p in publishers}
        assert len(self._publishers) == len(publishers), "one bridge per stream from a source"
        self._pending: deque[Delivery] = deque()
        self._retry: IDelayedCall | None = None
        self._reconnect: IDelayedCall | None = None
        self._connecting: Deferred[MalamuteClient] | None = None
        self._ungranted = 0
        self._stopped = False
        self.client: MalamuteClient | None = None
        self.received = 0

    def start(self) -> None:
        """Connect (again every L{RECONNECT} seconds until the source answers)."""
        self._reconnect = None
        if self._stopped:
            return
        self._connecting = MalamuteClient.connect(
            self._reactor,
            self._source,
            options=self._options,
            version=2,
            context=self._context,
            on_delivery=self._delivered,
        )
        self._connecting.addCallbacks(self._connected, self._unreachable)

    def stop(self) -> Deferred[None]:
        """
        Publish nothing more and close the connection to the source.

        @return: fires once it is closed (or, while connecting, given up).
        """
        self._stopped = True
        # Nothing is left behind in the reactor: no retry, no reconnection.
        for call in (self._retry, self._reconnect):
            if call is not None and call.active():
                call.cancel()
        self._retry = self._reconnect = None
        self._pending.clear()
        if self.client is not None:
            client, self.client = self.client, None
            return client.close()
        if self._connecting is None:
            return succeed(None)
        done: Deferred[None] = Deferred()
        self._connecting.addBoth(lambda _: done.callback(None))
        return done

    def _unreachable(self, failure: Failure) -> None:
        self._connecting = None
        if self._stopped:
            return
        _log.warn(
            "multicast proxy: source {source}: {error}; trying again",
            source=self._source,
            error=failure.getErrorMessage(),
        )
        self._reconnect = self._clock.callLater(RECONNECT, self.start)

    def _connected(self, client: MalamuteClient) -> Deferred[None] | None:
        self._connecting = None
        if self._stopped:
            return client.close()
        self.client = client
        client.credit(WINDOW)
        for publisher in self._publishers.values():
            # After a restart of this proxy, receivers repair what it missed.
            client.set_consumer(publisher.stream, publisher.pattern).addErrback(
                self._refused, publisher.stream
            )
        _log.info("multicast proxy: reading {source}", source=self._source)
        return None

    def _refused(self, failure: Failure, stream: str) -> None:
        _log.error(
            "multicast proxy: {source} refused to let stream {stream!r} be read: {error}",
            source=self._source,
            stream=stream,
            error=failure.getErrorMessage(),
        )

    def _delivered(self, delivery: Delivery) -> None:
        if self._stopped:
            return  # arrived while the connection closes: its socket may be closed
        self.received += 1
        self._pending.append(delivery)
        if len(self._pending) == 1:
            self._publish()

    def _publish(self) -> None:
        """Publish what waits, in order, until a socket is full."""
        self._retry = None
        pending = self._pending
        published = 0
        while pending:
            delivery = pending[0]
            publisher = self._publishers.get(delivery.address)
            if publisher is not None and delivery.sequence is not None:
                sent = publisher.publish(
                    delivery.sequence,
                    delivery.timestamp or self._clock.seconds(),
                    delivery.sender,
                    delivery.subject,
                    delivery.content,
                )
                if not sent:
                    self._retry = self._clock.callLater(RETRY, self._publish)
                    break
            pending.popleft()
            published += 1
        self._grant(published)

    def _grant(self, published: int) -> None:
        self._ungranted += published
        if self._ungranted >= WINDOW // 4 and self.client is not None:
            try:
                self.client.credit(self._ungranted)
            except ClientError:
                return  # closed meanwhile
            self._ungranted = 0
