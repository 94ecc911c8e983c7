"""
What a pair's broker does with its clients' messages before it is active:
the gate between the transport's sessions and the broker model.

While the broker is not active, every message is a client request for the
pair's state machine (Binary Star's CLIENT_REQUEST): if the machine
refuses it, the client is answered ERROR 503 "not active" (our client
library then tries the partner); if it accepts it (the partner is silent:
this broker takes over), the message waits, with the others that arrive
meanwhile (at most L{HELD_MESSAGES}; beyond, refused the same way), until
the broker is active, and is then handed to the model in arrival order.
Once open, the gate passes everything straight through, unless it is
suspended: an active that cannot reach its partner (and has no evidence
its process is gone) acknowledges nothing without it, and refuses its
clients the same way (503), so that they turn to the partner, which may
take over (L{ClientGate.suspend}, L{ClientGate.resume}).

Tests: ``tests/system/test_pair_service.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from malamute_pack.broker.session import Receiver, Session
from malamute_pack.protocol import mlm
from malamute_pack.protocol.records import StreamRecord

# The status a broker that is not active answers with.
NOT_ACTIVE: Final = mlm.NOT_ACTIVE
# Messages held while the broker takes over.
HELD_MESSAGES: Final = 10_000


class ClientGate:
    """
    Feeds C{broker} once L{open}; before, asks C{client_request} (True:
    hold the message until the gate opens; False: refuse it).
    """

    def __init__(self, broker: Receiver, client_request: Callable[[], bool]) -> None:
        self._broker = broker
        self._client_request = client_request
        self.is_open = False
        self.suspended = False
        self._held: list[tuple[Session, mlm.Message]] = []
        self.refused = 0
        self.reason = "not active: this broker is its pair's passive; connect to its partner"
        self._suspended_reason = ""

    def open(self) -> None:
        """The broker is active: hand it what waited, then everything."""
        self.is_open = True
        held, self._held = self._held, []
        for session, message in held:
            self._broker.receive(session, message)

    def close(self, reason: str) -> None:
        """The broker serves no more (it yielded to its partner): refuse with C{reason}."""
        self.is_open = False
        self.reason = reason

    def suspend(self, reason: str) -> None:
        """Refuse every client (503, C{reason}) until L{resume}, the broker still active."""
        self.suspended = True
        self._suspended_reason = reason

    def resume(self) -> None:
        self.suspended = False

    def receive(self, session: Session, message: mlm.Message) -> None:
        if self.is_open:
            if self.suspended:
                self.refused += 1
                session.error(NOT_ACTIVE, self._suspended_reason)
                return
            self._broker.receive(session, message)
            return
        if self._client_request() and len(self._held) < HELD_MESSAGES:
            self._held.append((session, message))
            return
        self.refused += 1
        session.error(NOT_ACTIVE, self.reason)

    def malformed(self, session: Session, reason: str) -> None:
        self._broker.malformed(session, reason)

    def rejected(self, session: Session, message: mlm.Message, reason: str) -> None:
        if self.is_open and not self.suspended:
            self._broker.rejected(session, message, reason)
        else:
            self.refused += 1
            session.error(NOT_ACTIVE, self.reason)

    def undelivered(self, session: Session, record: StreamRecord) -> None:
        self._broker.undelivered(session, record)

    def unresponsive(self, session: Session, reason: str) -> None:
        if self.is_open:
            self._broker.unresponsive(session, reason)
        else:
            self._held = [(s, m) for s, m in self._held if s is not session]
