"""
ZRE beacons over UDP: how Zyre nodes on one LAN find each other. Every
second a node broadcasts its uuid and inbox port to port 5670 of its
interface's broadcast address, and hears everyone else's.

Two parts: L{BeaconListener} turns datagrams into discoveries (pure logic,
no socket), and L{BeaconService} is the thin socket glue (a UDP socket made
here, so that it can share the port and broadcast, then adopted by the
reactor). L{resolve_interface} finds an interface's addresses.

A CURVE node (RFC 43) sends the 54-byte beacon that carries its public
key; heard beacons go to the node with the key they carry (in Z85), or
none, and the node decides: a CURVE node follows only listed keys, an
open node only beacons without a key (L{malamute_pack.pack.node}).

Tests: ``tests/system/test_pack_beacon.py`` (the listener, and the socket between
two network namespaces).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
from twisted.internet.interfaces import IListeningPort, IReactorTime
from twisted.internet.protocol import DatagramProtocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zmq.utils import z85

from malamute_pack.protocol.zre import Beacon, MalformedBeacon, decode_beacon, encode_beacon

BEACON_PORT = 5670
BEACON_INTERVAL = 1.0

_log = Logger()


def resolve_interface(name_or_address: str) -> tuple[str, str]:
    """
    The IPv4 address and broadcast address of the interface named
    C{name_or_address}, or that has that address.

    @raise ValueError: no such interface or address, or it has no IPv4
        broadcast address (loopback, point to point, a /31 or /32).
    """
    for name, entries in psutil.net_if_addrs().items():
        for entry in entries:
            if entry.family != socket.AF_INET:
                continue
            if name_or_address not in (name, entry.address):
                continue
            broadcast = entry.broadcast
            if not broadcast and entry.netmask and not entry.ptp:
                network = ipaddress.IPv4Interface(f"{entry.address}/{entry.netmask}").network
                if network.prefixlen < 31 and not network.is_loopback:
                    broadcast = str(network.broadcast_address)
            if not broadcast:
                raise ValueError(
                    f"interface {name} ({entry.address}) has no IPv4 broadcast address:"
                    " beacons need one (use gossip instead)"
                )
            return entry.address, broadcast
    raise ValueError(f"no network interface named or with IPv4 address {name_or_address!r}")


@dataclass
class BeaconCounters:
    """What beacons were sent and heard."""

    sent: int = 0
    send_errors: int = 0
    heard: int = 0  # other nodes' beacons, handed to the node
    own: int = 0  # our own, echoed by the broadcast
    malformed: int = 0  # datagrams that were not beacons
    curve: int = 0  # of those heard, CURVE beacons (with a public key)


# A node's uuid, its inbox endpoint and its CURVE public key (Z85), if any.
Discovered = Callable[[bytes, str, bytes | None], None]


class BeaconListener:
    """
    Turns beacons into C{discovered(uuid, "tcp://SOURCE:PORT", key)} (the
    key in Z85, or None) and, for port 0, C{departed(uuid)}; ignores our
    own and counts the rest.
    """

    def __init__(
        self,
        uuid: bytes,
        discovered: Discovered,
        departed: Callable[[bytes], None],
    ) -> None:
        self.uuid = uuid
        self._discovered = discovered
        self._departed = departed
        self.counters = BeaconCounters()

    def datagram(self, data: bytes, host: str) -> None:
        """One datagram from C{host} (an IPv4 address); never raises for its content."""
        try:
            beacon = decode_beacon(data)
        except MalformedBeacon:
            self.counters.malformed += 1
            return
        if beacon.uuid == self.uuid:
            self.counters.own += 1
            return
        key = None
        if beacon.public_key is not None:
            self.counters.curve += 1
            key = z85.encode(beacon.public_key)
        self.counters.heard += 1
        if beacon.port == 0:
            self._departed(beacon.uuid)
        else:
            self._discovered(beacon.uuid, f"tcp://{host}:{beacon.port}", key)


class BeaconService(DatagramProtocol):
    """
    Broadcasts our beacon every C{interval} seconds and listens for others.

    @ivar listener: the L{BeaconListener} heard beacons go to.
    """

    def __init__(
        self,
        reactor: Any,
        uuid: bytes,
        inbox_port: int,
        discovered: Discovered,
        departed: Callable[[bytes], None],
        broadcast: str,
        port: int = BEACON_PORT,
        interval: float = BEACON_INTERVAL,
        bind_address: str = "",
        clock: IReactorTime | None = None,
        public_key: bytes | None = None,
    ) -> None:
        """
        @param reactor: an C{IReactorSocket} (the socket is adopted).
        @param inbox_port: the TCP port our inbox listens on.
        @param broadcast: the broadcast address beacons are sent to.
        @param port: the UDP port beacons are sent to and heard on.
        @param bind_address: where to listen (all addresses by default).
        @param public_key: our CURVE public key (Z85): our beacons carry it.
        """
        self._reactor = reactor
        self.listener = BeaconListener(uuid, discovered, departed)
        raw = None if public_key is None else z85.decode(public_key)
        self._beacon = encode_beacon(Beacon(uuid, inbox_port, raw))
        self._farewell = encode_beacon(Beacon(uuid, 0, raw))
        self._target = (broadcast, port)
        self._bind = (bind_address, port)
        self.interval = interval
        self._listening: IListeningPort | None = None
        self._failing = False
        self._loop = LoopingCall(self._send)
        self._loop.clock = reactor if clock is None else clock

    @property
    def counters(self) -> BeaconCounters:
        return self.listener.counters

    def start(self) -> None:
        """
        Listen and start broadcasting (the first beacon at once).

        @raise OSError: the socket cannot be made or bound.
        """
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            # Several nodes on one host share the port; broadcasts reach each.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            sock.setblocking(False)
            sock.bind(self._bind)
            self._listening = self._reactor.adoptDatagramPort(sock.fileno(), socket.AF_INET, self)
        finally:
            sock.close()  # the reactor holds its own duplicate
        self._loop.start(self.interval, now=True)

    def stop(self) -> None:
        """Stop broadcasting, say we are leaving (a port-0 beacon), and close."""
        if self._loop.running:
            self._loop.stop()
        if self._listening is not None:
            self._write(self._farewell)
            self._listening.stopListening()
            self._listening = None

    def datagramReceived(self, datagram: bytes, addr: Any) -> None:
        self.listener.datagram(datagram, addr[0])

    def _send(self) -> None:
        self._write(self._beacon)

    def _write(self, data: bytes) -> None:
        if self.transport is None:
            return
        try:
            self.transport.write(data, self._target)
        except OSError as e:
            # The network may come back (a cable, a DHCP lease): keep trying.
            self.counters.send_errors += 1
            if not self._failing:  # once per outage, not once a second
                _log.warn("cannot send a beacon to {target}: {error}", target=self._target, error=e)
            self._failing = True
        else:
            self.counters.sent += 1
            self._failing = False
