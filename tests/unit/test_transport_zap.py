"""
Tests for L{malamute_pack.transport.zap}: the password file and the answers
of the ZAP handler to PLAIN and CURVE requests, the throttle (refusals
answered late per (address, user) pair, right answers at once, its bounds)
and the logging of refusals limited (the handler over real sockets is
tested end to end, in ``tests/unit/test_transport_security.py`` and, under a
brute force, in ``tests/system/test_system_bruteforce.py``).
"""

from __future__ import annotations

from pathlib import Path

import zmq
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zmq.utils import z85

from malamute_pack.transport.zap import (
    BROKER_LOG_INTERVAL,
    CLIENT_DOMAIN,
    FAILURE_WINDOW,
    FIRST_DELAY,
    MAX_DELAY,
    MAX_PENDING,
    MAX_TRACKED,
    PACK_DOMAIN,
    KeyAllowList,
    PasswordFileError,
    ZapHandler,
    check_plain,
    load_passwords,
    refusal_delay,
)
from tests.support import capture_log


class PasswordFileTests(SynchronousTestCase):
    def write(self, text: str) -> Path:
        path = Path(self.mktemp())
        path.write_text(text)
        return path

    def test_formats(self) -> None:
        """Both C{user = password} and C{user=password} lines are read; comments skipped."""
        path = self.write("# comment\n\nadmin = se=cret\nguest=guest\n")
        self.assertEqual(load_passwords(path), {"admin": "se=cret", "guest": "guest"})

    def test_badLine(self) -> None:
        """A line without '=' is refused with its line number."""
        with self.assertRaises(PasswordFileError) as ctx:
            load_passwords(self.write("admin secret\n"))
        self.assertIn(":1:", str(ctx.exception))

    def test_missingFile(self) -> None:
        """A missing file is a clear error, not a traceback from open()."""
        with self.assertRaises(PasswordFileError) as ctx:
            load_passwords(Path(self.mktemp()))
        self.assertIn("cannot read password file", str(ctx.exception))

    def test_reservedUsers(self) -> None:
        """C{*} and C{-} mean every user and no user in the access file: not names."""
        for text in ("* = x\n", "- = x\n"):
            with self.assertRaises(PasswordFileError) as ctx:
                load_passwords(self.write(text))
            self.assertIn("cannot be a user", str(ctx.exception))

    def test_check(self) -> None:
        """Only the right user and password pass."""
        passwords = {"admin": "secret"}
        self.assertTrue(check_plain(passwords, b"admin", b"secret"))
        self.assertFalse(check_plain(passwords, b"admin", b"Secret"))
        self.assertFalse(check_plain(passwords, b"nobody", b"secret"))


def request(mechanism: bytes, *credentials: bytes) -> list[bytes]:
    return [b"peer", b"", b"1.0", b"42", b"malamute", b"127.0.0.1", b"", mechanism, *credentials]


class AnswerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.handler = ZapHandler(reactor, zmq.Context.instance(), {"admin": "secret"})

    def test_plainAccepted(self) -> None:
        """A good PLAIN request gets status 200 with the user id."""
        reply = self.handler.answer(request(b"PLAIN", b"admin", b"secret"))
        self.assertEqual(reply, [b"peer", b"", b"1.0", b"42", b"200", b"OK", b"admin", b""])

    def test_plainRefused(self) -> None:
        """A bad password gets status 400."""
        reply = self.handler.answer(request(b"PLAIN", b"admin", b"wrong"))
        assert reply is not None
        self.assertEqual(reply[4], b"400")
        self.assertEqual(self.handler.refused, 1)

    def test_nullRefusedByDefault(self) -> None:
        """NULL clients are refused unless the handler allows them."""
        reply = self.handler.answer(request(b"NULL"))
        assert reply is not None
        self.assertEqual(reply[4], b"400")

    def test_malformedIgnored(self) -> None:
        """A request with no delimiter or a wrong version gets no answer."""
        self.assertIsNone(self.handler.answer([b"peer", b"junk"]))
        self.assertIsNone(self.handler.answer([b"peer", b"", b"2.0", b"1", b"", b"", b"", b"NULL"]))


class CurveAndThrottleTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        public, _ = zmq.curve_keypair()
        self.public = public
        self.handler = ZapHandler(
            self.clock,  # type: ignore[arg-type]
            zmq.Context.instance(),
            {"admin": "secret"},
            curve_keys={public: "alice"},
        )

    def test_curveKnownKey(self) -> None:
        """A CURVE request with a known public key gets 200 and that key's user."""
        reply = self.handler.answer(request(b"CURVE", z85.decode(self.public)))
        self.assertEqual(reply, [b"peer", b"", b"1.0", b"42", b"200", b"OK", b"alice", b""])

    def test_curveUnknownKey(self) -> None:
        """An unknown key, or credentials that are not one 32-byte key, get 400."""
        other, _ = zmq.curve_keypair()
        for credentials in ([z85.decode(other)], [b"short"], []):
            reply = self.handler.answer(request(b"CURVE", *credentials))
            assert reply is not None
            self.assertEqual(reply[4], b"400", credentials)

    def test_floodLogsAFewLines(self) -> None:
        """
        A flood of bad requests is counted in full but logged a few lines a
        second, whatever the number of addresses it comes from.
        """
        logged = capture_log(self)
        for n in range(1000):
            source = f"10.0.{n // 256}.{n % 256}".encode()
            self.handler.answer(
                [*request(b"PLAIN", b"x", b"y")[:5], source, b"", b"PLAIN", b"x", b"y"]
            )
        self.assertEqual(self.handler.refused, 1000)
        refusals = [e for e in logged if "refused {mechanism}" in str(e.get("log_format"))]
        self.assertLessEqual(len(refusals), 10)
        self.clock.advance(1)
        self.handler.answer(request(b"CURVE", b"k" * 32))
        self.assertIn("not logged", str(logged[-2].get("log_format")))

    def test_plainUserIsTheName(self) -> None:
        """The user id of an accepted PLAIN client is its name; a name not UTF-8 is refused."""
        reply = self.handler.answer(request(b"PLAIN", b"admin", b"secret"))
        assert reply is not None
        self.assertEqual(reply[6], b"admin")
        reply = self.handler.answer(request(b"PLAIN", b"adm\xffin", b"secret"))
        assert reply is not None
        self.assertEqual((reply[4], reply[6]), (b"400", b""))


def ipc_request(mechanism: bytes, *credentials: bytes) -> list[bytes]:
    return [b"peer", b"", b"1.0", b"7", b"malamute", b"", b"", mechanism, *credentials]


def domain_request(domain: bytes, mechanism: bytes, *credentials: bytes) -> list[bytes]:
    return [b"peer", b"", b"1.0", b"9", domain, b"10.0.0.7", b"", mechanism, *credentials]


class DomainTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.listed, _ = zmq.curve_keypair()
        self.handler = ZapHandler(
            self.clock,  # type: ignore[arg-type]
            zmq.Context.instance(),
            {"admin": "secret"},
            curve_keys={self.listed: "alice"},
        )
        self.handler.serve(PACK_DOMAIN, KeyAllowList("pack peer", {self.listed: "h1"}, "keys/"))

    def test_listedKeyGetsItselfAsUser(self) -> None:
        """A listed broker's key is admitted on its domain, with the key (Z85) as its user id."""
        reply = self.handler.answer(domain_request(PACK_DOMAIN, b"CURVE", z85.decode(self.listed)))
        assert reply is not None
        self.assertEqual(reply[4:7], [b"200", b"OK", self.listed])
        self.assertEqual(self.handler.counters["pack peer"].accepted, 1)

    def test_unlistedKeyRefusedAndLogged(self) -> None:
        """
        A key not listed is refused on the brokers' domain even when it is a
        client's key, and the log names the key and the address.
        """
        logged = capture_log(self)
        stranger, _ = zmq.curve_keypair()
        for key in (stranger, self.listed):
            request = domain_request(PACK_DOMAIN, b"CURVE", z85.decode(key))
            if key == self.listed:
                self.handler.serve(PACK_DOMAIN, KeyAllowList("pack peer", {}, "keys/"))
            reply = self.handler.answer(request)
            assert reply is not None
            self.assertEqual(reply[4], b"400")
        self.assertEqual(self.handler.counters["pack peer"].refused, 2)
        lines = [e for e in logged if "refused {mechanism} {name}" in str(e.get("log_format"))]
        self.assertEqual(lines[0]["who"], f"key {stranger.decode()}, not in keys/")
        self.assertEqual(lines[0]["address"], "10.0.0.7")

    def test_strangerLoggedOncePerInterval(self) -> None:
        """
        A stranger broker that tries again and again (for as long as it
        runs) is counted each time but logged once per key and address per
        BROKER_LOG_INTERVAL.
        """
        logged = capture_log(self)
        stranger, _ = zmq.curve_keypair()
        request = domain_request(PACK_DOMAIN, b"CURVE", z85.decode(stranger))
        for _ in range(5):
            self.handler.answer(request)
            self.clock.advance(30)
        self.clock.advance(BROKER_LOG_INTERVAL)
        self.handler.answer(request)
        lines = [e for e in logged if "refused {mechanism} {name}" in str(e.get("log_format"))]
        self.assertEqual((len(lines), self.handler.counters["pack peer"].refused), (2, 6))

    def test_onlyCurveOnBrokersDomain(self) -> None:
        """PLAIN credentials that a client could use never admit anyone to a brokers' domain."""
        reply = self.handler.answer(domain_request(PACK_DOMAIN, b"PLAIN", b"admin", b"secret"))
        assert reply is not None
        self.assertEqual(reply[4], b"400")

    def test_unknownDomainRefused(self) -> None:
        """A socket whose domain nobody serves lets nobody in."""
        reply = self.handler.answer(domain_request(b"other", b"CURVE", z85.decode(self.listed)))
        assert reply is not None
        self.assertEqual(reply[4], b"400")
        self.assertEqual(self.handler.counters["unknown"].refused, 1)

    def test_clientDomainUnchanged(self) -> None:
        """The clients' domain still takes the clients' keys, with their users."""
        reply = self.handler.answer(
            domain_request(CLIENT_DOMAIN, b"CURVE", z85.decode(self.listed))
        )
        assert reply is not None
        self.assertEqual(reply[4:7], [b"200", b"OK", b"alice"])


def attempt(
    user: bytes, password: bytes, address: bytes = b"127.0.0.1", serial: int = 0
) -> list[bytes]:
    """A PLAIN request from C{address} whose request id is C{serial}."""
    return [
        *(b"peer", b"", b"1.0", str(serial).encode(), b"malamute", address, b""),
        *(b"PLAIN", user, password),
    ]


def status(reply: list[bytes] | None) -> bytes | None:
    """A reply's status code (None for no reply)."""
    return None if reply is None else reply[4]


class ThrottleTests(SynchronousTestCase):
    """
    The throttle: refusals answered late, by how often their (address,
    user) pair failed lately; right answers at once; bounded work.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.sent: list[list[bytes]] = []
        self.handler = self.make()

    def make(self, max_pending: int = MAX_PENDING, max_tracked: int = MAX_TRACKED) -> ZapHandler:
        return ZapHandler(
            self.clock,  # type: ignore[arg-type]
            zmq.Context.instance(),
            {"admin": "secret", "guest": "guest"},
            send=self.sent.append,
            max_pending=max_pending,
            max_tracked=max_tracked,
        )

    def delay_of(self, frames: list[bytes]) -> float | None:
        """
        How long C{frames}' refusal waits for its answer (0: answered at
        once), checked by advancing the clock until it is sent; None if
        it is not a refusal.
        """
        self.sent.clear()
        before = set(self.clock.getDelayedCalls())
        reply = self.handler.answer(frames)
        if reply is not None:
            return 0.0 if status(reply) == b"400" else None
        [call] = set(self.clock.getDelayedCalls()) - before
        delay = round(call.getTime() - self.clock.seconds(), 6)
        self.clock.advance(delay - 0.001)
        self.assertEqual(self.sent, [], "answered early")
        self.clock.advance(0.002)
        [sent] = self.sent
        self.assertEqual((sent[3], status(sent)), (frames[3], b"400"))
        return delay

    def test_delays(self) -> None:
        """
        A pair's first refusal is answered at once, the next after
        FIRST_DELAY, each later one after twice the one before, at most
        MAX_DELAY.
        """
        self.assertEqual((FIRST_DELAY, MAX_DELAY), (0.1, 2.0))
        delays = [self.delay_of(attempt(b"admin", b"guess", serial=n)) for n in range(9)]
        self.assertEqual(delays, [0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0])
        self.assertEqual([refusal_delay(n) for n in (1, 2, 7, 100, 10**9)], [0, 0.1, 2, 2, 2])
        counters = self.handler.counters["client"]
        self.assertEqual((counters.refused, counters.throttled, counters.hurried), (9, 8, 0))

    def test_rightAnswerAtOnce(self) -> None:
        """
        After a brute force of 1000 wrong passwords for admin from one
        address, the right password for admin from that address, and
        another user's from it, are answered 200 at once, without the
        clock moving; every refusal is answered, those past the bound on
        waiting ones (MAX_PENDING) sooner than their time.
        """
        first = self.handler.answer(attempt(b"admin", b"guess", serial=0))
        self.assertEqual(status(first), b"400")  # a first refusal: at once
        for n in range(1, 1000):
            self.assertIsNone(self.handler.answer(attempt(b"admin", b"guess", serial=n)))
        for user, password in ((b"admin", b"secret"), (b"guest", b"guest")):
            reply = self.handler.answer(attempt(user, password, serial=5000))
            assert reply is not None
            self.assertEqual(reply[4:7], [b"200", b"OK", user])
        self.assertEqual(self.handler.accepted, 2)
        self.assertEqual(
            (self.handler.pending, self.handler.hurried), (MAX_PENDING, 999 - MAX_PENDING)
        )
        self.clock.advance(MAX_DELAY)
        self.assertEqual(self.handler.pending, 0)
        answered = {frames[3] for frames in self.sent}
        self.assertEqual(len(answered), 999)  # the first was the answer() return
        self.assertEqual({status(frames) for frames in self.sent}, {b"400"})

    def test_othersNotDelayed(self) -> None:
        """
        The failures of admin at one address delay neither another user's
        first refusal there nor admin's first refusal at another address.
        """
        for n in range(10):
            self.handler.answer(attempt(b"admin", b"guess", serial=n))
        self.assertEqual(self.delay_of(attempt(b"guest", b"guess")), 0.0)
        self.assertEqual(self.delay_of(attempt(b"admin", b"guess", b"10.0.0.9")), 0.0)

    def test_failuresForgotten(self) -> None:
        """
        A pair's failures are forgotten FAILURE_WINDOW seconds after its
        last one: its next refusal is answered at once, as a first; a
        failure within the window keeps them.
        """
        for n in range(4):
            self.delay_of(attempt(b"admin", b"guess", serial=n))
        self.clock.advance(FAILURE_WINDOW - 1)
        self.assertEqual(self.delay_of(attempt(b"admin", b"guess")), 0.8)
        self.clock.advance(FAILURE_WINDOW)
        self.assertEqual(self.delay_of(attempt(b"admin", b"guess")), 0.0)
        self.assertEqual(self.delay_of(attempt(b"admin", b"guess")), 0.1)

    def test_pendingBound(self) -> None:
        """
        At most max_pending refusals wait: one more answers the oldest at
        once (counted as hurried); a right answer then is still sent at
        once and hurries none.
        """
        handler = self.handler = self.make(max_pending=3)
        handler.answer(attempt(b"admin", b"guess", serial=0))  # a first: answered at once
        for n in range(1, 4):
            self.assertIsNone(handler.answer(attempt(b"admin", b"guess", serial=n)))
        self.assertEqual((handler.pending, self.sent), (3, []))
        self.assertIsNone(handler.answer(attempt(b"admin", b"guess", serial=4)))
        self.assertEqual([(f[3], status(f)) for f in self.sent], [(b"1", b"400")])
        self.assertEqual((handler.pending, handler.hurried, handler.throttled), (3, 1, 4))
        reply = handler.answer(attempt(b"admin", b"secret", serial=5))
        self.assertEqual(status(reply), b"200")
        self.assertEqual((handler.pending, handler.hurried, len(self.sent)), (3, 1, 1))
        self.clock.advance(MAX_DELAY)
        self.assertEqual(sorted(f[3] for f in self.sent), [b"1", b"2", b"3", b"4"])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_trackedBound(self) -> None:
        """
        At most max_tracked pairs are remembered: one more forgets the pair
        that failed longest ago, whose next refusal is then a first.
        """
        handler = self.handler = self.make(max_tracked=3)
        for user in (b"u1", b"u2", b"u3", b"u1", b"u4"):
            self.delay_of(attempt(user, b"guess"))
        self.assertEqual(handler.tracked, 3)
        self.assertEqual(self.delay_of(attempt(b"u2", b"guess")), 0.0)  # u2 was forgotten
        self.assertEqual(self.delay_of(attempt(b"u4", b"guess")), 0.1)

    def test_ipcThrottledPerUser(self) -> None:
        """
        ipc clients (all at the empty address) are throttled per user: a
        local process guessing admin's password waits, another user's
        refusal does not, and admin's right password is answered at once.
        """
        delays = [self.delay_of(ipc_request(b"PLAIN", b"admin", b"guess")) for _ in range(3)]
        self.assertEqual(delays, [0.0, 0.1, 0.2])
        self.assertEqual(self.delay_of(ipc_request(b"PLAIN", b"guest", b"guess")), 0.0)
        reply = self.handler.answer(ipc_request(b"PLAIN", b"admin", b"secret"))
        self.assertEqual(status(reply), b"200")

    def test_curveKeyThrottled(self) -> None:
        """On a brokers' domain an unlisted key is the pair's user: its refusals wait."""
        self.handler.serve(PACK_DOMAIN, KeyAllowList("pack peer", {}, "keys/"))
        stranger, _ = zmq.curve_keypair()
        frames = domain_request(PACK_DOMAIN, b"CURVE", z85.decode(stranger))
        self.assertEqual([self.delay_of(frames) for _ in range(3)], [0.0, 0.1, 0.2])
        other, _ = zmq.curve_keypair()
        self.assertEqual(self.delay_of(domain_request(PACK_DOMAIN, b"CURVE", z85.decode(other))), 0)
        self.assertEqual(self.handler.counters["pack peer"].throttled, 2)

    def test_throttledRefusalLogged(self) -> None:
        """A delayed refusal's log line says the delay and the failures lately."""
        logged = capture_log(self)
        for n in range(3):
            self.handler.answer(attempt(b"admin", b"guess", serial=n))
        lines = [e for e in logged if "refused {mechanism}" in str(e.get("log_format"))]
        self.assertEqual([(e["delay"], e["failures"]) for e in lines], [(0, 1), (0.1, 2), (0.2, 3)])
        self.assertIn("answered in {delay}s", lines[-1]["log_format"])
        self.assertNotIn("answered in", lines[0]["log_format"])

    def test_stopAnswersWaiting(self) -> None:
        """Stopping the handler answers the refusals still waiting and leaves no timer."""
        for n in range(4):
            self.handler.answer(attempt(b"admin", b"guess", serial=n))
        self.handler.stopService()
        self.assertEqual(sorted(f[3] for f in self.sent), [b"1", b"2", b"3"])
        self.assertEqual((self.handler.pending, self.clock.getDelayedCalls()), (0, []))

    def test_boundsAtLeastOne(self) -> None:
        """A bound below 1 is refused: the throttle could hold nothing."""
        self.assertRaises(ValueError, self.make, max_pending=0)
        self.assertRaises(ValueError, self.make, max_tracked=0)


class LifetimeTests(SynchronousTestCase):
    """The handler's socket over a real ZeroMQ context."""

    def test_restartAtOnce(self) -> None:
        """
        A handler stopped frees ZAP's inproc name at once: another started
        right after it on the same context binds it (a close alone frees it
        later, in ZeroMQ's reaper thread, and the bind could fail).
        """
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.destroy, linger=0)
        for _ in range(200):
            handler = ZapHandler(reactor, context, {"admin": "secret"})
            handler.startService()
            handler.stopService()
        self.assertFalse(handler.running)
