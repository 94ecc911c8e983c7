"""
Tests for L{malamute_pack.transport.zap}: the password file and the answers
of the ZAP handler to PLAIN and CURVE requests, refusals throttled per
peer address and their logging limited (the handler over real sockets is
tested end to end and in ``tests/test_transport_security.py``).
"""

from __future__ import annotations

from pathlib import Path

import zmq
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zmq.utils import z85

from malamute_pack.transport.zap import (
    FAILURE_WINDOW,
    MAX_FAILURES,
    PasswordFileError,
    ZapHandler,
    check_plain,
    load_passwords,
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

    def test_failuresThrottled(self) -> None:
        """
        After MAX_FAILURES failures within the window, a peer address is
        refused even with good credentials until the window ends; other
        addresses are not affected.
        """
        for _ in range(MAX_FAILURES):
            self.handler.answer(request(b"PLAIN", b"admin", b"guess"))
        good = request(b"PLAIN", b"admin", b"secret")
        reply = self.handler.answer(good)
        assert reply is not None
        self.assertEqual(reply[4:6], [b"400", b"too many failures"])
        self.assertEqual(self.handler.throttled, 1)
        elsewhere = [*good[:5], b"10.0.0.9", *good[6:]]
        self.assertEqual(self.handler.answer(elsewhere)[4], b"200")  # type: ignore[index]
        self.clock.advance(FAILURE_WINDOW)
        self.assertEqual(self.handler.answer(good)[4], b"200")  # type: ignore[index]

    def test_ipcClientsNotThrottled(self) -> None:
        """
        Failures from the empty address (every ipc client has it) are
        counted but never lock the others out.
        """
        for _ in range(MAX_FAILURES * 2):
            self.handler.answer(ipc_request(b"PLAIN", b"admin", b"guess"))
        self.assertEqual(self.handler.refused, MAX_FAILURES * 2)
        reply = self.handler.answer(ipc_request(b"PLAIN", b"admin", b"secret"))
        assert reply is not None
        self.assertEqual(reply[4], b"200")

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
