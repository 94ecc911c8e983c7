"""
Reconnecting version 2 load clients for the kill -9 system test: a sender
that pipelines MAILBOX_SEND and SERVICE_SEND and resends whatever it has
not seen STORED for (at-least-once), and recipients (a mailbox owner and a
service worker) that answer DONE to every record and remember what they
got. All of them notice a restarted broker by its ERROR 500, open again and
carry on; all are driven by one poll loop (L{pump}) in the test's thread.

Tests: used by ``tests/system/test_system_durability.py``.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from time import monotonic

import zmq

from malamute_pack.protocol import mlm
from tests.system_support import Peer

# Ping a peer that has sent nothing for this long (seconds).
PING_IDLE = 0.2
# Open again when no OK came back for this long (the OPEN may have gone to
# the dead broker).
REOPEN_AFTER = 2.0


class ReconnectingClient:
    """
    A version 2 client that opens (again) on ERROR 500 and pings while idle.

    @ivar opens: how many times it sent CONNECTION_OPEN.
    @ivar errors: ERROR replies by (code, reason).
    """

    def __init__(self, peer: Peer, address: str) -> None:
        self.peer = peer
        self.address = address
        self.open = False
        self.opens = 0
        self._oks_wanted = 0
        self._opened_at = 0.0
        self._last_send = 0.0
        self.errors: Counter[tuple[int, str]] = Counter()

    def opening_commands(self) -> list[mlm.Message]:
        """What to send on every (re)connection, OPEN first; each is answered OK."""
        return [mlm.ConnectionOpen(version=2, address=self.address)]

    def connect(self) -> None:
        self.open = False
        commands = self.opening_commands()
        self._oks_wanted = len(commands)
        self._opened_at = monotonic()
        self.opens += 1
        for command in commands:
            self.send(command)

    def send(self, message: mlm.Message) -> None:
        self._last_send = monotonic()
        self.peer.send(message)

    def handle(self, message: mlm.Message) -> None:
        if isinstance(message, mlm.Error):
            self.errors[(message.status_code, message.status_reason)] += 1
            # While opening, ERRORs answer what was sent before the OPEN.
            if message.status_code == mlm.COMMAND_INVALID and self.open:
                self.connect()
        elif isinstance(message, mlm.Ok):
            if not self.open:
                self._oks_wanted -= 1
                if self._oks_wanted == 0:
                    self.open = True
                    self.opened()
        elif not isinstance(message, mlm.ConnectionPong):
            self.received(message)

    def opened(self) -> None:
        """The broker answered every opening command."""

    def received(self, message: mlm.Message) -> None:
        raise AssertionError(f"{self.address}: unexpected {message}")

    def tick(self, now: float) -> None:
        if not self.open and now - self._opened_at > REOPEN_AFTER:
            self.connect()
        elif now - self._last_send > PING_IDLE:
            self.send(mlm.ConnectionPing())


def letter_subjects(n: int) -> list[str]:
    """C{n} distinct subjects, alternating mailbox (m-) and service (s-) letters."""
    return [f"m-{i}" if i % 2 == 0 else f"s-{i}" for i in range(n)]


class Sender(ReconnectingClient):
    """
    Sends every subject (tracker = subject, content = its bytes) with at
    most C{window} unacknowledged, until each has a STORED 200.

    @ivar acked: subject -> ids of the STORED 200 it got (more than one when
        a resent letter had in fact been stored).
    @ivar ids: id -> subject of the first STORED 200 with that id.
    @ivar id_clashes: (id, subject, other subject) for each STORED 200 whose
        id an earlier one gave to another letter.
    @ivar resend_reversed: resend in the reverse of the send order (a
        sender may resend in any order; reversing gives letters the broker
        numbers again ids other than those they had).
    """

    def __init__(
        self,
        peer: Peer,
        subjects: Sequence[str],
        mailbox: str,
        service: str,
        window: int,
        resend_reversed: bool = False,
    ) -> None:
        super().__init__(peer, "tx")
        self.mailbox = mailbox
        self.service = service
        self.window = window
        self.resend_reversed = resend_reversed
        self.to_send: deque[str] = deque(subjects)
        self.in_flight: dict[str, None] = {}  # sent, no STORED yet; in send order
        self.acked: dict[str, list[int]] = {}
        self.ids: dict[int, str] = {}
        self.id_clashes: list[tuple[int, str, str]] = []
        self.sends = 0
        self.resent = 0
        self.refused: Counter[str] = Counter()
        self.confirms = 0

    def done(self) -> bool:
        return not self.to_send and not self.in_flight

    def opened(self) -> None:
        # At least once: whatever has no STORED yet goes again, first.
        self.resent += len(self.in_flight)
        again = list(self.in_flight)
        self.to_send.extendleft(again if self.resend_reversed else reversed(again))
        self.in_flight.clear()

    def received(self, message: mlm.Message) -> None:
        if isinstance(message, mlm.Confirm):
            self.confirms += 1
            return
        if not isinstance(message, mlm.Stored):
            super().received(message)
            return
        subject = message.tracker
        self.in_flight.pop(subject, None)
        if message.status_code == mlm.SUCCESS:
            self.acked.setdefault(subject, []).append(message.id)
            previous = self.ids.setdefault(message.id, subject)
            if previous != subject:
                self.id_clashes.append((message.id, previous, subject))
        else:
            self.refused[message.status_reason] += 1
            if subject not in self.acked:
                self.to_send.append(subject)

    def tick(self, now: float) -> None:
        while self.open and self.to_send and len(self.in_flight) < self.window:
            subject = self.to_send.popleft()
            if subject in self.acked:
                continue  # a late STORED from before a reconnection settled it
            cls = mlm.MailboxSend if subject.startswith("m-") else mlm.ServiceSend
            address = self.mailbox if cls is mlm.MailboxSend else self.service
            self.in_flight[subject] = None
            self.sends += 1
            self.send(cls(address, subject, subject, 0, [subject.encode()]))
        super().tick(now)


@dataclass(frozen=True, slots=True)
class Delivery:
    """
    One record a recipient got; C{generation} is how many broker restarts
    the test had made when it was read (the killed broker's last records
    may be read after its restart).
    """

    id: int
    subject: str
    content: tuple[bytes, ...]
    generation: int


class Recipient(ReconnectingClient):
    """
    Takes records of one kind (MAILBOX_RECORD, or SERVICE_RECORD after
    offering C{service}), answers DONE 200 to each and remembers it.
    """

    def __init__(self, peer: Peer, address: str, service: str | None = None) -> None:
        super().__init__(peer, address)
        self.service = service
        self.kind: type[mlm.Message] = mlm.MailboxRecord if service is None else mlm.ServiceRecord
        self.deliveries: list[Delivery] = []
        self.generation = 0  # the test counts broker restarts here
        self.max_id = 0
        self.last_delivery = monotonic()

    def opening_commands(self) -> list[mlm.Message]:
        offer = [] if self.service is None else [mlm.ServiceOffer(self.service, "")]
        return [*super().opening_commands(), *offer]

    def received(self, message: mlm.Message) -> None:
        if not isinstance(message, mlm.MailboxRecord | mlm.ServiceRecord) or not isinstance(
            message, self.kind
        ):
            super().received(message)
            return
        self.deliveries.append(
            Delivery(message.id, message.subject, tuple(message.content), self.generation)
        )
        self.last_delivery = monotonic()
        self.max_id = max(self.max_id, message.id)
        self.send(mlm.Done(message.id, mlm.SUCCESS, ""))


def pump(clients: Sequence[ReconnectingClient], poller: zmq.Poller, timeout: float) -> None:
    """Wait up to C{timeout} seconds for input, handle all of it, then tick every client."""
    ready = dict(poller.poll(int(timeout * 1000)))
    for client in clients:
        if client.peer.socket in ready:
            for message in client.peer.receive_ready():
                client.handle(message)
    now = monotonic()
    for client in clients:
        client.tick(now)
