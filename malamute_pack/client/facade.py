"""
What the Twisted and the blocking client share: the whole API over their
L{ClientCore}, written once. A driver adds only the I/O: how a command's
OK/ERROR and a send's STORED are awaited (a Deferred, or turning a
C{zmq.Poller} loop until it comes), what follows a send, how deliveries
and confirmations wait for the application, and how frames reach the
socket.

Tests: ``tests/unit/test_client_reactor.py``, ``tests/system/test_client_blocking.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from twisted.logger import Logger

from malamute_pack.client.core import ClientCore, ClientState, Done
from malamute_pack.client.events import Delivery, Gap
from malamute_pack.client.options import ClientOptions
from malamute_pack.client.outbox import StoredCallback
from malamute_pack.protocol import mlm

_log = Logger()

# What a command returns (a Deferred, or nothing once it is done), and what
# a version 2 send returns (a Deferred of the id, or the id).
CommandResult = TypeVar("CommandResult")
StoredResult = TypeVar("StoredResult")


class ClientFacade(ABC, Generic[CommandResult, StoredResult]):
    """
    A client's API; subclasses set C{_core} and add the I/O.

    @ivar on_gap: if set, called with each L{Gap} (version 2) as it arrives.
    """

    _core: ClientCore
    on_gap: Callable[[Gap], object] | None

    # State

    @property
    def state(self) -> ClientState:
        return self._core.state

    @property
    def options(self) -> ClientOptions:
        """The options the client runs with."""
        return self._core.options

    @property
    def address(self) -> str:
        return self._core.address

    @property
    def endpoint(self) -> str:
        """The endpoint the client is on (or trying, while it fails over)."""
        return self._core.endpoint

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every endpoint the client may use, in the order it tries them."""
        return self._core.endpoints

    @property
    def switches(self) -> int:
        """How many times the client moved to another endpoint (fail-overs)."""
        return self._core.switches

    @property
    def reconnects(self) -> int:
        """
        How many times the broker forgot us (or we moved to another
        endpoint) and we opened again and replayed.
        """
        return self._core.reconnects

    @property
    def version(self) -> int:
        """The protocol version the client speaks (1 or 2)."""
        return self._core.version

    @property
    def duplicates(self) -> int:
        """Redelivered records (version 2) dropped instead of handed over again."""
        return self._core.duplicates

    @property
    def gaps(self) -> int:
        """STREAM_GAPs received (version 2)."""
        return self._core.gaps

    @property
    def dropped(self) -> int:
        """Messages dropped: the socket's queue stayed full, or too many were held."""
        return self._socket_dropped + self._core.held_dropped

    # Commands (OK or ERROR: the result fires or returns, MalamuteError is raised)

    def set_producer(self, stream: str) -> CommandResult:
        """Publish to C{stream} from now on."""
        return self._run_command(lambda done: self._core.set_producer(stream, done))

    def set_consumer(
        self, stream: str, pattern: str, whence: int = mlm.LATEST, position: int = 0
    ) -> CommandResult:
        """
        Read C{stream} for the subjects C{pattern} finds, from C{whence}:
        C{mlm.LATEST} (from now on), or with version 2 C{mlm.EARLIEST},
        C{mlm.SEQUENCE} (from message number C{position}), C{mlm.TIME}
        (from C{position}, milliseconds since the epoch) or
        C{mlm.LAST_VALUES} (a last-value stream's latest record of each
        subject, then on).

        @raise ValueError: at the call, for a position with version 1.
        """
        return self._run_command(
            lambda done: self._core.set_consumer(stream, pattern, done, whence, position)
        )

    def consume(
        self,
        stream: str,
        pattern: str,
        consumer: str,
        group: str = "",
        whence: int = mlm.RESUME,
        position: int = 0,
    ) -> CommandResult:
        """
        Read C{stream} for the subjects C{pattern} finds as the durable
        consumer C{consumer} (version 2): the broker keeps its position, so
        it resumes after its last L{commit} from any process, after a broker
        restart or a pair's fail-over. C{whence} other than C{mlm.RESUME}
        resets it (C{mlm.LATEST}, C{mlm.EARLIEST}, C{mlm.SEQUENCE} or
        C{mlm.TIME} with C{position}).
        """
        return self._run_command(
            lambda done: self._core.consume(
                stream, pattern, consumer, done, group, whence, position
            )
        )

    def commit(self, stream: str, sequence: int) -> StoredResult:
        """
        Acknowledge every record of C{stream} up to C{sequence} (version 2,
        as a consumer): the result is the position the broker made durable,
        which is the broker's and may be lower than C{sequence} (a reader's
        commit past the last record it was sent is clamped to that record); a
        refusal (of a number past the stream's last record, among others)
        raises (or fails with) L{MalamuteError}, no answer within
        C{commit_timeout} seconds L{BrokerUnreachableError}.
        """
        return self._await_stored(lambda settled: self._core.commit(stream, sequence, settled))

    def remove_consumer(self, stream: str) -> CommandResult:
        """Stop reading C{stream}."""
        return self._run_command(lambda done: self._core.remove_consumer(stream, done))

    def set_worker(self, service: str, pattern: str) -> CommandResult:
        """Serve requests to C{service} whose subjects C{pattern} finds."""
        return self._run_command(lambda done: self._core.set_worker(service, pattern, done))

    # Messages without a reply (with version 2, sendto and sendfor get STORED)

    def send(self, subject: str, content: Sequence[bytes]) -> None:
        """Publish a message to the producer stream."""
        self._core.send(subject, content)
        self._sent()

    def sendto(
        self,
        address: str,
        subject: str,
        content: Sequence[bytes],
        tracker: str = "",
        timeout_ms: int = 0,
    ) -> StoredResult | None:
        """
        Send a letter to the mailbox C{address}.

        @return: with version 1, None at once; with version 2, the id the
            broker stored the message under: a Deferred that fires with it
            (L{MalamuteClient}) or the id once it came (L{BlockingClient}).
            A refusal (e.g. 300, a full mailbox) is a L{MalamuteError}, a
            close first a L{ClientClosedError}; the blocking client raises
            L{BrokerUnreachableError} if the connection is lost first (the
            message is still sent when the broker is back).
        """
        return self._send_stored(
            lambda stored: self._core.sendto(address, subject, content, tracker, timeout_ms, stored)
        )

    def sendfor(
        self,
        service: str,
        subject: str,
        content: Sequence[bytes],
        tracker: str = "",
        timeout_ms: int = 0,
    ) -> StoredResult | None:
        """
        Send a request to C{service}; the reply comes to our mailbox.

        @return: as for L{sendto}.
        """
        return self._send_stored(
            lambda stored: self._core.sendfor(
                service, subject, content, tracker, timeout_ms, stored
            )
        )

    def _send_stored(self, send: Callable[[StoredCallback | None], None]) -> StoredResult | None:
        if self._core.version < 2:
            send(None)
            self._sent()
            return None
        return self._await_stored(send)

    def credit(self, amount: int) -> None:
        """Let the broker deliver at most C{amount} more messages (opt-in flow control)."""
        self._core.credit(amount)

    def confirm(self, tracker: str, status_code: int = mlm.SUCCESS, reason: str = "") -> None:
        """Confirm a tracked letter; its sender hears through C{recv_confirm}."""
        self._core.confirm(tracker, status_code, reason)

    def done(self, delivery: Delivery, status_code: int = mlm.SUCCESS, reason: str = "") -> None:
        """
        Answer a mailbox or service delivery (version 2, with
        C{auto_done=False}) once processed: the broker removes it and passes
        the status to a tracked message's sender.

        @raise ValueError: for a delivery without an id.
        """
        self._core.done(delivery, status_code, reason)

    # Receiving

    def _hand_over(self, delivery: Delivery) -> Delivery:
        """The application takes C{delivery}: with C{auto_done}, a record is answered."""
        self._core.handed_over(delivery)
        return delivery

    def gap(self, gap: Gap) -> None:
        """(CoreOwner) A STREAM_GAP: to C{on_gap} if set, else kept if the driver keeps them."""
        callback = self.on_gap
        if callback is None:
            self._keep_gap(gap)
            return
        try:
            callback(gap)
        except Exception:
            _log.failure("on_gap raised")

    # The I/O, in each driver

    @property
    @abstractmethod
    def _socket_dropped(self) -> int:
        """Messages the socket dropped."""

    @abstractmethod
    def _run_command(self, start: Callable[[Done], None]) -> CommandResult:
        """Start a command with a completion callback; its result for the application."""

    @abstractmethod
    def _await_stored(self, send: Callable[[StoredCallback], None]) -> StoredResult:
        """Send a message that gets STORED; its result for the application."""

    @abstractmethod
    def _sent(self) -> None:
        """A message without a reply went to the core."""

    @abstractmethod
    def _keep_gap(self, gap: Gap) -> None:
        """A STREAM_GAP with no C{on_gap}."""
