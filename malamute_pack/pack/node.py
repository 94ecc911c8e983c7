"""
A ZRE node (RFC 36, as C zyre runs it): who our peers are, which groups
they are in, and what they say to us, with no socket of its own.

The node is told what the network says (L{ZreNode.discovered} from a beacon
or gossip, L{ZreNode.departed} from a port-0 beacon, L{ZreNode.receive} for
each message on our inbox ROUTER) and talks to each peer through a L{Link}
(one DEALER connected to the peer's inbox) that the injected L{Connect}
makes. What happens to peers is reported to L{NodeEvents}. Time comes from
an injected C{IReactorTime}.

The rules, as zyre keeps them:
 - A link's messages are numbered from 1 (its HELLO), wrapping from 65535
   to 0; a receiver starts again at each HELLO and drops the peer on any
   gap. pyre wraps from 65534 to 0: that one step is accepted (and
   counted in C{sequence_quirks}) rather than dropping every pyre peer
   after 65534 messages.
 - The status byte counts a node's own JOINs and LEAVEs. A peer's JOIN or
   LEAVE must carry our count for it plus one, or the peer is dropped.
 - A HELLO from an unknown peer connects back to the endpoint it names; a
   HELLO from a peer already entered means it restarted: it exits and
   enters again. Anything else from a peer that has not said HELLO is
   dropped and counted.
 - A peer silent for C{evasive} seconds is reported evasive and PINGed
   (once per silence); silent for C{expired} seconds it exits. GOODBYE
   and a port-0 beacon make it exit at once.

One deviation, for the broker's flow control: a WHISPER or SHOUT that the
link refuses (its queue is full) consumes no sequence number and leaves the
peer alone, so the caller can try again later. A HELLO, JOIN, LEAVE, PING
or PING_OK that cannot be sent drops the peer, as zyre does.

With CURVE (RFC 43, as zyre with C{zyre_set_zcert}: a node given its
public key and L{PeerKeys}), a node is a peer only if its public key is
listed: it is linked to only when a beacon or gossip names a listed key
(the link is CURVE with that key as the server's), its HELLO must carry
C{X-PUBLICKEY} and arrive on a connection authenticated as that key, and
every later message must come from that key (the inbox reads each
message's key, which ZAP set: L{receive}'s C{key}). A node that names no
key, or another, is never linked to nor heard; it is counted and reported
(L{Stranger}). A key no longer listed (L{drop_keys}) loses its peer at
once. Beacons are not authenticated, so a CURVE node lets them find new
nodes only: a peer that entered is moved (another endpoint, another key)
or dropped (a port-0 beacon) only by its own link (a new HELLO, GOODBYE)
or by its silence.

Tests: ``tests/unit/test_pack_node.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall

from malamute_pack.protocol import zre

UUID_SIZE = 16
# A DEALER's routing id on a peer's inbox: 0x01 then the sender's uuid
# (libzmq once refused ids starting with a zero byte).
IDENTITY_PREFIX = b"\x01"
REAP_INTERVAL = 1.0  # seconds between checks of the peers' timers, as zyre


class Link(Protocol):
    """One outgoing DEALER to a peer's inbox."""

    def send(self, frames: Sequence[bytes]) -> bool:
        """Queue one message; False if the queue is full and it was not sent."""

    def close(self) -> None:
        """Disconnect; nothing more is sent."""


# An endpoint and the server's CURVE public key (Z85; None without CURVE)
# to a new link to it, whose DEALER has the routing id 0x01 + our uuid.
# May raise ValueError for an endpoint it cannot connect to.
Connect = Callable[[str, bytes | None], Link]

# The header in which a CURVE node's HELLO carries its public key (Z85), as zyre.
PUBLIC_KEY_HEADER = "X-PUBLICKEY"


class PeerKeys(Protocol):
    """Which public keys (Z85) may be peers of a CURVE node."""

    def admits(self, key: bytes) -> bool:
        """Whether C{key} is listed."""


# Told of a node that is not let in: why, its uuid, where, and its key (if any).
Stranger = Callable[[str, bytes, str, bytes | None], None]


class NodeEvents(Protocol):
    """What a node reports about its peers."""

    def peer_entered(self, peer: ZrePeer) -> None:
        """C{peer} said HELLO: it is in L{ZreNode.peers} from now on."""

    def peer_exited(self, peer: ZrePeer) -> None:
        """C{peer} left, expired or was dropped: it is no longer in L{ZreNode.peers}."""

    def peer_joined(self, peer: ZrePeer, group: str) -> None:
        """C{peer} is in C{group} (from its HELLO or a JOIN)."""

    def peer_left(self, peer: ZrePeer, group: str) -> None:
        """C{peer} left C{group}."""

    def whispered(self, peer: ZrePeer, content: list[bytes]) -> None:
        """C{peer} sent us C{content}."""

    def shouted(self, peer: ZrePeer, group: str, content: list[bytes]) -> None:
        """
        C{peer} sent C{content} to C{group}. Delivered whether or not we
        are in C{group}, as zyre does (a shout can cross our LEAVE).
        """

    def peer_evasive(self, peer: ZrePeer) -> None:
        """C{peer} has been silent for C{evasive} seconds; it was sent a PING."""


@dataclass
class NodeCounters:
    """What a node dropped or refused, by reason."""

    malformed: int = 0  # messages that did not decode
    unknown_identity: int = 0  # routing ids not 0x01 + 16 bytes, or our own
    not_ready: int = 0  # messages other than HELLO from a peer with no HELLO
    sequence_gaps: int = 0  # peers dropped for a message out of sequence
    sequence_quirks: int = 0  # pyre's wrap from 65534 to 0, accepted
    status_mismatches: int = 0  # peers dropped for a JOIN/LEAVE status out of step
    peers_expired: int = 0  # peers that exited after `expired` seconds of silence
    pending_expired: int = 0  # peers connected to that never said HELLO
    sends_refused: int = 0  # WHISPERs and SHOUTs a full link did not take
    links_lost: int = 0  # peers dropped because a HELLO/JOIN/LEAVE/PING could not go
    bad_endpoints: int = 0  # endpoints the connect function refused
    restarts: int = 0  # peers seen again with a new HELLO or at a new endpoint
    not_listed: int = 0  # CURVE: nodes discovered or heard with a key not listed
    no_key: int = 0  # CURVE: nodes discovered, or HELLOs, with no key (open nodes)
    key_mismatches: int = 0  # CURVE: a HELLO or message from another key than the peer's
    keys_dropped: int = 0  # CURVE: peers dropped when their key was no longer listed


class ZrePeer:
    """
    A peer: another node we have a link to.

    @ivar uuid: its 16-byte uuid.
    @ivar endpoint: the inbox endpoint our link is connected to.
    @ivar name: the name from its HELLO.
    @ivar headers: the headers from its HELLO.
    @ivar groups: the groups it is in.
    @ivar ready: whether it has said HELLO (it is in L{ZreNode.peers}).
    @ivar key: its CURVE public key (Z85), or None without CURVE.
    """

    __slots__ = (
        "endpoint",
        "endpoints",
        "evasive",
        "groups",
        "headers",
        "key",
        "last_heard",
        "link",
        "name",
        "ready",
        "sent_sequence",
        "status",
        "uuid",
        "want_sequence",
    )

    def __init__(
        self, uuid: bytes, endpoint: str, link: Link, now: float, key: bytes | None = None
    ) -> None:
        self.uuid = uuid
        self.key = key
        self.endpoint = endpoint
        # Every endpoint it is known by (beacon source, HELLO): another is a restart.
        self.endpoints = {endpoint}
        self.link = link
        self.name = ""
        self.headers: dict[str, str] = {}
        self.groups: set[str] = set()
        self.ready = False
        self.sent_sequence = 0  # the last sequence number we sent it
        self.want_sequence = 0  # the last sequence number it sent us
        self.status = 0  # its join/leave count, as we have seen it
        self.last_heard = now
        self.evasive = False  # reported evasive since it was last heard

    def __repr__(self) -> str:
        return f"<ZrePeer {self.uuid.hex()} {self.name!r} at {self.endpoint}>"


_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
_PING = zre.encode(zre.Ping(0))
_PING_OK = zre.encode(zre.PingOk(0))
_GOODBYE = zre.encode(zre.Goodbye(0))


class ZreNode:
    """
    One ZRE node's peers, groups and timers (see the module).

    @ivar uuid: our 16-byte uuid.
    @ivar name: our name, sent in HELLO.
    @ivar endpoint: our inbox's endpoint, sent in HELLO (may be set after
        construction, before L{start}).
    @ivar groups: the groups we are in.
    @ivar status: our join/leave count (a u8).
    @ivar peers: the peers that have said HELLO, by uuid.
    @ivar counters: what was dropped, by reason.
    """

    def __init__(
        self,
        clock: IReactorTime,
        uuid: bytes,
        name: str,
        endpoint: str,
        connect: Connect,
        events: NodeEvents,
        headers: Mapping[str, str] = _NO_HEADERS,
        evasive: float = 5.0,
        expired: float = 30.0,
        reap_interval: float = REAP_INTERVAL,
        public_key: bytes | None = None,
        peer_keys: PeerKeys | None = None,
        stranger: Stranger | None = None,
    ) -> None:
        """
        @param public_key: our CURVE public key (Z85): a CURVE node, whose
            peers must be listed in C{peer_keys} (both or neither).
        @param stranger: told of each node not let in (for the log).
        @raise ValueError: a uuid not of 16 bytes, or a name, endpoint or
            header that does not fit in a HELLO.
        """
        if (public_key is None) != (peer_keys is None):
            raise ValueError("a CURVE node needs both its public key and the peers' keys")
        if len(uuid) != UUID_SIZE:
            raise ValueError(f"a uuid is 16 bytes, not {len(uuid)}")
        self._clock = clock
        self.uuid = uuid
        self.name = name
        self.endpoint = endpoint
        self.headers = dict(headers)
        self.public_key = public_key
        self._peer_keys = peer_keys
        self._stranger = stranger
        if public_key is not None:
            self.headers[PUBLIC_KEY_HEADER] = public_key.decode("ascii")
        self._connect_link = connect
        self._events = events
        self.evasive = evasive
        self.expired = expired
        self.groups: set[str] = set()
        self.status = 0
        self.peers: dict[bytes, ZrePeer] = {}
        self._pending: dict[bytes, ZrePeer] = {}  # linked to, no HELLO from them yet
        self.counters = NodeCounters()
        self._running = False
        self._reaper = LoopingCall(self._reap)
        self._reaper.clock = clock
        self._reap_interval = reap_interval
        self._hello()  # fails now for a name or header that cannot be sent

    @property
    def running(self) -> bool:
        """Whether the node is started (and not stopped)."""
        return self._running

    @property
    def curve(self) -> bool:
        """Whether this is a CURVE node (its peers' keys are listed)."""
        return self._peer_keys is not None

    def _refuse(self, why: str, uuid: bytes, endpoint: str, key: bytes | None) -> None:
        if why == "no key":
            self.counters.no_key += 1
        elif why == "not listed":
            self.counters.not_listed += 1
        else:
            self.counters.key_mismatches += 1
        if self._stranger is not None:
            self._stranger(why, uuid, endpoint, key)

    def _admits(self, uuid: bytes, endpoint: str, key: bytes | None) -> bool:
        """Whether a node with C{key} may be a peer (always, without CURVE)."""
        keys = self._peer_keys
        if keys is None:
            return True
        if key is None:
            self._refuse("no key", uuid, endpoint, key)
            return False
        if not keys.admits(key):
            self._refuse("not listed", uuid, endpoint, key)
            return False
        return True

    def drop_keys(self, keys: set[bytes]) -> None:
        """C{keys} are no longer listed: their peers are dropped at once."""
        for peer in self._all_peers():
            if peer.key is not None and peer.key in keys:
                self.counters.keys_dropped += 1
                self._drop(peer)

    def _all_peers(self) -> Iterator[ZrePeer]:
        """Every peer with a link (entered or not), in a list safe to mutate under."""
        return iter([*self.peers.values(), *self._pending.values()])

    def _known(self, uuid: bytes) -> ZrePeer | None:
        return self.peers.get(uuid) or self._pending.get(uuid)

    def knows(self, uuid: bytes) -> bool:
        """Whether node C{uuid} is a peer, or one being linked to."""
        return self._known(uuid) is not None

    # Lifetime

    def start(self) -> None:
        """Start the peers' timers; from now on the node hears the network."""
        if self._running:
            return
        self._running = True
        self._reaper.start(self._reap_interval, now=False)

    def heard_all(self) -> None:
        """
        Count every peer as heard just now: after our own reading paused
        (backpressure), their silence was ours, not theirs.
        """
        now = self._clock.seconds()
        for peer in self._all_peers():
            peer.last_heard = now

    def stop(self) -> None:
        """
        Say GOODBYE to every peer, close every link and stop the timers. No
        event is reported for the peers forgotten; L{peers} is empty after.
        """
        if not self._running:
            return
        self._running = False
        if self._reaper.running:
            self._reaper.stop()
        peers = list(self._all_peers())
        self.peers.clear()
        self._pending.clear()
        for peer in peers:
            self._send(peer, _GOODBYE)
            peer.link.close()

    # Our groups

    def join(self, group: str) -> None:
        """
        Join C{group} and tell every peer (nothing if already in it).

        @raise ValueError: a group name longer than 255 UTF-8 bytes.
        """
        if group in self.groups:
            return
        zre.encode(zre.Join(0, group, 0))  # a name too long fails before any change
        self.groups.add(group)
        self._tell_status(zre.Join, group)

    def leave(self, group: str) -> None:
        """Leave C{group} and tell every peer (nothing if not in it)."""
        if group not in self.groups:
            return
        self.groups.discard(group)
        self._tell_status(zre.Leave, group)

    def _tell_status(self, kind: type[zre.Join] | type[zre.Leave], group: str) -> None:
        self.status = (self.status + 1) & 0xFF
        frames = zre.encode(kind(0, group, self.status))
        # Peers not yet heard from have our HELLO and count our status too.
        for peer in self._all_peers():
            if self._known(peer.uuid) is peer:
                self._control(peer, frames)

    # Sending

    def whisper(self, uuid: bytes, content: Sequence[bytes]) -> bool:
        """
        Send C{content} to the peer C{uuid}.

        @return: False if its link is full (nothing sent, no sequence number
            used, the peer kept: try again later).
        @raise KeyError: no such peer in L{peers}.
        """
        peer = self.peers[uuid]
        sent = self._send(peer, [zre.header(zre.Whisper.ID, 0), *content])
        if not sent:
            self.counters.sends_refused += 1
        return sent

    def shout(self, group: str, content: Sequence[bytes]) -> int:
        """
        Send C{content} to every peer in C{group}.

        @return: how many peers it was sent to; the others' links were full
            (counted in C{sends_refused}).
        @raise ValueError: a group name longer than 255 UTF-8 bytes.
        """
        frames = zre.encode(zre.Shout(0, group, tuple(content)))
        sent = 0
        for peer in self.peers.values():
            if group in peer.groups:
                if self._send(peer, frames):
                    sent += 1
                else:
                    self.counters.sends_refused += 1
        return sent

    def _send(self, peer: ZrePeer, frames: Sequence[bytes]) -> bool:
        """Number C{frames} for C{peer}'s link and send them; False if refused."""
        previous = peer.sent_sequence
        sequence = (previous + 1) & 0xFFFF
        # Taken before sending: a link that delivers at once can bring a
        # reply that makes us send again on this link.
        peer.sent_sequence = sequence
        if peer.link.send(zre.resequence(frames, sequence)):
            return True
        peer.sent_sequence = previous  # a refused send delivered nothing
        return False

    def _control(self, peer: ZrePeer, frames: Sequence[bytes]) -> bool:
        """Send a message the protocol cannot do without; drop the peer if refused."""
        if self._send(peer, frames):
            return True
        self.counters.links_lost += 1
        self._drop(peer)
        return False

    def _hello(self) -> list[bytes]:
        return zre.encode(
            zre.Hello(
                0,
                self.endpoint,
                tuple(sorted(self.groups)),
                self.status,
                self.name,
                tuple(self.headers.items()),
            )
        )

    # Peers coming and going

    def _connect(self, uuid: bytes, endpoint: str, key: bytes | None) -> ZrePeer | None:
        """Link to a new peer (its CURVE key: C{key}) and say HELLO; None if that failed."""
        try:
            link = self._connect_link(endpoint, key if self.curve else None)
        except ValueError:
            self.counters.bad_endpoints += 1
            return None
        peer = ZrePeer(uuid, endpoint, link, self._clock.seconds(), key if self.curve else None)
        self._pending[uuid] = peer
        if not self._control(peer, self._hello()):
            return None
        return peer

    def _drop(self, peer: ZrePeer) -> None:
        """Forget C{peer} and close its link; report its exit if it had entered."""
        if self.peers.get(peer.uuid) is peer:
            del self.peers[peer.uuid]
        elif self._pending.get(peer.uuid) is peer:
            del self._pending[peer.uuid]
        else:
            return
        peer.link.close()
        if peer.ready:
            peer.ready = False
            self._events.peer_exited(peer)

    def _purge_endpoint(
        self, uuid: bytes, endpoint: str, key: bytes | None = None, proved: bool = False
    ) -> None:
        """
        Another uuid at C{endpoint}: the node there restarted with a new
        uuid. A CURVE peer that has entered goes only when its own key says
        so (C{proved}: a HELLO on a connection authenticated as C{key}), not
        on a beacon's word, nor on another listed key's.
        """
        for other in self._all_peers():
            if other.uuid != uuid and endpoint in other.endpoints:
                if self.curve and other.ready and not (proved and other.key == key):
                    continue
                self.counters.restarts += 1
                self._drop(other)

    def discovered(self, uuid: bytes, endpoint: str, key: bytes | None = None) -> None:
        """
        A beacon or gossip says node C{uuid} has its inbox at C{endpoint}
        (with the CURVE public key C{key}, Z85): link to it and say HELLO if
        it is new (never to ourselves). A peer known at other endpoints, or
        with another key, restarted: it is dropped and linked to again. A
        known peer is refreshed, as a beacon does in zyre. A CURVE node
        links only to listed keys; a node without CURVE ignores a node with
        a key (it could not talk to it).
        """
        if not self._running or uuid == self.uuid or endpoint == self.endpoint:
            return
        if len(uuid) != UUID_SIZE:
            self.counters.unknown_identity += 1
            return
        if not self.curve:
            if key is not None:
                return
        elif not self._admits(uuid, endpoint, key):
            return
        peer = self._known(uuid)
        if peer is not None:
            if endpoint in peer.endpoints and peer.key == key:
                peer.last_heard = self._clock.seconds()
                return
            if self.curve and peer.ready:
                # Anyone can send a beacon: a CURVE peer is moved only by
                # what its authenticated link says (a new HELLO).
                return
            self.counters.restarts += 1
            self._drop(peer)
        if self.curve and any(
            other.uuid != uuid and endpoint in other.endpoints for other in self.peers.values()
        ):
            return  # likewise: a beacon cannot push a CURVE peer out
        self._purge_endpoint(uuid, endpoint)
        self._connect(uuid, endpoint, key)

    def departed(self, uuid: bytes) -> None:
        """
        A port-0 beacon: node C{uuid} is leaving. A CURVE node ignores it:
        anyone can send one, and a CURVE peer says GOODBYE on its link or
        falls silent.
        """
        if not self._running or self.curve:
            return
        peer = self._known(uuid)
        if peer is not None:
            self._drop(peer)

    # Receiving

    def receive(self, identity: bytes, frames: list[bytes], key: bytes | None = None) -> None:
        """
        One message from our inbox: C{identity} is the routing id the
        ROUTER gave it, C{key} the CURVE public key (Z85) its connection
        authenticated with (a CURVE node's inbox reads it from ZAP's user
        id). Bad input is dropped and counted, never raised.
        """
        if not self._running:
            return
        if len(identity) != UUID_SIZE + 1 or identity[:1] != IDENTITY_PREFIX:
            self.counters.unknown_identity += 1
            return
        try:
            message = zre.decode(frames)
        except zre.MalformedZre:
            self.counters.malformed += 1
            return
        uuid = identity[1:]
        if uuid == self.uuid:
            self.counters.unknown_identity += 1
            return
        if self.curve and not self._admits(uuid, "", key):
            return  # a key no longer listed, whose connection predates the reload
        if isinstance(message, zre.Hello):
            self._on_hello(uuid, message, key)
            return
        peer = self.peers.get(uuid)
        if peer is None:
            self.counters.not_ready += 1
            return
        if peer.key != key:
            self._refuse("another key", uuid, peer.endpoint, key)
            return
        if not self._in_sequence(peer, message.sequence):
            return
        peer.last_heard = self._clock.seconds()
        peer.evasive = False
        if isinstance(message, zre.Whisper):
            self._events.whispered(peer, list(message.content))
        elif isinstance(message, zre.Shout):
            self._events.shouted(peer, message.group, list(message.content))
        elif isinstance(message, zre.Join | zre.Leave):
            self._on_status(peer, message)
        elif isinstance(message, zre.Ping):
            self._control(peer, _PING_OK)
        elif isinstance(message, zre.Goodbye):
            self._drop(peer)
        # PING_OK: being heard from was the point.

    def _in_sequence(self, peer: ZrePeer, sequence: int) -> bool:
        """Whether C{sequence} is the next from C{peer}; if not, it is dropped."""
        want = (peer.want_sequence + 1) & 0xFFFF
        if sequence != want:
            if not (want == 0xFFFF and sequence == 0):
                self.counters.sequence_gaps += 1
                self._drop(peer)
                return False
            self.counters.sequence_quirks += 1  # pyre: 65534 then 0
        peer.want_sequence = sequence
        return True

    def _on_hello(self, uuid: bytes, hello: zre.Hello, key: bytes | None) -> None:
        if self.curve:
            # The key the HELLO names must be the one its connection proved.
            named = dict(hello.headers).get(PUBLIC_KEY_HEADER)
            if named is None:
                self._refuse("no key", uuid, hello.endpoint, key)
                return
            if named.encode("ascii", "replace") != key:
                self._refuse("another key", uuid, hello.endpoint, key)
                return
            known = self._known(uuid)
            if known is not None and known.key != key:
                # Proved by its connection, listed: the node's key is new.
                self.counters.restarts += 1
                self._drop(known)
        if hello.sequence != 1:
            self.counters.sequence_gaps += 1
            known = self._known(uuid)
            if known is not None:
                self._drop(known)
            return
        peer = self.peers.get(uuid)
        if peer is not None:
            # HELLO again from a peer that entered: it restarted.
            self.counters.restarts += 1
            self._drop(peer)
        peer = self._pending.get(uuid)
        if peer is None:
            if hello.endpoint == self.endpoint:
                self.counters.unknown_identity += 1  # would link us to ourselves
                return
            self._purge_endpoint(uuid, hello.endpoint, key, proved=True)
            peer = self._connect(uuid, hello.endpoint, key)
            if peer is None:
                return
        del self._pending[uuid]
        peer.ready = True
        peer.name = hello.name
        peer.headers = dict(hello.headers)
        peer.endpoints.add(hello.endpoint)
        peer.want_sequence = 1
        peer.status = hello.status
        peer.last_heard = self._clock.seconds()
        self.peers[uuid] = peer
        self._events.peer_entered(peer)
        for group in hello.groups:
            if self.peers.get(uuid) is not peer:
                return  # dropped by whoever heard the events
            if group not in peer.groups:
                peer.groups.add(group)
                self._events.peer_joined(peer, group)

    def _on_status(self, peer: ZrePeer, message: zre.Join | zre.Leave) -> None:
        status = (peer.status + 1) & 0xFF
        if message.status != status:
            self.counters.status_mismatches += 1
            self._drop(peer)
            return
        peer.status = status
        if isinstance(message, zre.Join):
            if message.group not in peer.groups:
                peer.groups.add(message.group)
                self._events.peer_joined(peer, message.group)
        elif message.group in peer.groups:
            peer.groups.discard(message.group)
            self._events.peer_left(peer, message.group)

    # Timers

    def _reap(self) -> None:
        """Once a second: PING peers gone quiet, forget those gone silent."""
        now = self._clock.seconds()
        for peer in list(self.peers.values()):
            if self.peers.get(peer.uuid) is not peer:
                continue
            silent = now - peer.last_heard
            if silent >= self.expired:
                self.counters.peers_expired += 1
                self._drop(peer)
            elif silent >= self.evasive and not peer.evasive:
                peer.evasive = True
                if self._control(peer, _PING):
                    self._events.peer_evasive(peer)
        for peer in list(self._pending.values()):
            if self._pending.get(peer.uuid) is peer and now - peer.last_heard >= self.expired:
                self.counters.pending_expired += 1
                self._drop(peer)
