"""
Tests that the clients report an authentication refusal as such, at once:
a broker in the reactor with PLAIN security (the project's ZAP handler and
a password table, as C{twistd malamute} runs it) and the real clients
(L{MalamuteClient} in the reactor; L{BlockingClient} and L{BulkClient} in
a child process, since they block and the broker's ZAP handler answers
from this reactor). A wrong password and missing credentials raise
L{AuthenticationRefusedError} well before the connect timeout, and the
broker logs each refusal once: ZAP's for a wrong password, the handshake
monitor's for a mechanism mismatch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import zmq
from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.logger import LogEvent, formatEvent
from twisted.trial.unittest import TestCase

from malamute_pack.client import (
    AuthenticationRefusedError,
    BrokerUnreachableError,
    MalamuteClient,
)
from malamute_pack.settings import Settings
from malamute_pack.transport.handshakes import HandshakeLog
from malamute_pack.transport.zap import ZapHandler
from tests.e2e_support import settle, start_broker, tcp_endpoint
from tests.support import capture_log

ROOT = Path(__file__).resolve().parents[1]
PASSWORDS = "bob = builder\n"

# Run in a child: connect a blocking client (argv: kind, endpoint, user or
# "", password) and print what happened as JSON.
CHILD = """
import json, sys, time
from malamute_pack.client import BlockingClient, BrokerUnreachableError
from malamute_pack.client.bulk import BulkClient
from malamute_pack.client.options import ClientOptions
kind, endpoint, user, password = sys.argv[1:5]
plain = (user, password) if user else None
started = time.monotonic()
try:
    if kind == "blocking":
        BlockingClient(endpoint, "me", plain=plain, timeout=5.0).close()
    else:
        BulkClient(endpoint, options=ClientOptions(plain=plain), timeout=5.0).close()
    outcome = {"error": None}
except Exception as e:
    outcome = {
        "error": type(e).__name__,
        "message": str(e),
        "unreachable": isinstance(e, BrokerUnreachableError),
    }
outcome["seconds"] = time.monotonic() - started
print(json.dumps(outcome))
"""


def lines(events: list[LogEvent], fragment: str) -> list[str]:
    """The formatted log lines that contain C{fragment}."""
    return [text for text in map(formatEvent, events) if text and fragment in text]


class RefusalTests(TestCase):
    """The clients against a broker whose TCP endpoint requires PLAIN."""

    def setUp(self) -> None:
        self.events = capture_log(self)
        passwords = Path(self.mktemp())
        passwords.write_text(PASSWORDS)
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        settings = Settings(
            endpoints=(tcp_endpoint(),),
            mechanism="plain",
            passwords=passwords,
            data_dir=Path(self.mktemp()),
        )
        self.service, self.router = start_broker(settings, self.context)
        self.addCleanup(self.service.stopService)
        self.endpoint = self.router.bound[0]

    def zap(self) -> ZapHandler:
        zap = self.service.getServiceNamed("zap")
        assert isinstance(zap, ZapHandler)
        return zap

    def handshakes(self) -> HandshakeLog:
        assert self.router.handshakes is not None
        return self.router.handshakes.log

    async def refused(self, plain: tuple[str, str] | None) -> tuple[Exception, float]:
        """Connect the Twisted client with C{plain}: the error, and the seconds it took."""
        started = time.monotonic()
        try:
            client = await MalamuteClient.connect(
                reactor, self.endpoint, "me", plain=plain, timeout=5.0
            )
        except Exception as e:
            return e, time.monotonic() - started
        await client.close()
        self.fail("the broker accepted the client")

    async def child(self, kind: str, user: str = "", password: str = "") -> dict[str, Any]:
        """Run a blocking client of C{kind} in a child process: what it printed."""
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out, err, code = await getProcessOutputAndValue(
            sys.executable,
            ["-c", CHILD, kind, self.endpoint, user, password],
            env=env,
            path=str(ROOT),
        )
        self.assertEqual(code, 0, err.decode(errors="replace"))
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        return result

    async def test_wrongPassword(self) -> None:
        """
        A wrong PLAIN password fails connect() with AuthenticationRefusedError
        (a BrokerUnreachableError too) within 2 s, naming the user and what
        to check; the broker logs it once, as ZAP's refusal (the handshake
        monitor counts it without a second line).
        """
        error, seconds = await self.refused(("bob", "wrong"))
        self.assertIsInstance(error, AuthenticationRefusedError)
        self.assertIsInstance(error, BrokerUnreachableError)
        self.assertLess(seconds, 2.0)
        self.assertEqual(
            str(error),
            f"the broker at {self.endpoint} refused the credentials (PLAIN user 'bob'): "
            "check --user and the password",
        )
        assert isinstance(error, AuthenticationRefusedError)
        self.assertEqual((error.mechanism, error.status), ("PLAIN", 400))
        await settle(0.2)
        self.assertEqual(len(lines(self.events, "refused PLAIN client user 'bob'")), 1)
        self.assertEqual(lines(self.events, "refused a client on"), [])
        self.assertEqual(self.zap().refused, 1)
        self.assertEqual(self.handshakes().refused_by_zap, 1)

    async def test_noCredentials(self) -> None:
        """
        A client without credentials fails connect() at once with an error
        that says the broker requires PLAIN/CURVE and the client offers
        none; the broker (whose ZAP never hears of it) logs the mismatch
        with the endpoint and its mechanism, and counts it.
        """
        error, seconds = await self.refused(None)
        self.assertIsInstance(error, AuthenticationRefusedError)
        self.assertLess(seconds, 2.0)
        self.assertIn("requires PLAIN/CURVE authentication and this client offers none", str(error))
        assert isinstance(error, AuthenticationRefusedError)
        self.assertEqual((error.mechanism, error.status), ("NULL", None))
        await settle(0.2)
        # The broker sees the mismatch, or the client closing first (it
        # found the mismatch first): either is logged with the endpoint.
        logged = [
            line
            for line in lines(self.events, f" on {self.endpoint}")
            if "refused a client" in line or "broke off" in line
        ]
        self.assertGreaterEqual(len(logged), 1, logged)
        self.assertRegex(
            logged[0],
            rf"^(refused a client on {self.endpoint}: security mechanism mismatch: this "
            rf"endpoint requires PLAIN|a client on {self.endpoint} broke off the PLAIN handshake)",
        )
        self.assertIn("(peer ", logged[0])
        log = self.handshakes()
        self.assertEqual(log.refused + log.broken_off, len(logged))
        self.assertEqual(self.zap().refused, 0)

    async def test_rightPassword(self) -> None:
        """
        The right password connects; the broker logs the connect with the
        address, user and protocol version, and the close with its reason.
        """
        client = await MalamuteClient.connect(
            reactor, self.endpoint, "me", plain=("bob", "builder"), timeout=5.0
        )
        await client.close()
        await settle(0.1)
        self.assertEqual(
            lines(self.events, "client connected"),
            ["client connected: address=me user=bob version=2"],
        )
        self.assertEqual(
            lines(self.events, "client closed"),
            ["client closed: address=me user=bob (CONNECTION_CLOSE)"],
        )
        self.assertEqual(lines(self.events, "refused"), [])

    async def test_blockingClientWrongPassword(self) -> None:
        """The blocking client raises AuthenticationRefusedError within 2 s (timeout 5 s)."""
        result = await self.child("blocking", "bob", "wrong")
        self.assertEqual(result["error"], "AuthenticationRefusedError", result)
        self.assertTrue(result["unreachable"])
        self.assertLess(result["seconds"], 2.0)
        self.assertIn("refused the credentials (PLAIN user 'bob')", result["message"])

    async def test_blockingClientNoCredentials(self) -> None:
        """Without credentials, the blocking client says the broker requires some."""
        result = await self.child("blocking")
        self.assertEqual(result["error"], "AuthenticationRefusedError", result)
        self.assertLess(result["seconds"], 2.0)
        self.assertIn("offers none", result["message"])

    async def test_blockingClientRightPassword(self) -> None:
        """With the right password, the blocking client connects and closes."""
        result = await self.child("blocking", "bob", "builder")
        self.assertIsNone(result["error"], result)

    async def test_bulkClientWrongPassword(self) -> None:
        """The bulk client (Spark's) raises AuthenticationRefusedError within 2 s, unretried."""
        result = await self.child("bulk", "bob", "wrong")
        self.assertEqual(result["error"], "AuthenticationRefusedError", result)
        self.assertLess(result["seconds"], 2.0)
        self.assertIn("PLAIN user 'bob'", result["message"])

    async def test_bulkClientNoCredentials(self) -> None:
        """Without credentials, the bulk client says the broker requires some."""
        result = await self.child("bulk")
        self.assertEqual(result["error"], "AuthenticationRefusedError", result)
        self.assertLess(result["seconds"], 2.0)
        self.assertIn("offers none", result["message"])
