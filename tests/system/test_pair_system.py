"""
System tests of the primary/backup pair (``--pair``, Binary Star): two
real brokers on two hosts (network namespaces) with the pair link on a LAN
of its own, and clients on a third host (the project's BlockingClient and
BulkClient: multi-endpoint fail-over, or one endpoint on a floating
address) under load. What the pair promises, checked end to end: a kill -9
of the active loses nothing acknowledged (letters STORED 200, requests
STORED 200, appends STREAM_APPENDED), the old active rejoins as passive
and catches up, a cut pair link alone makes no second active, a restarted
passive catches up what the active did alone, a floating address moved to
the new active serves unchanged single-endpoint clients, and a backup made
a second active (a stranger's forged messages on its open pair link) stops
itself and exits, as it does on SIGTERM in the middle of a catch-up.

Needs root and iproute2 (skipped otherwise), and is slow
(C{MALAMUTE_SKIP_SLOW=1} skips it). Support: ``tests/pair_system_support.py``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections.abc import Sequence
from time import monotonic, sleep
from typing import Any, ClassVar

import zmq

from malamute_pack.pair.service import EXIT_GRACE_S, EXIT_YIELDED
from malamute_pack.testing.brokerprocess import checkout_environment, python_command
from tests.pair_system_support import (
    ACTIVE,
    CAUGHT_UP,
    CLIENT_SUBNET,
    IN_SYNC,
    PAIR_PORT,
    PAIR_SUBNET,
    PASSIVE,
    PORT,
    SILENT,
    TAKING_OVER,
    ClientJob,
    PairCase,
    Record,
    check_appends,
    check_letters,
    longest_wait,
)

STREAM = "ticks"
MAILBOX = "box"
SERVICE = "work"
# Records per append.
RECORDS = 5
# What an active logs when it acknowledges without its partner.
ALONE = "this broker goes on alone"
# The longest a client of the active may wait for an acknowledgement while
# its partner dies or is cut off: the partner's expiry (2 s) and then some.
STALL = 8.0


class Load:
    """A mailbox sender, a service requester and an appender, running on h3."""

    def __init__(self, case: PairCase, endpoints: Sequence[str], tag: str) -> None:
        endpoints = list(endpoints)
        self.mail = case.client(
            f"mail-{tag}", kind="mail", endpoints=endpoints, address=f"sender-{tag}",
            to=MAILBOX, prefix="m-",
        )  # fmt: skip
        self.service = case.client(
            f"service-{tag}", kind="service", endpoints=endpoints, address=f"asker-{tag}",
            to=SERVICE, prefix="r-",
        )  # fmt: skip
        self.append = case.client(
            f"append-{tag}", kind="append", endpoints=endpoints, stream=STREAM, prefix="k-",
            records=RECORDS,
        )  # fmt: skip
        self.jobs: list[ClientJob] = [self.mail, self.service, self.append]

    def finish(self) -> tuple[list[Record], list[Record], list[Record]]:
        """Stop all three; what each acknowledged (or not), in order."""
        for job in self.jobs:
            job.stop()
        mail, service, append = (job.records(60.0) for job in self.jobs)
        return mail, service, append


class PairSystemCase(PairCase):
    """The pair's scenarios; see each test."""

    def load(self, endpoints: Sequence[str], tag: str = "1") -> Load:
        return Load(self, endpoints, tag)

    def verify(
        self,
        endpoints: Sequence[str],
        mail: list[Record],
        service: list[Record],
        append: list[Record],
        what: str,
    ) -> str:
        """
        Every acknowledged letter reaches its recipient and every request
        a worker (through C{endpoints}), duplicates only for sends that saw
        the client move; every acknowledged append is read back at its
        sequence numbers, none given twice. A summary for the output.
        """
        box = self.receive(endpoints, MAILBOX, [r["s"] for r in mail if "id" in r])
        letters = check_letters(mail, box)
        work = self.receive(endpoints, "worker", [r["s"] for r in service if "id" in r], SERVICE)
        requests = check_letters(service, work)
        appends = check_appends(append, self.read_stream(endpoints, STREAM))
        summary = (
            f"{what}: letters {letters.acknowledged} STORED ({letters.unknown} unknown,"
            f" {letters.duplicates} twice), requests {requests.acknowledged} STORED"
            f" ({requests.unknown} unknown, {requests.duplicates} twice), appends"
            f" {appends.acknowledged} acknowledged ({appends.records} records read)"
        )
        for name, check in (("letters", letters), ("requests", requests)):
            self.assertGreater(check.acknowledged, 0, f"{what}: no {name} acknowledged")
            self.assertEqual(
                (check.missing[:10], len(check.missing), check.bad_duplicates[:10]),
                ([], 0, []),
                f"{what}: {name} acknowledged and not delivered, or delivered twice:"
                f" {summary}\n{self.logs()}",
            )
            self.assertEqual(check.unexpected, [], f"{what}: {name} never sent")
        self.assertGreater(appends.acknowledged, 0, f"{what}: no appends acknowledged")
        self.assertEqual(
            (appends.missing[:10], len(appends.missing), appends.reused[:10]),
            ([], 0, []),
            f"{what}: appended records lost, moved or numbered twice: {summary}\n{self.logs()}",
        )
        self.assertEqual(appends.written_twice, [], f"{what}: appends written twice")
        return summary

    def assertServedBy(self, records: Sequence[Record], endpoint: str, after: int = 0) -> None:
        """Every acknowledgement from the C{after}th record on came through C{endpoint}."""
        elsewhere = [
            r for r in records[after:] if ("id" in r or "first" in r) and r["at"] != endpoint
        ]
        self.assertEqual(elsewhere[:5], [], f"acknowledged elsewhere than {endpoint}")


class PairFailoverTests(PairSystemCase):
    """The active dies; the passive takes over; the old one comes back."""

    PREFIXES: ClassVar[dict[str, str]] = {
        "test_killActiveUnderLoad": "mpp1",
        "test_oldActiveRejoinsAndServes": "mpp2",
    }

    def test_killActiveUnderLoad(self) -> None:
        """
        Clients on h3 with both endpoints send letters (sendto, STORED
        200), service requests (sendfor, STORED 200) and idempotent appends
        (STREAM_APPENDED) to the active h1, which is SIGKILLed mid-load:
        h2 takes over on the clients' first request, the clients fail over
        and go on there; afterwards every letter and request acknowledged
        (before or after the kill) is delivered by h2 (twice only if sent
        again without a STORED), every acknowledged appended record is
        read back from h2 at its sequence number, and no sequence number
        was given twice; what h2 numbered itself (appends, letter and
        request ids) comes after everything h1 handed out.
        """
        self.start_pair()
        load = self.load(self.both)
        self.wait_acknowledged(load.jobs, 30, 30.0)
        self.broker(1).kill()
        killed = monotonic()
        numbered = max(r["last"] for r in load.append.lines() if "first" in r)
        took = self.wait_logs([(2, TAKING_OVER), (2, ACTIVE)], 20.0, "h2 did not take over")
        self.wait_acknowledged(load.jobs, 30, 30.0)
        resumed = monotonic() - killed
        mail, service, append = load.finish()
        # Appends h2 wrote itself are numbered past anything h1 handed out.
        on_h2 = [r for r in append if r.get("at") == self.endpoint(2) and r.get("dup") is False]
        self.assertTrue(on_h2, "no append acknowledged by h2")
        self.assertGreater(min(r["first"] for r in on_h2), numbered)
        # So are the letters and requests it stored.
        stored = [r for r in mail + service if "id" in r]
        ids = {i: [r["id"] for r in stored if r["at"] == self.endpoint(i)] for i in (1, 2)}
        self.assertTrue(ids[2], "no letter stored by h2")
        self.assertGreater(min(ids[2]), max(ids[1]), "h2 reused letter ids of h1's")
        summary = self.verify([self.endpoint(2)], mail, service, append, "kill -9 of the active")
        print(
            f"\n{summary}; h2 active {took:.1f}s after the kill,"
            f" clients going again within {resumed:.1f}s"
        )

    def test_oldActiveRejoinsAndServes(self) -> None:
        """
        After h1 (the active) is SIGKILLed under load and h2 took over,
        h1 restarts on its data directory while the load goes on: it
        becomes passive (never active) and catches up ("pair: caught up
        with the active"; h2 logs its partner in sync). Then h2 is
        SIGKILLed too: h1 takes over and delivers every letter and request
        acknowledged since the start (by h1 before, by h2, and after),
        and every acknowledged appended record reads back at its number.
        """
        self.start_pair()
        load = self.load(self.both)
        self.wait_acknowledged(load.jobs, 30, 30.0)
        self.broker(1).kill()
        self.wait_logs([(2, TAKING_OVER), (2, ACTIVE)], 20.0, "h2 did not take over")
        self.wait_acknowledged(load.jobs, 20, 30.0)
        self.broker(1).start(timeout=30.0)
        self.wait_logs([(1, PASSIVE), (1, CAUGHT_UP), (2, IN_SYNC)], 30.0, "h1 did not catch up")
        self.wait_acknowledged(load.jobs, 20, 30.0)
        self.assertNotIn(ACTIVE, self.broker(1).run_log(), "the restarted h1 went active")
        self.broker(2).kill()
        self.wait_logs([(1, TAKING_OVER), (1, ACTIVE)], 20.0, "h1 did not take over again")
        self.wait_acknowledged(load.jobs, 20, 30.0)
        mail, service, append = load.finish()
        summary = self.verify(
            [self.endpoint(1)], mail, service, append, "the rejoined h1 after h2's kill"
        )
        print(f"\n{summary}")


class PairPartitionTests(PairSystemCase):
    """
    The active is cut off from its partner (the pair link), or paused:
    nothing is acknowledged alone, the clients make the passive take over,
    and the old active yields to it.
    """

    PREFIXES: ClassVar[dict[str, str]] = {
        "test_pairLinkCut": "mpp3",
        "test_activePaused": "mpp7",
    }

    def yielded(self, index: int, timeout: float) -> str:
        """
        Wait for broker C{hINDEX} to yield and exit with EXIT_YIELDED; start
        it again (it comes back passive). What it logged before it exited.
        """
        broker = self.broker(index)
        deadline = monotonic() + timeout
        while broker.alive() and monotonic() < deadline:
            sleep(0.05)
        self.assertFalse(broker.alive(), f"h{index} did not yield\n{self.logs()}")
        assert broker.process is not None
        self.assertEqual(broker.process.returncode, EXIT_YIELDED, self.logs())
        log = broker.run_log()
        self.assertIn(YIELDS, log)
        broker.start(timeout=30.0)
        broker.wait_log(PASSIVE, 30.0)
        return log

    def test_pairLinkCut(self) -> None:
        """
        With clients (both endpoints) on the active h1, h1's port of the
        pair LAN goes down: both log the partner silent, and h1
        acknowledges nothing h2 does not have (its clients wait, then turn
        to h2); h2, in sync, takes over and serves them. Healed, h1 hears
        the newer active and yields (exit 75); started again it comes back
        passive and catches up. h2 delivers everything acknowledged, before
        the cut and after.
        """
        self.start_pair()
        load = self.load(self.both)
        self.wait_acknowledged(load.jobs, 20, 30.0)
        self.pair_lan.unplug(1)
        cut = monotonic()
        self.wait_logs([(1, SILENT), (2, SILENT)], 10.0, "neither broker saw the cut")
        self.wait_logs([(2, TAKING_OVER), (2, ACTIVE)], 60.0, "h2 did not take over")
        self.wait_acknowledged(load.jobs, 20, 30.0)
        self.pair_lan.plug(1)
        self.assertNotIn(ALONE, self.yielded(1, 30.0), "h1 went on alone behind the cut")
        self.wait_logs([(1, CAUGHT_UP)], 60.0, "h1 did not catch up after yielding")
        self.wait_acknowledged(load.jobs, 10, 30.0)
        mail, service, append = load.finish()
        # What h1 acknowledged after the cut (in flight then) came before
        # it could know: nothing later.
        late = [
            r
            for r in mail + service + append
            if ("id" in r or "first" in r)
            and r.get("at") == self.endpoint(1)
            and r.get("t", 0.0) > cut + 1.0
        ]
        self.assertEqual(late[:5], [], "h1 acknowledged without its partner after the cut")
        summary = self.verify([self.endpoint(2)], mail, service, append, "after the cut")
        print(f"\n{summary}")

    def test_activePaused(self) -> None:
        """
        The active h1 is paused (SIGSTOP) under load for longer than the
        clients' timeout: they turn to h2, which takes over. h1 resumed
        (SIGCONT) does not take its partner for gone, hears the newer active
        and yields (exit 75), acknowledging nothing it held; started again
        it comes back passive and catches up. h2 delivers everything
        acknowledged.
        """
        self.start_pair()
        load = self.load(self.both)
        self.wait_acknowledged(load.jobs, 20, 30.0)
        h1 = self.broker(1)
        assert h1.process is not None
        h1.process.send_signal(signal.SIGSTOP)
        try:
            self.wait_logs([(2, TAKING_OVER), (2, ACTIVE)], 60.0, "h2 did not take over")
            self.wait_acknowledged(load.jobs, 20, 30.0)
        finally:
            h1.process.send_signal(signal.SIGCONT)
        self.assertNotIn(ALONE, self.yielded(1, 30.0), "h1 went on alone after its pause")
        self.wait_logs([(1, CAUGHT_UP)], 60.0, "h1 did not catch up after yielding")
        self.wait_acknowledged(load.jobs, 10, 30.0)
        mail, service, append = load.finish()
        summary = self.verify([self.endpoint(2)], mail, service, append, "after the pause")
        print(f"\n{summary}")


class PairPassiveRestartTests(PairSystemCase):
    """The passive dies and comes back while the active serves."""

    PREFIXES: ClassVar[dict[str, str]] = {"test_passiveRestartsUnderLoad": "mpp4"}

    def test_passiveRestartsUnderLoad(self) -> None:
        """
        Under load on h1, the passive h2 is SIGKILLed: h1 goes on alone
        (the clients never move); h2 restarts on its data directory,
        becomes passive and catches up while the load goes on. Then h1 is
        SIGKILLed: h2 delivers every letter and request acknowledged,
        including those acknowledged while it was down, and reads back
        every acknowledged appended record at its number.
        """
        self.start_pair()
        load = self.load(self.both)
        self.wait_acknowledged(load.jobs, 20, 30.0)
        self.broker(2).kill()
        killed = monotonic()
        self.wait_logs([(1, SILENT)], 10.0, "h1 did not see h2 go")
        self.wait_acknowledged(load.jobs, 30, 30.0)
        self.broker(2).start(timeout=30.0)
        self.wait_logs([(2, PASSIVE), (2, CAUGHT_UP), (1, IN_SYNC, 2)], 30.0, "h2 did not catch up")
        self.wait_acknowledged(load.jobs, 20, 30.0)
        mail, service, append = load.finish()
        for records in (mail, service, append):
            moved = [r for r in records if "error" in r or r.get("moved")]
            self.assertEqual(moved[:5], [], "a client failed or moved while h1 served")
        stalls = [round(longest_wait(records, killed), 2) for records in (mail, service, append)]
        self.assertLess(max(stalls), STALL, "the active kept its clients waiting")
        # The report after h1's kill: until then h2 refuses a client (503),
        # h1 may be alive. Not an earlier one: h2 restarting may find h1,
        # busy with the load, slow to answer at first.
        silent = self.broker(2).run_log().count(SILENT)
        self.broker(1).kill()
        self.wait_logs([(2, SILENT, silent + 1)], 10.0, "h2 did not see h1 go")
        summary = self.verify([self.endpoint(2)], mail, service, append, "the restarted passive")
        print(f"\n{summary}; longest waits after the passive's kill: {stalls}")


class PairFloatingAddressTests(PairSystemCase):
    """Unchanged clients with one endpoint: a floating address moves to the new active."""

    PREFIXES: ClassVar[dict[str, str]] = {"test_floatingAddress": "mpp5"}
    FLOATING = f"{CLIENT_SUBNET}.100"

    def move_address(self, source: int | None, target: int) -> str:
        """
        Move the floating address from host C{hSOURCE} (if any) to
        C{hTARGET}, as keepalived would, and make h3 find its new place:
        a gratuitous ARP from the target if C{arping} exists, else h3's
        neighbour entry for it flushed. How h3 was told.
        """
        hosts = self.lan.hosts
        cidr = f"{self.FLOATING}/24"
        if source is not None:
            old = hosts[source - 1]
            old.run(["ip", "address", "del", cidr, "dev", old.interface], check=True)
        new = hosts[target - 1]
        new.run(["ip", "address", "add", cidr, "dev", new.interface], check=True)
        if source is None:
            return "added"
        if shutil.which("arping") is not None:
            sent = new.run(["arping", "-U", "-c", "2", "-I", new.interface, self.FLOATING])
            if sent.returncode == 0:
                return "gratuitous ARP"
        hosts[2].run(["ip", "neigh", "flush", "to", self.FLOATING], check=True)
        return "h3's neighbour cache flushed"

    def test_floatingAddress(self) -> None:
        """
        Both brokers bind every address (tcp://*:9999); the floating
        address is on the active h1's interface and the clients on h3
        know it alone (one endpoint: a letter sender and an appender, as
        an unchanged libmlm program would be). h1 is SIGKILLed and the
        address moved to h2: the clients reconnect to the same endpoint,
        h2 takes over on their first request and serves them; every
        letter acknowledged, before or after, is delivered from there and
        every acknowledged appended record reads back at its number.
        """
        self.start_pair()
        self.move_address(None, 1)
        floating = f"tcp://{self.FLOATING}:{PORT}"
        mail = self.client(
            "mail", kind="mail", endpoints=[floating], address="sender", to=MAILBOX, prefix="m-"
        )
        append = self.client(
            "append", kind="append", endpoints=[floating], stream=STREAM, prefix="k-",
            records=RECORDS,
        )  # fmt: skip
        self.wait_acknowledged([mail, append], 30, 30.0)
        self.broker(1).kill()
        told = self.move_address(1, 2)
        killed = monotonic()
        self.wait_logs([(2, TAKING_OVER), (2, ACTIVE)], 30.0, "h2 did not take over")
        self.wait_acknowledged([mail, append], 30, 30.0)
        resumed = monotonic() - killed
        for job in (mail, append):
            job.stop()
        sent: list[Record] = mail.records(60.0)
        appended: list[Record] = append.records(60.0)
        box = self.receive([floating], MAILBOX, [r["s"] for r in sent if "id" in r])
        letters = check_letters(sent, box)
        appends = check_appends(appended, self.read_stream([floating], STREAM))
        summary: dict[str, Any] = {
            "letters": letters.acknowledged,
            "unknown": letters.unknown,
            "twice": letters.duplicates,
            "appends": appends.acknowledged,
        }
        self.assertEqual(
            (letters.missing[:10], len(letters.missing), letters.bad_duplicates[:10]),
            ([], 0, []),
            f"{summary}\n{self.logs()}",
        )
        self.assertEqual(
            (appends.missing[:10], len(appends.missing), appends.reused, appends.written_twice),
            ([], 0, [], []),
            f"{summary}\n{self.logs()}",
        )
        print(f"\nfloating address ({told}): {summary}, going again within {resumed:.1f}s")


# The stranger of tests/system/test_system_pair_curve.py: for two seconds, forged
# pair messages (the primary restarted, SHIPs, the primary active).
STRANGER = "from tests.system.test_system_pair_curve import stranger_main; stranger_main()"
# What a backup that yields logs (malamute_pack/pair/service.py), and its
# watchdog if the process outlives the stop.
YIELDS = f"stops serving now and exits (status {EXIT_YIELDED})"
WATCHDOG = "has not exited"
CLEAN_EXIT = "Main loop terminated."


class PairSecondActiveTests(PairSystemCase):
    """The passive is made a second active: it stops itself, and the process ends."""

    PREFIXES: ClassVar[dict[str, str]] = {"test_strangerMakesBackupStopItself": "mpp6"}

    def test_strangerMakesBackupStopItself(self) -> None:
        """
        A stranger on h1 (not its broker) sends h2, the passive backup,
        forged pair messages at its open --pair-bind: h2 takes over, hears
        an active primary and stops itself, its takeover under way. The
        process exits by itself with status EXIT_YIELDED, its main loop
        terminated and before its watchdog had to end it (a broker process
        that lingered there, its journal's reader thread left running,
        ignored SIGTERM); h1 goes on. While h2 is down, h1 takes 50,000
        appended records; h2 restarted on its data directory comes back
        passive, and SIGTERMed in the middle of that catch-up stops cleanly;
        started again it catches up.
        """
        self.start_pair()
        backup = self.broker(2)
        job = {
            "endpoint": f"tcp://{PAIR_SUBNET}.2:{PAIR_PORT}",
            "server_key": zmq.curve_keypair()[0].decode("ascii"),  # no broker's
        }
        stranger = subprocess.Popen(
            python_command(self.lan.hosts[0].name, "-c", STRANGER, json.dumps(job)),
            env=checkout_environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.addCleanup(stranger.wait)
        self.addCleanup(stranger.kill)
        started = monotonic()
        yielded: float | None = None
        while backup.alive() and monotonic() - started < 30.0:
            if yielded is None and YIELDS in backup.run_log():
                yielded = monotonic()
            sleep(0.02)
        log = backup.run_log()
        self.assertFalse(backup.alive(), f"h2 did not exit after stopping itself\n{self.logs()}")
        assert backup.process is not None
        exited = monotonic()
        took = exited - (exited if yielded is None else yielded)  # None: gone within a poll
        self.assertEqual(backup.process.returncode, EXIT_YIELDED, self.logs())
        self.assertIn(YIELDS, log)
        self.assertIn(CLEAN_EXIT, log)
        self.assertNotIn(WATCHDOG, log)
        self.assertLess(took, EXIT_GRACE_S)
        self.assertTrue(self.broker(1).alive())
        self.assertNotIn("stops serving", self.broker(1).run_log())
        # h1 alone takes what h2 must catch up.
        fill = self.client(
            "fill", kind="append", endpoints=[self.endpoint(1)], stream="fill", prefix="f-",
            records=1000, count=50,
        )  # fmt: skip
        self.assertEqual(len([r for r in fill.records(120.0) if "first" in r]), 50)
        backup.start(timeout=30.0)
        backup.wait_log(PASSIVE, 30.0)
        midway = CAUGHT_UP not in backup.run_log()
        backup.stop(timeout=20.0)  # SIGTERM: raises unless it stopped cleanly
        in_sync = self.broker(1).run_log().count(IN_SYNC)
        backup.start(timeout=30.0)
        self.wait_logs([(2, CAUGHT_UP), (1, IN_SYNC, in_sync + 1)], 60.0, "h2 did not catch up")
        self.assertNotIn(ACTIVE, backup.run_log(), "the restarted h2 went active")
        print(
            f"\nh2 exited {took:.2f}s after it stopped itself;"
            f" SIGTERM {'in the middle of' if midway else 'after'} its catch-up: stopped cleanly"
        )
