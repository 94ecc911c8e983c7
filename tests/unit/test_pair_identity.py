"""
Tests of what decides the clients' identities on both brokers of a pair
(L{malamute_pack.pair.service}'s takeover and replica hooks, with
L{malamute_pack.pair.replication}): two brokers with PLAIN clients and an
access file, each the service C{twistd malamute --pair} runs, in this
process (a ZeroMQ context each: each has its own ZAP handler), with real
sockets (ipc), real journals and raw client peers. Owners of addresses,
the access rules and passwords reloaded on the active, and stream deletes
are all the new active's after a takeover.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import zmq
from twisted.trial.unittest import TestCase

from malamute_pack.broker.access import NOT_ALLOWED, Right
from malamute_pack.broker.broker import Broker
from malamute_pack.journal import Journal
from malamute_pack.journal.service import JournalService
from malamute_pack.ops.admin import Admin
from malamute_pack.pair.machine import State
from malamute_pack.protocol import mlm
from malamute_pack.tap import BrokerService
from malamute_pack.transport.security import SecurityService
from tests.e2e_support import Peer, ipc_endpoint, settle, until
from tests.system.test_pair_service import Member, pair_of

PASSWORDS = "alice = wonderland\nbob = builder\n"
RULES = "alice write: prices\nbob write: prices\n"


class SecureMember(Member):
    """A broker of the pair whose clients authenticate (PLAIN) under an access file."""

    def __init__(self, case: TestCase, role: str, bind: str, connect: str, data: Path) -> None:
        super().__init__(case, role, bind, connect, data)
        data.mkdir(parents=True)
        self.passwords, self.rules = data.parent / f"{role}.passwords", data.parent / f"{role}.acl"
        self.passwords.write_text(PASSWORDS)
        self.rules.write_text(RULES)
        self.settings = dataclasses.replace(
            self.settings,
            endpoints=(f"plain:{ipc_endpoint()}",),
            passwords=self.passwords,
            access_file=self.rules,
        )

    @property
    def endpoint(self) -> str:
        return self.settings.endpoints[0].removeprefix("plain:")

    def part(self, name: str) -> Any:
        assert self.service is not None
        return self.service.getServiceNamed(name)

    @property
    def broker(self) -> Broker:
        service = self.part("broker")
        assert isinstance(service, BrokerService)
        return service.broker

    @property
    def journal(self) -> Journal:
        service = self.part("journal")
        assert isinstance(service, JournalService)
        return service.journal

    @property
    def security(self) -> SecurityService:
        service = self.part("security")
        assert isinstance(service, SecurityService)
        return service


class PairIdentityTests(TestCase):
    """What decides the clients' identities, on both brokers of a pair."""

    def setUp(self) -> None:
        # The clients' context; each broker gets one of its own (started).
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)
        self.primary, self.backup = pair_of(self, SecureMember)

    async def started(self) -> None:
        for member in (self.primary, self.backup):
            context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
            self.addCleanup(context.term)
            member.start(context)
        await until(
            lambda: (
                self.primary.pair.machine.state is State.ACTIVE
                and self.backup.pair.replica is not None
                and self.backup.pair.replica.may_take_over
                and self.primary.pair.source is not None
                and self.primary.pair.source.in_sync
            )
        )

    def user(self, member: SecureMember, name: str) -> Peer:
        password = dict(line.split(" = ") for line in PASSWORDS.splitlines())[name]
        peer = Peer(self.context, member.endpoint, plain=(name, password))
        self.addCleanup(peer.close)
        return peer

    async def replicated(self) -> None:
        """Wait until the backup has on its disk everything the primary wrote so far."""
        journal, source = self.primary.journal, self.primary.pair.source
        assert source is not None
        await journal.flush()
        await until(lambda: source.acked >= journal.handed)

    async def fail_over(self) -> None:
        """The primary stops; the backup's silence timer runs out."""
        await self.primary.stop()
        await settle(0.3)  # the partner's expiry: 2 heartbeats of 100 ms

    async def test_ownerUnchangedAfterFailover(self) -> None:
        """
        alice owns the address alice on the active; after a takeover the
        new active refuses bob's OPEN of it (403) and lets alice in. Its
        owners are read from the journal when it takes over: the passive
        held none in memory before.
        """
        await self.started()
        alice = self.user(self.primary, "alice")
        self.assertEqual(
            await alice.command(mlm.ConnectionOpen(version=2, address="alice")), mlm.Ok()
        )
        await alice.command(mlm.ConnectionClose())
        await self.replicated()
        backup = self.backup
        self.assertEqual(len(backup.broker.access.owners), 0)  # type: ignore[union-attr]
        await self.fail_over()
        bob = self.user(backup, "bob")
        refused = await bob.command(mlm.ConnectionOpen(version=2, address="alice"))
        assert isinstance(refused, mlm.Error), refused
        self.assertEqual(refused.status_code, NOT_ALLOWED)
        self.assertIn("belongs to another user", refused.status_reason)
        self.assertIs(backup.pair.machine.state, State.ACTIVE)
        self.assertEqual(backup.broker.access.owners.owner("alice"), "alice")  # type: ignore[union-attr]
        again = self.user(backup, "alice")
        self.assertEqual(
            await again.command(mlm.ConnectionOpen(version=2, address="alice")), mlm.Ok()
        )

    async def test_reloadedRulesFollowAFailover(self) -> None:
        """
        The active reloads its access file (bob loses write on prices) and
        its password file (bob's password changes): the passive puts them in
        force at once though its own files did not change, and after a
        takeover bob's STREAM_WRITE to prices is refused (403) while
        alice's is not. The passive's files are left as they were.
        """
        await self.started()
        self.primary.rules.write_text("alice write: prices\n")
        self.primary.passwords.write_text("alice = wonderland\nbob = rebuilt\n")
        self.assertTrue(self.primary.security.reload())
        backup = self.backup
        access = backup.broker.access
        assert access is not None
        await until(lambda: not access.policy.allows("bob", Right.WRITE, "prices"))
        self.assertEqual(backup.part("zap").passwords["bob"], "rebuilt")
        self.assertEqual(access.passwords, {"alice": "wonderland", "bob": "rebuilt"})
        self.assertEqual(backup.rules.read_text(), RULES)
        await self.fail_over()
        bob = Peer(self.context, backup.endpoint, plain=("bob", "rebuilt"))
        self.addCleanup(bob.close)
        self.assertEqual(await bob.command(mlm.ConnectionOpen(version=2, address="b")), mlm.Ok())
        refused = await bob.command(mlm.StreamWrite("prices"))
        assert isinstance(refused, mlm.Error), refused
        self.assertEqual(refused.status_code, NOT_ALLOWED)
        alice = self.user(backup, "alice")
        await alice.command(mlm.ConnectionOpen(version=2, address="a"))
        self.assertEqual(await alice.command(mlm.StreamWrite("prices")), mlm.Ok())

    async def test_deletedStreamGoneAfterFailover(self) -> None:
        """
        A stream deleted on the active (the management API's admin
        action) has no records on the new active after a takeover; what
        was written after the delete is there.
        """
        await self.started()
        alice = self.user(self.primary, "alice")
        await alice.command(mlm.ConnectionOpen(version=2, address="alice"))
        self.assertEqual(await alice.command(mlm.StreamWrite("prices")), mlm.Ok())
        for n in range(5):
            alice.send(mlm.StreamSend(f"before-{n}", [b"x"]))
        await self.replicated()
        await until(lambda: self.primary.journal.last_seq("prices") == 5)
        done = Admin(self.primary.broker, self.primary.journal).delete_stream("prices")
        self.assertEqual(done["deleted_through"], 5)
        alice.send(mlm.StreamSend("after", [b"y"]))
        await until(lambda: self.primary.journal.last_seq("prices") == 6)
        await self.replicated()
        await self.fail_over()
        backup = self.backup
        reader = self.user(backup, "bob")
        self.assertEqual(await reader.command(mlm.ConnectionOpen(version=2, address="r")), mlm.Ok())
        await until(lambda: backup.pair.machine.state is State.ACTIVE)
        self.assertEqual(backup.journal.first_seq("prices"), 6)
        rows = await backup.journal.read_stream("prices", 1, 10)
        self.assertEqual([(r.seq, r.subject) for r in rows], [(6, "after")])
