"""
A Zyre node in the reactor: the L{ZreNode} logic given its sockets. An
inbox ROUTER (ROUTER_HANDOVER, so a restarted peer's new connection takes
over its routing id), one DEALER per peer (routing id 0x01 + our uuid,
never blocking), and optionally UDP beacons on one interface and zgossip
(publishing our uuid as 32 uppercase hex characters -> our inbox, and
following every tuple learned). All through L{ZmqSocket}: no threads.

With CURVE (a L{LinkCurve}: our key pair and the listed keys), as zyre
with C{zyre_set_zcert}: the inbox is a CURVE server whose ZAP domain
admits only the listed keys, and is read with each message's key; each
peer's DEALER is a CURVE client with the peer's key as the server's; our
beacons carry our public key (the 54-byte form); gossip is CURVE and we
publish C{ENDPOINT|PUBLIC_KEY}; our HELLO carries C{X-PUBLICKEY}. Which
nodes become peers is the node's decision (L{malamute_pack.pack.node}).

Tests: ``tests/unit/test_pack_zyre.py`` (two nodes on loopback),
``tests/system/test_pack_interop.py`` (against pyre, between namespaces).
"""

from __future__ import annotations

import re
import uuid as uuid_module
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import zmq
from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from malamute_pack.pack.beacon import BEACON_INTERVAL, BEACON_PORT, BeaconService, resolve_interface
from malamute_pack.pack.gossip import Gossip
from malamute_pack.pack.node import IDENTITY_PREFIX, NodeEvents, Stranger, ZreNode
from malamute_pack.transport.curve import LinkCurve
from malamute_pack.transport.zap import PACK_DOMAIN
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

_log = Logger()

# How long a closed link still tries to deliver what it queued (a GOODBYE).
CLOSE_LINGER_MS = 200
# The largest frame the inbox takes; a peer sending more is disconnected.
MAX_FRAME_BYTES = 8 * 1024 * 1024
# Seconds between tries to link again to nodes gossip knows of (see _rediscover).
REGOSSIP_INTERVAL = 5.0
_GOSSIP_KEY = re.compile(r"^[0-9A-F]{32}$")
_TCP_ENDPOINT = re.compile(r"^tcp://(?P<host>[^/]+):(?P<port>[0-9]+)$")


class ZmqLink:
    """A L{malamute_pack.pack.node.Link}: one DEALER to a peer's inbox."""

    def __init__(self, socket: ZmqSocket) -> None:
        self._socket = socket

    def send(self, frames: Sequence[bytes]) -> bool:
        return self._socket.send(frames)

    def close(self) -> None:
        self._socket.close(linger=CLOSE_LINGER_MS)


def gossip_key(uuid: bytes) -> str:
    """A node's key in gossip: its uuid as 32 uppercase hex characters."""
    return uuid.hex().upper()


class Zyre(Service):
    """
    One Zyre node as a Twisted service.

    @ivar node: the L{ZreNode} (peers, groups, counters); its C{endpoint}
        is our inbox's, once started.
    @ivar beacon: the L{BeaconService} while started with beacons, or None.
    @ivar gossip: the L{Gossip} node while started with gossip, or None.
    """

    def __init__(
        self,
        reactor: Any,
        context: zmq.Context[zmq.Socket[bytes]],
        events: NodeEvents,
        uuid: bytes | None = None,
        name: str | None = None,
        headers: Mapping[str, str] = MappingProxyType({}),
        groups: Sequence[str] = (),
        endpoint: str | None = None,
        beacon_interface: str | None = None,
        beacon_port: int = BEACON_PORT,
        beacon_interval: float = BEACON_INTERVAL,
        gossip_bind: Sequence[str] = (),
        gossip_connect: Sequence[str] = (),
        sndhwm: int = 100_000,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        evasive: float = 5.0,
        expired: float = 30.0,
        clock: IReactorTime | None = None,
        regossip_interval: float = REGOSSIP_INTERVAL,
        curve: LinkCurve | None = None,
        stranger: Stranger | None = None,
        zap_domain: bytes = PACK_DOMAIN,
    ) -> None:
        """
        @param reactor: the reactor (C{IReactorFDSet}, C{IReactorSocket}).
        @param uuid: 16 bytes; a random one by default.
        @param name: sent in HELLO; the first six hex digits of the uuid by
            default, as zyre.
        @param groups: joined before the first peer is met.
        @param endpoint: where the inbox binds (a C{*} port is read back);
            C{tcp://ADDRESS:*} on the beacon interface's address by default.
            A wildcard host (C{*}, C{0.0.0.0}) is advertised as the beacon
            interface's address (and refused without one).
        @param beacon_interface: an interface name or address: beacons on
            its broadcast address; None for no beacons.
        @param gossip_bind: endpoints a gossip server binds.
        @param gossip_connect: gossip servers to be a client of.
        @param sndhwm: messages each peer link queues before a send fails.
        @param clock: the peers' timers; the reactor by default.
        @param regossip_interval: seconds between tries to link again to
            the nodes gossip knows of that are not peers now.
        @param curve: our key pair and the keys of the nodes that may be
            peers (a ZAP handler must serve C{zap_domain} with them).
        @param stranger: told of each node not let in (see
            L{malamute_pack.pack.node.Stranger}).
        @raise ValueError: neither an endpoint nor a beacon interface, or a
            uuid, name or header the node refuses.
        """
        if endpoint is None and beacon_interface is None:
            raise ValueError("a Zyre node needs an inbox endpoint or a beacon interface")
        self._reactor = reactor
        self._context = context
        self._bind_endpoint = endpoint
        self._beacon_interface = beacon_interface
        self._beacon_port = beacon_port
        self._beacon_interval = beacon_interval
        self._gossip_bind = list(gossip_bind)
        self._gossip_connect = list(gossip_connect)
        self.sndhwm = sndhwm
        self.max_frame_bytes = max_frame_bytes
        self.curve = curve
        self._zap_domain = zap_domain
        uuid = uuid_module.uuid4().bytes if uuid is None else uuid
        self.node = ZreNode(
            reactor if clock is None else clock,
            uuid,
            uuid.hex()[:6].upper() if name is None else name,
            "",
            self._connect,
            events,
            headers,
            evasive,
            expired,
            public_key=None if curve is None else curve.keys.public,
            peer_keys=None if curve is None else curve.allowed,
            stranger=stranger,
        )
        for group in groups:
            self.node.join(group)
        self._inbox: ZmqSocket | None = None
        self._paused = False
        self.node_clock: IReactorTime = reactor if clock is None else clock
        # How often nodes gossip knows of and that are not peers are tried again.
        self.regossip_interval = regossip_interval
        self._regossip = LoopingCall(self._rediscover)
        self.beacon: BeaconService | None = None
        self.gossip: Gossip | None = None

    @property
    def uuid(self) -> bytes:
        return self.node.uuid

    @property
    def endpoint(self) -> str:
        """Our inbox's endpoint, as peers connect to it (empty until started)."""
        return self.node.endpoint

    # Lifetime

    def startService(self) -> None:
        """
        Bind the inbox, start the node, the beacon and gossip.

        @raise ValueError: an unknown interface or a bad endpoint.
        @raise OSError: the beacon's socket cannot be bound.
        """
        address = broadcast = None
        if self._beacon_interface is not None:
            address, broadcast = resolve_interface(self._beacon_interface)
        endpoint = self._bind_endpoint or f"tcp://{address}:*"
        self.node.endpoint = self._bind_inbox(endpoint, address)
        super().startService()
        if self.curve is not None:
            self.curve.allowed.listeners.append(self.node.drop_keys)
        self.node.start()
        try:
            if broadcast is not None:
                self._start_beacon(broadcast)
            if self._gossip_bind or self._gossip_connect:
                self._start_gossip()
        except BaseException:
            self.stopService()
            raise

    def _bind_inbox(self, endpoint: str, address: str | None) -> str:
        raw: zmq.Socket[bytes] = self._context.socket(zmq.ROUTER)
        try:
            raw.setsockopt(zmq.ROUTER_HANDOVER, 1)
            raw.setsockopt(zmq.LINGER, 0)
            raw.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes)
            if self.curve is not None:
                raw.setsockopt(zmq.CURVE_SERVER, 1)
                raw.setsockopt(zmq.CURVE_SECRETKEY, self.curve.keys.secret)
                raw.setsockopt(zmq.ZAP_DOMAIN, self._zap_domain)
                # Without a ZAP handler, refuse everyone rather than admit anyone.
                raw.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
            raw.bind(endpoint)
            bound = raw.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            raw.close(linger=0)
            raise ValueError(f"cannot bind the Zyre inbox on {endpoint}: {e}") from e
        self._inbox = ZmqSocket(
            self._reactor, raw, self._on_inbox, identified=self.curve is not None
        )
        self._inbox.startReading()
        if self._paused:
            self._inbox.pauseReading()
        match = _TCP_ENDPOINT.match(bound)
        if match and match["host"] in ("0.0.0.0", "*"):
            if address is None:
                self._inbox.close(linger=0)
                self._inbox = None
                raise ValueError(
                    f"the Zyre inbox {endpoint} binds every address: say which one"
                    " peers should connect to, or give a beacon interface"
                )
            bound = f"tcp://{address}:{match['port']}"
        return bound

    def _start_beacon(self, broadcast: str) -> None:
        match = _TCP_ENDPOINT.match(self.node.endpoint)
        if match is None:
            raise ValueError(f"beacons need a tcp inbox, not {self.node.endpoint}")
        self.beacon = BeaconService(
            self._reactor,
            self.node.uuid,
            int(match["port"]),
            self.node.discovered,
            self.node.departed,
            broadcast,
            self._beacon_port,
            self._beacon_interval,
            public_key=None if self.curve is None else self.curve.keys.public,
        )
        self.beacon.start()

    def _start_gossip(self) -> None:
        self._regossip.clock = self.node_clock
        self._regossip.start(self.regossip_interval, now=False)
        self.gossip = Gossip(
            self._reactor,
            self._context,
            self._on_gossip_tuple,
            bind=self._gossip_bind,
            connect=self._gossip_connect,
            curve=self.curve,
            zap_domain=self._zap_domain,
        )
        self.gossip.start()
        self.gossip.publish(gossip_key(self.node.uuid), self.published_endpoint)

    @property
    def published_endpoint(self) -> str:
        """What gossip says of our inbox: C{ENDPOINT}, or C{ENDPOINT|PUBLIC_KEY} with CURVE."""
        if self.curve is None:
            return self.node.endpoint
        return f"{self.node.endpoint}|{self.curve.keys.public.decode('ascii')}"

    def stopService(self) -> None:
        """Say GOODBYE to every peer and a port-0 beacon, and close every socket."""
        super().stopService()
        if self.curve is not None and self.node.drop_keys in self.curve.allowed.listeners:
            self.curve.allowed.listeners.remove(self.node.drop_keys)
        self.node.stop()
        if self.beacon is not None:
            self.beacon.stop()
            self.beacon = None
        if self._regossip.running:
            self._regossip.stop()
        if self.gossip is not None:
            self.gossip.stop()
            self.gossip = None
        if self._inbox is not None:
            self._inbox.close(linger=0)
            self._inbox = None

    # Backpressure (a malamute_pack.transport.gate.Pausable)

    def pauseReading(self) -> None:
        """Read nothing from peers: what they send waits in ZeroMQ's queues and then theirs."""
        self._paused = True
        if self._inbox is not None:
            self._inbox.pauseReading()

    def resumeReading(self) -> None:
        """Read again; peers silent meanwhile are not held to it."""
        self._paused = False
        self.node.heard_all()
        if self._inbox is not None:
            self._inbox.resumeReading()

    # Conveniences

    def join(self, group: str) -> None:
        self.node.join(group)

    def leave(self, group: str) -> None:
        self.node.leave(group)

    def whisper(self, uuid: bytes, content: Sequence[bytes]) -> bool:
        return self.node.whisper(uuid, content)

    def shout(self, group: str, content: Sequence[bytes]) -> int:
        return self.node.shout(group, content)

    # Sockets

    def _connect(self, endpoint: str, server_key: bytes | None) -> ZmqLink:
        """
        A DEALER to a peer's inbox (a CURVE client of C{server_key} with
        CURVE); ValueError for an endpoint not tcp:// or refused.
        """
        if not endpoint.startswith("tcp://"):
            # Never inproc:// or ipc://: a HELLO must not reach our own process's sockets.
            raise ValueError(f"not a tcp endpoint: {endpoint!r}")
        raw: zmq.Socket[bytes] = self._context.socket(zmq.DEALER)
        try:
            raw.setsockopt(zmq.IDENTITY, IDENTITY_PREFIX + self.node.uuid)
            raw.setsockopt(zmq.LINGER, 0)
            raw.setsockopt(zmq.SNDTIMEO, 0)
            raw.setsockopt(zmq.SNDHWM, self.sndhwm)
            if self.curve is not None:
                if server_key is None:
                    raise ValueError("a CURVE node links only to a node with a key")
                raw.setsockopt(zmq.CURVE_SERVERKEY, server_key)
                raw.setsockopt(zmq.CURVE_PUBLICKEY, self.curve.keys.public)
                raw.setsockopt(zmq.CURVE_SECRETKEY, self.curve.keys.secret)
            raw.connect(endpoint)
        except zmq.ZMQError as e:
            raw.close(linger=0)
            raise ValueError(f"cannot connect to {endpoint}: {e}") from e
        sock = ZmqSocket(self._reactor, raw, _ignore)
        sock.startReading()
        return ZmqLink(sock)

    def _on_inbox(self, batch: Batch) -> None:
        receive = self.node.receive
        curve = self.curve is not None
        for frames in batch:
            try:
                if curve:
                    # The key ZAP admitted the connection with, then the routing id.
                    receive(frames[1], frames[2:], frames[0] or None)
                else:
                    receive(frames[0], frames[1:])
            except Exception:
                # A bug in an event handler must not cost the rest of the
                # batch, nor the socket (the reactor drops a reader that raises).
                _log.failure("handling a ZRE message failed")

    def _rediscover(self) -> None:
        """
        Link again to every node gossip knows that is not a peer now: a peer
        expired in a partition (or dropped for a protocol error) publishes
        no new tuple, and, with no beacons, would never be met again.
        """
        if self.gossip is None:
            return
        for key, value in self.gossip.table.items():
            if _GOSSIP_KEY.match(key) and not self.node.knows(bytes.fromhex(key)):
                self._on_gossip_tuple(key, value)

    def _on_gossip_tuple(self, key: str, value: str) -> None:
        if not _GOSSIP_KEY.match(key):
            return  # not a Zyre node's tuple
        # "ENDPOINT|PUBLIC_KEY" for a CURVE node: the node decides whom it follows.
        endpoint, _, public_key = value.partition("|")
        try:
            raw_key = public_key.encode("ascii") if public_key else None
        except UnicodeError:
            return
        self.node.discovered(bytes.fromhex(key), endpoint, raw_key)


def _ignore(batch: Batch) -> None:
    """Peers never answer on the links we open to them: anything read is dropped."""
