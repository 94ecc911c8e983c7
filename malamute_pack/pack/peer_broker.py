"""
One peer broker of the pack, as this broker sees it: what it announced
(the streams and patterns its readers read, the addresses its clients
hold, the services its workers offer) made into connections of the broker
model (L{malamute_pack.pack.sessions}), and what it sends applied to the
model: forwarded records written to the local copy of their stream (once:
a record at or below the highest sequence number already taken from that
origin is a duplicate), letters posted here on behalf of its clients, and
its answers for the letters handed to it.

Tests: ``tests/unit/test_pack_federation.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pyroaring import BitMap64
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.broker import Broker
from malamute_pack.broker.connection import Connection
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.letters import Kind, Letter
from malamute_pack.broker.limits import check_name, longer_than
from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.pack.outbox import PeerOutbox
from malamute_pack.pack.sessions import PeerSession, RemoteHolder
from malamute_pack.protocol import mlm, packlink
from malamute_pack.protocol.records import StreamRecord

_log = Logger()

# Letters handed over by a peer that are remembered, so that one it hands
# over again (it lost our answer) is not stored twice.
RECENT_RELAYS = 100_000

# Seconds before a peer is asked again for records not written here (a
# full disk seldom clears at once: one ask a second at most); asked again
# as long as none of them comes, each time twice as long after.
REWIND_DELAY = 1.0
# Asks after which records that never come are taken as gone from their
# origin (its retention removed them meanwhile): the next it sends again
# is taken, and what was missing is counted lost.
MAX_ASKS = 5
# Per (stream, origin): what the peer forwarded that was not written here,
# below the mark (asked for again, taken when it comes); a bitmap, so that
# a long full disk's thousands of records cost bytes each, not a Python int.
Missing = dict[tuple[str, str], BitMap64]

# Highest origin sequence number taken, by (stream, origin).
Marks = MutableMapping[tuple[str, str], int]


class Relays:
    """
    The letters one origin broker handed over lately, by (kind, relay id),
    and for a service request whether it is done with here: kept by the
    pack across the origin's losses and returns (a partition, a restart of
    the origin), because the origin hands over again what it heard no
    answer for, and must then hear the answer it missed.

    @ivar send: sends a message to the origin over its current link (None
        while it is apart): answers for requests finished meanwhile wait
        for the origin to hand them over again.
    """

    def __init__(self, size: int = RECENT_RELAYS) -> None:
        self._size = size
        self._done: OrderedDict[tuple[int, int], bool] = OrderedDict()
        self.send: Callable[[Sequence[bytes]], None] | None = None

    def get(self, key: tuple[int, int]) -> bool | None:
        """None if not handed over lately; else whether it is done with here."""
        return self._done.get(key)

    def taken(self, key: tuple[int, int]) -> None:
        self._done[key] = False
        if len(self._done) > self._size:
            self._done.popitem(last=False)

    def forget(self, key: tuple[int, int]) -> None:
        self._done.pop(key, None)

    def finished(self, relay_id: int) -> Callable[[Letter], None]:
        """What a service request calls once done with here: the origin hears."""
        key = (packlink.SERVICE, relay_id)

        def finished(letter: Letter) -> None:
            if key in self._done:
                self._done[key] = True
            if self.send is not None:
                self.send(packlink.encode(packlink.Answer(relay_id, packlink.DONE, 200, "done")))

        return finished


class CountsRefusals(Protocol):
    """Counters with a count of the messages refused."""

    refused: int


def count_refusal(
    counters: CountsRefusals,
    log_limit: LogLimit,
    peer: PeerBroker,
    message: packlink.LinkMessage,
    error: Refused,
) -> None:
    """
    C{message} from C{peer} was refused (C{error}): counted, and logged as
    often as C{log_limit} lets (a peer decides how much it sends: a line
    per refusal would let it fill the log). For the messages a
    L{PeerBroker} applies, and those L{malamute_pack.pack.groups} does.
    """
    counters.refused += 1
    log_limit.info(
        "refused",
        "{peer}: refused {kind}: {reason}",
        peer=peer,
        kind=type(message).__name__,
        reason=error,
    )


@dataclass
class PeerCounters:
    """What one peer link has counted."""

    forwarded_in: int = 0
    duplicates: int = 0
    # Forwarded while earlier records of their origin were missing here:
    # dropped, and taken in order when the origin sends them again.
    deferred: int = 0
    # Records missing here that their origin never sent again.
    never_sent_again: int = 0
    letters_in: int = 0
    letters_repeated: int = 0
    refused: int = 0


class PeerBroker:
    """
    One peer broker: its sessions in the model and its messages applied.

    @ivar origin: the peer's stable broker id, what records it forwards are
        journaled with.
    @ivar addresses: the addresses its clients hold.
    """

    def __init__(
        self,
        broker: Broker,
        clock: IReactorTime,
        origin: str,
        name: str,
        outbox: PeerOutbox,
        marks: Marks,
        on_addresses: Callable[[str], None],
        relays: Relays | None = None,
        missing: Missing | None = None,
        firsts: dict[tuple[str, str], int] | None = None,
    ) -> None:
        """
        @param on_addresses: called with an address this peer stopped
            holding, or whose holding here may have to move (the pack
            finds who holds it now).
        """
        self._broker = broker
        self._clock = clock
        self.origin = origin
        self.name = name
        self.outbox = outbox
        self._marks = marks
        self._on_addresses = on_addresses
        self._relays = Relays() if relays is None else relays
        self.session = PeerSession(name, outbox, self._relays.forget)
        connection = broker.attach_remote(self.session)
        assert connection is not None
        self.session.connection = self.connection = connection
        self.addresses: set[str] = set()
        self.mailboxes: dict[str, RemoteHolder] = {}
        self.workers: dict[str, RemoteHolder] = {}
        self._offered: dict[tuple[str, str], int] = {}
        self._relays.send = outbox.send
        self.counters = PeerCounters()
        self._log_limit = LogLimit(clock, _log)
        # Records asked for again (L{rewind}), by (stream, origin): the
        # pack's, shared by the peer's connections, so that one that comes
        # after a reconnection asks for them too (L{Federation._interest}).
        self.missing: Missing = {} if missing is None else missing
        # The pack's: per (stream, origin) this copy held nothing of at
        # start, the first origin number taken (L{Federation._covers}).
        self._firsts: dict[tuple[str, str], int] = {} if firsts is None else firsts
        self._asking: dict[str, IDelayedCall] = {}
        # Per stream asked for again: (asks without one of them coming,
        # how many were missing at the last ask).
        self._asks: dict[str, tuple[int, int]] = {}
        # Streams whose peer is sending again what was missing (one of
        # them came, or it was asked too often): the first record past the
        # mark ends the missing (what it did not send is gone there).
        self._resending: set[str] = set()

    def __repr__(self) -> str:
        return f"<PeerBroker {self.name} {self.origin}>"

    # Lifetime

    def close(self) -> None:
        """The peer is gone: its connections end, letters it held go back to their queues."""
        self.outbox.stop()
        for call in self._asking.values():
            call.cancel()
        self._asking.clear()
        if self._relays.send == self.outbox.send:
            self._relays.send = None
        holders = [*self.mailboxes.values(), *self.workers.values()]
        returned = sum(len(h.connection.held) for h in holders if h.connection is not None)
        if returned:
            _log.info(
                "{peer} is gone holding {count} letters and requests: back in their queues",
                peer=self,
                count=returned,
            )
        for holder in holders:
            self._broker.detach_remote(holder)
        self.mailboxes.clear()
        self.workers.clear()
        self._offered.clear()
        self._broker.detach_remote(self.session)
        addresses, self.addresses = self.addresses, set()
        for address in addresses:
            self._on_addresses(address)

    def reset(self) -> None:
        """The peer starts telling its state anew (SYNC): forget what it told before."""
        streams = self._broker.streams
        for name in list(self.connection.reading):
            streams.cancel(self.connection, name)
        self.session.history.clear()
        for service in list(self.workers):
            self._drop_worker(service)
        self._offered.clear()
        addresses, self.addresses = self.addresses, set()
        for address in addresses:
            self._drop_mailbox(address)
            self._on_addresses(address)

    def rewind(self, stream: str, patterns: list[str]) -> None:
        """
        Records the peer forwarded on C{stream} were not written here (the
        pack noted them L{missing}): they are taken when they come again
        (though below the mark), and the peer is asked, after
        L{REWIND_DELAY}, to send again from the first of them, for each of
        C{patterns}. Until they come, what it forwards after them is not
        taken (it comes again after them): the copy here keeps its
        origin's order, which a group's members see.
        """
        if not patterns:
            return
        self._resending.discard(stream)
        self._asks.pop(stream, None)
        if stream not in self._asking:
            self._asking[stream] = self._clock.callLater(
                REWIND_DELAY, self._ask, stream, patterns, REWIND_DELAY
            )

    def _ask(self, stream: str, patterns: list[str], delay: float) -> None:
        del self._asking[stream]
        missing = self.missing.get((stream, self.origin))
        if not missing:
            self._asks.pop(stream, None)
            return
        asks, before = self._asks.get(stream, (0, 0))
        asks = asks + 1 if len(missing) >= before else 1
        self._asks[stream] = (asks, len(missing))
        if asks > MAX_ASKS:
            self._resending.add(stream)  # its next record past the mark ends it
        first = missing.min()
        for pattern in patterns:
            interest = packlink.Interest(stream, pattern, packlink.SEQUENCE, first, 1)
            self.outbox.send(packlink.encode(interest))
        delay = min(delay * 2, 60.0)
        self._asking[stream] = self._clock.callLater(delay, self._ask, stream, patterns, delay)

    # Input

    def receive(self, message: packlink.LinkMessage) -> None:
        """Apply one message from the peer; a refusal is logged and counted."""
        handler = self._handlers.get(type(message))
        if handler is None:
            return
        try:
            if message.HAS_CONTENT:
                self.check_size(message)
            handler(self, message)
        except Refused as e:
            count_refusal(self.counters, self._log_limit, self, message, e)

    def check_size(self, message: packlink.LinkMessage) -> None:
        """A peer is held to the limits a client is (its clients were)."""
        limits = self._broker.limits
        content: tuple[bytes, ...] = message.content  # type: ignore[attr-defined]
        if len(content) >= limits.max_frames or sum(map(len, content)) > limits.max_message_bytes:
            raise Refused(
                f"message too large: the limits are {limits.max_frames} frames"
                f" and {limits.max_message_bytes} bytes"
            )
        subject = getattr(message, "subject", "")
        if longer_than(subject, limits.max_subject):
            raise Refused(f"invalid subject: longer than {limits.max_subject} bytes")

    def _interest(self, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.Interest)
        broker = self._broker
        check_name("stream name", message.stream, broker.limits.max_address)
        limit = broker.limits.max_subscriptions * 16
        if self.connection.subscriptions() >= limit:
            raise Refused(f"too many interests from one peer: the limit is {limit}")
        streams = broker.streams
        if message.history and broker.store is not None:
            last = broker.store.last_seq(message.stream)
            self.session.history[message.stream] = max(
                last, self.session.history.get(message.stream, 0)
            )
        try:
            streams.read_from(
                self.connection, message.stream, message.pattern, message.whence, message.position
            )
        except Refused:
            if message.whence == packlink.LATEST:
                raise
            # No journal here: live from now on is all there is.
            streams.subscribe(self.connection, message.stream, message.pattern)
        streams.resume(self.connection, message.stream)

    def _uninterest(self, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.Uninterest)
        self._broker.streams.unsubscribe(self.connection, message.stream, message.pattern)

    def _address(self, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.Address)
        address = message.address
        check_name("address", address, self._broker.limits.max_address)
        if message.present:
            self.addresses.add(address)
            self.hold_address(address)
        else:
            self.addresses.discard(address)
            self._drop_mailbox(address)
            self._on_addresses(address)

    def hold_address(self, address: str) -> bool:
        """
        Have letters for C{address} (which this peer holds) go to the peer,
        unless a local client or another peer's holder has it; whether
        they go there now.
        """
        existing = self.mailboxes.get(address)
        if existing is not None and existing.connection is not None:
            if not existing.connection.gone:
                return True
            del self.mailboxes[address]  # a local client took the address over
        holder = RemoteHolder(self.session, self.outbox, Kind.MAILBOX, address, self._clock)
        connection = self._broker.attach_remote(holder, address)
        if connection is None:
            return False
        holder.connection = connection
        self.mailboxes[address] = holder
        self._broker.post.deliver_mail(connection)
        return True

    def _drop_mailbox(self, address: str) -> None:
        holder = self.mailboxes.pop(address, None)
        if holder is not None:
            self._broker.detach_remote(holder)

    def _offer(self, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.Offer)
        post = self._broker.post
        service = message.service
        check_name("service address", service, self._broker.limits.max_address)
        key = (service, message.pattern)
        holder = self.workers.get(service)
        if message.workers:
            if holder is None:
                holder = RemoteHolder(self.session, self.outbox, Kind.SERVICE, service, self._clock)
                connection = self._broker.attach_remote(holder)
                assert connection is not None
                holder.connection = connection
                self.workers[service] = holder
            assert holder.connection is not None
            post.offer(holder.connection, service, message.pattern)
            self._offered[key] = message.workers
        elif holder is not None and holder.connection is not None:
            self._offered.pop(key, None)
            post.unoffer(holder.connection, service, message.pattern)
            if not holder.connection.offers:
                self._drop_worker(service)
                return
        if holder is not None and holder.connection is not None:
            self._set_window(holder.connection, service)
            post.dispatch(post.service(service))

    def _set_window(self, connection: Connection, service: str) -> None:
        """As many requests in flight to the peer as it has workers for the service."""
        workers = max((n for (s, _), n in self._offered.items() if s == service), default=0)
        connection.credit = max(0, workers - len(connection.held))

    def _drop_worker(self, service: str) -> None:
        holder = self.workers.pop(service, None)
        if holder is not None:
            self._broker.detach_remote(holder)
        for key in [k for k in self._offered if k[0] == service]:
            del self._offered[key]

    def _forward(self, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.Forward)
        broker = self._broker
        check_name("stream name", message.stream, broker.limits.max_address)
        key = (message.stream, self.origin)
        missing = self.missing.get(key)
        if message.origin_seq <= self._marks.get(key, 0):
            if not missing or message.origin_seq not in missing:
                self.counters.duplicates += 1
                return
            missing.discard(message.origin_seq)  # not written before: taken now
            self._resending.add(message.stream)
            if not missing:
                self._found(message.stream)
        elif missing:
            if message.stream not in self._resending or not message.history:
                # Sent before what is missing came again: it comes after it.
                self.counters.deferred += 1
                return
            # Sent again past what is missing: the rest is gone there.
            self._never_sent_again(message.stream, missing)
            self._marks[key] = message.origin_seq
        else:
            if key not in self._marks:
                self._firsts.setdefault(key, message.origin_seq)
            self._marks[key] = message.origin_seq
        self.counters.forwarded_in += 1
        record = StreamRecord(
            message.stream,
            0,
            message.timestamp / 1_000_000,
            message.sender,
            message.subject,
            message.content,
            self.origin,
            message.origin_seq,
        )
        broker.streams.write_forwarded(
            self.connection, message.stream, record, bool(message.history)
        )

    def _found(self, stream: str) -> None:
        """Nothing of C{stream} is missing any more: forwards are taken as they come."""
        del self.missing[(stream, self.origin)]
        self._resending.discard(stream)
        self._asks.pop(stream, None)
        call = self._asking.pop(stream, None)
        if call is not None:
            call.cancel()

    def _never_sent_again(self, stream: str, missing: BitMap64) -> None:
        self.counters.never_sent_again += len(missing)
        _log.warn(
            "{peer}: {count} records of stream {stream} (from {first}) were not written here"
            " and it does not have them any more: lost here",
            peer=self,
            count=len(missing),
            stream=stream,
            first=missing.min(),
        )
        self._found(stream)

    def _letter(self, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.Letter)
        key = (message.kind, message.relay_id)
        done = self._relays.get(key)
        if done is not None:
            # Handed over again (our answer was lost): it is here already,
            # and the answer it missed is sent again.
            self.counters.letters_repeated += 1
            phase, reason = (packlink.DONE, "done") if done else (packlink.STORED, "stored")
            self.outbox.send(packlink.encode(packlink.Answer(message.relay_id, phase, 200, reason)))
            return
        self._relays.taken(key)
        self.counters.letters_in += 1
        if message.kind == packlink.SERVICE and not self._broker.interests.offering(
            message.address
        ):
            # Its workers here left since they were announced: the peer
            # tries another (rather than have it wait here, and be served twice).
            self.outbox.send(
                packlink.encode(
                    packlink.Answer(
                        message.relay_id, packlink.STORED, 503, "no worker offers it here now"
                    )
                )
            )
            self._relays.forget(key)
            return
        service = message.kind == packlink.SERVICE
        kind = Kind.SERVICE if service else Kind.MAILBOX
        send = mlm.ServiceSend if service else mlm.MailboxSend
        outbound = send(
            message.address,
            message.subject,
            message.tracker,
            message.timeout,
            list(message.content),
        )
        # A request is answered for again once done with here (a letter once stored).
        relay = self._relays.finished(message.relay_id) if service else None
        self.session.relays.append(key)
        self._broker.post.post(
            kind, self.connection, outbound, message.sender, relay, (self.origin, message.relay_id)
        )

    def _answer(self, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.Answer)
        post = self._broker.post
        holder = self._holder_of(message.relay_id)
        if holder is None or holder.connection is None:
            return  # the letter came back to its queue meanwhile (peer lost and found)
        connection = holder.connection
        if message.code != mlm.SUCCESS:
            _log.info(
                "{peer} refused letter {id}: {reason}",
                peer=self,
                id=message.relay_id,
                reason=message.reason,
            )
            # Not at once to the same peer: retried after a pause.
            del self.session.in_flight[message.relay_id]
            self._broker.stalled.add(connection)
            post.taken_back(connection, message.relay_id)
            return
        if holder.kind is Kind.MAILBOX:
            if message.phase == packlink.STORED:
                del self.session.in_flight[message.relay_id]
                post.passed_on(connection, message.relay_id)
            return
        if message.phase == packlink.DONE:
            del self.session.in_flight[message.relay_id]
            post.passed_on(connection, message.relay_id)
            self._set_window(connection, holder.name)
            post.dispatch(post.service(holder.name))

    def _holder_of(self, letter_id: int) -> RemoteHolder | None:
        in_flight = self.session.in_flight
        holder = in_flight.get(letter_id)
        if holder is None:
            return None
        if holder.connection is None or letter_id not in holder.connection.held:
            del in_flight[letter_id]  # back in its queue meanwhile (a lease ended...)
            return None
        return holder

    def _confirm(self, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.Confirm)
        sender = self._broker.registry.holder(message.address)
        if sender is not None and not sender.remote:
            sender.session.confirm(message.tracker, message.code, message.reason)

    _handlers: dict[type[packlink.LinkMessage], Callable[[PeerBroker, packlink.LinkMessage], None]]


PeerBroker._handlers = {
    packlink.Interest: PeerBroker._interest,
    packlink.Uninterest: PeerBroker._uninterest,
    packlink.Address: PeerBroker._address,
    packlink.Offer: PeerBroker._offer,
    packlink.Forward: PeerBroker._forward,
    packlink.Letter: PeerBroker._letter,
    packlink.Answer: PeerBroker._answer,
    packlink.Confirm: PeerBroker._confirm,
}
