"""
The sessions through which the broker model meets a peer broker of the
pack (the dialect of L{malamute_pack.protocol.packlink}); the model treats
them as it treats clients, which is how a record, a letter or a request
reaches another host with no branch for it inside the model:

- L{PeerSession}: the peer broker itself, as a reader of the streams its
  clients read (with their patterns), as the writer of the records it
  forwards here and as the sender of the letters it hands over here.
- L{RemoteHolder}: one address a client of the peer holds (so letters for
  it go there), or one service the peer's workers offer (so requests can
  go there when no local worker can take them).

Tests: ``tests/unit/test_pack_federation.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.letters import Kind, Letter
from malamute_pack.broker.receipts import Receipt
from malamute_pack.broker.session import Hold, PartySession
from malamute_pack.protocol import mlm, packlink
from malamute_pack.protocol.records import StreamRecord

if TYPE_CHECKING:
    from malamute_pack.broker.connection import Connection
    from malamute_pack.pack.outbox import PeerOutbox

_log = Logger()


class _PackSession(PartySession):
    """
    What every session of the pack has in common: it holds each letter
    until the peer answers for it.
    """

    def hold(self, letter: Letter) -> Hold:
        return Hold.UNTIL_ANSWERED


class PeerSession(_PackSession):
    """
    A peer broker, as one connection of the model.

    @ivar connection: its connection, once attached.
    @ivar history: streams the peer asked history of, with the last
        sequence number written when it asked: records up to it are marked
        as history (what was written since is live for the peer's readers).
    @ivar relays: the peer's letters it handed over, as (kind, relay id),
        in the order they were posted (their receipts come in that order).
    @ivar in_flight: the letters handed to the peer and not answered for
        yet, by id, with the holder that handed each.
    """

    def __init__(
        self, name: str, outbox: PeerOutbox, refused: Callable[[tuple[int, int]], None]
    ) -> None:
        """
        @param refused: called with a letter's (kind, relay id) when it was
            refused here: the peer hands it over again, and it must then be
            taken anew, not be known as one stored here already.
        """
        self.name = name
        self._outbox = outbox
        self._refused = refused
        self.connection: Connection | None = None
        self.history: dict[str, int] = {}
        self.relays: deque[tuple[int, int]] = deque()
        # The letters handed to the peer, by id, and who handed them.
        self.in_flight: dict[int, RemoteHolder] = {}
        self.gaps = 0
        self.errors = 0

    def __repr__(self) -> str:
        return f"<peer broker {self.name}>"

    def detached(self) -> None:
        self.relays.clear()
        self.in_flight.clear()

    def error(self, code: int, reason: str) -> None:
        self.errors += 1
        _log.info("{peer}: {code} {reason}", peer=self, code=code, reason=reason)

    def deliver_stream(self, record: StreamRecord) -> bool:
        if record.origin:
            return True  # forwarded here from another peer: one hop only
        name = record.stream
        history = 0
        if name in self.history:
            if record.seq <= self.history[name]:
                history = 1
            if record.seq >= self.history[name]:
                del self.history[name]  # the history is through
        frames = packlink.encode_forward(
            name,
            record.seq,
            int(record.timestamp * 1_000_000),
            record.sender,
            record.subject,
            history,
            record.content,
        )
        return self._outbox.deliver(frames)

    def deliver_letter(self, letter: Letter) -> bool:
        return False  # it holds no address and offers nothing

    def gap(self, stream: str, missed: int, available: int) -> None:
        self.gaps += 1

    def stored(self, receipt: Receipt) -> None:
        """A letter the peer handed over is stored here (or refused): it hears."""
        if not self.relays:
            return
        key = self.relays.popleft()
        relay_id = key[1]
        code = receipt.code if receipt.code is not None else mlm.FAILED
        if code != mlm.SUCCESS:
            # Not kept here: when it comes again it is taken, not answered
            # "stored" (found by the soak: a pair refused letters for a
            # journal error, and lost their retries that way).
            self._refused(key)
        self._outbox.send(
            packlink.encode(
                packlink.Answer(relay_id, packlink.STORED, code, mlm.fit_string(receipt.reason))
            )
        )

    # confirm(): for an anonymous sender on the peer, nobody to tell.


class RemoteHolder(_PackSession):
    """
    An address held on a peer broker (C{kind} mailbox), or a service its
    workers offer (C{kind} service): letters handed to it go to the peer,
    and stay held here until the peer answers for them.

    @ivar connection: its connection, once attached.
    """

    def __init__(
        self, peer: PeerSession, outbox: PeerOutbox, kind: Kind, name: str, clock: IReactorTime
    ) -> None:
        self.peer = peer
        self._clock = clock
        self.kind = kind
        self.name = name
        self._outbox = outbox
        self.connection: Connection | None = None

    def __repr__(self) -> str:
        return f"<{self.kind.value} {self.name!r} on {self.peer.name}>"

    def deliver_stream(self, record: StreamRecord) -> bool:
        return True  # it reads nothing

    def deliver_letter(self, letter: Letter) -> bool:
        timeout = 0
        if letter.deadline is not None:
            timeout = max(1, int((letter.deadline - self._clock.seconds()) * 1000))
        kind = packlink.MAILBOX if letter.kind is Kind.MAILBOX else packlink.SERVICE
        frames = packlink.encode(
            packlink.Letter(
                kind,
                letter.id,
                letter.sender,
                letter.address,
                letter.subject,
                letter.tracker,
                timeout,
                tuple(letter.content),
            )
        )
        if not self._outbox.deliver(frames):
            return False
        self.peer.in_flight[letter.id] = self
        return True

    def confirm(self, tracker: str, code: int, reason: str) -> None:
        """A recipient here answered a tracked letter from this address: its sender hears."""
        self._outbox.send(
            packlink.encode(packlink.Confirm(self.name, tracker, code, mlm.fit_string(reason)))
        )
