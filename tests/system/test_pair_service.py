"""
Tests for L{malamute_pack.pair.service}, L{malamute_pack.pair.link} and
L{malamute_pack.pair.gate}: two brokers of a pair, each the service
C{twistd malamute --pair} runs, in this process, with real sockets (ipc),
real journals and raw client peers; the identity the pair shares.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar

import zmq
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred
from twisted.logger import formatEvent
from twisted.python import usage
from twisted.trial.unittest import TestCase

from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.datadir import learned_identity, pack_identity
from malamute_pack.journal.journal import Journal, Recovered
from malamute_pack.journal.service import JournalService
from malamute_pack.ops.service import OperationsService
from malamute_pack.pair.check import current_state
from malamute_pack.pair.gate import NOT_ACTIVE, ClientGate
from malamute_pack.pair.machine import State
from malamute_pack.pair.service import EXIT_YIELDED, PairService
from malamute_pack.protocol import mlm
from malamute_pack.protocol import pair as wire
from malamute_pack.settings import PairSettings, Settings
from malamute_pack.tap import makeBrokerService
from malamute_pack.testing.brokerprocess import checkout_environment
from malamute_pack.transport.curve import load_client_keys, write_certificates
from malamute_pack.transport.zap import ZapHandler
from tests.e2e_support import Peer, clock, ipc_endpoint, settle, the_reactor, until
from tests.memory_session import InMemorySession, Said
from tests.support import capture_log


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
        self.stop_as_reactor(self.service)
        self.service.startService()
        self.case.addCleanup(self.stop)

    async def stop(self) -> None:
        service, self.service = self.service, None
        if service is not None and service.running:
            await service.stopService()

    @property
    def journal(self) -> Journal:
        assert self.service is not None
        service = self.service.getServiceNamed("journal")
        assert isinstance(service, JournalService)
        return service.journal

    def stop_as_reactor(self, service: MultiService) -> None:
        """
        Have this broker stop itself (L{PairService.stop_broker}) as the
        reactor's shutdown stops a broker process, without stopping this
        test's reactor nor ending its process: on the next turn, every
        service stops (L{stopping} fires when they all have). The statuses
        asked for accumulate in L{exit_statuses}.
        """
        self.exit_statuses: list[int] = []
        self.stopping: Deferred[object] = Deferred()

        def stop(status: int) -> None:
            self.exit_statuses.append(status)
            if len(self.exit_statuses) == 1:
                clock().callLater(0, stop_services, service, self.stopping)

        pair = service.getServiceNamed("pair")
        assert isinstance(pair, PairService)
        pair.stop_broker = stop


async def formed(active: Member, passive: Member) -> None:
    """Wait until C{active} serves and C{passive} follows it, both in sync."""
    await until(
        lambda: (
            active.pair.machine.state is State.ACTIVE
            and passive.pair.replica is not None
            and passive.pair.replica.may_take_over
            and active.pair.source is not None
            and active.pair.source.in_sync
        )
    )


def stop_services(service: MultiService, stopped: Deferred[object]) -> None:
    """Stop C{service}, as a reactor's shutdown does; C{stopped} fires once it has."""
    stopping = service.stopService()
    assert isinstance(stopping, Deferred)
    stopping.chainDeferred(stopped)


def pair_state(path: Path) -> dict[str, str]:
    """The pair's state recorded in the journal at C{path}."""
    with closing(sqlite3.connect(path)) as conn:
        return dict(conn.execute("SELECT name, value FROM pair_state").fetchall())


def journal_threads() -> set[threading.Thread]:
    """The live threads of every journal of this process (writers and readers)."""
    return {
        t
        for t in threading.enumerate()
        if t.name == "journal-writer" or t.name.startswith("PoolThread-journal-reader")
    }


M = TypeVar("M", bound=Member)


def pair_of(case: TestCase, kind: type[M]) -> tuple[M, M]:
    """A primary and a backup of kind C{kind}, their links on fresh ipc names."""
    link_a, link_b = ipc_endpoint(), ipc_endpoint()
    base = Path(case.mktemp())
    return (
        kind(case, "primary", link_a, link_b, base / "a"),
        kind(case, "backup", link_b, link_a, base / "b"),
    )


async def stored_letter_fails_over(
    case: TestCase, primary: Member, backup: Member, peer: Callable[[Member], Peer]
) -> tuple[mlm.Stored, Peer]:
    """
    A letter C{primary} acknowledged (STORED 200) is delivered, with its id,
    by C{backup} once C{primary} is stopped and a client turns to C{backup}
    (its OPEN answered OK once it took over); the STORED, and that client.
    """
    sender = peer(primary)
    await sender.command(mlm.ConnectionOpen(version=2, address="sender"))
    sender.send(mlm.MailboxSend("box", "hello", "", 0, [b"body"]))
    stored = await sender.next()
    assert isinstance(stored, mlm.Stored)
    case.assertEqual(stored.status_code, mlm.SUCCESS)
    await primary.stop()
    await settle(0.3)  # the partner's expiry: 2 heartbeats of 100 ms
    receiver = peer(backup)
    case.assertEqual(await receiver.command(mlm.ConnectionOpen(version=2, address="box")), mlm.Ok())
    record = await receiver.next()
    assert isinstance(record, mlm.MailboxRecord)
    case.assertEqual((record.id, record.content), (stored.id, [b"body"]))
    return stored, receiver


class PairServiceTests(TestCase):
    """Two brokers of a pair in one process."""

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)
        self.primary, self.backup = pair_of(self, Member)

    def peer(self, member: Member) -> Peer:
        peer = Peer(self.context, member.endpoint)
        self.addCleanup(peer.close)
        return peer

    async def started(self) -> set[threading.Thread]:
        """
        Start both; once the pair formed, the journal threads of the
        process before the backup started (the primary's).
        """
        self.primary.start(self.context)
        others = journal_threads()
        self.backup.start(self.context)
        await formed(self.primary, self.backup)
        return others

    async def stored_by_backup_alone(self, body: bytes, records: int = 0) -> mlm.Stored:
        """
        Once the pair formed (and the primary wrote C{records} records of
        stream C{orders}, both in sync), the primary stops and the backup,
        taking over for a client, stores a letter with C{body} alone: its
        STORED.
        """
        await self.started()
        if records:
            for n in range(records):
                self.primary.journal.append_stream("orders", "w", "s", [b"r%d" % n], 1.0)
            await self.primary.journal.flush()
            await until(lambda: self.backup.journal.last_seq("orders") == records)
            await self.backup.journal.flush()
        await self.primary.stop()
        await settle(0.3)
        writer = self.peer(self.backup)
        self.assertEqual(await writer.command(mlm.ConnectionOpen(version=2, address="w")), mlm.Ok())
        writer.send(mlm.MailboxSend("box", "alone", "", 0, [body]))
        stored = await writer.next()
        assert isinstance(stored, mlm.Stored)
        self.assertEqual(stored.status_code, mlm.SUCCESS)
        return stored

    async def delivered_to_box(self, member: Member, stored: mlm.Stored, body: bytes) -> None:
        """The letter C{stored} acknowledged, with C{body}, is delivered to "box" by C{member}."""
        receiver = self.peer(member)
        self.assertEqual(
            await receiver.command(mlm.ConnectionOpen(version=2, address="box")), mlm.Ok()
        )
        record = await receiver.next()
        assert isinstance(record, mlm.MailboxRecord)
        self.assertEqual((record.id, record.content), (stored.id, [body]))

    async def both_restart_after(self, serving: Member, *statements: str) -> Path:
        """
        The backup stops, C{statements} are run on its journal file (as a
        salvage of a damaged file leaves it), and both start: C{serving}
        serves and the other follows it. The backup's journal's path.
        """
        await self.backup.stop()
        path = self.backup.settings.data_dir / "journal.sqlite"
        with closing(sqlite3.connect(path)) as conn:
            for statement in statements:
                conn.execute(statement)
            conn.commit()
        self.primary.start(self.context)
        self.backup.start(self.context)
        following = self.backup if serving is self.primary else self.primary
        await formed(serving, following)
        self.assertIs(following.pair.machine.state, State.PASSIVE)
        return path

    async def letter_held_for_the_backup(self) -> Peer:
        """
        The backup applies nothing more, and a client of the primary sends
        a letter: its STORED waits for the replica. That client.
        """
        sender = self.peer(self.primary)
        await sender.command(mlm.ConnectionOpen(version=2, address="sender"))
        self.backup.pair.link.pauseReading()  # the old backup applies nothing more
        sender.send(mlm.MailboxSend("box", "held", "", 0, [b"1"]))
        await settle(0.05)
        self.assertEqual(sender.pending(), 0)  # STORED waits for the replica
        return sender

    async def test_backupSharesThePrimarysIdentity(self) -> None:
        """
        The pair shows other brokers one identity, the primary's: the backup
        learns it from the primary's heartbeats and keeps it in its data
        directory, so that it has it again when it starts, before it hears
        the primary (and joins a pack with it if it takes over).
        """
        await self.started()
        primary_id = pack_identity(self.primary.settings.data_dir)
        self.assertEqual(self.primary.pair.shared_identity, primary_id)
        await until(lambda: self.backup.pair.shared_identity == primary_id)
        self.assertEqual(learned_identity(self.backup.settings.data_dir), primary_id)
        self.assertNotEqual(pack_identity(self.backup.settings.data_dir), primary_id)
        await self.backup.stop()
        await self.primary.stop()
        self.backup.start(self.context)
        self.assertEqual(self.backup.pair.shared_identity, primary_id)

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
        stored, receiver = await stored_letter_fails_over(
            self, self.primary, self.backup, self.peer
        )
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
        await until(
            lambda: self.primary.pair.replica is not None and self.primary.pair.replica.in_sync
        )
        self.assertIs(self.primary.pair.machine.state, State.PASSIVE)
        self.assertIs(self.backup.pair.machine.state, State.ACTIVE)
        refused = await self.peer(self.primary).command(mlm.ConnectionOpen(version=2))
        assert isinstance(refused, mlm.Error)
        self.assertEqual(refused.status_code, NOT_ACTIVE)

    async def test_newerHistoryServesAfterBothRestart(self) -> None:
        """
        The backup took over (the primary stopped), acknowledged a letter
        alone, then stopped serving as a silent partner makes it (its
        journal leads no more); both restart: the backup, whose journal
        took over from the primary's history, serves, whatever the roles,
        and the letter it acknowledged is delivered (found by the soak:
        the primary served its older history and the backup's letters and
        records were cut back, their numbers given again).
        """
        stored = await self.stored_by_backup_alone(b"kept")
        self.backup.pair._suspend()  # as when its partner falls silent, maybe alive
        await self.backup.stop()
        self.primary.start(self.context)
        self.backup.start(self.context)
        await formed(self.backup, self.primary)
        self.assertIs(self.primary.pair.machine.state, State.PASSIVE)
        await self.delivered_to_box(self.backup, stored, b"kept")

    async def test_newerHistoryWaitsForTheOlderActiveToYield(self) -> None:
        """
        The backup took over and acknowledged a letter alone, then died;
        started again, it hears the primary active in the history it took
        over from (the primary refused its clients, cut off, meanwhile): it
        stays starting (the primary, hearing it, yields) instead of going
        passive and cutting back what it acknowledged (found by the soak).
        """
        await self.stored_by_backup_alone(b"kept")
        await self.backup.stop()
        self.backup.start(self.context)
        pair = self.backup.pair
        older = pair.previous_epoch
        self.assertNotEqual(older, "")
        pair.link.pauseReading()  # only the heartbeat below is heard
        pair._received(wire.Heartbeat("primary", "active", True, "old", older, 0, True))
        self.assertIs(pair.machine.state, State.STARTING)
        self.assertIsNone(pair.replica)

    async def test_damagedNewerJournalServesAndRefills(self) -> None:
        """
        The backup took over and acknowledged a letter alone, then its
        journal lost records of the primary's history to damage (a
        salvage's losses): when both restart it still serves (its history
        is the newer), the letter is delivered, and once the primary is in
        sync the lost records are copied back from it, with no loss left
        (found by the soak: the primary served its older history, and what
        the backup acknowledged alone was cut back).
        """
        stored = await self.stored_by_backup_alone(b"kept", records=5)
        path = await self.both_restart_after(
            self.backup,
            "DELETE FROM stream_messages WHERE stream = 'orders' AND seq BETWEEN 2 AND 4",
            "UPDATE streams SET message_count = 2 WHERE stream = 'orders'",
            "INSERT INTO journal_losses VALUES ('orders', 2, 4, 0.0, 'damaged page')",
        )
        journal = self.backup.journal
        await until(lambda: not journal.losses())
        await journal.flush()
        self.assertEqual(journal.lost("orders", 1, 5), [])
        with closing(sqlite3.connect(path)) as conn:
            rows = conn.execute(
                "SELECT seq, content FROM stream_messages WHERE stream = 'orders' AND seq <= 5"
            ).fetchall()
            counted = conn.execute("SELECT message_count FROM streams").fetchone()
            losses = conn.execute("SELECT count(*) FROM journal_losses").fetchone()
        framed = [(n + 1, len(b"r%d" % n).to_bytes(4, "big") + b"r%d" % n) for n in range(5)]
        self.assertEqual(rows, framed)
        self.assertEqual((counted, losses), ((5,), (0,)))
        await self.delivered_to_box(self.backup, stored, b"kept")

    async def test_damagedPartnersNumbersNotGivenAgain(self) -> None:
        """
        The backup took over and gave letter ids of its own history, then
        its journal was damaged so that the salvage lost records and could
        not read the pair's state (which history it took over from): it
        claims no history when both restart, so the primary serves its
        older history, and numbers past what the backup said it may have
        given (found by the soak: the same ids and sequence numbers given
        twice, and a client's dedupe dropped the second letter of an id).
        """
        stored = await self.stored_by_backup_alone(b"")
        await self.both_restart_after(
            self.primary,
            "INSERT INTO journal_losses VALUES ('orders', 5, 9, 0.0, 'damaged page')",
            "DELETE FROM pair_state",
        )
        sender = self.peer(self.primary)
        self.assertEqual(await sender.command(mlm.ConnectionOpen(version=2, address="s")), mlm.Ok())
        sender.send(mlm.MailboxSend("box", "after", "", 0, [b""]))
        after = await sender.next()
        assert isinstance(after, mlm.Stored)
        self.assertGreater(after.id, stored.id)

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
        sender = await self.letter_held_for_the_backup()
        self.primary.pair._received(
            wire.Heartbeat("backup", "starting", False, "a-new-incarnation", "", 0)
        )
        stored = await sender.next(timeout=0.1)
        assert isinstance(stored, mlm.Stored)
        self.assertEqual(stored.status_code, mlm.SUCCESS)
        self.assertFalse(source.in_sync)

    async def test_restartedNewerPartnerMakesActiveYield(self) -> None:
        """
        The partner starts again with a journal that took over from the
        history the active serves (it served the clients the active
        refused, then died): the active does not go on alone on that
        restart (what waits for the partner is not acknowledged) and
        yields, stopping itself (found by the soak: it served its older
        history, and the partner's acknowledged writes were cut back).
        """
        await self.started()
        sender = await self.letter_held_for_the_backup()
        epoch = self.primary.pair.epoch
        self.primary.pair._received(
            wire.Heartbeat("backup", "starting", False, "new", "newer", 0, False, epoch)
        )
        stored = await sender.next(timeout=1.0)
        assert isinstance(stored, mlm.Stored)
        self.assertNotEqual(stored.status_code, mlm.SUCCESS)
        await self.primary.stopping
        self.assertEqual(self.primary.exit_statuses, [EXIT_YIELDED])

    async def test_goneWhileRefusingWaitsToHearIt(self) -> None:
        """
        An active that refused its clients while its partner was silent
        (cut off from it, maybe taking over: the probe proved nothing), and
        then finds the partner's port refusing connections (its process is
        gone), does not go on alone: the partner may have taken over and
        acknowledged writes before it went. It keeps refusing its clients
        until it hears the partner again.
        """
        await self.started()
        self.backup.pair.link.stop()  # the partner falls silent
        pair = self.primary.pair
        await until(lambda: not pair.machine.partner_alive(clock().seconds()))
        pair._probed(False)  # no evidence: it refuses its clients (503)
        self.assertTrue(pair.gate.suspended)
        pair._probed(True)  # then the partner's port refuses connections
        self.assertTrue(pair.gate.suspended)
        refused = await self.peer(self.primary).command(mlm.ConnectionOpen(version=2))
        assert isinstance(refused, mlm.Error)
        self.assertEqual(refused.status_code, NOT_ACTIVE)

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

    async def stopsCleanly(self, stopping: Deferred[Any], others: set[threading.Thread]) -> None:
        """
        C{stopping}, the backup's stop (with a takeover under way), fires
        within 10 s; when it does (where a broker process's reactor ends its
        main loop) the backup's journal is closed and no thread of it runs
        (no journal thread but C{others}, the primary's); 0.3 s later
        neither (nothing opened it again); the backup never served.
        """
        journal = self.backup.journal
        self.addCleanup(journal.close)  # whatever a failed check leaves open
        seen: list[tuple[bool, set[threading.Thread]]] = []
        stopping.addCallback(lambda _: seen.append((journal.is_open, journal_threads())))
        await until(lambda: bool(seen))
        await settle(0.3)
        for is_open, alive in (*seen, (journal.is_open, journal_threads())):
            self.assertEqual(
                (is_open, sorted(t.name for t in alive - others)),
                (False, []),
                "the backup's journal open, or its threads running",
            )
        self.assertFalse(self.backup.pair.gate.is_open)

    async def test_yieldDuringTakeoverStops(self) -> None:
        """
        A stranger's DEALER at the passive backup's open pair link sends a
        forged heartbeat of the primary starting again, then one of it
        active: the backup takes over (its journal closing, to open again
        as the successor) and, hearing an active primary, yields while its
        takeover is under way: it stops itself with L{EXIT_YIELDED}, and
        its stop waits for the takeover, which gives up without opening
        the journal again: the journal is closed and its threads gone when
        the broker's services have stopped (a broker process whose reactor
        stopped there exits).
        """
        others = await self.started()
        stranger = self.context.socket(zmq.DEALER)
        stranger.setsockopt(zmq.LINGER, 0)
        self.addCleanup(stranger.close)
        bind = self.backup.settings.pair.bind
        assert bind is not None
        stranger.connect(bind)
        for forged in (
            wire.Heartbeat("primary", "starting", False, "stranger", "", 0, False),
            wire.Heartbeat("primary", "active", True, "stranger", "forged", 1, True),
        ):
            stranger.send_multipart(wire.encode(forged))
        await self.stopsCleanly(self.backup.stopping, others)
        self.assertEqual(self.backup.exit_statuses, [EXIT_YIELDED])

    async def test_stopDuringTakeoverClose(self) -> None:
        """
        The backup's services stop (SIGTERM) while its takeover is closing
        its journal: the stop waits for that close, and the takeover does
        not open the journal again.
        """
        others = await self.started()
        self.backup.pair.link.pauseReading()  # no yield to the primary's heartbeats
        self.backup.pair._received(
            wire.Heartbeat("primary", "starting", False, "restarted", "", 0, False)
        )
        self.assertIs(self.backup.pair.machine.state, State.ACTIVE)
        assert self.backup.service is not None
        stopped: Deferred[object] = Deferred()
        stop_services(self.backup.service, stopped)
        await self.stopsCleanly(stopped, others)

    async def test_stopDuringTakeoverReopen(self) -> None:
        """
        The backup's services stop (SIGTERM) once its takeover has opened
        the journal again, while it records the new history there: the
        takeover goes no further (no model restored, no gate opened), the
        journal closes, and it says it never served the new history
        (restarted, it claims no takeover of the primary's history: it
        would otherwise make the primary, which went on serving, yield and
        cut back what it acknowledged meanwhile; found by the soak). It
        claims the history it followed, not leading it: not the new epoch
        as its leader either (found by the soak: so claimed, the journal
        looked unrelated to the backup's, and as the primary's it served).
        """
        others = await self.started()
        journal = self.backup.journal
        followed = pair_state(journal.path)
        self.assertTrue(followed.get("epoch"))
        stopped: Deferred[object] = Deferred()
        real_open = journal.open

        def open_then_stop(*, takeover: bool = False) -> Recovered:
            found = real_open(takeover=takeover)
            assert self.backup.service is not None
            clock().callLater(0, stop_services, self.backup.service, stopped)
            return found

        self.patch(journal, "open", open_then_stop)
        self.backup.pair.link.pauseReading()  # no yield to the primary's heartbeats
        self.backup.pair._received(
            wire.Heartbeat("primary", "starting", False, "restarted", "", 0, False)
        )
        await self.stopsCleanly(stopped, others)
        kept = pair_state(journal.path)
        self.assertEqual(kept.get("previous_epoch"), followed["epoch"])
        self.assertEqual(kept.get("served"), "0")
        self.assertNotEqual(kept.get("epoch"), followed["epoch"])  # the new history's
        self.backup.start(self.context)
        self.assertEqual(self.backup.pair.previous_epoch, "")
        self.assertEqual(self.backup.pair.epoch, followed["epoch"])
        self.assertFalse(self.backup.pair._leads)

    async def test_caughtUpUnheardMakesNoTakeover(self) -> None:
        """
        A passive whose CAUGHT_UP never reached the active (the link cut
        just then) does not take over when the active falls silent and a
        client turns to it: the active, which never held it in sync,
        acknowledged without it (found by the soak: the passive took over,
        the old active yielded, and what it acknowledged meanwhile was lost).
        """
        await self.started()
        replica = self.backup.pair.replica
        assert replica is not None
        send = replica._send
        replica._send = lambda message: (
            not isinstance(message, wire.CaughtUp) and send(message)
        )  # the CAUGHT_UP is lost on the way
        replica.hello()
        await until(lambda: replica.in_sync)
        await settle(0.3)  # heartbeats: the active does not hold it in sync
        source = self.primary.pair.source
        assert source is not None
        self.assertEqual((source.in_sync, source.holding), (False, False))
        self.assertFalse(self.backup.pair.status().in_sync)
        sender = self.peer(self.primary)
        await sender.command(mlm.ConnectionOpen(version=2, address="sender"))
        sender.send(mlm.MailboxSend("box", "alone", "", 0, [b"1"]))
        stored = await sender.next()  # acknowledged without the passive
        assert isinstance(stored, mlm.Stored)
        self.assertEqual(stored.status_code, mlm.SUCCESS)
        self.primary.pair.link.stop()  # silent from here on; it still serves
        await settle(0.3)
        refused = await self.peer(self.backup).command(mlm.ConnectionOpen(version=2))
        assert isinstance(refused, mlm.Error)
        self.assertEqual(refused.status_code, NOT_ACTIVE)
        self.assertIs(self.backup.pair.machine.state, State.PASSIVE)

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


class CurvePairServiceTests(TestCase):
    """
    Two brokers of a CURVE pair (C{--pair-key}, C{--curve-secret}) in one
    process, each on a ZeroMQ context of its own: each has its own ZAP
    handler, as a broker process has.
    """

    def setUp(self) -> None:
        self.logged = capture_log(self)
        self.contexts: list[zmq.Context[zmq.Socket[bytes]]] = []
        for _ in range(3):  # the primary's, the backup's, the clients'
            context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
            self.addCleanup(context.term)
            self.contexts.append(context)
        base = Path(self.mktemp())
        self.keys = {n: write_certificates(base / "keys", n) for n in ("a", "b", "other")}
        link_a, link_b = ipc_endpoint(), ipc_endpoint()
        self.primary = self.member("primary", link_a, link_b, base / "a", "a", "b")
        self.backup = self.member("backup", link_b, link_a, base / "b", "b", "a")

    def member(
        self, role: str, bind: str, connect: str, data: Path, own: str, partner: str
    ) -> Member:
        member = Member(self, role, bind, connect, data)
        member.settings = dataclasses.replace(
            member.settings,
            curve_secret=self.keys[own][1],
            pair=dataclasses.replace(member.settings.pair, key=self.keys[partner][0]),
        )
        return member

    def peer(self, member: Member) -> Peer:
        peer = Peer(self.contexts[2], member.endpoint)
        self.addCleanup(peer.close)
        return peer

    async def test_curvePairReplicatesAndFailsOver(self) -> None:
        """
        Brokers given each other's public certificate form the pair over
        CURVE (each link's status says so, with the partner's key, in the
        pair's stats too, and each logs it at start); a letter STORED by
        the active is delivered by the passive once it took over.
        """
        self.primary.start(self.contexts[0])
        self.backup.start(self.contexts[1])
        await until(
            lambda: (
                self.primary.pair.source is not None
                and self.primary.pair.source.in_sync
                and self.backup.pair.replica is not None
                and self.backup.pair.replica.in_sync
            )
        )
        b_public = load_client_keys(self.keys["b"][0])
        link = self.primary.pair.link.status()
        self.assertEqual((link.security, link.partner_key.encode()), ("curve", *b_public))
        self.assertIn(
            f"pair link: CURVE, admitting only the partner key {link.partner_key}"
            f" (--pair-key {self.keys['b'][0]})",
            [formatEvent(e) for e in self.logged],
        )
        operations = self.primary.service.getServiceNamed("operations")  # type: ignore[union-attr]
        assert isinstance(operations, OperationsService)
        self.assertEqual(operations.statistics.pair_status()["link"]["security"], "curve")
        _, _ = await stored_letter_fails_over(self, self.primary, self.backup, self.peer)

    async def test_wrongPartnerKeyFormsNoPair(self) -> None:
        """
        A backup whose --pair-key names another broker's certificate forms
        no pair: its ZAP refuses the primary's key; its own DEALER, trusting
        the other key, fails its CURVE handshake with the primary (counted
        by the primary's link); neither hears the other, and the backup
        never becomes passive.
        """
        self.backup.settings = dataclasses.replace(
            self.backup.settings,
            pair=dataclasses.replace(self.backup.settings.pair, key=self.keys["other"][0]),
        )
        self.primary.start(self.contexts[0])
        self.backup.start(self.contexts[1])
        zap = self.backup.service.getServiceNamed("zap")  # type: ignore[union-attr]
        assert isinstance(zap, ZapHandler)
        link = self.primary.pair.link

        def refused() -> bool:
            status = link.status()
            return (
                zap.counters["pair partner"].refused >= 1
                and status.refused_handshakes + status.broken_off >= 1
            )

        await until(refused)
        await settle(0.5)
        self.assertIs(self.backup.pair.machine.state, State.STARTING)
        self.assertFalse(self.backup.pair.machine.partner_alive(clock().seconds()))
        self.assertFalse(self.primary.pair.machine.partner_alive(clock().seconds()))

    def test_severalPartnerKeysRefused(self) -> None:
        """
        A --pair-key file that lists two keys is refused at start, saying
        so: the link trusts one partner key, as its DEALER's server key.
        """
        listed = self.primary.settings.data_dir.parent / "two.keys"
        listed.write_text(
            "".join(
                f"{name} = {key.decode()}\n"
                for name in ("a", "b")
                for key in load_client_keys(self.keys[name][0])
            )
        )
        self.primary.settings = dataclasses.replace(
            self.primary.settings,
            pair=dataclasses.replace(self.primary.settings.pair, key=listed),
        )
        with self.assertRaises(usage.UsageError) as raised:
            makeBrokerService(self.primary.settings, the_reactor(), self.contexts[0])
        self.assertIn(f"--pair-key {listed} lists 2", str(raised.exception))


def run_exiting(code: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run C{code} in a Python process of its own: how it ended, and in how many seconds."""
    started = time.monotonic()
    ran = subprocess.run(
        [sys.executable, "-c", code],
        env=checkout_environment(),
        capture_output=True,
        text=True,
        timeout=60.0,
    )
    return ran, time.monotonic() - started


class ExitWhenStoppedTests(TestCase):
    """
    How a broker that stopped itself ends its process
    (L{malamute_pack.pair.service.exit_when_stopped}), in a child process.
    """

    def test_exitsWithStatus(self) -> None:
        """
        A process that stops cleanly after it was called (twistd returned)
        exits with the status given, not 0, at once (not at the watchdog's
        time), its output flushed.
        """
        ran, took = run_exiting(
            "from malamute_pack.pair.service import exit_when_stopped;"
            " exit_when_stopped(75, 30.0); print('flushed', end='')"
        )
        self.assertEqual((ran.returncode, ran.stdout, ran.stderr), (75, "flushed", ""))
        self.assertLess(took, 20.0)

    def test_watchdogEndsStuckProcess(self) -> None:
        """
        A process that cannot exit (a thread that never ends, as a
        journal's reader pool left running did) is ended by the watchdog
        after the grace: the status given, and a line on stderr saying so.
        """
        ran, took = run_exiting(
            "import threading; from malamute_pack.pair.service import exit_when_stopped;"
            " exit_when_stopped(75, 0.5); threading.Thread(target=threading.Event().wait).start()"
        )
        self.assertEqual(ran.returncode, 75)
        self.assertIn(
            "pair: the broker stopped itself 0.5 s ago and has not exited (a stop that never"
            " finished): exiting now with status 75",
            ran.stderr,
        )
        self.assertLess(took, 20.0)


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
