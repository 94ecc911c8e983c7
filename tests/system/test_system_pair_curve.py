"""
System tests of a CURVE pair link (``--pair-key``): two real brokers on
hosts h1 and h2 (network namespaces), the pair link on a LAN of its own,
clients on h3 (L{tests.pair_system_support}). Each broker's key pair is
made in its data directory (C{curve/server.key_secret}, as a broker makes
it on its first start) before either starts, and each is given the
other's public certificate. Checked: the pair forms over CURVE (both say
so at start), replicates and fails over as an open one does; and a
stranger (a process on h1 that is not its broker, with a CURVE key of its
own, and one with no CURVE) that sends the passive well-formed pair
messages (a heartbeat saying the primary restarted, which an open link
would obey by taking over; SHIPs of stream records and letters) changes
nothing in the passive's journal and is logged with its key and address.

Needs root and iproute2 (skipped otherwise), and is slow
(C{MALAMUTE_SKIP_SLOW=1} skips it).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import zmq

from malamute_pack.journal.records import stream_row
from malamute_pack.pair.check import current_state
from malamute_pack.protocol import pair as wire
from malamute_pack.protocol.records import QueuedRecord
from malamute_pack.testing.brokerprocess import run_python
from malamute_pack.transport.curve import load_client_keys, server_secret
from tests.pair_system_support import (
    ACTIVE,
    PAIR_PORT,
    PAIR_SUBNET,
    TAKING_OVER,
    PairCase,
    check_letters,
)

# What a CURVE link logs at start (malamute_pack/pair/link.py).
CURVE_LINK = "pair link: CURVE, admitting only the partner key"
# The journal's tables a stranger must not touch.
TABLES = ("stream_messages", "queued_messages", "streams", "pair_state")


def stranger_main() -> None:
    """
    A stranger to the pair, run on a host of the Lan: reads
    C{{"endpoint", "server_key"}} as JSON from C{sys.argv[1]} and for two
    seconds sends well-formed pair messages to C{endpoint} from a DEALER
    with a CURVE key of its own (trusting C{server_key}, the passive's
    real public key) and from one with no CURVE; prints its key as JSON.
    """
    job = json.loads(sys.argv[1])
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    public, secret = zmq.curve_keypair()
    curved = context.socket(zmq.DEALER)
    curved.setsockopt(zmq.CURVE_SERVERKEY, job["server_key"].encode("ascii"))
    curved.setsockopt(zmq.CURVE_PUBLICKEY, public)
    curved.setsockopt(zmq.CURVE_SECRETKEY, secret)
    bare = context.socket(zmq.DEALER)
    now = time.time()
    letter = QueuedRecord(
        10**9, "mailbox", "victim", "stranger", "forged", "", None, now, (b"forged",)
    )
    messages: list[wire.PairMessage] = [
        # The primary restarted: a passive in sync takes over on this.
        wire.Heartbeat("primary", "starting", False, "stranger", "", 0, False),
        *(
            wire.Ship(
                link,
                first,
                [stream_row("forged", 10**6 + first, now, "stranger", "forged", [b"x"]), letter],
            )
            for link in range(1, 4)
            for first in range(0, 3)
        ),
        wire.Heartbeat("primary", "active", True, "stranger", "forged-epoch", 1, True),
    ]
    for sock in (curved, bare):
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(job["endpoint"])
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        for sock in (curved, bare):
            for message in messages:
                with contextlib.suppress(zmq.Again):
                    sock.send_multipart(wire.encode(message), zmq.NOBLOCK)
        time.sleep(0.1)
    curved.close()
    bare.close()
    context.term()
    print(json.dumps({"key": public.decode("ascii")}))


_STRANGER = "from tests.system.test_system_pair_curve import stranger_main; stranger_main()"


def journal_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the L{TABLES} of the journal at C{path}, read-only, sorted."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {
            table: sorted(
                connection.execute(f"SELECT * FROM {table}").fetchall(),
                key=repr,
            )
            for table in TABLES
        }
    finally:
        connection.close()


class PairCurveTests(PairCase):
    """A pair whose brokers hold each other's public certificate (--pair-key)."""

    PREFIXES: ClassVar[dict[str, str]] = {
        "test_curvePairFailsOver": "mpk1",
        "test_strangerChangesNothing": "mpk2",
    }

    def setUp(self) -> None:
        super().setUp()
        # Each broker's key pair, where it would make it on its first start.
        self.public = [server_secret(broker.data_dir)[1] for broker in self.brokers]
        for index, broker in enumerate(self.brokers):
            broker.args = (*broker.args, "--pair-key", str(self.public[1 - index]))

    def key(self, index: int) -> str:
        """Broker C{hINDEX}'s public key (Z85)."""
        (key,) = load_client_keys(self.public[index - 1])
        return key.decode("ascii")

    def test_curvePairFailsOver(self) -> None:
        """
        The pair forms over CURVE (each broker logs that it admits only its
        partner's key, naming it and its file); letters a client on h3
        sends with both endpoints are STORED by h1, which is SIGKILLed:
        h2 takes over and delivers every letter acknowledged.
        """
        self.start_pair()
        for index in (1, 2):
            self.assertIn(
                f"{CURVE_LINK} {self.key(3 - index)} (--pair-key {self.public[2 - index]})",
                self.broker(index).run_log(),
            )
        mail = self.client(
            "mail", kind="mail", endpoints=self.both, address="sender", to="box", prefix="m-"
        )
        self.wait_acknowledged([mail], 30, 30.0)
        self.broker(1).kill()
        self.wait_logs([(2, TAKING_OVER), (2, ACTIVE)], 20.0, "h2 did not take over")
        self.wait_acknowledged([mail], 10, 30.0)
        mail.stop()
        sent = mail.records(60.0)
        box = self.receive([self.endpoint(2)], "box", [r["s"] for r in sent if "id" in r])
        check = check_letters(sent, box)
        self.assertGreater(check.acknowledged, 0)
        self.assertEqual((check.missing, check.bad_duplicates), ([], []), self.logs())

    def test_strangerChangesNothing(self) -> None:
        """
        A stranger on h1 (not its broker) sends h2, the passive, pair
        messages at its --pair-bind for two seconds, from a CURVE key of
        its own and with no CURVE: h2 stays passive (never takes over, as
        the forged "primary restarted" heartbeat would make it), the rows
        of its journal (stream records, letters, streams, pair state) are
        the same before and after, and its log names the refused key and
        the stranger's address, and the connection without CURVE.
        """
        self.start_pair()
        passive = self.broker(2)
        time.sleep(1.0)  # the pair settled: nothing more to replicate
        before = journal_rows(passive.data_dir / "journal.sqlite")
        endpoint = f"tcp://{PAIR_SUBNET}.2:{PAIR_PORT}"
        ran = run_python(
            self.lan.hosts[0].name,
            "-c",
            _STRANGER,
            json.dumps({"endpoint": endpoint, "server_key": self.key(2)}),
        )
        self.assertEqual(ran.returncode, 0, ran.stderr)
        stranger = json.loads(ran.stdout)["key"]
        time.sleep(1.0)  # anything that got in has been applied
        after = journal_rows(passive.data_dir / "journal.sqlite")
        self.assertEqual(after, before, self.logs())
        log = passive.run_log()
        self.assertNotIn(TAKING_OVER, log)
        self.assertNotIn(ACTIVE, log)
        self.assertEqual(current_state(passive.data_dir), "passive")
        self.assertIn(
            f"refused CURVE pair partner key {stranger}, not in --pair-key {self.public[0]}"
            f" from {PAIR_SUBNET}.1",
            log,
        )
        self.assertRegex(
            log,
            rf"(refused a client on {endpoint}: security mechanism mismatch: this endpoint"
            rf" requires CURVE|a client on {endpoint} broke off the CURVE handshake)",
        )
