"""
The pack as one broker takes part in it: the ZRE node's events (a peer
broker joined the pack's group, left it, whispered) turned into
L{PeerBroker}s, and the local clients' interests, addresses and offers
(L{malamute_pack.broker.interests}) announced to every peer broker, as a
full resynchronisation when a peer joins and as deltas afterwards.

Only peers that join the ZRE group named after the pack and speak our
inter-broker protocol version federate. Forwarding is one hop over a full
mesh: a record a peer forwarded here is delivered here only, never sent on.

In a CURVE pack whose clients authenticate, the brokers also tell each
other who owns which address (OWNER: each claim made here, and all of them
at a resynchronisation) and keep the claim that prevails, so an address
belongs to its owner on every broker of the pack. Only listed brokers are
believed: an open pack tells and believes no claims (any process could
join it and claim every address).

Socket-free: the node's whisper is a function it is given.

Tests: ``tests/unit/test_pack_federation.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pyroaring import BitMap64
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.access import Claim, Owners
from malamute_pack.broker.broker import Broker
from malamute_pack.broker.letters import Kind
from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.pack.groups import PackGroups
from malamute_pack.pack.outbox import PeerOutbox
from malamute_pack.pack.peer_broker import Marks, Missing, PeerBroker, Relays
from malamute_pack.protocol import mlm, packlink

_log = Logger()

# The HELLO headers a broker's ZRE node carries.
HEADER_PACK = "X-MALAMUTE-PACK"
HEADER_PROTOCOL = "X-MALAMUTE-PROTOCOL"
PROTOCOL = str(packlink.VERSION)


class ZrePeerInfo(Protocol):
    """What the pack needs of a ZRE peer (L{malamute_pack.pack.node.ZrePeer})."""

    uuid: bytes
    name: str
    headers: dict[str, str]


# Whispers frames to the peer with a uuid; False if its link's queue is full.
WhisperTo = Callable[[bytes, Sequence[bytes]], bool]


# Seconds taken off a time a peer is asked to send its records from, for
# the skew between the brokers' clocks.
CLOCK_SKEW = 5.0


@dataclass
class PackCounters:
    """What the pack has counted."""

    malformed: int = 0
    strangers: int = 0
    incompatible: int = 0
    joined: int = 0
    left: int = 0
    overflowed: int = 0
    owners_learned: int = 0  # OWNER claims that changed who owns an address here
    owners_ignored: int = 0  # OWNER claims not believed (an open pack) or not kept
    forwards_failed: int = 0  # forwarded records not written here (asked for again)


class Pack:
    """
    This broker's part in a pack: the L{NodeEvents} of its ZRE node and
    the L{InterestListener} of its model.

    @ivar peers: the peer brokers of the pack, by ZRE uuid.
    @ivar by_origin: the same peer brokers, by origin id (kept in step with
        L{peers}).
    """

    def __init__(
        self,
        broker: Broker,
        clock: IReactorTime,
        name: str,
        broker_id: str,
        whisper: WhisperTo,
        marks: Marks,
        outbox_limit: int = 16 * 1024 * 1024,
        owners: Owners | None = None,
        since: Mapping[str, float] | None = None,
    ) -> None:
        """
        @param owners: the owners of addresses, told to and learned from
            the peers (a CURVE pack whose clients authenticate); None: no
            claim is told or believed.
        @param since: per stream, the time of its newest record here at
            start (the journal's C{newest_times}).
        @param name: the pack's name (the ZRE group its brokers join).
        @param broker_id: this broker's stable id (its ZRE uuid in hex).
        @param marks: the highest origin sequence number taken per (stream,
            origin), from the journal at start (updated as records come).
        @param outbox_limit: bytes of control messages that may wait for
            one peer (its link full); past them the peer is dropped.
        """
        self._broker = broker
        self._clock = clock
        self.name = name
        self.broker_id = broker_id
        self._whisper = whisper
        self._marks = marks
        # Records peers forwarded that were not written here, by (stream,
        # origin): asked for again (PeerBroker.rewind), also after a reconnection.
        self._missing: Missing = {}
        # When this broker last took part in each stream (its newest record
        # at start), and when each peer last left: a peer nothing was taken
        # from yet is asked for what it wrote since (less CLOCK_SKEW).
        self._since = dict(since or {})
        self._left: dict[str, float] = {}
        self._started = clock.seconds()
        self._outbox_limit = outbox_limit
        self._owners = owners
        self.peers: dict[bytes, PeerBroker] = {}
        self.by_origin: dict[str, PeerBroker] = {}
        # Per origin, the letters its broker handed over lately (L{Relays}).
        self._relays: dict[str, Relays] = {}
        self.counters = PackCounters()
        self._log_limit = LogLimit(clock, _log)
        # Per (stream, origin) of which this copy held nothing at start: the
        # first origin number taken since (what comes before it is not here).
        self._firsts: dict[tuple[str, str], int] = {}
        self.groups = PackGroups(
            broker, clock, broker_id, self.by_origin, owners is not None, self._covers
        )

    def start(self) -> None:
        self._started = self._clock.seconds()
        self._broker.interests.listener = self
        self._broker.streams.on_forward_failed = self._forward_failed
        self.groups.start()
        if self._owners is not None:
            self._owners.listeners.append(self._claimed)
        self._remember_relayed()

    def _remember_relayed(self) -> None:
        """
        The letters peers handed over that the journal gave back at start:
        known when a peer hands one over again (it heard no answer before
        this broker stopped), and a request answered for once done.
        """
        post = self._broker.post
        queues = [*post.mailboxes.values(), *(s.queue for s in post.services.values())]
        for queue in queues:
            for letter in queue:
                if letter.relay_key is None:
                    continue
                origin, relay_id = letter.relay_key
                relays = self._relays.setdefault(origin, Relays())
                if letter.kind is Kind.SERVICE:
                    relays.taken((packlink.SERVICE, relay_id))
                    letter.relay = relays.finished(relay_id)
                else:
                    relays.taken((packlink.MAILBOX, relay_id))

    def stop(self) -> None:
        self.groups.stop()
        self._broker.interests.listener = None
        self._broker.streams.on_forward_failed = None
        if self._owners is not None and self._claimed in self._owners.listeners:
            self._owners.listeners.remove(self._claimed)
        for uuid in list(self.peers):
            self._remove(uuid)

    # The ZRE node's events

    def peer_entered(self, peer: ZrePeerInfo) -> None:
        pass  # a pack member once it joins the pack's group

    def peer_joined(self, peer: ZrePeerInfo, group: str) -> None:
        if group != self.name or peer.uuid in self.peers:
            return
        if peer.headers.get(HEADER_PROTOCOL) != PROTOCOL:
            self.counters.incompatible += 1
            _log.warn(
                "broker {name} joined pack {pack} speaking inter-broker protocol {version!r},"
                " not {ours!r}: ignored",
                name=peer.name,
                pack=self.name,
                version=peer.headers.get(HEADER_PROTOCOL),
                ours=PROTOCOL,
            )
            return
        self._add(peer)

    def peer_left(self, peer: ZrePeerInfo, group: str) -> None:
        if group == self.name:
            self._remove(peer.uuid)

    def peer_exited(self, peer: ZrePeerInfo) -> None:
        self._remove(peer.uuid)

    def peer_evasive(self, peer: ZrePeerInfo) -> None:
        pass

    def whispered(self, peer: ZrePeerInfo, content: list[bytes]) -> None:
        member = self.peers.get(peer.uuid)
        if member is None:
            self.counters.strangers += 1
            return
        try:
            message = packlink.decode(content)
        except packlink.MalformedLink as e:
            self.counters.malformed += 1
            self._log_limit.info(
                "malformed", "malformed message from {peer}: {reason}", peer=member, reason=e
            )
            return
        if isinstance(message, packlink.Sync):
            member.reset()
            self.groups.peer_reset(member)
        elif isinstance(message, packlink.Owner):
            self._learn(member, message)
        elif isinstance(message, packlink.GROUP_MESSAGES):
            self.groups.receive(member, message)
        else:
            member.receive(message)

    def shouted(self, peer: ZrePeerInfo, group: str, content: list[bytes]) -> None:
        pass

    # Members

    def _add(self, peer: ZrePeerInfo) -> None:
        uuid = peer.uuid
        origin = uuid.hex().upper()

        def whisper(frames: Sequence[bytes]) -> bool:
            return self._whisper(uuid, frames)

        def overflow() -> None:
            self.counters.overflowed += 1
            _log.warn("pack peer {name} does not read what it is sent: dropped", name=peer.name)
            self._clock.callLater(0, self._remove, uuid)

        outbox = PeerOutbox(whisper, self._clock, overflow, self._outbox_limit)
        member = PeerBroker(
            self._broker,
            self._clock,
            origin,
            peer.name,
            outbox,
            self._marks,
            self._rehome,
            self._relays.setdefault(origin, Relays()),
            self._missing,
            self._firsts,
        )
        self.peers[uuid] = member
        self.by_origin[origin] = member
        self.counters.joined += 1
        _log.info("pack {pack}: broker {name} joined", pack=self.name, name=peer.name)
        self._resync(member)
        self.groups.tell(member)  # what groups acknowledged, before members move there
        self.groups.rehome()

    def _remove(self, uuid: bytes) -> None:
        member = self.peers.pop(uuid, None)
        if member is None:
            return
        del self.by_origin[member.origin]
        self._left[member.origin] = self._clock.seconds()
        self.counters.left += 1
        _log.info("pack {pack}: broker {name} left", pack=self.name, name=member.name)
        member.close()
        self.groups.peer_gone(member.origin)
        self.groups.rehome()

    def _resync(self, member: PeerBroker) -> None:
        """Tell C{member} everything, from scratch."""
        send = member.outbox.send
        send(packlink.encode(packlink.Sync(self.broker_id)))
        interests = self._broker.interests
        for stream, pattern in interests.readings():
            send(packlink.encode(self._interest(member, stream, pattern)))
        for stream, origin in list(self._missing):
            if origin == member.origin:  # asked for above: asked again until they come
                member.rewind(stream, self._patterns(stream))
        for address in interests.addresses():
            send(packlink.encode(packlink.Address(address, 1)))
        for service, pattern, workers in interests.offers():
            send(packlink.encode(packlink.Offer(service, pattern, workers)))
        if self._owners is not None:
            for address, claim in self._owners.claims():
                send(packlink.encode(_owner(address, claim)))

    def _interest(self, member: PeerBroker, stream: str, pattern: str) -> packlink.Interest:
        """
        Our readers' interest, as a (re)connected peer is told it: from
        after the last record taken from it on that stream (none lost while
        apart); if none was ever taken, what it wrote since this broker last
        took part (the peer left; else the stream's newest record here at
        start; else since this broker started: a peer seen for the first
        time, a new member, is asked for all it wrote meanwhile), a few
        seconds earlier for the clocks' skew (nothing of it is here, so
        nothing comes twice).
        """
        mark = self._marks.get((stream, member.origin))
        missing = self._missing.get((stream, member.origin))
        if missing:
            # Records of it not written here (a full disk), asked for again
            # when the link broke (found by the soak: never asked for again).
            return packlink.Interest(stream, pattern, packlink.SEQUENCE, missing.min())
        if mark is not None:
            return packlink.Interest(stream, pattern, packlink.SEQUENCE, mark + 1)
        since = self._left.get(member.origin, self._since.get(stream, self._started))
        position = max(0, round((since - CLOCK_SKEW) * 1000))
        return packlink.Interest(stream, pattern, packlink.TIME, position)

    def _forward_failed(self, stream: str, origin: str, origin_seqs: list[int]) -> None:
        """
        Records C{origin} forwarded on C{stream} (its numbers C{origin_seqs})
        were not written here (a full disk): asked for again, and taken
        when they come though the mark is past them.
        """
        self.counters.forwards_failed += len(origin_seqs)
        # Noted whether or not the origin is here: asked for when it is.
        self._missing.setdefault((stream, origin), BitMap64()).update(origin_seqs)
        member = self.by_origin.get(origin)
        if member is None:
            return
        member.rewind(stream, self._patterns(stream))

    def _covers(self, stream: str, origin: str, after: int) -> bool:
        """
        Whether this copy of C{stream} holds every record of C{origin}
        numbered past C{after} there: yes if this copy held its records at
        start or took them from at or below C{after} (or from the origin's
        first, 1); no if it took its first one past that (a copy started
        afresh is asked only for what the peer wrote since it started). An
        C{after} of 0 is not taken to say that nothing was acknowledged: a
        broker started afresh may not have been told yet (found by the
        soak).
        """
        first = self._firsts.get((stream, origin))
        return first is None or first <= max(after, 1)

    def _patterns(self, stream: str) -> list[str]:
        """The patterns this broker's readers read C{stream} with."""
        return [p for s, p in self._broker.interests.readings() if s == stream]

    # Owners of addresses

    def _claimed(self, address: str, claim: Claim) -> None:
        """A client here claimed C{address}: every peer hears it."""
        self._broadcast(_owner(address, claim))

    def _learn(self, member: PeerBroker, message: packlink.Owner) -> None:
        owners = self._owners
        if owners is None:
            self.counters.owners_ignored += 1
            return
        claim = Claim(message.user, message.claimed / 1_000_000)
        if not message.address or not message.user:
            self.counters.owners_ignored += 1
        elif owners.learn(message.address, claim):
            self.counters.owners_learned += 1
            self._log_limit.info(
                "owner",
                "pack: {peer} says user {user!r} owns {address!r}",
                peer=member.name,
                user=message.user,
                address=message.address,
            )

    def _broadcast(self, message: packlink.LinkMessage) -> None:
        if not self.peers:
            return
        frames = packlink.encode(message)
        for member in self.peers.values():
            member.outbox.send(frames)

    def _rehome(self, address: str) -> None:
        """Letters for C{address} go to whoever holds it now (a peer, if no local client)."""
        if self._broker.registry.holder(address) is not None:
            return
        for member in self.peers.values():
            if address in member.addresses and member.hold_address(address):
                return

    # The model's interests (InterestListener)

    def reading_started(self, stream: str, pattern: str) -> None:
        self._broadcast(packlink.Interest(stream, pattern))

    def reading_stopped(self, stream: str, pattern: str) -> None:
        self._broadcast(packlink.Uninterest(stream, pattern))

    def history_wanted(self, stream: str, pattern: str, whence: int, position: int) -> None:
        for member in self.peers.values():
            mark = self._marks.get((stream, member.origin))
            if mark is not None:
                message = packlink.Interest(stream, pattern, packlink.SEQUENCE, mark + 1, 1)
            elif whence == mlm.TIME:
                message = packlink.Interest(stream, pattern, packlink.TIME, position, 1)
            else:
                # A sequence number here means nothing there: all it holds.
                message = packlink.Interest(stream, pattern, packlink.EARLIEST, 0, 1)
            member.outbox.send(packlink.encode(message))

    def address_opened(self, address: str) -> None:
        self._broadcast(packlink.Address(address, 1))

    def address_closed(self, address: str) -> None:
        self._broadcast(packlink.Address(address, 0))
        self._rehome(address)

    def offers_changed(self, service: str, pattern: str, workers: int) -> None:
        self._broadcast(packlink.Offer(service, pattern, workers))


def _owner(address: str, claim: Claim) -> packlink.Owner:
    return packlink.Owner(address, claim.user, round(claim.claimed * 1_000_000))
