"""
Tests for L{malamute_pack.bench}: the figures a scenario's reports make, the
journal comparison, which scenarios run on which broker, each load role
against a scripted broker side on real sockets; and, as slow system tests,
short real runs of ``python -m malamute_pack.bench`` (broker processes and
load processes). The broker process itself is tested in
``tests/system/test_testing_brokerprocess.py``.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import re
import subprocess
import sys
from pathlib import Path

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.bench import load
from malamute_pack.bench.__main__ import parse
from malamute_pack.bench.scenarios import (
    CONSUMER_SCENARIOS,
    DEFAULT_SCENARIOS,
    SCENARIOS,
    BenchError,
    BrokerRun,
    Result,
    journal_cost_lines,
    plan,
    run,
)
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import (
    PROJECT_ROOT,
    BrokerProcess,
    fresh_ipc_endpoint,
)
from tests.support import skip_slow

COMMON = ["scenario", "journal", "n", "secs", "msgs_per_s", "lost"]
KEYS = {
    "stream_1to1": COMMON,
    "stream_fanout10": [*COMMON, "delivered_per_s"],
    "mailbox": COMMON,
    "mailbox_durable": [*COMMON, "acked"],
    "service_rr": [*COMMON, "avg_rtt_us", "p50_us", "p99_us", "p999_us", "max_us"],
}
COMPARED = ["stream_1to1", "stream_fanout10", "mailbox"]
COST_KEYS = ["scenario", "on_msgs_per_s", "off_msgs_per_s", "ratio"]


def _bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "malamute_pack.bench", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _fields(line: str) -> list[tuple[str, str]]:
    return [tuple(token.split("=", 1)) for token in line.split()]  # type: ignore[misc]


def _names(runs: list[BrokerRun]) -> list[tuple[bool | None, list[str]]]:
    return [(run.journal, [s.name for s in run.scenarios]) for run in runs]


class FiguresTests(SynchronousTestCase):
    def test_fanoutFigures(self) -> None:
        """
        Time runs from the earliest send to the latest counted receipt; lost
        is n per counting role minus what they counted; the fan-out line
        adds deliveries per second.
        """
        scenario = SCENARIOS["stream_fanout10"]
        reports = [load.Report(received=100, last_receipt=12.0) for _ in range(10)]
        reports[3] = load.Report(received=90, last_receipt=11.0)
        reports.append(load.Report(sent=100, first_send=10.0))
        line = Result(scenario, 100, tuple(reports)).line()
        self.assertEqual(
            line,
            "scenario=stream_fanout10 n=100 secs=2.000 msgs_per_s=50 lost=10 delivered_per_s=495",
        )

    def test_roundTripFigures(self) -> None:
        """
        The service line gives round trips per second, the mean round trip
        and the percentiles of the round trips, in microseconds.
        """
        scenario = SCENARIOS["service_rr"]
        rtts = [0.0003, 0.0004, 0.0005, 0.0008]
        reports = (
            load.Report(sent=4),
            load.Report(
                sent=4,
                received=4,
                first_send=1.0,
                last_receipt=3.0,
                rtt_total=sum(rtts),
                samples=rtts,
            ),
        )
        self.assertEqual(
            Result(scenario, 4, reports).line(),
            "scenario=service_rr n=4 secs=2.000 msgs_per_s=2 lost=0 avg_rtt_us=500.0 "
            "p50_us=400 p99_us=800 p999_us=800 max_us=800",
        )

    def test_brokerKey(self) -> None:
        """In a comparison a line names its broker, after the scenario and before the journal."""
        scenario = SCENARIOS["mailbox"]
        reports = (
            load.Report(received=5, last_receipt=2.0),
            load.Report(sent=5, first_send=1.0),
        )
        self.assertEqual(
            Result(scenario, 5, reports, journal=True, broker="ours").line(),
            "scenario=mailbox broker=ours journal=on n=5 secs=1.000 msgs_per_s=5 lost=0",
        )

    def test_sharedFigures(self) -> None:
        """A group's members share the messages: n deliveries in all, none lost."""
        scenario = SCENARIOS["stream_group3"]
        reports = [load.Report(received=r, last_receipt=2.0) for r in (4, 3, 3)]
        reports.append(load.Report(sent=10, first_send=0.0))
        figures = Result(scenario, 10, tuple(reports), journal=True).figures()
        self.assertEqual((figures["lost"], figures["delivered_per_s"]), ("0", "5"))

    def test_nothingReceived(self) -> None:
        """With no receipt at all there is no duration: rates are 0 and all is lost."""
        scenario = SCENARIOS["mailbox"]
        reports = (load.Report(), load.Report(sent=5, first_send=1.0))
        self.assertEqual(
            Result(scenario, 5, reports).line(),
            "scenario=mailbox n=5 secs=0.000 msgs_per_s=0 lost=5",
        )

    def test_durableFigures(self) -> None:
        """
        The durable mailbox's rate is STORED 200s per second, its time runs
        to the last acknowledgement when that comes after the last delivery,
        a letter not acknowledged with 200 is not acked, and one the
        receiver never got is lost.
        """
        scenario = SCENARIOS["mailbox_durable"]
        reports = (
            load.Report(received=9, last_receipt=3.0),
            load.Report(sent=10, acked=8, first_send=1.0, last_ack=5.0),
        )
        self.assertEqual(
            Result(scenario, 10, reports, journal=True).line(),
            "scenario=mailbox_durable journal=on n=10 secs=4.000 msgs_per_s=2 lost=1 acked=8",
        )

    def test_journalKey(self) -> None:
        """A line says whether its broker journaled, right after the scenario's name."""
        scenario = SCENARIOS["mailbox"]
        reports = (
            load.Report(received=5, last_receipt=2.0),
            load.Report(sent=5, first_send=1.0),
        )
        self.assertEqual(
            Result(scenario, 5, reports, journal=False).line(),
            "scenario=mailbox journal=off n=5 secs=1.000 msgs_per_s=5 lost=0",
        )


def _mailbox_result(rate: int, journal: bool | None) -> Result:
    """A mailbox result of C{rate} messages in one second."""
    reports = (
        load.Report(received=rate, last_receipt=2.0),
        load.Report(sent=rate, first_send=1.0),
    )
    return Result(SCENARIOS["mailbox"], rate, reports, journal)


class JournalCostTests(SynchronousTestCase):
    def test_ratioOfOnToOff(self) -> None:
        """A scenario that ran with and without the journal gets one line: on over off."""
        results = [_mailbox_result(400, False), _mailbox_result(300, True)]
        self.assertEqual(
            journal_cost_lines(results),
            ["journal_cost scenario=mailbox on_msgs_per_s=300 off_msgs_per_s=400 ratio=0.75"],
        )

    def test_onlyScenariosRunBothWays(self) -> None:
        """A scenario that ran once, or against a broker of unknown kind, gets no line."""
        results = [_mailbox_result(300, True), _mailbox_result(200, None)]
        self.assertEqual(journal_cost_lines(results), [])

    def test_nothingWithoutTheJournal(self) -> None:
        """A journal-off run that measured nothing gives ratio 0, not a division error."""
        results = [_mailbox_result(0, False), _mailbox_result(300, True)]
        self.assertEqual(
            journal_cost_lines(results),
            ["journal_cost scenario=mailbox on_msgs_per_s=300 off_msgs_per_s=0 ratio=0"],
        )


class PlanTests(SynchronousTestCase):
    def test_both(self) -> None:
        """
        Comparing, the journal-off broker plays the compared scenarios first,
        then the journal-on broker plays every scenario.
        """
        self.assertEqual(
            _names(plan(list(SCENARIOS), "both")),
            [(False, COMPARED), (True, list(SCENARIOS))],
        )

    def test_bothWithNothingToCompare(self) -> None:
        """No journal-off broker is started when no chosen scenario is compared."""
        self.assertEqual(
            _names(plan(["service_rr", "mailbox_durable"], "both")),
            [(True, ["service_rr", "mailbox_durable"])],
        )

    def test_on(self) -> None:
        """With the journal only, one broker plays everything."""
        self.assertEqual(_names(plan(list(SCENARIOS), "on")), [(True, list(SCENARIOS))])

    def test_off(self) -> None:
        """Without the journal only, one broker plays all but what needs the journal."""
        self.assertEqual(
            _names(plan(list(SCENARIOS), "off")),
            [(False, [*COMPARED, "service_rr", "latency", "scale"])],
        )

    def test_defaultScenarios(self) -> None:
        """
        Without --scenario, all run but latency, scale and the consumers',
        which run only when named.
        """
        self.assertEqual(list(DEFAULT_SCENARIOS), list(KEYS))
        self.assertEqual(
            set(SCENARIOS) - set(DEFAULT_SCENARIOS), {"latency", "scale", *CONSUMER_SCENARIOS}
        )

    def test_external(self) -> None:
        """A broker the harness did not start plays every scenario once."""
        self.assertEqual(_names(plan(list(SCENARIOS), None)), [(None, list(SCENARIOS))])


class RunGuardTests(SynchronousTestCase):
    def test_notPlayedByTheRunner(self) -> None:
        """
        The runner refuses scale (its own module plays it) and latency
        without a rate, before it starts any process.
        """
        context = multiprocessing.get_context("spawn")
        for name, job in (("scale", load.Job(10)), ("latency", load.Job(10, rate=0))):
            self.assertRaises(BenchError, run, SCENARIOS[name], "ipc://@/nowhere", job, context)


class OptionsTests(SynchronousTestCase):
    def _refused(self, *argv: str) -> str:
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors):
            self.assertRaises(SystemExit, parse, list(argv))
        return errors.getvalue()

    def test_durableNeedsTheJournal(self) -> None:
        """Asking for mailbox_durable without the journal is a usage error."""
        self.assertIn(
            "mailbox_durable needs the journal",
            self._refused("--journal", "off", "--scenario", "mailbox_durable"),
        )

    def test_journalNeedsOwnBroker(self) -> None:
        """--journal says which brokers to start, so it cannot go with --endpoint."""
        self.assertIn(
            "--journal needs a broker this command starts",
            self._refused("--journal", "on", "--endpoint", "ipc://@/x"),
        )

    def test_windowAtLeastOne(self) -> None:
        """A durable sender's window must let at least one letter out."""
        self.assertIn("--window must be at least 1", self._refused("--window", "0"))

    def test_compareOptions(self) -> None:
        """
        --compare starts one broker of ours (so not with --endpoint nor
        --journal both); --rounds goes with it and is at least 1.
        """
        self.assertIn("drop --endpoint", self._refused("--compare", "ipc://@/a", "--endpoint", "x"))
        self.assertIn(
            "--journal on or off", self._refused("--compare", "ipc://@/a", "--journal", "both")
        )
        self.assertIn("--rounds needs --compare", self._refused("--rounds", "2"))
        self.assertIn(
            "--rounds must be at least 1", self._refused("--compare", "ipc://@/a", "--rounds", "0")
        )
        args = parse(["--compare", "ipc://@/a", "--journal", "off", "--rounds", "5"])
        self.assertEqual((args.compare, args.journal, args.rounds), ("ipc://@/a", "off", 5))

    def test_rates(self) -> None:
        """--rates is a comma-separated list of positive rates, 1k, 10k and 50k by default."""
        self.assertEqual(parse([]).rates, (1000, 10_000, 50_000))
        self.assertEqual(parse(["--rates", "200,3000"]).rates, (200, 3000))
        self.assertIn("at least 1 msg/s", self._refused("--rates", "100,0"))
        self.assertIn("not a list of whole numbers", self._refused("--rates", "1k"))

    def test_scaleNeedsThePid(self) -> None:
        """
        Against an external broker scale needs its --broker-pid, and that
        option means nothing without an external broker.
        """
        self.assertIn(
            "--broker-pid",
            self._refused("--endpoint", "ipc://@/a", "--scenario", "scale"),
        )
        self.assertIn("give --endpoint or --compare", self._refused("--broker-pid", "1"))
        args = parse(["--endpoint", "ipc://@/a", "--scenario", "scale", "--broker-pid", "7"])
        self.assertEqual((args.broker_pid, args.clients, args.subscriptions), (7, 10_000, 100_000))

    def test_silentIdle(self) -> None:
        """
        --silent-idle keeps scale's idle clients from pinging an external
        broker (they ping one by default); the bench's own are never pinged.
        """
        self.assertFalse(parse(["--endpoint", "ipc://@/a"]).silent_idle)
        self.assertTrue(parse(["--endpoint", "ipc://@/a", "--silent-idle"]).silent_idle)
        self.assertTrue(
            parse(["--compare", "ipc://@/a", "--journal", "on", "--silent-idle"]).silent_idle
        )
        self.assertIn("external broker", self._refused("--silent-idle"))


class BrokerSide:
    """
    A ROUTER socket that plays the broker's side for one load link: it
    sends the link whatever a test scripts, and gives back, decoded, what
    the link sent.
    """

    def __init__(self, case: SynchronousTestCase) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        case.addCleanup(self.context.term)
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        case.addCleanup(self.router.close)
        self.endpoint = fresh_ipc_endpoint("bench-test")
        self.router.bind(self.endpoint)
        self.link = load.Link(self.endpoint, ping_interval=60.0)
        # Cleanups run last first: the socket closes before its context ends.
        case.addCleanup(self.link.context.term)
        case.addCleanup(self.link.socket.close, 0)
        # The link's first message tells the ROUTER its routing id.
        self.link.socket.send_multipart(mlm.encode(mlm.ConnectionPing()))
        self.route = self.router.recv_multipart()[0]

    def send(self, *messages: mlm.Message) -> None:
        for message in messages:
            self.router.send_multipart([self.route, *mlm.encode(message)])

    def received(self) -> list[mlm.Message]:
        """What the link has sent since, decoded."""
        got = []
        while self.router.poll(200):
            got.append(mlm.decode(self.router.recv_multipart()[1:]))
        return got


class LoadTests(SynchronousTestCase):
    """Each role's work against a scripted broker side on real sockets."""

    def test_countAnswersRecordsWithDone(self) -> None:
        """
        A receiver that answers DONE counts the records of its kind and
        answers each with DONE(id, 200, ""), whatever the id's size,
        skipping other messages.
        """
        side = BrokerSide(self)
        ids = [1, 2**40 + 3, 2**64 - 1]
        side.send(mlm.MailboxRecord(ids[0], "tx", "rx", "s", "", [b"a"]), mlm.ConnectionPong())
        side.send(*(mlm.MailboxRecord(i, "tx", "rx", "s", "t", []) for i in ids[1:]))
        role = load.Role("rx", load.count, counts=mlm.MailboxRecord.ID, version=2, done=True)
        report = load.count(side.link, role, load.Job(3, idle=5.0))
        self.assertEqual((report.received, report.last_receipt is not None), (3, True))
        self.assertEqual(side.received(), [mlm.Done(i, mlm.SUCCESS, "") for i in ids])

    def test_countCommitsAsAConsumer(self) -> None:
        """
        A consumer commits every C{commit_every} records counted, and the
        last one at the end, each by its stream and sequence number.
        """
        side = BrokerSide(self)
        side.send(*(mlm.StreamRecord("s", "w", "t", seq, 0, [b"x"]) for seq in range(1, 6)))
        role = load.Role("c", load.count, counts=mlm.StreamRecord.ID, version=2, commit_every=2)
        report = load.count(side.link, role, load.Job(5, idle=5.0))
        self.assertEqual(report.received, 5)
        self.assertEqual(
            side.received(),
            [mlm.StreamCommit("s", 2), mlm.StreamCommit("s", 4), mlm.StreamCommit("s", 5)],
        )

    def test_countOnlyCounts(self) -> None:
        """
        A receiver without DONE counts deliveries of its kind only, sends
        nothing back, and gives up after its idle time with what it has.
        """
        side = BrokerSide(self)
        deliver = mlm.StreamDeliver("s", "w", "subject", [b"x"])
        side.send(deliver, mlm.MailboxDeliver("a", "b", "c", "", []), deliver)
        role = load.Role("reader", load.count, counts=mlm.StreamDeliver.ID)
        report = load.count(side.link, role, load.Job(3, idle=0.3))
        self.assertEqual(report.received, 2)
        self.assertEqual(side.received(), [])

    def test_postCountsStored200(self) -> None:
        """
        A durable sender sends its letter n times and counts as acked the
        STOREDs with status 200 only; a PONG is not an answer.
        """
        side = BrokerSide(self)
        letter = mlm.MailboxSend("rx", "s", "", 0, [b"payload"])
        side.send(
            mlm.Stored(1, "", mlm.SUCCESS, ""),
            mlm.ConnectionPong(),
            mlm.Stored(0, "", mlm.FAILED, "mailbox full"),
            mlm.Stored(2, "", mlm.SUCCESS, ""),
        )
        role = load.Role("tx", load.post, frames=tuple(mlm.encode(letter)), version=2)
        report = load.post(side.link, role, load.Job(3, idle=5.0, window=3))
        self.assertEqual((report.sent, report.acked), (3, 2))
        self.assertIsNotNone(report.last_ack)
        self.assertEqual(side.received(), [letter] * 3)

    def test_serveAnswersEachRequester(self) -> None:
        """
        A worker answers each SERVICE_DELIVER with a MAILBOX_SEND "echo" to
        its sender, carrying the request's content; other messages are
        skipped.
        """
        side = BrokerSide(self)
        side.send(
            mlm.ServiceDeliver("req-a", "echo", "s", "", [b"1"]),
            mlm.Ok(),
            mlm.ServiceDeliver("req-\u00e9", "echo", "s", "", [b"2", b"3"]),
            mlm.ServiceDeliver("req-a", "echo", "s", "", []),
        )
        report = load.serve(side.link, load.Role("worker", load.serve), load.Job(3, idle=5.0))
        self.assertEqual(report.sent, 3)
        self.assertEqual(
            side.received(),
            [
                mlm.MailboxSend("req-a", "echo", "", 0, [b"1"]),
                mlm.MailboxSend("req-\u00e9", "echo", "", 0, [b"2", b"3"]),
                mlm.MailboxSend("req-a", "echo", "", 0, []),
            ],
        )

    def test_requestRoundTrips(self) -> None:
        """
        A requester sends its request once a round trip and counts a round
        trip when a delivery of its kind arrives, skipping anything else;
        it keeps each round trip's seconds, which sum to its total.
        """
        side = BrokerSide(self)
        side.send(
            mlm.ConnectionPong(),
            mlm.MailboxDeliver("worker", "req", "echo", "", []),
            mlm.MailboxDeliver("worker", "req", "echo", "", []),
        )
        request = mlm.ServiceSend("echo", "s", "", 0, [b"q"])
        role = load.Role(
            "req", load.request, frames=tuple(mlm.encode(request)), counts=mlm.MailboxDeliver.ID
        )
        report = load.request(side.link, role, load.Job(2, idle=2.0))
        self.assertEqual((report.sent, report.received), (2, 2))
        self.assertGreater(report.rtt_total, 0)
        self.assertEqual(len(report.samples), 2)
        self.assertEqual(sum(report.samples), report.rtt_total)
        self.assertEqual(side.received(), [request] * 2)


class BenchCommandTests(SynchronousTestCase):
    skip = skip_slow

    def _assertLine(self, line: str, journal: str | None) -> None:
        fields = _fields(line)
        keys = KEYS[fields[0][1]]
        if journal is None:
            keys = [k for k in keys if k != "journal"]
        self.assertEqual([k for k, _ in fields], keys, line)
        values = dict(fields)
        if journal is not None:
            self.assertEqual(values["journal"], journal, line)
        self.assertEqual(values["n"], "2000", line)
        self.assertEqual(values["lost"], "0", line)
        self.assertGreater(float(values["secs"]), 0, line)
        self.assertGreater(float(values["msgs_per_s"]), 0, line)
        if "acked" in values:
            self.assertEqual(values["acked"], "2000", line)

    def test_everyScenarioPrintsItsLine(self) -> None:
        """
        A default run with 2000 messages plays the compared scenarios
        against a journal-off broker, then every scenario against a
        journal-on broker, each line with exactly its scenario's keys and
        nothing lost (the durable sender's letters all acknowledged), then a
        journal_cost line per compared scenario; it exits 0, which includes
        both broker processes shutting down cleanly on SIGTERM.
        """
        result = _bench("--messages", "2000")
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        expected = [("off", name) for name in COMPARED] + [("on", name) for name in KEYS]
        scenario_lines = lines[: len(expected)]
        self.assertEqual(
            [(dict(_fields(line)).get("journal"), _fields(line)[0][1]) for line in scenario_lines],
            expected,
            result.stdout,
        )
        for (journal, _), line in zip(expected, scenario_lines, strict=True):
            self._assertLine(line, journal)
        costs = lines[len(expected) :]
        self.assertEqual([line.split()[0] for line in costs], ["journal_cost"] * len(COMPARED))
        self.assertEqual([dict(_fields(line)[1:])["scenario"] for line in costs], COMPARED)
        for line in costs:
            fields = _fields(line)[1:]
            self.assertEqual([k for k, _ in fields], COST_KEYS, line)
            values = dict(fields)
            self.assertGreater(float(values["on_msgs_per_s"]), 0, line)
            self.assertGreater(float(values["off_msgs_per_s"]), 0, line)
            ratio = float(values["on_msgs_per_s"]) / float(values["off_msgs_per_s"])
            self.assertEqual(values["ratio"], f"{ratio:.2f}", line)

    def test_externalBrokerOnce(self) -> None:
        """
        Against a broker it did not start, the command plays each scenario
        once, with no journal key and no journal_cost line.
        """
        with BrokerProcess(Path(self.mktemp())) as broker:
            scenarios = ["--scenario", "stream_1to1", "--scenario", "mailbox_durable"]
            result = _bench("--messages", "2000", "--endpoint", broker.endpoint, *scenarios)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        names = [_fields(line)[0][1] for line in lines]
        self.assertEqual(names, ["stream_1to1", "mailbox_durable"])
        for line in lines:
            self._assertLine(line, None)

    def test_profileIsWrittenAndPrinted(self) -> None:
        """
        With C{--profile} the journal-on broker runs under cProfile, shuts
        down cleanly so the profile file is written, and the command prints
        its top 25 functions by own time after the scenario's lines (with
        and without the journal) and their journal_cost line.
        """
        profile = Path(self.mktemp()).resolve()
        result = _bench(
            "--messages", "2000", "--scenario", "stream_1to1", "--profile", str(profile)
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(profile.stat().st_size > 0)
        lines = result.stdout.splitlines()
        self.assertTrue(lines[0].startswith("scenario=stream_1to1 journal=off "), lines[0])
        self.assertTrue(lines[1].startswith("scenario=stream_1to1 journal=on "), lines[1])
        self.assertTrue(lines[2].startswith("journal_cost scenario=stream_1to1 "), lines[2])
        self.assertIn("Ordered by: internal time", result.stdout)
        self.assertIn("List reduced from", result.stdout)
        table = result.stdout.split("filename:lineno(function)", 1)[1]
        rows = [row for row in table.splitlines() if re.match(r"\s*\d", row)]
        self.assertEqual(len(rows), 25, table)
