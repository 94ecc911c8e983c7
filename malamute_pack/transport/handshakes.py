"""
Failed security handshakes on the broker's ROUTER sockets, logged: a client
that offers another mechanism than its endpoint takes (no credentials
against a PLAIN or CURVE endpoint, PLAIN against CURVE, credentials against
a NULL one), or whose CURVE handshake breaks (a wrong broker key), never
reaches ZAP, so without this the broker would say nothing of it while the
client is refused. Refusals by ZAP (a wrong password, an unknown CURVE key)
are counted here but logged by the ZAP handler only
(L{malamute_pack.transport.zap}), with its own rate limit.

L{HandshakeLog} is the logic, with no socket: it is fed the events of a
ZeroMQ socket monitor and logs each failed handshake once (rate-limited:
L{malamute_pack.broker.log_limit}), with the peer's address when it could
be had, and counts them. L{HandshakeMonitor} is the glue: the monitor of
one ROUTER, read in the reactor through a L{ZmqSocket}.

A mismatch is seen from the broker's end either as such (a protocol
error), or, when the client found it first and closed, as a handshake
broken off (an errno: EPIPE, ECONNRESET); both are logged, under their own
rate limits. A client libzmq reconnects before it closes its socket may
add a second line.

What libzmq 4.3 reports, checked with real sockets: a failed handshake's
event carries no connection (its value is libzmq's protocol error code,
the ZAP status or an errno), but the connection's ACCEPTED event carries
its file descriptor, and its DISCONNECTED follows the failure (at once,
for a protocol error: the same call in libzmq's one I/O thread). So the
peer is looked up (C{getpeername} on a duplicate of the descriptor) when
ACCEPTED arrives, and a failure is reported with the peer of the next
connection that ends. The descriptor may be closed by then (a mismatch on
loopback fails within microseconds, before the reactor reads the event) or
even reused: the peer is then unknown, never a guess (a descriptor whose
local port is not the endpoint's is not believed).

Tests: ``tests/unit/test_transport_handshakes.py``.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import Final

import zmq
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

_log = Logger()

# The events the broker's ROUTERs are monitored for.
HANDSHAKE_EVENTS: Final = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_ACCEPTED: Final = int(zmq.EVENT_ACCEPTED)
_DISCONNECTED: Final = int(zmq.EVENT_DISCONNECTED)
_FAILED_AUTH: Final = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_FAILED_PROTOCOL: Final = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_FAILED_NO_DETAIL: Final = int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_FAILURES: Final = frozenset({_FAILED_AUTH, _FAILED_PROTOCOL, _FAILED_NO_DETAIL})
MECHANISM_MISMATCH: Final = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
CRYPTOGRAPHIC: Final = int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
_PROTOCOL_ERRORS: Final = {
    int(getattr(zmq, name)): name.removeprefix("PROTOCOL_ERROR_")
    for name in dir(zmq)
    if name.startswith("PROTOCOL_ERROR_")
}
# Connections whose peer is remembered at most (one entry per open
# connection; the oldest go first), and failures waiting for their end.
MAX_TRACKED: Final = 10_000
MAX_PENDING: Final = 1_000
# Seconds between reads of the monitor besides those its descriptor
# announces: under twistd, events were seen to wait for the next one's
# edge; a read with nothing waiting costs one getsockopt.
POLL_INTERVAL: Final = 0.5

_EVENT: Final = struct.Struct("=HI")  # the event's number, and its value
_PEERCRED: Final = struct.Struct("3i")  # pid, uid, gid
_addresses = itertools.count(1)

# The peer of an accepted connection's descriptor on an endpoint, or None.
PeerLookup = Callable[[int, str], "str | None"]


def peer_of(fd: int, endpoint: str) -> str | None:
    """
    The peer of the connection whose descriptor is C{fd}, accepted on
    C{endpoint}: C{tcp://host:port}, or for ipc the peer process
    (C{pid 12 uid 0}); None if the descriptor is closed, is not a socket,
    or is one of another endpoint (it was reused). Never raises.
    """
    try:
        duplicate = os.dup(fd)
    except OSError:
        return None
    try:
        peer = socket.socket(fileno=duplicate)
    except OSError:
        os.close(duplicate)
        return None
    try:
        return _describe(peer, endpoint)
    except (OSError, ValueError, struct.error):
        return None
    finally:
        peer.close()


def _describe(peer: socket.socket, endpoint: str) -> str | None:
    if peer.family == socket.AF_UNIX:
        if not endpoint.startswith("ipc://"):
            return None
        pid, uid, _ = _PEERCRED.unpack(
            peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        return f"pid {pid} uid {uid}"
    if peer.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    local_port = peer.getsockname()[1]
    if not endpoint.startswith("tcp://") or not endpoint.endswith(f":{local_port}"):
        return None  # the descriptor was reused by another socket
    host, port = peer.getpeername()[:2]
    return f"tcp://[{host}]:{port}" if peer.family == socket.AF_INET6 else f"tcp://{host}:{port}"


class HandshakeLog:
    """
    The failed handshakes of one ROUTER (whose endpoints take C{mechanism}:
    C{"null"}, C{"plain"} or C{"curve"}), from its monitor's events.

    @ivar refused: failed handshakes logged (a mechanism mismatch or
        another protocol error).
    @ivar refused_by_zap: handshakes ZAP refused (counted here, logged by
        the ZAP handler).
    @ivar broken_off: handshakes the peer broke off (it closed or reset
        the connection): a client that found the mechanism mismatch before
        this end did (logged as such), a port check or a scan.
    @ivar unknown_peers: failures logged without the peer's address.
    """

    def __init__(self, clock: IReactorTime, mechanism: str, lookup: PeerLookup = peer_of) -> None:
        self.mechanism = mechanism.upper()
        self._lookup = lookup
        self._log_limit = LogLimit(clock, _log, per_second=5)
        self._peers: dict[int, str | None] = {}  # descriptor: peer, while open
        self._pending: deque[tuple[int, int, str]] = deque()  # failures waiting for their end
        self.refused = 0
        self.refused_by_zap = 0
        self.broken_off = 0
        self.unknown_peers = 0

    def event(self, event: int, value: int, endpoint: str) -> None:
        """One monitor event: its number, its value, and the endpoint it concerns."""
        if event == _ACCEPTED:
            if len(self._peers) >= MAX_TRACKED:
                del self._peers[next(iter(self._peers))]
            self._peers[value] = self._lookup(value, endpoint)
        elif event in _FAILURES:
            if len(self._pending) >= MAX_PENDING:
                self._report(*self._pending.popleft(), None)
            self._pending.append((event, value, endpoint))
        elif event == _DISCONNECTED:
            peer = self._peers.pop(value, None)
            if self._pending:
                self._report(*self._pending.popleft(), peer)

    def _report(self, event: int, value: int, endpoint: str, peer: str | None) -> None:
        if event == _FAILED_AUTH:
            self.refused_by_zap += 1  # the ZAP handler logged it, with the address
            return
        if peer is None:
            self.unknown_peers += 1
        shown = peer or "unknown: its connection was already closed"
        if event == _FAILED_NO_DETAIL:
            # A client that found the mismatch first closes before this end
            # reads its mechanism: the same refusal, seen from here.
            self.broken_off += 1
            self._log_limit.info(
                "handshake-broken",
                "a client on {endpoint} broke off the {mechanism} handshake ({error}): it "
                "offers another security mechanism, or none, or it only checked the port "
                "(peer {peer})",
                endpoint=endpoint,
                mechanism=self.mechanism,
                error=os.strerror(value) if 0 < value < 4096 else value,
                peer=shown,
            )
            return
        self.refused += 1
        self._log_limit.info(
            "handshake-refused",
            "refused a client on {endpoint}: {why} (peer {peer})",
            endpoint=endpoint,
            why=self.why(value),
            peer=shown,
        )

    def why(self, protocol_error: int) -> str:
        """What a failed handshake's protocol error means, for the log."""
        if protocol_error == MECHANISM_MISMATCH:
            if self.mechanism == "NULL":
                return "it offers PLAIN or CURVE and this endpoint takes no security (NULL)"
            return (
                f"security mechanism mismatch: this endpoint requires {self.mechanism} and the "
                "client offers another, or none (no credentials)"
            )
        if protocol_error == CRYPTOGRAPHIC:
            return f"its {self.mechanism} handshake failed (for CURVE: a wrong broker key)"
        name = _PROTOCOL_ERRORS.get(protocol_error, hex(protocol_error))
        return f"its {self.mechanism} handshake failed ({name})"


class HandshakeMonitor:
    """
    A socket monitor on a ROUTER, read in the reactor, its events fed to a
    L{HandshakeLog} (C{log}). Start it once the ROUTER is bound; stop it
    before the ROUTER closes.
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        router: zmq.Socket[bytes],
        mechanism: str,
        lookup: PeerLookup = peer_of,
    ) -> None:
        clock: IReactorTime = reactor  # type: ignore[assignment]
        self.log = HandshakeLog(clock, mechanism, lookup)
        self._reactor = reactor
        self._router = router
        self._pair: ZmqSocket | None = None
        self._poll = LoopingCall(self._read)
        self._poll.clock = clock

    def start(self) -> None:
        address = f"inproc://malamute-handshakes-{os.getpid()}-{next(_addresses)}"
        self._router.monitor(address, HANDSHAKE_EVENTS)
        pair: zmq.Socket[bytes] = self._router.context.socket(zmq.PAIR)
        pair.setsockopt(zmq.LINGER, 0)
        pair.connect(address)
        self._pair = ZmqSocket(self._reactor, pair, self._events)
        self._pair.startReading()
        self._poll.start(POLL_INTERVAL, now=False)

    def _read(self) -> None:
        if self._pair is not None:
            self._pair.doRead()

    def stop(self) -> None:
        if self._poll.running:
            self._poll.stop()
        if self._pair is None:
            return
        if not self._router.closed:
            self._router.disable_monitor()
        self._pair.close()
        self._pair = None

    def _events(self, batch: Batch) -> None:
        event = self.log.event
        for frames in batch:
            if len(frames) != 2 or len(frames[0]) != _EVENT.size:
                continue  # not an event of libzmq's monitor format
            number, value = _EVENT.unpack(frames[0])
            event(number, value, frames[1].decode("utf-8", "replace"))
