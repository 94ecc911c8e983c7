"""
Tests for L{malamute_pack.client.options}: the frozen options object, its
checks, and how the drivers' keyword arguments become one.
"""

from __future__ import annotations

import dataclasses

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.options import (
    ClientOptions,
    CurveKeys,
    OptionOverrides,
    resolve_options,
)
from malamute_pack.protocol import mlm


class ClientOptionsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        """
        The defaults: anonymous, version 2, timeout 5 s, heartbeat 1 s,
        commit timeout 30 s, auto_done.
        """
        options = ClientOptions()
        self.assertEqual(
            (
                options.address,
                options.version,
                options.timeout,
                options.heartbeat,
                options.commit_timeout,
            ),
            ("", 2, 5.0, 1.0, 30.0),
        )
        self.assertTrue(options.auto_done)
        self.assertIsNone(options.plain)

    def test_frozen(self) -> None:
        """Options cannot change once made."""
        options = ClientOptions()
        self.assertRaises(dataclasses.FrozenInstanceError, setattr, options, "timeout", 1.0)

    def test_refused(self) -> None:
        """Values that cannot work are refused when the options are made."""
        for bad in (
            {"heartbeat": 5.0},  # not below the timeout
            {"heartbeat": 0.0},
            {"version": 3},
            {"close_timeout": 0.0},
            {"commit_timeout": 0.0},
            {"max_held": -1},
            {"dedupe_window": 0},
        ):
            self.assertRaises(ValueError, ClientOptions, **bad)

    def test_addressTooLong(self) -> None:
        """An address the wire cannot carry (over 255 bytes) is refused at once."""
        self.assertRaises(mlm.MalformedMessage, ClientOptions, address="a" * 256)


class ResolveTests(SynchronousTestCase):
    def test_overridesApplied(self) -> None:
        """The address and each keyword replace their field of the options given."""
        base = ClientOptions(address="old", version=1, timeout=9.0)
        resolved = resolve_options(base, "new", {"timeout": 2.0, "heartbeat": 0.5})
        expected = ClientOptions(address="new", version=1, timeout=2.0, heartbeat=0.5)
        self.assertEqual(resolved, expected)

    def test_nothingToApply(self) -> None:
        """No options, no address, no keywords: the defaults."""
        self.assertEqual(resolve_options(None, None, {}), ClientOptions())

    def test_resultChecked(self) -> None:
        """An override that makes the options invalid raises ValueError."""
        self.assertRaises(ValueError, resolve_options, None, None, {"heartbeat": 10.0})

    def test_unknownKeyword(self) -> None:
        """A keyword naming no option raises TypeError."""
        overrides: dict[str, object] = {"timout": 1.0}
        self.assertRaises(TypeError, resolve_options, None, None, overrides)

    def test_overridesNameEveryOptionButAddress(self) -> None:
        """The keyword overrides and the options' fields cannot drift apart."""
        fields = {field.name for field in dataclasses.fields(ClientOptions)}
        self.assertEqual(set(OptionOverrides.__annotations__) | {"address"}, fields)

    def test_curveKeys(self) -> None:
        """
        CURVE keys are three 40-character Z85 keys; a short one, or CURVE
        together with PLAIN, is refused.
        """
        public, secret = zmq.curve_keypair()
        keys = CurveKeys(public.decode(), public.decode(), secret.decode())
        self.assertEqual(ClientOptions(curve=keys).curve, keys)
        with self.assertRaises(ValueError) as ctx:
            ClientOptions(curve=keys._replace(secret="short"))
        self.assertIn("secret", str(ctx.exception))
        self.assertRaises(ValueError, ClientOptions, curve=keys, plain=("u", "p"))
