"""
System tests of a CURVE pack (``--pack-keys``): real brokers, one per host
of a LAN of network namespaces (L{tests.pack_system_support.PackCase}).

- A CURVE pack of three, with a stranger broker (a key of its own, not
  listed) and an open broker (no ``--pack-keys``) on the same LAN, with
  the same beacons and the same gossip server: the three federate, the
  two others never do; a reader on each of the two gets none of the 1000
  records written in the pack while a listed broker's reader gets them
  all; a letter addressed to a client of the stranger stays queued at its
  origin; the stranger's attempts are in the origin's log with its key.
- Identities that hold pack-wide: with PLAIN clients, alice owns C{alice}
  on h1 and bob opening C{alice} on h2 gets ERROR 403; a letter that
  bob's ACL refuses is refused at its origin (STORED 403) and never
  reaches the other broker.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from time import sleep
from typing import ClassVar

from malamute_pack.testing.brokerprocess import PROJECT_ROOT, checkout_environment, python_command
from malamute_pack.transport.curve import write_certificates
from tests.pack_system_support import GOSSIP_PORT, PACK, AgentProcess, PackCase, joined


class KeyedPackCase(PackCase):
    """
    A pack whose first C{listed} brokers are a CURVE pack (their keys in
    one C{--pack-keys} directory, each its own C{--pack-secret}); h1
    serves gossip too, and every broker both beacons and gossips.

    @cvar stranger: the index of a broker with a key of its own, not
        listed (it lists everyone's keys, its own included), or None.
    @cvar open_broker: the index of a broker of the same pack name without
        C{--pack-keys}, or None.
    """

    listed: ClassVar[int] = 3
    stranger: ClassVar[int | None] = None
    open_broker: ClassVar[int | None] = None

    def keys(self) -> Path:
        """The brokers' certificates, made once: C{hN.key} and C{hN.key_secret} (0600)."""
        keys = self.base / "keys"
        if not keys.exists():
            for index in range(1, self.size + 1):
                write_certificates(keys, f"h{index}")
            pack = self.base / "pack-keys"
            pack.mkdir()
            for index in range(1, self.listed + 1):
                shutil.copy(keys / f"h{index}.key", pack)
            everyone = self.base / "stranger-keys"
            everyone.mkdir()
            for index in range(1, self.size + 1):
                shutil.copy(keys / f"h{index}.key", everyone)
        return keys

    def public_key(self, index: int) -> str:
        text = (self.keys() / f"h{index}.key").read_text()
        return text.split('public-key = "')[1].split('"')[0]

    def pack_args(self, index: int) -> list[str]:
        host = self.lan.hosts[index - 1]
        args = ["--pack", PACK, "--broker-name", f"h{index}", "--beacon", "eth0"]
        gossip = f"tcp://{self.lan.hosts[0].address}:{GOSSIP_PORT}"
        if index == 1:
            args += ["--gossip-bind", gossip]
        elif index == self.open_broker:
            args += ["--gossip-connect", gossip]
        else:
            args += ["--gossip-connect", f"{gossip}|{self.public_key(1)}"]
        args += ["--peer-endpoint", f"tcp://{host.address}:*"]
        if index != self.open_broker:
            listed = "stranger-keys" if index == self.stranger else "pack-keys"
            args += ["--pack-keys", str(self.base / listed)]
            args += ["--pack-secret", str(self.keys() / f"h{index}.key_secret")]
        if self.config is not None:
            args += ["--config", str(self.config)]
        return args

    def wait_federated(self, timeout: float = 30.0) -> float:
        """Wait until each listed broker has seen every other listed one join."""
        members = range(1, self.listed + 1)
        expected = [(i, joined(f"h{j}"), 1) for i in members for j in members if i != j]
        return self.wait_logs(expected, timeout, "the CURVE pack did not federate")


class StrangerTests(KeyedPackCase):
    """A CURVE pack of three beside a stranger broker and an open broker."""

    size = 5
    stranger = 4
    open_broker = 5
    LANS: ClassVar[dict[str, tuple[str, str]]] = {
        "test_strangersGetNothing": ("mpv1", "10.77.71"),
    }

    def test_strangersGetNothing(self) -> None:
        """
        The stranger (h4) and the open broker (h5) never federate with the
        pack nor are told anything: their readers get 0 of 1000 records a
        listed broker's reader gets all of; a letter for the stranger's
        client stays queued at its origin; the origin's log names the
        stranger's key, once, and the open broker.
        """
        readers = {index: self.agent(index, f"reader{index}") for index in (2, 4, 5)}
        for reader in readers.values():
            reader.call("open", version=2, address="")
            reader.call("read", stream="weather", pattern=".*")
        stranger_client = self.agent(4, "stranger-client")
        stranger_client.call("open", version=2, address="stranger-client")
        writer = self.agent(1, "writer")
        writer.call("open", version=2, address="writer")
        writer.call("write", stream="weather")
        self.open_route(writer, [readers[2]])
        writer.call("send", prefix="rec-", count=1000, width=4)
        got = readers[2].collect(count=1000, prefix="rec-", timeout=30.0)
        self.assertEqual(len([e for e in got if e["s"].startswith("rec-")]), 1000)
        for index in (4, 5):
            self.assertEqual(readers[index].collect(quiet=2.0, timeout=10.0), [], f"h{index}")

        stored = writer.call(
            "post", kind="mailbox", address="stranger-client", subjects=["for-h4"], wait="all"
        )
        self.assertEqual(stored["stored"][0][1], 200)  # stored at its origin, h1
        sleep(2.0)
        self.assertEqual(stranger_client.collect(["mailbox"], quiet=1.0, timeout=5.0), [])
        self.assertEqual(self.mailbox_queue(1, "stranger-client"), 1)

        for index in range(1, self.size + 1):
            log = self.broker(index).run_log()
            for other in (4, 5):
                if other != index:
                    self.assertNotIn(joined(f"h{other}"), log, f"h{index}")
        h1 = self.broker(1).run_log()
        stranger_key = self.public_key(4)
        self.assertIn(f"not in --pack-keys: key {stranger_key}", h1.replace("\n", " "))
        self.assertEqual(
            h1.count(f"pack: refused a broker whose key is not in --pack-keys: key {stranger_key}"),
            1,
        )
        self.assertIn("pack: refused a broker without CURVE", h1)
        self.assertIn("is open: any broker that reaches this one", self.broker(5).run_log())

    def mailbox_queue(self, index: int, address: str) -> int:
        """The letters queued for C{address} on broker C{hINDEX}, from its $broker service."""
        host = self.lan.hosts[index - 1]
        command = python_command(
            host.name,
            "-c",
            "from malamute_pack.cli.main import main; main()",
            "mailboxes",
            "--json",
            "-e",
            self.broker(index).endpoint,
        )
        done = subprocess.run(
            command,
            cwd=PROJECT_ROOT,
            env=checkout_environment(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        for mailbox in json.loads(done.stdout):
            if mailbox.get("address") == address:
                return int(mailbox.get("depth", 0))
        return 0


class PackWideOwnerTests(KeyedPackCase):
    """Identities that hold pack-wide, in a CURVE pack of two with PLAIN clients."""

    size = 2
    listed = 2
    plain = ("admin", "secret")
    LANS: ClassVar[dict[str, tuple[str, str]]] = {
        "test_ownerHoldsPackWide": ("mpv2", "10.77.72"),
    }

    def pack_args(self, index: int) -> list[str]:
        secrets = self.base / "secrets"
        if not secrets.exists():
            secrets.mkdir()
            (secrets / "passwords").write_text("admin = secret\nalice = alice-pw\nbob = bob-pw\n")
            (secrets / "acl").write_text("admin send: *\nalice send: *\nbob send: bob bob.*\n")
        extra = ["-p", str(secrets / "passwords"), "--acl", str(secrets / "acl")]
        return super().pack_args(index) + extra

    def agent_as(self, index: int, user: str) -> AgentProcess:
        return self.agent(index, f"{user}-h{index}", plain=(user, f"{user}-pw"))

    def test_ownerHoldsPackWide(self) -> None:
        """
        alice owns C{alice} on h1: bob opening C{alice} on h2 gets ERROR 403
        (once h2 has heard the claim), alice may open it there; a letter bob
        may not send (ACL) is refused on h2 with STORED 403 and never
        reaches alice on h1.
        """
        alice = self.agent_as(1, "alice")
        alice.call("open", version=2, address="alice")
        self.wait_logs([(2, "says user 'alice' owns 'alice'", 1)], 15.0, "h2 hears the claim")
        bob = self.agent_as(2, "bob")
        answer = bob.call("try_open", version=2, address="alice")
        self.assertEqual((answer["reply"], answer["status"]), ("Error", 403))
        again = self.agent_as(2, "alice")
        self.assertEqual(again.call("try_open", version=2, address="alice")["reply"], "Ok")
        again.call("close")
        alice.call("open", version=2, address="alice")  # h1 holds it again

        sender = self.agent_as(2, "bob")
        sender.call("open", version=2, address="bob")
        stored = sender.call("post", kind="mailbox", address="alice", subjects=["hi"], wait="all")
        self.assertEqual(stored["stored"][0][1], 403)
        self.assertEqual(alice.collect(["mailbox"], quiet=1.0, timeout=5.0), [])
