"""
Tests for L{malamute_pack.pair.service}, L{malamute_pack.pair.link} and
L{malamute_pack.pair.gate}: two brokers of a pair, each the service
C{twistd malamute --pair} runs, in this process, with real sockets (ipc),
real journals and raw client peers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import zmq
from twisted.application.service import MultiService
from twisted.trial.unittest import TestCase

from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.pair.check import current_state
from malamute_pack.pair.gate import NOT_ACTIVE, ClientGate
from malamute_pack.pair.machine import State
from malamute_pack.pair.service import PairService
from malamute_pack.protocol import mlm
from malamute_pack.protocol import pair as wire
from malamute_pack.settings import PairSettings, Settings
from malamute_pack.tap import makeBrokerService
from tests.e2e_support import Peer, clock, ipc_endpoint, settle, the_reactor
from tests.memory_session import InMemorySession, Said


class Member:
    """One broker of the pair: its settings, and its service while it runs."""

    def __init__(self, case: TestCase, role: str, bind: str, connect: str, data: Path) -> None:
        self.settings = Settings(
            endpoints=(ipc_endpoint(),),
            data_dir=data,
            pair=PairSettings(role, bind, connect, "sync", heartbeat_ms=100, misses=2),
        )
        self.case = case
        self.service: MultiService | None = None

    @property
    def endpoint(self) -> str:
        return self.settings.endpoints[0]

    @property
    def pair(self) -> PairService:
        assert self.service is not None
        service = self.service.getServiceNamed("pair")
        assert isinstance(service, PairService)
        return service

    def start(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.service = makeBrokerService(self.settings, the_reactor(), context)
        self.service.startService()
        self.case.addCleanup(self.stop)

    async def stop(self) -> None:
        service, self.service = self.service, None
        if service is not None and service.running:
            await service.stopService()


class PairServiceTests(TestCase):
    """Two brokers of a pair in one process."""

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)
        link_a, link_b = ipc_endpoint(), ipc_endpoint()
        base = Path(self.mktemp())
        self.primary = Member(self, "primary", link_a, link_b, base / "a")
        self.backup = Member(self, "backup", link_b, link_a, base / "b")

    def peer(self, member: Member) -> Peer:
        peer = Peer(self.context, member.endpoint)
        self.addCleanup(peer.close)
        return peer

    async def until(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = clock().seconds() + timeout
        while not condition():
            if clock().seconds() > deadline:
                self.fail("condition not met in time")
            await settle(0.02)

    async def started(self) -> None:
        self.primary.start(self.context)
        self.backup.start(self.context)
        await self.until(
            lambda: (
                self.primary.pair.machine.state is State.ACTIVE
                and self.backup.pair.replica is not None
                and self.backup.pair.replica.in_sync
                and self.primary.pair.source is not None
                and self.primary.pair.source.in_sync
            )
        )

    async def test_passiveRefusesClients(self) -> None:
        """
        The primary goes active and the backup passive (as each records for
        the check command and reports in its status); a client of the
        passive is refused with 503 "not active", a client of the active is
        served.
        """
        await self.started()
        self.assertIs(self.backup.pair.machine.state, State.PASSIVE)
        self.assertEqual(current_state(self.primary.settings.data_dir), "active")
        self.assertEqual(current_state(self.backup.settings.data_dir), "passive")
        refused = await self.peer(self.backup).command(mlm.ConnectionOpen(version=2))
        assert isinstance(refused, mlm.Error)
        self.assertEqual(refused.status_code, NOT_ACTIVE)
        self.assertIn("not active", refused.status_reason)
        served = self.peer(self.primary)
        self.assertEqual(await served.command(mlm.ConnectionOpen(version=2)), mlm.Ok())
        primary, backup = self.primary.pair.status(), self.backup.pair.status()
        self.assertEqual(
            (primary.role, primary.state, primary.in_sync, primary.partner_alive),
            ("primary", "active", True, True),
        )
        self.assertEqual(
            (backup.state, backup.in_sync, backup.refused_clients), ("passive", True, 1)
        )
        self.assertEqual(primary.epoch, backup.epoch)

    async def test_storedLetterSurvivesFailover(self) -> None:
        """
        A letter acknowledged (STORED 200) by the active is delivered by
        the passive once the active is gone and a client turns to the
        passive: the client's OPEN waits while it takes over, then is
        answered OK; ids continue without reuse.
        """
        await self.started()
        sender = self.peer(self.primary)
        await sender.command(mlm.ConnectionOpen(version=2, address="sender"))
        sender.send(mlm.MailboxSend("box", "hello", "", 0, [b"body"]))
        stored = await sender.next()
        assert isinstance(stored, mlm.Stored)
        self.assertEqual(stored.status_code, mlm.SUCCESS)
        await self.primary.stop()
        await settle(0.3)  # the partner's expiry: 2 heartbeats of 100 ms
        receiver = self.peer(self.backup)
        self.assertEqual(
            await receiver.command(mlm.ConnectionOpen(version=2, address="box")), mlm.Ok()
        )
        record = await receiver.next()
        assert isinstance(record, mlm.MailboxRecord)
        self.assertEqual((record.id, record.content), (stored.id, [b"body"]))
        self.assertIs(self.backup.pair.machine.state, State.ACTIVE)
        self.assertEqual(self.backup.pair.takeovers, 1)
        receiver.send(mlm.MailboxSend("other", "next", "", 0, [b""]))
        after = await receiver.next()
        assert isinstance(after, mlm.Stored)
        self.assertGreater(after.id, stored.id + 1)

    async def test_oldActiveRejoinsAsPassive(self) -> None:
        """
        The old active, started again after the takeover, becomes passive
        and catches up: it then holds the new active's letters and none of
        the ones finished there.
        """
        await self.started()
        sender = self.peer(self.primary)
        await sender.command(mlm.ConnectionOpen(version=2, address="sender"))
        sender.send(mlm.MailboxSend("box", "before", "", 0, [b"1"]))
        await sender.next()
        await self.primary.stop()
        await settle(0.3)
        client = self.peer(self.backup)
        await client.command(mlm.ConnectionOpen(version=2, address="writer"))
        client.send(mlm.MailboxSend("box", "after", "", 0, [b"2"]))
        stored = await client.next()
        assert isinstance(stored, mlm.Stored)
        self.primary.start(self.context)
        await self.until(
            lambda: self.primary.pair.replica is not None and self.primary.pair.replica.in_sync
        )
        self.assertIs(self.primary.pair.machine.state, State.PASSIVE)
        self.assertIs(self.backup.pair.machine.state, State.ACTIVE)
        refused = await self.peer(self.primary).command(mlm.ConnectionOpen(version=2))
        assert isinstance(refused, mlm.Error)
        self.assertEqual(refused.status_code, NOT_ACTIVE)

    async def test_restartedPartnerReleasesAcknowledgements(self) -> None:
        """
        A heartbeat from a new incarnation of the partner (it restarted)
        ends the old replication link at once: the active's letters are
        acknowledged without waiting for a replica that is gone. The
        replica's own heartbeats (the process that asked for the link)
        leave the link alone.
        """
        await self.started()
        source = self.primary.pair.source
        assert source is not None
        replica = self.backup.pair.incarnation
        self.primary.pair._received(wire.Heartbeat("backup", "passive", True, replica, "", 0))
        self.assertTrue(source.in_sync)
        sender = self.peer(self.primary)
        await sender.command(mlm.ConnectionOpen(version=2, address="sender"))
        self.backup.pair.link.pauseReading()  # the old backup applies nothing more
        sender.send(mlm.MailboxSend("box", "held", "", 0, [b"1"]))
        await settle(0.05)
        self.assertEqual(sender.pending(), 0)  # STORED waits for the replica
        self.primary.pair._received(
            wire.Heartbeat("backup", "starting", False, "a-new-incarnation", "", 0)
        )
        stored = await sender.next(timeout=0.1)
        assert isinstance(stored, mlm.Stored)
        self.assertEqual(stored.status_code, mlm.SUCCESS)
        self.assertFalse(source.in_sync)

    async def test_sameRoleIgnored(self) -> None:
        """
        A heartbeat from another broker of this one's role, while this one
        is active, is reported and ignored: it changes nothing.
        """
        await self.started()
        primary = self.primary.pair
        primary._received(wire.Heartbeat("primary", "active", True, "impostor", "", 0))
        self.assertIs(primary.machine.state, State.ACTIVE)
        self.assertTrue(primary.source is not None and primary.source.in_sync)

    async def test_partitionAloneMakesNoSecondActive(self) -> None:
        """
        With the partner silent but no client turning to it, a passive
        stays passive; only a client request makes it take over.
        """
        await self.started()
        self.primary.pair.link.stop()  # its heartbeats stop; it still serves
        await settle(0.5)
        self.assertIs(self.backup.pair.machine.state, State.PASSIVE)
        self.assertIs(self.primary.pair.machine.state, State.ACTIVE)
        served = self.peer(self.primary)
        self.assertEqual(await served.command(mlm.ConnectionOpen(version=2)), mlm.Ok())


class ClientGateTests(TestCase):
    """The gate in front of the broker model."""

    def setUp(self) -> None:
        self.broker = Broker(clock(), BrokerConfig())
        self.accept = False
        self.gate = ClientGate(self.broker, lambda: self.accept)

    def test_refusedBeforeActive(self) -> None:
        """A request the machine refuses is answered ERROR 503 and counted."""
        session = InMemorySession("client")
        self.gate.receive(session, mlm.ConnectionOpen())
        self.assertEqual(session.take(), [Said("error", (NOT_ACTIVE, self.gate.reason))])
        self.assertEqual(self.gate.refused, 1)

    def test_heldUntilOpen(self) -> None:
        """
        A request the machine accepts (a takeover under way) waits and is
        handed to the broker when the gate opens, in order.
        """
        self.accept = True
        session = InMemorySession("client")
        self.gate.receive(session, mlm.ConnectionOpen(address="a"))
        self.assertEqual(session.take(), [])
        self.gate.open()
        self.assertEqual(session.take(), [Said("ok")])
        self.gate.receive(session, mlm.ConnectionPing())
        self.assertEqual(session.take(), [Said("pong")])
