"""
Tests of authenticated identities over real ZeroMQ sockets in the test's
reactor (L{malamute_pack.transport.security}, the router's identified
sockets, the ZAP handler): the user ZAP gives a connection reaches the
model's session, for PLAIN and CURVE; an unknown CURVE key never gets a
session; NULL and PLAIN endpoints side by side; the security files
reloaded on a real SIGHUP, a bad file keeping the rules in force.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import zmq
import zmq.auth
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase

from malamute_pack.broker.access import (
    NOT_ALLOWED,
    AccessControl,
    AccessPolicy,
    Right,
    parse_access,
)
from malamute_pack.broker.broker import Broker
from malamute_pack.protocol import mlm
from malamute_pack.settings import Settings
from malamute_pack.tap import BrokerService
from malamute_pack.transport.curve import write_certificates
from malamute_pack.transport.router import RouterService
from malamute_pack.transport.security import ClientSecurity, SecurityService
from malamute_pack.transport.zap import ZapHandler
from tests.e2e_support import Peer, ipc_endpoint, settle, start_broker, tcp_endpoint


class SecureBrokerCase(TestCase):
    """A broker service per test, with the settings the test gives."""

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.peers: list[Peer] = []
        self.service: MultiService | None = None
        self.addCleanup(lambda: Deferred.fromCoroutine(self._stop()))

    async def _stop(self) -> None:
        for peer in self.peers:
            peer.close()
        if self.service is not None:
            await self.service.stopService()
        self.context.term()

    def start(self, settings: Settings) -> list[str]:
        """Start the broker; every endpoint it bound, router by router."""
        self.service, _ = start_broker(settings, self.context)
        bound: list[str] = []
        for child in self.service:
            if isinstance(child, RouterService):
                bound.extend(child.bound)
        return bound

    def broker(self) -> Broker:
        assert self.service is not None
        model = self.service.getServiceNamed("broker")
        assert isinstance(model, BrokerService)
        return model.broker

    def zap(self) -> ZapHandler:
        assert self.service is not None
        zap = self.service.getServiceNamed("zap")
        assert isinstance(zap, ZapHandler)
        return zap

    def peer(self, endpoint: str, **security: object) -> Peer:
        peer = Peer(self.context, endpoint, **security)  # type: ignore[arg-type]
        self.peers.append(peer)
        return peer

    def user_of(self, address: str) -> str | None:
        connection = self.broker().registry.holder(address)
        assert connection is not None, address
        return connection.session.user

    def files(self) -> Path:
        directory = Path(self.mktemp())
        directory.mkdir()
        return directory


class CurveTests(SecureBrokerCase):
    def setUp(self) -> None:
        super().setUp()
        directory = self.files()
        server_public, server_secret = write_certificates(directory / "server", "server")
        clients = directory / "clients"
        self.alice = write_certificates(clients, "alice", "alice")[1]
        self.bound = self.start(
            Settings(
                endpoints=(tcp_endpoint(),),
                mechanism="curve",
                curve_secret=server_secret,
                curve_clients=clients,
                journal=False,
                data_dir=directory / "data",
            )
        )
        self.server = zmq.auth.load_certificate(str(server_public))[0]

    async def test_knownKeyIsItsUser(self) -> None:
        """A client with a key the broker knows connects; its session's user is the key's."""
        public, secret = zmq.auth.load_certificate(str(self.alice))
        assert secret is not None
        peer = self.peer(self.bound[0], curve=(self.server, public, secret))
        await peer.open("alice-box")
        self.assertEqual(self.user_of("alice-box"), "alice")
        self.assertEqual(self.zap().accepted, 1)

    async def test_unknownKeyNeverHeard(self) -> None:
        """
        An unknown key is refused by ZAP (counted); a client without CURVE
        gets no connection at all; the broker hears neither.
        """
        stranger = self.peer(self.bound[0], curve=(self.server, *zmq.curve_keypair()))
        stranger.send(mlm.ConnectionOpen(address="x"))
        plain = self.peer(self.bound[0])
        plain.send(mlm.ConnectionOpen(address="y"))
        await settle(0.3)
        self.assertEqual((stranger.pending(), plain.pending()), (0, 0))
        self.assertGreaterEqual(self.zap().refused, 1)
        # Only the broker's own parts (its management service) are connected.
        self.assertEqual([c for c in self.broker().registry if not c.internal], [])


class PlainBesideNullTests(SecureBrokerCase):
    def setUp(self) -> None:
        super().setUp()
        directory = self.files()
        passwords = directory / "passwords"
        passwords.write_text("alice = wonderland\nbob = builder\n")
        self.bound = self.start(
            Settings(
                endpoints=(f"plain:{tcp_endpoint()}", f"null:{ipc_endpoint()}"),
                passwords=passwords,
                journal=False,
                data_dir=directory / "data",
            )
        )

    async def test_usersAndOwnership(self) -> None:
        """
        The PLAIN endpoint's sessions carry their users; the NULL
        endpoint's have none and cannot open an address a user owns (ERROR
        403), but may open a free one; bob cannot open alice's.
        """
        plain, null = self.bound
        alice = self.peer(plain, plain=("alice", "wonderland"))
        await alice.open("alice-box")
        self.assertEqual(self.user_of("alice-box"), "alice")
        anonymous = self.peer(null)
        reply = await anonymous.command(mlm.ConnectionOpen(address="alice-box"))
        assert isinstance(reply, mlm.Error), reply
        self.assertEqual(reply.status_code, NOT_ALLOWED)
        await anonymous.open("free")
        self.assertIsNone(self.user_of("free"))
        bob = self.peer(plain, plain=("bob", "builder"))
        reply = await bob.command(mlm.ConnectionOpen(address="alice-box"))
        assert isinstance(reply, mlm.Error), reply
        self.assertIn("belongs to another user", reply.status_reason)
        self.assertEqual(self.user_of("alice-box"), "alice")


class ReloadTests(SecureBrokerCase):
    def setUp(self) -> None:
        super().setUp()
        directory = self.files()
        self.passwords = directory / "passwords"
        self.passwords.write_text("alice = wonderland\n")
        self.acl = directory / "acl"
        self.acl.write_text("alice write: weather\n")
        self.bound = self.start(
            Settings(
                endpoints=(tcp_endpoint(),),
                mechanism="plain",
                passwords=self.passwords,
                access_file=self.acl,
                journal=False,
                data_dir=directory / "data",
            )
        )
        assert self.service is not None
        security = self.service.getServiceNamed("security")
        assert isinstance(security, SecurityService)
        self.security = security

    async def sighup(self) -> None:
        os.kill(os.getpid(), signal.SIGHUP)
        await settle(0.1)

    async def test_sighupReloads(self) -> None:
        """
        SIGHUP makes the running broker read its files again: the new
        access rules apply to the next command of a client that stays
        connected, and a new password lets a new user in.
        """
        alice = self.peer(self.bound[0], plain=("alice", "wonderland"))
        await alice.open("alice")
        reply = await alice.command(mlm.StreamWrite("prices"))
        assert isinstance(reply, mlm.Error), reply
        self.assertEqual(reply.status_code, NOT_ALLOWED)
        self.acl.write_text("alice write: weather prices\n")
        self.passwords.write_text("alice = wonderland\nbob = builder\n")
        await self.sighup()
        self.assertEqual(self.security.reloads, 1)
        self.assertEqual(await alice.command(mlm.StreamWrite("prices")), mlm.Ok())
        bob = self.peer(self.bound[0], plain=("bob", "builder"))
        await bob.open("bob")

    async def test_badFileKeepsTheRules(self) -> None:
        """A reload with a bad file changes nothing (the password file included) and says so."""
        access = self.broker().access
        assert isinstance(access, AccessControl)
        policy = access.policy
        self.acl.write_text("alice erase: everything\n")
        self.passwords.write_text("alice = changed\n")
        await self.sighup()
        self.assertEqual((self.security.reloads, self.security.failed_reloads), (0, 1))
        self.assertIs(access.policy, policy)
        alice = self.peer(self.bound[0], plain=("alice", "wonderland"))
        await alice.open("alice")

    async def test_reloadTellsItsListeners(self) -> None:
        """
        A successful reload tells each listener of C{reloaded} the clients'
        security now in force (the pair's active ships it to its partner);
        a failed one tells nobody, and neither does the first load.
        """
        told: list[ClientSecurity] = []
        self.security.reloaded.append(told.append)
        self.assertIsNotNone(self.security.clients)
        self.acl.write_text("alice erase: everything\n")
        await self.sighup()
        self.assertEqual(told, [])
        self.acl.write_text("alice write: weather prices\n")
        self.passwords.write_text("alice = wonderland\nbob = builder\n")
        await self.sighup()
        (state,) = told
        self.assertIs(state, self.security.clients)
        self.assertEqual(state.passwords, {"alice": "wonderland", "bob": "builder"})
        self.assertTrue(state.policy.allows("alice", Right.WRITE, "prices"))
        self.assertNotIn("builder", repr(state))

    async def test_installPutsAnotherStateInForce(self) -> None:
        """
        C{install} puts a state from elsewhere (a pair's active) in force
        as a reload would: the access rules and passwords the broker
        checks, and the ZAP handler's passwords (a new user gets in),
        without touching the files; a part given as None stays this
        broker's; a later reload reads the files again.
        """
        alice = self.peer(self.bound[0], plain=("alice", "wonderland"))
        await alice.open("alice")
        policy = parse_access(["alice write: prices", "bob write: prices"])
        installed = self.security.install(
            ClientSecurity({"alice": "wonderland", "bob": "builder"}, None, policy)
        )
        self.assertTrue(installed)
        self.assertEqual(await alice.command(mlm.StreamWrite("prices")), mlm.Ok())
        bob = self.peer(self.bound[0], plain=("bob", "builder"))
        await bob.open("bob")
        self.assertEqual(self.zap().passwords, {"alice": "wonderland", "bob": "builder"})
        access = self.broker().access
        assert access is not None
        self.assertEqual(access.passwords, {"alice": "wonderland", "bob": "builder"})
        self.assertEqual(self.passwords.read_text(), "alice = wonderland\n")
        clients = self.security.clients
        assert clients is not None
        self.assertIs(clients.policy, policy)
        # None leaves this broker's own in force.
        self.security.install(ClientSecurity(None, None, AccessPolicy()))
        self.assertEqual(self.zap().passwords, {"alice": "wonderland", "bob": "builder"})
        await self.sighup()
        self.assertEqual(self.zap().passwords, {"alice": "wonderland"})

    async def test_stoppingRestoresTheSignalHandler(self) -> None:
        """Once the broker stops, SIGHUP is no longer its."""
        assert self.service is not None
        before = signal.getsignal(signal.SIGHUP)
        await self.service.stopService()
        self.service = None
        self.assertIsNot(signal.getsignal(signal.SIGHUP), before)
