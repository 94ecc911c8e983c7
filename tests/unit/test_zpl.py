"""
Tests for L{malamute_pack.zpl}: the ZPL reader for the C broker's config file.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.zpl import ZplError, parse_zpl

C_BROKER_CFG = """\
#   Malamute configuration

#   Apply to the whole broker
server
    timeout = 10000     #   Client connection timeout, msec
    background = 0      #   Run as background process
    auth
        verbose = 1     #   Debug authentication steps?
        plain = passwords.cfg

mlm_server
    security
        mechanism = plain
    echo = binding Malamute service to 'tcp://*:9999'
    bind
        endpoint = tcp://*:9999
        endpoint = "ipc://@/malamute"
    mailbox
        size-limit = max        # Maximum mailbox size (integer or "max")
"""


class ParseTests(SynchronousTestCase):
    def test_cBrokerConfig(self) -> None:
        """
        The C broker's sample config parses into paths: nesting by four
        spaces, comments stripped, quotes removed, repeated keys kept in order.
        """
        config = parse_zpl(C_BROKER_CFG)
        self.assertEqual(config["server/timeout"], ["10000"])
        self.assertEqual(config["server/auth/plain"], ["passwords.cfg"])
        self.assertEqual(config["mlm_server/security/mechanism"], ["plain"])
        self.assertEqual(config["mlm_server/bind/endpoint"], ["tcp://*:9999", "ipc://@/malamute"])
        self.assertEqual(config["mlm_server/mailbox/size-limit"], ["max"])
        self.assertEqual(config["mlm_server/echo"], ["binding Malamute service to 'tcp://*:9999'"])
        self.assertNotIn("server", config)

    def test_badIndent(self) -> None:
        """A line indented deeper than one level below its parent is refused."""
        self.assertRaises(ZplError, parse_zpl, "a\n        b = 1\n")

    def test_badLine(self) -> None:
        """A line that is not a name (with an optional value) is refused with its number."""
        with self.assertRaises(ZplError) as ctx:
            parse_zpl("a = 1\n  odd indent = 2\n")
        self.assertIn("line 2", str(ctx.exception))

    def test_unterminatedQuote(self) -> None:
        """An unterminated quoted value is refused."""
        self.assertRaises(ZplError, parse_zpl, 'a = "open\n')


class LinesTests(SynchronousTestCase):
    def test_firstLineOfEachKey(self) -> None:
        """The tree knows the line each key is first given on (for start-up's errors)."""
        tree = parse_zpl("# comment\nserver\n    timeout = 1\n\nbind\n    e = a\n    e = b\n")
        self.assertEqual(tree.lines, {"server/timeout": 3, "bind/e": 6})
        self.assertEqual(tree["bind/e"], ["a", "b"])
