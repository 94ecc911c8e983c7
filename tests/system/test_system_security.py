"""
Slow system tests of identities with the broker as a real process
(L{malamute_pack.testing.brokerprocess}) and real ZeroMQ security:

- PLAIN: an address belongs to the user who opened it; another user can
  neither take it over nor open it while it is free, and never receives
  its letters, queued or held without DONE; the owner can, again, and the
  ownership survives a restart of the broker (it is in the journal);
- CURVE on a TCP endpoint beside a NULL ipc one: an allowed key connects as
  its user (our client library included), an unknown key never gets in;
- the access-control file: a refused right is ERROR 403 with the reason,
  and SIGHUP reloads the file live (a bad file keeps the old rules).

Skipped with C{MALAMUTE_SKIP_SLOW=1}.

Tests: this is a test module; its helpers are ``tests/system_support.py``
and the broker process of L{malamute_pack.testing.brokerprocess}.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import zmq
import zmq.auth

from malamute_pack.broker.access import NOT_ALLOWED
from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.options import CurveKeys
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, BrokerProcess, fresh_ipc_endpoint
from malamute_pack.transport.curve import write_certificates
from tests.support import skip_slow
from tests.system_support import Peer, SystemCase

PASSWORDS = "alice = wonderland\nbob = builder\ncarol = singer\n"


class SecurityCase(SystemCase):
    skip = skip_slow

    def peer(
        self, endpoint: str, address: str, **security: object
    ) -> tuple[Peer, mlm.Message | None]:
        """A peer that opened (version 2) with C{address}; its OPEN's answer (None: none)."""
        peer = Peer(self.context, endpoint, **security)  # type: ignore[arg-type]
        self.addCleanup(peer.close)
        reply = peer.command(mlm.ConnectionOpen(version=2, address=address), timeout=3.0)
        return peer, reply

    def assertLetterToItself(self, endpoint: str, address: str, keys: CurveKeys) -> None:
        """The project's client, with C{keys}, opens C{address} and mails itself a letter."""
        client = BlockingClient(endpoint, address, curve=keys, context=self.context)
        self.addCleanup(client.close)
        client.sendto(address, "hello", [b"hi"])
        letter = client.recv(timeout=5.0)
        assert letter is not None
        self.assertEqual(letter.subject, "hello")

    def assertRefused(self, reply: mlm.Message | None, fragment: str) -> None:
        assert isinstance(reply, mlm.Error), reply
        self.assertEqual(reply.status_code, NOT_ALLOWED)
        self.assertIn(fragment, reply.status_reason)


class PlainOwnershipTests(SecurityCase):
    def test_addressBelongsToItsUser(self) -> None:
        """
        alice opens alice-box and holds one of carol's letters without DONE;
        bob's OPEN of alice-box is refused while she is connected and after
        she left, and bob receives nothing (carol sends another meanwhile);
        after a restart of the broker bob is still refused; alice, back,
        gets both letters.
        """
        passwords = self.base / "passwords"
        passwords.write_text(PASSWORDS)
        broker = self.start("--passwords", str(passwords), plain=("carol", "singer"))
        endpoint = broker.endpoint
        alice, reply = self.peer(endpoint, "alice-box", plain=("alice", "wonderland"))
        self.assertEqual(reply, mlm.Ok())
        carol, _ = self.peer(endpoint, "carol", plain=("carol", "singer"))
        carol.send(mlm.MailboxSend("alice-box", "held", "", 0, [b"secret"]))
        stored = carol.expect(mlm.Stored)
        assert isinstance(stored, mlm.Stored)
        self.assertEqual(stored.status_code, mlm.SUCCESS)
        held = alice.expect(mlm.MailboxRecord)
        assert isinstance(held, mlm.MailboxRecord)

        bob, reply = self.peer(endpoint, "alice-box", plain=("bob", "builder"))
        self.assertRefused(reply, "belongs to another user")
        self.assertEqual(alice.command(mlm.ConnectionClose()), mlm.Ok())
        carol.send(mlm.MailboxSend("alice-box", "queued", "", 0, [b"secret"]))
        carol.expect(mlm.Stored)
        bob.send(mlm.ConnectionOpen(version=2, address="alice-box"))
        self.assertRefused(bob.receive(3.0), "belongs to another user")
        self.assertIsNone(bob.receive(1.0))  # no letter of alice's, ever

        broker.stop()
        broker.start()
        bob, reply = self.peer(endpoint, "alice-box", plain=("bob", "builder"))
        self.assertRefused(reply, "belongs to another user")
        self.assertIsNone(bob.receive(1.0))
        back, reply = self.peer(endpoint, "alice-box", plain=("alice", "wonderland"))
        self.assertEqual(reply, mlm.Ok())
        subjects = []
        for _ in range(2):
            letter = back.expect(mlm.MailboxRecord)
            assert isinstance(letter, mlm.MailboxRecord)
            subjects.append(letter.subject)
        self.assertEqual(subjects, ["held", "queued"])


class CurveTests(SecurityCase):
    def setUp(self) -> None:
        super().setUp()
        keys = self.base / "keys"
        clients = self.base / "clients"
        server_public, server_secret = write_certificates(keys, "server")
        self.alice = write_certificates(keys, "alice", "alice")[1]
        self.bob = write_certificates(keys, "bob", "bob")[1]
        probe = write_certificates(keys, "probe", "probe")[1]
        clients.mkdir()
        for name in ("alice", "bob", "probe"):
            (clients / f"{name}.key").write_text((keys / f"{name}.key").read_text())
        self.server = zmq.auth.load_certificate(str(server_public))[0]
        probe_keys = CurveKeys.load(server_public, probe)
        self.broker = self.start(
            "--curve-secret",
            str(server_secret),
            "--curve-clients",
            str(clients),
            f"--endpoint=null:{fresh_ipc_endpoint('curve')}",
            bind=ANY_TCP_PORT,
            curve=probe_keys,
        )
        [self.tcp, self.ipc] = self.broker.bound()
        self.keys_file = server_public

    def curve(self, certificate: Path) -> tuple[bytes, bytes, bytes]:
        public, secret = zmq.auth.load_certificate(str(certificate))
        assert secret is not None
        return (self.server, public, secret)

    def test_allowedKeyIsItsUser(self) -> None:
        """
        An allowed key connects over TCP as its user: bob's key cannot open
        alice's address; the ipc endpoint needs no key, and its clients
        cannot open it either.
        """
        alice, reply = self.peer(self.tcp, "alice-box", curve=self.curve(self.alice))
        self.assertEqual(reply, mlm.Ok())
        self.assertEqual(alice.command(mlm.ConnectionPing()), mlm.ConnectionPong())
        _, reply = self.peer(self.tcp, "alice-box", curve=self.curve(self.bob))
        self.assertRefused(reply, "belongs to another user")
        _, reply = self.peer(self.ipc, "alice-box")
        self.assertRefused(reply, "authenticate to open it")
        _, reply = self.peer(self.ipc, "anyone")
        self.assertEqual(reply, mlm.Ok())

    def test_unknownOrWrongKeyNeverGetsIn(self) -> None:
        """
        A key pair the broker does not know, a client that believes in
        another server key, and a client with no key at all get no answer.
        """
        stranger = zmq.curve_keypair()
        wrong_server, _ = zmq.curve_keypair()
        for security in (
            {"curve": (self.server, *stranger)},
            {"curve": (wrong_server, *self.curve(self.alice)[1:])},
            {},
        ):
            _, reply = self.peer(self.tcp, "x", **security)
            self.assertIsNone(reply, security)
        self.assertIn("refused CURVE client key", self.broker.run_log())

    def test_clientLibrary(self) -> None:
        """The project's client connects with CurveKeys.load and sends a letter to itself."""
        self.assertLetterToItself(self.tcp, "alice-lib", CurveKeys.load(self.keys_file, self.alice))


class GeneratedServerKeyTests(SecurityCase):
    def test_curveWithKeysMadeOnFirstStart(self) -> None:
        """
        C{--curve DIR} alone: the broker makes its key pair in its data
        directory on its first start, never writes the secret key to its
        log, and a client that takes the public certificate from there
        connects as its user.
        """
        keys, clients = self.base / "keys", self.base / "clients"
        clients.mkdir()
        alice = write_certificates(keys, "alice", "alice")[1]
        (clients / "alice.key").write_text((keys / "alice.key").read_text())
        broker = self.start(
            "--curve",
            str(clients),
            "--endpoint=curve:tcp://127.0.0.1:*",
            bind="null:" + fresh_ipc_endpoint("made"),
        )
        [_ipc, tcp] = broker.bound()
        certificate = broker.data_dir / "curve" / "server.key"
        secret_file = broker.data_dir / "curve" / "server.key_secret"
        secret = zmq.auth.load_certificate(str(secret_file))[1]
        assert secret is not None
        self.assertNotIn(secret.decode(), broker.run_log())
        self.assertLetterToItself(tcp, "alice-box", CurveKeys.load(certificate, alice))


class AccessFileTests(SecurityCase):
    def test_refusedThenAllowedAfterSighup(self) -> None:
        """
        bob may not write to prices until the file says so and the broker
        gets SIGHUP; his mail to a mailbox he may not send to gets STORED
        403; a broken file on a later SIGHUP keeps the rules in force.
        """
        passwords = self.base / "passwords"
        passwords.write_text(PASSWORDS)
        acl = self.base / "acl"
        acl.write_text("alice write: prices\n* send: alice bob\n")
        broker = self.start(
            "--passwords", str(passwords), "--acl", str(acl), plain=("carol", "singer")
        )
        bob, reply = self.peer(broker.endpoint, "bob", plain=("bob", "builder"))
        self.assertEqual(reply, mlm.Ok())
        reply = bob.command(mlm.StreamWrite("prices"))
        assert isinstance(reply, mlm.Error), reply
        self.assertEqual(
            (reply.status_code, reply.status_reason),
            (NOT_ALLOWED, "not allowed: user 'bob' may not write to the stream 'prices'"),
        )
        bob.send(mlm.MailboxSend("carol", "hi", "", 0, [b"x"]))
        stored = bob.expect(mlm.Stored)
        assert isinstance(stored, mlm.Stored)
        self.assertEqual(stored.status_code, NOT_ALLOWED)

        acl.write_text("alice write: prices\nbob write: prices\n")
        self.sighup(broker, "security files reloaded")
        self.assertEqual(bob.command(mlm.StreamWrite("prices")), mlm.Ok())

        acl.write_text("bob erase: everything\n")
        self.sighup(broker, "security reload failed")
        self.assertEqual(bob.command(mlm.StreamWrite("prices")), mlm.Ok())
        self.assertEqual(bob.command(mlm.ConnectionPing()), mlm.ConnectionPong())

    def sighup(self, broker: BrokerProcess, logged: str) -> None:
        """SIGHUP the broker and wait until it logs C{logged} once more than before."""
        before = broker.run_log().count(logged)
        os.kill(broker.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while broker.run_log().count(logged) <= before:
            self.assertLess(time.monotonic(), deadline, broker.log_text())
            time.sleep(0.05)
