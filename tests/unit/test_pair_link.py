"""
Tests for L{malamute_pack.pair.link}: the pair link's sockets on their
own, with real sockets (abstract ipc) in this process. A CURVE link
(C{--pair-key}) is two L{PairLink}s, each on a ZeroMQ context of its own
with its own ZAP handler serving L{PAIR_DOMAIN} (as two brokers have),
each listing the other's public key; strangers are raw DEALERs.
"""

from __future__ import annotations

import contextlib

import zmq
from twisted.logger import LogEvent, LogLevel, formatEvent
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.pair.link import PairLink
from malamute_pack.protocol import pair as wire
from malamute_pack.transport.curve import KeyPair, LinkCurve
from malamute_pack.transport.zap import PAIR_DOMAIN, KeyAllowList, ZapHandler
from tests.e2e_support import clock, ipc_endpoint, settle, the_reactor, until
from tests.support import capture_log


def key_pair() -> KeyPair:
    public, secret = zmq.curve_keypair()
    return KeyPair(public, secret)


def heartbeat(incarnation: str, state: str = "active") -> wire.Heartbeat:
    return wire.Heartbeat("primary", state, True, incarnation, "epoch", 0, True)


def formats(events: list[LogEvent]) -> list[str]:
    """The log lines of C{events}, formatted."""
    return [formatEvent(e) for e in events]


class Side:
    """One broker's end of the link: its context, ZAP handler, keys and link."""

    def __init__(
        self,
        case: TestCase,
        bind: str,
        connect: str,
        keys: KeyPair | None,
        partner: bytes | None,
        zap: bool = True,
    ) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        case.addCleanup(self.context.term)
        self.received: list[wire.PairMessage] = []
        self.keys = keys
        self.curve: LinkCurve | None = None
        if keys is not None and partner is not None:
            allowed = KeyAllowList("pair partner", {partner: "partner"}, "--pair-key p.key")
            self.curve = LinkCurve(keys, allowed)
            self.zap = ZapHandler(the_reactor(), self.context, {})
            self.zap.serve(PAIR_DOMAIN, allowed)
            if zap:
                self.zap.startService()
                case.addCleanup(self.zap.stopService)
        self.link = PairLink(
            the_reactor(), self.context, bind, connect, self.received.append, self.curve
        )
        self.link.start()
        case.addCleanup(self.link.stop)


class CurveLinkTests(TestCase):
    """Two CURVE links, each admitting only the other's key, and strangers."""

    def setUp(self) -> None:
        self.logged = capture_log(self)
        self.a_end, self.b_end = ipc_endpoint(), ipc_endpoint()
        self.a_keys, self.b_keys = key_pair(), key_pair()
        self.a = Side(self, self.a_end, self.b_end, self.a_keys, self.b_keys.public)
        self.b = Side(self, self.b_end, self.a_end, self.b_keys, self.a_keys.public)

    async def exchanged(self, tag: str) -> None:
        """Each side sends a heartbeat until the other has received one with C{tag}."""

        def got(side: Side) -> bool:
            return any(
                isinstance(m, wire.Heartbeat) and m.incarnation == tag for m in side.received
            )

        async def send_until(sender: Side, receiver: Side) -> None:
            deadline = clock().seconds() + 10.0
            while not got(receiver):
                if clock().seconds() > deadline:
                    self.fail(f"no heartbeat {tag!r} arrived")
                sender.link.send(heartbeat(tag))
                await settle(0.05)

        await send_until(self.a, self.b)
        await send_until(self.b, self.a)

    def stranger(self, endpoint: str, keys: KeyPair | None, server: bytes) -> zmq.Socket[bytes]:
        """A DEALER of another broker (C{keys}, or no CURVE at all) to C{endpoint}."""
        dealer = self.a.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            dealer.setsockopt(zmq.CURVE_SERVERKEY, server)
            dealer.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
            dealer.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
        dealer.connect(endpoint)
        self.addCleanup(dealer.close, 0)
        return dealer

    async def test_partnersExchange(self) -> None:
        """
        Two CURVE links that list each other's key exchange messages both
        ways; each says it is CURVE, with the partner's key, and logs so
        at start, naming the key and where it is listed.
        """
        await self.exchanged("one")
        status = self.a.link.status()
        self.assertEqual(
            (status.security, status.partner_key, status.unlisted_dropped),
            ("curve", self.b_keys.public.decode(), 0),
        )
        self.assertGreaterEqual(status.sent, 1)
        self.assertIn(
            f"pair link: CURVE, admitting only the partner key {self.b_keys.public.decode()}"
            " (--pair-key p.key)",
            formats(self.logged),
        )

    async def test_strangersDeliverNothing(self) -> None:
        """
        A DEALER with another CURVE key and one with no CURVE reach B's
        ROUTER and send well-formed pair messages: B receives none of them
        (while its partner's still arrive); the CURVE stranger is refused by
        ZAP, which logs its key; the one without CURVE is refused before
        ZAP (a mechanism mismatch) and logged by the link's monitor; both
        are counted in the link's status.
        """
        await self.exchanged("before")
        other = key_pair()
        curved = self.stranger(self.b_end, other, self.b_keys.public)
        bare = self.stranger(self.b_end, None, b"")
        for _ in range(5):
            for dealer in (curved, bare):
                with contextlib.suppress(zmq.Again):
                    dealer.send_multipart(wire.encode(heartbeat("stranger")), zmq.NOBLOCK)
            await settle(0.05)

        def counted() -> bool:
            status = self.b.link.status()
            return status.refused_by_zap >= 1 and (
                status.refused_handshakes + status.broken_off >= 1
            )

        await until(counted)
        await self.exchanged("after")
        self.assertEqual(
            [
                m
                for m in self.b.received
                if isinstance(m, wire.Heartbeat) and m.incarnation == "stranger"
            ],
            [],
        )
        self.assertGreaterEqual(self.b.zap.counters["pair partner"].refused, 1)
        lines = formats(self.logged)
        self.assertTrue(
            any(
                f"refused CURVE pair partner key {other.public.decode()}, not in --pair-key p.key"
                in line
                for line in lines
            ),
            lines,
        )
        self.assertTrue(
            any(
                f"refused a client on {self.b_end}: security mechanism mismatch" in line
                or f"a client on {self.b_end} broke off the CURVE handshake" in line
                for line in lines
            ),
            lines,
        )

    async def test_removedKeyGivesNothing(self) -> None:
        """
        Once a reload lists another key in A's place, B drops what A's
        connection (still open) sends, counting and logging it, and B's
        DEALER follows the new key: A's link hears nothing from B either.
        """
        await self.exchanged("listed")
        replacement = key_pair()
        assert self.b.curve is not None
        self.b.curve.allowed.replace({replacement.public: "new partner"})
        self.assertEqual(self.b.link.partner_key, replacement.public)
        before_a, before_b = len(self.a.received), len(self.b.received)
        for _ in range(10):
            self.a.link.send(heartbeat("removed"))
            self.b.link.send(heartbeat("removed"))
            await settle(0.05)
        await until(lambda: self.b.link.status().unlisted_dropped >= 1)
        self.assertEqual(len(self.b.received), before_b)
        self.assertEqual(len(self.a.received), before_a)
        self.assertTrue(
            any(
                f"pair link: dropped a message from key {self.a_keys.public.decode()},"
                " no longer in --pair-key p.key" in line
                for line in formats(self.logged)
            )
        )

    async def test_keyListedAgain(self) -> None:
        """A key listed again by a later reload is heard again, both ways."""
        await self.exchanged("first")
        assert self.b.curve is not None
        self.b.curve.allowed.replace({key_pair().public: "new partner"})
        self.b.curve.allowed.replace({self.a_keys.public: "partner"})
        await self.exchanged("again")


class NoZapTests(TestCase):
    async def test_noZapHandlerAdmitsNobody(self) -> None:
        """
        A CURVE link whose context has no ZAP handler running fails closed:
        even its listed partner gets no message through.
        """
        a_end, b_end = ipc_endpoint(), ipc_endpoint()
        a_keys, b_keys = key_pair(), key_pair()
        a = Side(self, a_end, b_end, a_keys, b_keys.public)
        b = Side(self, b_end, a_end, b_keys, a_keys.public, zap=False)
        for _ in range(20):
            a.link.send(heartbeat("unchecked"))
            await settle(0.025)
        self.assertEqual(b.received, [])
        self.assertEqual(b.link.status().unlisted_dropped, 0)  # none got in to be dropped


class OpenLinkTests(TestCase):
    """A link without --pair-key."""

    async def test_openLinkWarns(self) -> None:
        """
        An open link exchanges messages as before, says it is open in its
        status, and warns at start that anything reaching its endpoint can
        speak as the partner, naming the endpoint and --pair-key.
        """
        logged = capture_log(self)
        a_end, b_end = ipc_endpoint(), ipc_endpoint()
        a = Side(self, a_end, b_end, None, None)
        b = Side(self, b_end, a_end, None, None)
        deadline = clock().seconds() + 10.0
        while not b.received:
            if clock().seconds() > deadline:
                self.fail("nothing arrived on the open link")
            a.link.send(heartbeat("open"))
            await settle(0.05)
        self.assertEqual(b.link.status().security, "open")
        warnings = [
            formatEvent(e)
            for e in logged
            if e.get("log_level") is LogLevel.warn and formatEvent(e).startswith("pair link: open:")
        ]
        self.assertIn(
            f"pair link: open: anything that reaches {a_end} can speak to this broker as its"
            " partner; give --pair-key FILE (docs/security.md)",
            warnings,
        )


class PartnerKeyTests(SynchronousTestCase):
    def test_oneKeyOnly(self) -> None:
        """A CURVE link refuses an allow-list of several keys: its DEALER needs one."""
        allowed = KeyAllowList(
            "pair partner", {key_pair().public: "a", key_pair().public: "b"}, "--pair-key keys/"
        )
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        with self.assertRaises(ValueError) as raised:
            PairLink(
                the_reactor(),
                context,
                ipc_endpoint(),
                ipc_endpoint(),
                lambda message: None,
                LinkCurve(key_pair(), allowed),
            )
        self.assertIn("--pair-key keys/ lists 2", str(raised.exception))
