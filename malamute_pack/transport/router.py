"""
A ROUTER socket of the broker as a Twisted service: binds its endpoints
(all of one security mechanism: NULL, PLAIN or CURVE) and feeds what
arrives to the L{MlmSessions} of that socket, which decode it for the
broker; the sessions answer through the same socket. On a PLAIN or CURVE
socket every message is read with the user ZAP gave its connection
(L{ZmqSocket}'s C{identified} mode), so the sessions know their users and
a routing id taken over by another user's connection is seen at once.
Security handshakes that fail before ZAP (a client without credentials on
a PLAIN endpoint) are logged by a socket monitor on the ROUTER
(L{malamute_pack.transport.handshakes}).

Tests: ``tests/unit/test_end_to_end.py``, ``tests/unit/test_transport_security.py``,
``tests/system/test_startup.py`` (endpoints it cannot bind).
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

import zmq
from twisted.application.service import Service
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.limits import Limits
from malamute_pack.broker.session import Receiver
from malamute_pack.transport.handshakes import HandshakeMonitor
from malamute_pack.transport.sessions import MlmSessions
from malamute_pack.transport.zap import CLIENT_DOMAIN
from malamute_pack.transport.zmqcore import BUILD
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

_log = Logger()

# The ZAP domain the clients' sockets authenticate in.
ZAP_DOMAIN = CLIENT_DOMAIN.decode("ascii")

_LIKE = "give an endpoint like tcp://*:9999, tcp://127.0.0.1:9999 or ipc://@/name"


def bind_error_message(endpoint: str, error_number: int | None, verb: str = "bind") -> str:
    """
    What a refused bind of C{endpoint} means, and what to do, in one line
    (C{verb} names what was refused).
    """
    reason = zmq.strerror(error_number) if error_number is not None else "refused"
    tcp = endpoint.startswith("tcp://")
    if tcp and _port_too_high(endpoint):
        hint = "a TCP port is at most 65535"
    elif error_number == errno.EADDRINUSE:
        hint = "another broker or program is bound there: stop it, or give this one another -e"
    elif error_number == errno.EADDRNOTAVAIL:
        hint = "no interface of this host has that address: give one it has, or tcp://*:PORT"
    elif error_number == errno.ENODEV:
        hint = (
            "bind takes an interface's address or name, not a host name: tcp://127.0.0.1:9999,"
            " tcp://eth0:9999 or tcp://*:9999"
        )
    elif error_number == errno.EACCES and tcp:
        hint = "ports below 1024 need root: pick a port above 1023"
    elif error_number in (errno.EACCES, errno.ENOENT, errno.ENOTDIR) and not tcp:
        hint = "the ipc file's directory must exist and be writable; or use ipc://@/name"
    elif error_number == getattr(zmq, "ENOCOMPATPROTO", None):
        hint = f"the broker binds tcp:// and ipc:// endpoints: {_LIKE.removeprefix('give ')}"
    else:
        hint = _LIKE
    return f"cannot {verb} {endpoint}: {reason} ({hint})"


def _port_too_high(endpoint: str) -> bool:
    """Whether a tcp endpoint's port is beyond 65535 (libzmq would bind it modulo 65536)."""
    port = endpoint.rpartition(":")[2]
    return port.isdigit() and int(port) > 65535


class BindError(zmq.ZMQError):
    """An endpoint the broker cannot bind; the message says why and what to do."""

    def __init__(self, endpoint: str, error: zmq.ZMQError) -> None:
        super().__init__(error.errno, bind_error_message(endpoint, error.errno))
        self.endpoint = endpoint


class RouterService(Service):
    """
    Binds a ROUTER socket on C{endpoints}; its peers are sessions of
    C{receiver} (the broker).

    @ivar mechanism: the security its peers must pass: C{"null"} (none),
        C{"plain"} or C{"curve"} (a ZAP handler must run for either; with
        C{"curve"}, C{curve_secret} is the broker's secret key). Each
        authenticated peer's session knows its user.
    @ivar bound: the endpoints bound, as ZeroMQ reports them (a C{*} port
        replaced by the real one), once started.
    @ivar sessions: the peers, once started.
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]],
        receiver: Receiver,
        limits: Limits,
        endpoints: Sequence[str],
        mechanism: str = "null",
        curve_secret: bytes | None = None,
    ) -> None:
        if mechanism not in ("null", "plain", "curve"):
            raise ValueError(f"unknown security mechanism {mechanism!r}")
        if (mechanism == "curve") != (curve_secret is not None):
            raise ValueError("CURVE needs the broker's secret key, and only CURVE takes one")
        self._reactor = reactor
        self._context = context
        self._receiver = receiver
        self._limits = limits
        self.endpoints = list(endpoints)
        self.mechanism = mechanism
        self._curve_secret = curve_secret
        self.socket: ZmqSocket | None = None
        self.sessions: MlmSessions | None = None
        self.bound: list[str] = []
        self._paused = False
        # Failed security handshakes, logged and counted (C{handshakes.log}), once started.
        self.handshakes: HandshakeMonitor | None = None

    def startService(self) -> None:
        raw = self._context.socket(zmq.ROUTER)
        raw.setsockopt(zmq.LINGER, 0)
        # Bounded queues per peer. A send to a peer whose queue is full fails
        # at once (ROUTER_MANDATORY) instead of being dropped unseen, so the
        # broker knows the peer does not drain and stops pushing at it.
        raw.setsockopt(zmq.ROUTER_MANDATORY, 1)
        raw.setsockopt(zmq.SNDHWM, self._limits.send_queue)
        raw.setsockopt(zmq.RCVHWM, self._limits.receive_queue)
        if self.mechanism == "plain":
            raw.setsockopt(zmq.PLAIN_SERVER, 1)
        elif self.mechanism == "curve":
            assert self._curve_secret is not None
            raw.setsockopt(zmq.CURVE_SERVER, 1)
            raw.setsockopt(zmq.CURVE_SECRETKEY, self._curve_secret)
        if self.mechanism != "null":
            raw.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        # Bound here, once the journal opened and ZAP runs (a broker that
        # refuses its journal never had clients); a refused endpoint is a
        # BindError that ends the start (L{malamute_pack.startup}).
        try:
            for endpoint in self.endpoints:
                try:
                    if endpoint.startswith("tcp://") and _port_too_high(endpoint):
                        raise zmq.ZMQError(errno.EINVAL)
                    raw.bind(endpoint)
                except zmq.ZMQError as e:
                    raise BindError(endpoint, e) from e
                self.bound.append(raw.getsockopt_string(zmq.LAST_ENDPOINT))
                _log.info("Malamute broker bound to {endpoint}", endpoint=self.bound[-1])
            _log.info("ZeroMQ I/O core: {build}", build=BUILD)
        except zmq.ZMQError:
            raw.close(linger=0)
            self.bound = []
            raise
        identified = self.mechanism != "null"
        self.socket = ZmqSocket(
            self._reactor,
            raw,
            self._received_identified if identified else self._received,
            identified=identified,
        )
        self.handshakes = HandshakeMonitor(self._reactor, raw, self.mechanism)
        self.handshakes.start()
        clock: IReactorTime = self._reactor  # type: ignore[assignment]
        self.sessions = MlmSessions(
            self._receiver,
            self.socket.send_to,
            self._limits,
            clock,
            deferred_output=self.socket.defer,
        )
        self.socket.startReading()
        if self._paused:
            self.socket.pauseReading()
        super().startService()

    def _received(self, batch: Batch) -> None:
        assert self.sessions is not None
        receive = self.sessions.receive
        for frames in batch:
            if len(frames) < 2:
                continue  # a ROUTER always prepends the routing id
            try:
                receive(frames[0], frames[1:])
            except Exception:
                # A bug met by one message must not cost the rest of the
                # batch, nor the socket (the reactor drops a reader that raises).
                _log.failure("handling a message from {route} failed", route=frames[0].hex())

    def _received_identified(self, batch: Batch) -> None:
        """As L{_received}, each message preceded by its connection's user."""
        assert self.sessions is not None
        receive = self.sessions.receive
        for frames in batch:
            if len(frames) < 3:
                continue
            try:
                user = frames[0].decode("utf-8", "surrogateescape") or None
                receive(frames[1], frames[2:], user)
            except Exception:
                _log.failure("handling a message from {route} failed", route=frames[1].hex())

    def pauseReading(self) -> None:
        """Read nothing from the peers until L{resumeReading} (backpressure)."""
        self._paused = True
        if self.socket is not None:
            self.socket.pauseReading()

    def resumeReading(self) -> None:
        self._paused = False
        if self.socket is not None:
            self.socket.resumeReading()

    def stopService(self) -> None:
        super().stopService()
        if self.sessions is not None:
            self.sessions.stop()
        if self.handshakes is not None:
            self.handshakes.stop()
            self.handshakes = None
        if self.socket is not None:
            self.socket.close()
            self.socket = None
        self.bound = []
