"""
Tests for L{malamute_pack.transport.zap}: the password file and the answers
of the ZAP handler (the handler over real sockets is tested end to end).
"""

from __future__ import annotations

from pathlib import Path

import zmq
from twisted.internet import reactor
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.transport.zap import (
    PasswordFileError,
    ZapHandler,
    check_plain,
    load_passwords,
)


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
