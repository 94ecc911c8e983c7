"""
Tests that the clients report an authentication refusal as such, at once:
a broker in the reactor with PLAIN security (the project's ZAP handler and
a password table, as C{twistd malamute} runs it) and the real clients
(L{MalamuteClient} in the reactor; L{BlockingClient} and L{BulkClient} in
a child process, since they block and the broker's ZAP handler answers
from this reactor). A wrong password and missing credentials raise
L{AuthenticationRefusedError} well before the connect timeout, and the
broker logs each refusal once: ZAP's for a wrong password, the handshake
monitor's for a mechanism mismatch. Against a CURVE broker, a client given
the wrong broker key raises L{WrongServerKeyError} well within its timeout,
while one with nothing listening at its endpoint, or a broker slow to
answer, is not taken for one.
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
from twisted.internet.defer import Deferred
from twisted.internet.utils import getProcessOutputAndValue
from twisted.logger import LogEvent, formatEvent
from twisted.trial.unittest import TestCase

from malamute_pack.client import (
    AuthenticationRefusedError,
    BrokerUnreachableError,
    CurveKeys,
    MalamuteClient,
    WrongServerKeyError,
)
from malamute_pack.settings import Settings
from malamute_pack.transport.curve import write_certificates
from malamute_pack.transport.handshakes import HandshakeLog
from malamute_pack.transport.zap import ZapHandler
from tests.e2e_support import settle, start_broker, tcp_endpoint
from tests.support import capture_log

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = "bob = builder\n"

# The connect timeout of the clients that are refused: a refusal must come
# well before it (within half of it), so that a client is seen to be told,
# not to give up waiting; long, so that a loaded machine cannot fail that.
REFUSED_TIMEOUT = 30.0

# Run in a child: connect a blocking client (argv: kind, endpoint, user or
# "", password, timeout, then CURVE keys if any: the broker's public key
# and the client's pair) and print what happened as JSON. With CHILD_GO in
# its environment, it first makes the file CHILD_GO.ready and waits for
# CHILD_GO to exist.
CHILD = """
import json, os, sys, time
from malamute_pack.client import BlockingClient, BrokerUnreachableError, CurveKeys
from malamute_pack.client.bulk import BulkClient
from malamute_pack.client.options import ClientOptions
kind, endpoint, user, password = sys.argv[1:5]
timeout = float(sys.argv[5])
plain = (user, password) if user else None
curve = CurveKeys(*sys.argv[6:9]) if len(sys.argv) > 6 else None
options = ClientOptions(plain=plain, curve=curve, heartbeat=min(1.0, timeout / 2))
go = os.environ.get("CHILD_GO")
if go:
    open(go + ".ready", "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
started = time.monotonic()
try:
    if kind == "blocking":
        BlockingClient(endpoint, "me", options=options, timeout=timeout).close()
    else:
        BulkClient(endpoint, options=options, timeout=timeout).close()
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


async def run_child(
    kind: str,
    endpoint: str,
    user: str = "",
    password: str = "",
    *,
    timeout: float = 5.0,
    curve: CurveKeys | None = None,
    go: Path | None = None,
) -> dict[str, Any]:
    """
    Run a blocking client of C{kind} ("blocking" or "bulk") in a child
    process: what it printed (an AssertionError if the child failed).

    @param go: if given, the child makes C{go}.ready once started and
        waits for C{go} to exist before it connects.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if go is not None:
        env["CHILD_GO"] = str(go)
    keys = list(curve) if curve is not None else []
    out, err, code = await getProcessOutputAndValue(
        sys.executable,
        ["-c", CHILD, kind, endpoint, user, password, str(timeout), *keys],
        env=env,
        path=str(ROOT),
    )
    assert code == 0, err.decode(errors="replace")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


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
                reactor, self.endpoint, "me", plain=plain, timeout=REFUSED_TIMEOUT
            )
        except Exception as e:
            return e, time.monotonic() - started
        await client.close()
        self.fail("the broker accepted the client")

    async def child(self, kind: str, user: str = "", password: str = "") -> dict[str, Any]:
        """Run a blocking client of C{kind} in a child process: what it printed."""
        return await run_child(kind, self.endpoint, user, password, timeout=REFUSED_TIMEOUT)

    async def test_wrongPassword(self) -> None:
        """
        A wrong PLAIN password fails connect() with AuthenticationRefusedError
        (a BrokerUnreachableError too) well within its timeout, naming the user and what
        to check; the broker logs it once, as ZAP's refusal (the handshake
        monitor counts it without a second line).
        """
        error, seconds = await self.refused(("bob", "wrong"))
        self.assertIsInstance(error, AuthenticationRefusedError)
        self.assertIsInstance(error, BrokerUnreachableError)
        self.assertLess(seconds, REFUSED_TIMEOUT / 2)
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
        self.assertLess(seconds, REFUSED_TIMEOUT / 2)
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
        """The blocking client raises AuthenticationRefusedError well within its timeout."""
        result = await self.child("blocking", "bob", "wrong")
        self.assertEqual(result["error"], "AuthenticationRefusedError", result)
        self.assertTrue(result["unreachable"])
        self.assertLess(result["seconds"], REFUSED_TIMEOUT / 2)
        self.assertIn("refused the credentials (PLAIN user 'bob')", result["message"])

    async def test_blockingClientNoCredentials(self) -> None:
        """Without credentials, the blocking client says the broker requires some."""
        result = await self.child("blocking")
        self.assertEqual(result["error"], "AuthenticationRefusedError", result)
        self.assertLess(result["seconds"], REFUSED_TIMEOUT / 2)
        self.assertIn("offers none", result["message"])

    async def test_blockingClientRightPassword(self) -> None:
        """With the right password, the blocking client connects and closes."""
        result = await self.child("blocking", "bob", "builder")
        self.assertIsNone(result["error"], result)

    async def test_bulkClientWrongPassword(self) -> None:
        """
        The bulk client (Spark's) raises AuthenticationRefusedError well
        within its timeout, unretried.
        """
        result = await self.child("bulk", "bob", "wrong")
        self.assertEqual(result["error"], "AuthenticationRefusedError", result)
        self.assertLess(result["seconds"], REFUSED_TIMEOUT / 2)
        self.assertIn("PLAIN user 'bob'", result["message"])

    async def test_bulkClientNoCredentials(self) -> None:
        """Without credentials, the bulk client says the broker requires some."""
        result = await self.child("bulk")
        self.assertEqual(result["error"], "AuthenticationRefusedError", result)
        self.assertLess(result["seconds"], REFUSED_TIMEOUT / 2)
        self.assertIn("offers none", result["message"])


def dead_endpoint() -> str:
    """An endpoint nothing listens on: an abstract ipc name of this test's own."""
    return f"ipc://@/malamute-dead-{os.getpid()}-{time.monotonic_ns()}"


class WrongServerKeyTests(TestCase):
    """CURVE clients against a broker whose TCP endpoint requires CURVE."""

    def setUp(self) -> None:
        directory = Path(self.mktemp())
        server_public, server_secret = write_certificates(directory / "server", "server")
        clients = directory / "clients"
        _, alice_secret = write_certificates(clients, "alice", "alice")
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        settings = Settings(
            endpoints=(tcp_endpoint(),),
            mechanism="curve",
            curve_secret=server_secret,
            curve_clients=clients,
            journal=False,
            data_dir=directory / "data",
        )
        self.service, self.router = start_broker(settings, self.context)
        self.addCleanup(self.service.stopService)
        self.endpoint = self.router.bound[0]
        self.right = CurveKeys.load(server_public, alice_secret)
        # Alice's own keys, with another broker's public key.
        self.wrong = self.right._replace(server=zmq.curve_keypair()[0].decode("ascii"))

    def expected(self, times: str) -> str:
        """The error's text for a broker that broke off the handshake C{times}."""
        return (
            f"the broker at {self.endpoint} broke off the CURVE handshake ({times}, never "
            "completing one): the broker's public key given to this client (server key "
            f"{self.wrong.server}) is probably not the broker's; check it against the "
            "broker's server.key"
        )

    async def refused(
        self, endpoint: str, keys: CurveKeys, **options: Any
    ) -> tuple[Exception, float]:
        """Connect the Twisted client with C{keys}: the error, and the seconds it took."""
        started = time.monotonic()
        try:
            client = await MalamuteClient.connect(reactor, endpoint, "me", curve=keys, **options)
        except Exception as e:
            return e, time.monotonic() - started
        await client.close()
        self.fail("the client connected")

    async def test_wrongServerKey(self) -> None:
        """
        A CURVE client given another broker's public key fails connect()
        with WrongServerKeyError (an AuthenticationRefusedError and a
        BrokerUnreachableError) well within its timeout, once the
        broker broke off two handshakes, naming the key given and what to
        check.
        """
        error, seconds = await self.refused(self.endpoint, self.wrong, timeout=REFUSED_TIMEOUT)
        self.assertIsInstance(error, WrongServerKeyError)
        self.assertIsInstance(error, AuthenticationRefusedError)
        self.assertIsInstance(error, BrokerUnreachableError)
        self.assertLess(seconds, REFUSED_TIMEOUT / 2)
        self.assertEqual(str(error), self.expected("twice"))
        assert isinstance(error, WrongServerKeyError)
        self.assertEqual(
            (error.endpoint, error.mechanism, error.status, error.server_key, error.broken_off),
            (self.endpoint, "CURVE", None, self.wrong.server, 2),
        )

    async def test_wrongServerKeyAtTimeout(self) -> None:
        """
        With a timeout shorter than libzmq's 100 ms between reconnections,
        one broken-off handshake is all the client sees: at its timeout it
        still fails with WrongServerKeyError, not as an unreachable broker.
        """
        error, seconds = await self.refused(self.endpoint, self.wrong, timeout=0.08, heartbeat=0.04)
        self.assertIsInstance(error, WrongServerKeyError)
        self.assertEqual(str(error), self.expected("once"))
        self.assertLess(seconds, REFUSED_TIMEOUT / 2)

    async def test_rightServerKey(self) -> None:
        """The right broker key connects (no handshake is broken off)."""
        client = await MalamuteClient.connect(
            reactor, self.endpoint, "me", curve=self.right, timeout=5.0
        )
        await client.close()

    async def test_nothingListening(self) -> None:
        """
        A CURVE client with nothing listening at its endpoint (connection
        refused: no handshake ever starts) still fails with a plain
        BrokerUnreachableError, at its timeout.
        """
        error, seconds = await self.refused(dead_endpoint(), self.wrong, timeout=1.0, heartbeat=0.5)
        self.assertIs(type(error), BrokerUnreachableError, error)
        self.assertGreaterEqual(seconds, 0.9)

    async def test_blockingClientWrongServerKey(self) -> None:
        """The blocking client raises WrongServerKeyError well within its timeout."""
        result = await run_child(
            "blocking", self.endpoint, curve=self.wrong, timeout=REFUSED_TIMEOUT
        )
        self.assertEqual(result["error"], "WrongServerKeyError", result)
        self.assertTrue(result["unreachable"])
        self.assertLess(result["seconds"], REFUSED_TIMEOUT / 2)
        self.assertEqual(result["message"], self.expected("twice"))

    async def test_bulkClientWrongServerKey(self) -> None:
        """The bulk client raises WrongServerKeyError well within its timeout."""
        result = await run_child("bulk", self.endpoint, curve=self.wrong, timeout=REFUSED_TIMEOUT)
        self.assertEqual(result["error"], "WrongServerKeyError", result)
        self.assertLess(result["seconds"], REFUSED_TIMEOUT / 2)
        self.assertEqual(result["message"], self.expected("twice"))

    async def test_blockingClientsNothingListening(self) -> None:
        """
        With nothing listening, the blocking and bulk clients still raise
        BrokerUnreachableError itself, at their timeout.
        """
        endpoint = dead_endpoint()
        for kind in ("blocking", "bulk"):
            result = await run_child(kind, endpoint, timeout=1.0, curve=self.wrong)
            self.assertEqual(result["error"], "BrokerUnreachableError", result)
            self.assertGreaterEqual(result["seconds"], 0.9)

    async def test_slowBroker(self) -> None:
        """
        A broker slow to finish the handshake (its reactor, where the ZAP
        handler answers, stalled for 1.5 s) is waited for: the blocking
        client with the right key connects, and is not told its key is
        wrong.
        """
        go = Path(self.mktemp()).resolve()  # the child runs elsewhere
        go.parent.mkdir(parents=True, exist_ok=True)
        child = Deferred.fromCoroutine(
            run_child("blocking", self.endpoint, curve=self.right, go=go)
        )
        ready = Path(f"{go}.ready")
        for _ in range(1000):
            if ready.exists():
                break
            await settle(0.01)
        self.assertTrue(ready.exists(), "the child did not start")
        go.touch()  # the child connects now, to a broker that stalls:
        time.sleep(1.5)
        result = await child
        self.assertIsNone(result["error"], result)
        self.assertGreaterEqual(result["seconds"], 1.0)
