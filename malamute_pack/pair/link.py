"""
The pair link's sockets: a ROUTER bound where the partner connects (what
the partner sends arrives there) and a DEALER connected to the partner's
(what this broker sends). Each direction is one ZeroMQ connection, which
reconnects by itself; the DEALER queues nothing for a partner that is not
connected (``IMMEDIATE``), so a message sent while the link is down is
refused at once, not delivered stale later: replication then starts over
with a catch-up, and heartbeats are simply missed.

Decoding is the codec's (L{malamute_pack.protocol.pair}); what arrives is
handed to C{received}, and what does not decode is counted and dropped.

A CURVE link (a L{LinkCurve}: C{--pair-key}, the partner's public
certificate) trusts no network. The ROUTER is a CURVE server with this
broker's secret key in the ZAP domain L{PAIR_DOMAIN}, ZAP enforced (if no
ZAP handler answers, nobody gets in); the ZAP handler
(L{malamute_pack.transport.zap}) admits only the listed partner key, and
logs (rate-limited) the key and address of every stranger it refuses. A
stranger offering no CURVE at all never reaches ZAP (a mechanism
mismatch): a socket monitor on the ROUTER logs it
(L{malamute_pack.transport.handshakes}, as for the clients' ROUTERs). The
DEALER is a CURVE client of the partner's key. Every message is read
with the key its connection authenticated with, and dropped (counted,
rate-limited log) unless that key is still listed: a key removed by a
reload (SIGHUP) keeps its TCP connection and gives nothing from then on;
the DEALER then follows the new partner key (or sends nothing), so that
a removed key gets nothing either. An open link (no key) logs a warning
at start: anything that reaches its endpoint can speak as the partner.

Tests: ``tests/unit/test_pair_link.py``, ``tests/system/test_pair_service.py``,
``tests/system/test_system_pair_curve.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import zmq
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.protocol import pair as wire
from malamute_pack.transport.curve import LinkCurve
from malamute_pack.transport.handshakes import HandshakeMonitor
from malamute_pack.transport.zap import PAIR_DOMAIN
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

_log = Logger()

# Messages queued towards the partner before a send is refused.
SEND_QUEUE = 100_000


@dataclass(frozen=True, slots=True)
class LinkStatus:
    """
    What the pair link did (the pair's stats, L{malamute_pack.ops.stats}).

    @ivar security: C{"curve"} (C{--pair-key}) or C{"open"}.
    @ivar partner_key: the partner's public key (Z85) the DEALER trusts on
        a CURVE link; empty on an open one.
    @ivar sent: messages queued towards the partner.
    @ivar send_refused: messages that could not be (the partner not connected).
    @ivar malformed: messages from the partner that did not decode.
    @ivar refused_by_zap: strangers ZAP refused (a CURVE key not listed).
    @ivar refused_handshakes: strangers refused before ZAP (no CURVE, a
        mechanism mismatch; or a failed CURVE handshake).
    @ivar broken_off: handshakes the peer broke off (a stranger that found
        the mismatch first; a port check).
    @ivar unlisted_dropped: messages dropped because their connection's key
        is no longer listed (removed by a reload).
    """

    security: str
    partner_key: str
    sent: int
    send_refused: int
    malformed: int
    refused_by_zap: int
    refused_handshakes: int
    broken_off: int
    unlisted_dropped: int


class PairLink:
    """
    The two sockets of the pair link; C{received} gets each decoded message.
    With C{curve}, the link is CURVE and admits only its listed partner key.
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]],
        bind: str,
        connect: str,
        received: Callable[[wire.PairMessage], None],
        curve: LinkCurve | None = None,
    ) -> None:
        """
        @param curve: this broker's key pair and the partner's public key
            (its allow-list holds exactly one key: the DEALER's server key);
            None for an open link.

        @raise ValueError: C{curve}'s allow-list does not hold one key.
        """
        self._reactor = reactor
        self._context = context
        self.bind_endpoint = bind
        self.connect_endpoint = connect
        self._received = received
        self.curve = curve
        self._partner_key: bytes | None = None
        if curve is not None:
            keys = list(curve.allowed.keys)
            if len(keys) != 1:
                raise ValueError(
                    f"the pair link admits one partner key, and {curve.allowed.listed_in}"
                    f" lists {len(keys)}: give the partner's public certificate alone"
                )
            self._partner_key = keys[0]
        self.bound: str | None = None
        self.malformed = 0
        self.sent = 0
        self.refused = 0
        self.unlisted = 0
        self.handshakes: HandshakeMonitor | None = None
        self._inbound: ZmqSocket | None = None
        self._outbound: ZmqSocket | None = None
        clock: IReactorTime = reactor  # type: ignore[assignment]
        self._log_limit = LogLimit(clock, _log, per_second=5)

    @property
    def partner_key(self) -> bytes | None:
        """The partner's public key (Z85) the DEALER trusts; None on an open link."""
        return self._partner_key

    def start(self) -> None:
        curve = self.curve
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.RCVHWM, SEND_QUEUE)
        if curve is not None:
            router.setsockopt(zmq.CURVE_SERVER, 1)
            router.setsockopt(zmq.CURVE_SECRETKEY, curve.keys.secret)
            router.setsockopt(zmq.ZAP_DOMAIN, PAIR_DOMAIN)
            # No ZAP handler answering: the handshake fails (libzmq would
            # let every CURVE client in otherwise).
            router.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        try:
            router.bind(self.bind_endpoint)
        except zmq.ZMQError:
            router.close(linger=0)
            raise
        self.bound = router.getsockopt_string(zmq.LAST_ENDPOINT)
        if curve is not None:
            self.handshakes = HandshakeMonitor(self._reactor, router, "curve")
            self.handshakes.start()
            curve.allowed.listeners.append(self._keys_replaced)
            self._inbound = ZmqSocket(self._reactor, router, self._identified, identified=True)
        else:
            self._inbound = ZmqSocket(self._reactor, router, self._batch)
        self._inbound.startReading()
        self._outbound = self._dealer()
        _log.info(
            "pair link bound to {bound}, partner at {partner}",
            bound=self.bound,
            partner=self.connect_endpoint,
        )
        if curve is not None:
            _log.info(
                "pair link: CURVE, admitting only the partner key {key} ({listed_in})",
                key=(self._partner_key or b"").decode("ascii"),
                listed_in=curve.allowed.listed_in,
            )
        else:
            _log.warn(
                "pair link: open: anything that reaches {bound} can speak to this broker as its"
                " partner; give --pair-key FILE (docs/security.md)",
                bound=self.bound,
            )

    def _dealer(self) -> ZmqSocket | None:
        """The DEALER to the partner (a CURVE client of its key on a CURVE link)."""
        curve = self.curve
        if curve is not None and self._partner_key is None:
            return None
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IMMEDIATE, 1)
        dealer.setsockopt(zmq.SNDHWM, SEND_QUEUE)
        dealer.setsockopt(zmq.RECONNECT_IVL, 100)
        dealer.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if curve is not None:
            assert self._partner_key is not None
            dealer.setsockopt(zmq.CURVE_SERVERKEY, self._partner_key)
            dealer.setsockopt(zmq.CURVE_PUBLICKEY, curve.keys.public)
            dealer.setsockopt(zmq.CURVE_SECRETKEY, curve.keys.secret)
        dealer.connect(self.connect_endpoint)
        return ZmqSocket(self._reactor, dealer, _ignore_batch)

    def send(self, message: wire.PairMessage) -> bool:
        """Send C{message} to the partner; False when it cannot be queued."""
        if self._outbound is None:
            self.refused += 1
            return False
        try:
            ok = self._outbound.send(wire.encode(message))
        except zmq.ZMQError:
            ok = False
        if ok:
            self.sent += 1
        else:
            self.refused += 1
        return ok

    def pauseReading(self) -> None:
        """Read nothing from the partner until L{resumeReading} (the journal is behind)."""
        if self._inbound is not None:
            self._inbound.pauseReading()

    def resumeReading(self) -> None:
        if self._inbound is not None:
            self._inbound.resumeReading()

    def status(self) -> LinkStatus:
        """The link's counters, for the pair's stats."""
        log = self.handshakes.log if self.handshakes is not None else None
        return LinkStatus(
            "open" if self.curve is None else "curve",
            (self._partner_key or b"").decode("ascii"),
            self.sent,
            self.refused,
            self.malformed,
            log.refused_by_zap if log is not None else 0,
            log.refused if log is not None else 0,
            log.broken_off if log is not None else 0,
            self.unlisted,
        )

    def _identified(self, batch: Batch) -> None:
        """
        A CURVE link's messages, each after its connection's user (the
        key ZAP admitted it with): those of a key no longer listed are dropped.
        """
        assert self.curve is not None
        admits = self.curve.allowed.admits
        admitted: Batch = []
        for frames in batch:
            if admits(frames[0]):
                admitted.append(frames[1:])
                continue
            self.unlisted += 1
            self._log_limit.info(
                "pair-unlisted",
                "pair link: dropped a message from key {key}, no longer in {listed_in}",
                key=frames[0].decode("ascii", "replace"),
                listed_in=self.curve.allowed.listed_in,
            )
        if admitted:
            self._batch(admitted)

    def _batch(self, batch: Batch) -> None:
        for frames in batch:
            try:
                message = wire.decode(frames[1:])
            except wire.MalformedPairMessage as e:
                self.malformed += 1
                # Rate-limited: a partner of another version sends nothing else.
                self._log_limit.info(
                    "pair-malformed", "pair link: dropped a malformed message: {e}", e=e
                )
                continue
            try:
                self._received(message)
            except Exception:
                _log.failure("pair link: handling {kind} failed", kind=type(message).__name__)

    def _keys_replaced(self, gone: set[bytes]) -> None:
        """
        The allow-list was reloaded: the DEALER follows the partner key (the
        one listed; the current one while it stays listed beside others),
        and sends nothing while none can be told.
        """
        assert self.curve is not None
        allowed = self.curve.allowed
        keys = list(allowed.keys)
        if self._partner_key is not None and allowed.admits(self._partner_key):
            return  # still listed: nothing changes
        key = keys[0] if len(keys) == 1 else None
        previous, self._partner_key = self._partner_key, key
        if self._outbound is not None:
            self._outbound.close()
            self._outbound = None
        if key is None:
            _log.error(
                "pair link: {listed_in} lists {n} keys, none of them the partner's key so far:"
                " nothing is sent to the partner until a reload lists it alone",
                listed_in=allowed.listed_in,
                n=len(keys),
            )
            return
        _log.warn(
            "pair link: the partner key is now {key} ({listed_in}), no longer {previous}",
            key=key.decode("ascii"),
            listed_in=allowed.listed_in,
            previous=(previous or b"-").decode("ascii"),
        )
        if self._inbound is not None:  # started
            self._outbound = self._dealer()

    def stop(self) -> None:
        if self.curve is not None and self._keys_replaced in self.curve.allowed.listeners:
            self.curve.allowed.listeners.remove(self._keys_replaced)
        if self.handshakes is not None:
            self.handshakes.stop()  # before its ROUTER closes; its counts stay
        for sock in (self._inbound, self._outbound):
            if sock is not None:
                sock.close()
        self._inbound = self._outbound = None


def _ignore_batch(batch: Batch) -> None:
    """The DEALER only sends: the partner answers on its own DEALER."""
