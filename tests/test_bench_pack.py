"""
Tests for L{malamute_pack.bench.pack}: its pure parts (log lines, who
joined whom, figures, tables, arguments, counters) without namespaces; its
load roles run as subprocesses against a real broker; and, as slow system
tests run as root, the command end to end on namespaces C{mpg9*}
(10.77.49.0/24) with tiny counts.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from malamute_pack.bench import __main__ as bench_main
from malamute_pack.bench import load, pack, scenarios
from malamute_pack.bench.brokerprocess import BrokerProcess, checkout_environment
from malamute_pack.bench.netns import Host, Lan, netns_available
from tests.support import skip_slow

# This helper's share of the project's names and addresses, for the tests.
PREFIX = "mpg9"
SUBNET = "10.77.49"

REACHABLE = (
    "2026-11-23T12:09:47+0000 [malamute_pack.pack.service#info] Malamute pack tst: broker "
    "mpg5h1 (4C803F8BE8A5420D9BF980A4E511717A) reachable by peers at tcp://10.77.45.1:45941"
)


def joined(broker: str, pack_name: str = "tst", event: str = "joined") -> str:
    return (
        f"2026-11-23T12:09:48+0000 [malamute_pack.pack.federation#info] pack {pack_name}: "
        f"broker {broker} {event}"
    )


def reachable(broker: str, pack_name: str = "tst") -> str:
    return REACHABLE.replace("mpg5h1", broker).replace("pack tst", f"pack {pack_name}")


class ParseLineTests(SynchronousTestCase):
    def test_reachable(self) -> None:
        """The pack service's start line names the pack and the broker."""
        self.assertEqual(pack.parse_line(REACHABLE), pack.LogEvent("reachable", "tst", "mpg5h1"))

    def test_joinedAndLeft(self) -> None:
        """The federation's joined and left lines name the pack and the peer."""
        self.assertEqual(pack.parse_line(joined("h2")), pack.LogEvent("joined", "tst", "h2"))
        self.assertEqual(
            pack.parse_line(joined("h2", event="left")), pack.LogEvent("left", "tst", "h2")
        )

    def test_otherLines(self) -> None:
        """Other lines, a client's subject that looks alike included, are no event."""
        self.assertIsNone(pack.parse_line("[-] BeaconService starting on 5670"))
        self.assertIsNone(pack.parse_line(joined("h2") + " twice"))
        self.assertIsNone(pack.parse_line(""))

    def test_notable(self) -> None:
        """Warnings, errors, criticals and tracebacks are notable; info lines are not."""
        self.assertTrue(pack.notable("x [malamute_pack.pack.federation#warn] dropped"))
        self.assertTrue(pack.notable("x [twisted#error] boom"))
        self.assertTrue(pack.notable("x [twisted#critical] boom"))
        self.assertTrue(pack.notable("Traceback (most recent call last):"))
        self.assertFalse(pack.notable(joined("h2")))


class DiscoveryWatchTests(SynchronousTestCase):
    def watch(self) -> pack.DiscoveryWatch:
        return pack.DiscoveryWatch("tst", ["h1", "h2", "h3"])

    def test_timesFromTheLastReachable(self) -> None:
        """
        Discovery runs from the last "reachable" read to the moment the last
        broker had every other joined; each broker's own time is kept.
        """
        watch = self.watch()
        watch.feed("h1", reachable("h1"), 1.0)
        watch.feed("h2", reachable("h2"), 2.0)
        watch.feed("h1", joined("h2"), 2.5)
        watch.feed("h3", reachable("h3"), 3.0)
        self.assertEqual(watch.all_reachable, 3.0)
        self.assertIsNone(watch.discovery_secs())
        for name, peers, when in (
            ("h2", ("h1", "h3"), 3.25),
            ("h1", ("h3",), 3.5),
            ("h3", ("h1", "h2"), 4.0),
        ):
            for peer in peers:
                watch.feed(name, joined(peer), when)
        self.assertTrue(watch.complete)
        self.assertEqual(watch.discovery_secs(), 1.0)
        self.assertEqual(watch.formation_secs(), 3.0)
        self.assertEqual(watch.broker_secs(), {"h1": 0.5, "h2": 0.25, "h3": 1.0})
        self.assertEqual(watch.missing(), {})

    def test_neverNegative(self) -> None:
        """A broker complete before the last "reachable" was read counts 0, not less."""
        watch = pack.DiscoveryWatch("tst", ["h1", "h2"])
        watch.feed("h1", reachable("h1"), 1.0)
        watch.feed("h1", joined("h2"), 1.5)
        watch.feed("h2", joined("h1"), 1.5)
        watch.feed("h2", reachable("h2"), 2.0)
        self.assertEqual(watch.discovery_secs(), 0.0)

    def test_missingAndLeft(self) -> None:
        """
        The brokers not yet complete say whom they miss; a peer that left is
        missed again and the event kept; another pack's lines are ignored.
        """
        watch = self.watch()
        watch.feed("h1", joined("h2"), 1.0)
        watch.feed("h1", joined("h3", pack_name="other"), 1.0)
        watch.feed("h2", joined("h1"), 1.0)
        watch.feed("h2", joined("h1", event="left"), 1.5)
        self.assertEqual(watch.missing(), {"h1": ["h3"], "h2": ["h1", "h3"], "h3": ["h1", "h2"]})
        self.assertEqual(watch.left, [("h2", "h1")])
        self.assertFalse(watch.complete)
        self.assertIsNone(watch.all_reachable)
        self.assertIsNone(watch.formation_secs())


class LogFollowerTests(SynchronousTestCase):
    def test_completeLinesOnly(self) -> None:
        """Each call gives the complete lines added since the last; a partial one waits."""
        path = Path(self.mktemp())
        follower = pack.LogFollower(path)
        self.assertEqual(follower.new_lines(), [])
        path.write_bytes(b"one\ntw")
        self.assertEqual(follower.new_lines(), ["one"])
        with path.open("ab") as f:
            f.write(b"o\nthree\n")
        self.assertEqual(follower.new_lines(), ["two", "three"])
        self.assertEqual(follower.new_lines(), [])


class FiguresTests(SynchronousTestCase):
    def test_medianAndRatio(self) -> None:
        """Medians of none are None, and so is a ratio with nothing to divide by."""
        self.assertEqual(pack.median([3.0, 1.0, 2.0]), 2.0)
        self.assertEqual(pack.median([1.0, 2.0]), 1.5)
        self.assertIsNone(pack.median([]))
        self.assertEqual(pack.ratio(1.0, 4.0), 0.25)
        self.assertIsNone(pack.ratio(None, 4.0))
        self.assertIsNone(pack.ratio(1.0, None))
        self.assertIsNone(pack.ratio(1.0, 0.0))

    def test_show(self) -> None:
        """Cells: floats with the digits asked, None as a dash."""
        self.assertEqual(pack.show(1.236, 2), "1.24")
        self.assertEqual(pack.show(1.5), "2")
        self.assertEqual(pack.show(None), "-")
        self.assertEqual(pack.show(7), "7")

    def test_table(self) -> None:
        """The first column is left-aligned, the others right-aligned, two spaces apart."""
        lines = pack.table(["name", "n"], [["a", "100"], ["bbbbbb", "2"]])
        self.assertEqual(lines, ["name      n", "a       100", "bbbbbb    2"])

    def test_pairSummary(self) -> None:
        """
        The two-broker summary: per measure, the medians over the rounds on
        each placement, their ratio cross over single, and the losses summed.
        """
        result = pack.PairResult()
        for placement, rates, rtts in (
            (pack.CROSS_HOST, (100, 300, 200), ("900", "1000", "1100")),
            (pack.SINGLE_HOST, (400, 500, 800), ("100", "200", "300")),
        ):
            for rate, round_trip in zip(rates, rtts, strict=True):
                result.rounds.append(
                    {"placement": placement, "scenario": pack.STREAM}
                    | {"msgs_per_s": str(rate), "lost": "1"}
                )
                result.rounds.append(
                    {"placement": placement, "scenario": pack.SERVICE}
                    | {"msgs_per_s": str(rate / 10), "lost": "0", "avg_rtt_us": round_trip}
                )
        stream, trips, rtt = result.summary()
        self.assertEqual(
            stream,
            {
                "measure": "stream_1to1 msgs/s",
                pack.CROSS_HOST: 200.0,
                pack.SINGLE_HOST: 500.0,
                "ratio": 0.4,
                "lost_cross_host": 3.0,
                "lost_single_host": 3.0,
            },
        )
        self.assertEqual((trips[pack.CROSS_HOST], trips[pack.SINGLE_HOST]), (20.0, 50.0))
        self.assertEqual((rtt[pack.CROSS_HOST], rtt["ratio"]), (1000.0, 5.0))
        lines = result.lines()
        self.assertEqual(lines[0].split(), ["measure", *PAIR_COLUMNS])
        self.assertEqual(
            lines[1].split(), ["stream_1to1", "msgs/s", "200", "500", "0.40", "3", "3"]
        )
        self.assertEqual(
            lines[3].split()[:5], ["service_rr", "avg_rtt_us", "1000.0", "200.0", "5.00"]
        )

    def test_traffic(self) -> None:
        """
        Traffic per entry divides by the entries, per entry and peer by the
        entries times the other brokers; a median row closes the table.
        """
        result = pack.TrafficResult(pack.BEACON, 5, 10, 5.0)
        result.rows = [
            pack.TrafficRow("h1", 64.0, 4000.0, 40.0, 8000.0, 80.0),
            pack.TrafficRow("h2", 64.0, 6000.0, 60.0, 10000.0, 100.0),
        ]
        self.assertEqual(result.per_entry(4000.0), 400.0)
        self.assertEqual(result.per_entry_peer(4000.0), 100.0)
        lines = result.lines()
        self.assertEqual(len(lines), 4)
        self.assertEqual(
            lines[1].split(),
            ["h1", "64", "4000", "40", "400", "100.0", "8000", "80", "800", "200.0"],
        )
        self.assertEqual(lines[3].split()[:3], ["median", "64", "5000"])

    def test_netDev(self) -> None:
        """The tx bytes and packets of one interface, from a /proc/net/dev text."""
        text = (
            "Inter-|   Receive                                                |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets"
            " errs drop fifo colls carrier compressed\n"
            "    lo:     100       2    0    0    0     0          0         0      100       2"
            "    0    0    0     0       0          0\n"
            "  eth0:    5000      50    0    0    0     0          0         0     7000      70"
            "    0    0    0     0       0          0\n"
        )
        self.assertEqual(pack.parse_net_dev(text, "eth0"), (7000, 70))
        self.assertRaises(pack.PackBenchError, pack.parse_net_dev, text, "eth1")


PAIR_COLUMNS = ["cross_host", "single_host", "ratio", "lost_cross", "lost_single"]


class ArgumentsTests(SynchronousTestCase):
    def test_beacon(self) -> None:
        """With beacons every broker beacons on its host's eth0 under its host's name."""
        first, other = Host("mpg9dh1", "10.77.49.1"), Host("mpg9dh2", "10.77.49.2")
        self.assertEqual(
            pack.pack_arguments(pack.BEACON, "p", other, first),
            ["--pack", "p", "--broker-name", "mpg9dh2", "--beacon", "eth0"],
        )

    def test_gossip(self) -> None:
        """
        With gossip the first broker serves it on its address, the others
        connect there; each advertises a peer endpoint on its own address.
        """
        first, other = Host("mpg9dh1", "10.77.49.1"), Host("mpg9dh2", "10.77.49.2")
        self.assertEqual(
            pack.pack_arguments(pack.GOSSIP, "p", first, first)[4:],
            ["--gossip-bind", "tcp://10.77.49.1:5680", "--peer-endpoint", "tcp://10.77.49.1:*"],
        )
        self.assertEqual(
            pack.pack_arguments(pack.GOSSIP, "p", other, first)[4:],
            ["--gossip-connect", "tcp://10.77.49.1:5680", "--peer-endpoint", "tcp://10.77.49.2:*"],
        )

    def test_settled(self) -> None:
        """The senders of a scenario wait before their first message; the other roles do not."""
        stream = pack.settled(scenarios.SCENARIOS[pack.STREAM])
        self.assertEqual([role.work for role in stream.roles], [load.count, pack.settle_then_blast])
        service = pack.settled(scenarios.SCENARIOS[pack.SERVICE])
        self.assertEqual(
            [role.work for role in service.roles], [load.serve, pack.settle_then_request]
        )
        self.assertEqual(stream.name, pack.STREAM)

    def test_defaults(self) -> None:
        """By default: both parts, 3 rounds, discovery at 4, 8 and 16 both ways."""
        options = pack.parse([])
        self.assertIsNone(options.only)
        self.assertEqual(options.rounds, 3)
        self.assertEqual(options.brokers, [4, 8, 16])
        self.assertEqual(options.discovery, [pack.BEACON, pack.GOSSIP])
        self.assertEqual((options.prefix, options.subnet), ("mpg1", "10.77.41"))

    def test_refused(self) -> None:
        """Bad sizes, counts, prefixes and subnets are refused."""
        for argv in (
            ["--brokers", "1"],
            ["--brokers", "4,x"],
            ["--brokers", ""],
            ["--rounds", "0"],
            ["--messages", "0"],
            ["--round-trips", "0"],
            ["--entries", "-1"],
            ["--traffic-secs", "0"],
            ["--prefix", "xx1"],
            ["--prefix", "mpg1234"],
            ["--subnet", "10.77"],
        ):
            with redirect_stdout(io.StringIO()):
                error = self.assertRaises(SystemExit, pack.parse, argv)
            self.assertEqual(error.code, 2, argv)

    def test_subcommand(self) -> None:
        """C{python -m malamute_pack.bench pack} hands the arguments after C{pack} to this bench."""
        out = io.StringIO()
        with redirect_stdout(out):
            error = self.assertRaises(SystemExit, bench_main.main, ["pack", "--help"])
        self.assertEqual(error.code, 0)
        self.assertIn("usage: python -m malamute_pack.bench pack", out.getvalue())
        self.assertIn("--discovery", out.getvalue())


class NamespaceContextTests(SynchronousTestCase):
    def test_placement(self) -> None:
        """Roles named in the placement run in its namespace, the others in the default."""
        context = pack.NamespaceContext({"reader-0": "mpg9th2"}, "mpg9th1")
        reader, writer = scenarios.SCENARIOS[pack.STREAM].roles
        for role, where in ((reader, "mpg9th2"), (writer, "mpg9th1")):
            process = context.Process(load.run_role, (role, "ep", load.Job(1), None), "x", True)
            self.assertEqual(process.netns, where)
        self.assertRaises(ValueError, context.Process, print, (reader,))


class SubprocessRolesTests(SynchronousTestCase):
    skip = skip_slow

    def test_rolesAsSubprocesses(self) -> None:
        """
        The scenarios' runner plays a scenario with its roles as subprocesses
        (here in this process's namespace) given their ends of its pipes,
        against a real broker: nothing is lost, the figures are whole.
        """
        with BrokerProcess(Path(self.mktemp()), timeout_ms=600_000) as broker:
            context = pack.NamespaceContext({}, None)
            result = scenarios.run(
                pack.settled(scenarios.SCENARIOS[pack.STREAM]),
                broker.endpoint,
                load.Job(500),
                context,
                True,
            )
            served = scenarios.run(
                scenarios.SCENARIOS[pack.SERVICE], broker.endpoint, load.Job(50), context
            )
        self.assertEqual(result.figures()["lost"], "0")
        self.assertGreater(float(result.figures()["msgs_per_s"]), 0)
        self.assertEqual(served.figures()["lost"], "0")
        self.assertGreater(float(served.figures()["avg_rtt_us"]), 0)


def _bench_pack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "malamute_pack.bench", "pack", *args],
        env=checkout_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )


TINY = ("--prefix", PREFIX, "--subnet", SUBNET, "--traffic-secs", "1", "--entries", "5")


class PackCommandTests(SynchronousTestCase):
    """The command end to end, as root, on namespaces C{mpg9*}."""

    skip = skip_slow

    def setUp(self) -> None:
        reason = netns_available()
        if reason is not None:
            raise SkipTest(reason)
        for lan in (Lan(f"{PREFIX}t", SUBNET, 2), Lan(f"{PREFIX}d", SUBNET, 3)):
            self.addCleanup(self.assertEqual, lan.existing(), [])

    def test_tinyRun(self) -> None:
        """
        With tiny counts the command prints the two-broker table (three
        measures, all figures positive, nothing lost), the discovery table
        (beacons and gossip, 3 brokers, each complete) and a traffic table
        per discovery (a row per host and a median, directory and interest
        bytes positive); it exits 0, its brokers shut down cleanly, and its
        namespaces are gone.
        """
        result = _bench_pack(
            *TINY, "--rounds", "1", "--messages", "2000", "--round-trips", "100", "--brokers", "3"
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertTrue(lines[0].startswith("# two brokers in a pack"), result.stdout)
        self.assertEqual(lines[1].split(), ["measure", *PAIR_COLUMNS])
        measures = [" ".join(line.split()[:2]) for line in lines[2:5]]
        self.assertEqual(
            measures, ["stream_1to1 msgs/s", "service_rr trips/s", "service_rr avg_rtt_us"]
        )
        for line in lines[2:5]:
            cells = line.split()
            self.assertGreater(float(cells[2]), 0, line)
            self.assertGreater(float(cells[3]), 0, line)
            self.assertEqual(cells[5:], ["0", "0"], line)
        self.assertTrue(lines[5].startswith("# discovery"), result.stdout)
        self.assertEqual(lines[6].split(), pack.DISCOVERY_HEADERS)
        for line, mode in zip(lines[7:9], ("beacon", "gossip"), strict=True):
            cells = line.split()
            self.assertEqual((cells[0], cells[1], cells[-1]), (mode, "3", "yes"), line)
            self.assertGreaterEqual(float(cells[3]), 0, line)
        for start, mode in ((9, "beacon"), (15, "gossip")):
            self.assertTrue(lines[start].startswith(f"# traffic, {mode} pack of 3"), result.stdout)
            rows = [line.split() for line in lines[start + 2 : start + 6]]
            self.assertEqual(
                [row[0] for row in rows], [f"{PREFIX}dh1", f"{PREFIX}dh2", f"{PREFIX}dh3", "median"]
            )
            self.assertGreater(float(rows[-1][2]), 0, result.stdout)
            self.assertGreater(float(rows[-1][6]), 0, result.stdout)
        self.assertEqual(len(lines), 21, result.stdout)

    def test_json(self) -> None:
        """
        With C{--json} and C{--only discovery} it prints one JSON document:
        no pair, one discovery of 2 brokers with beacons, complete, with its
        traffic per host.
        """
        result = _bench_pack(
            *TINY, "--only", "discovery", "--discovery", "beacon", "--brokers", "2", "--json"
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        document = json.loads(result.stdout)
        self.assertNotIn("pair", document)
        (discovery,) = document["discovery"]
        self.assertEqual((discovery["mode"], discovery["brokers"]), ("beacon", 2))
        self.assertEqual(discovery["missing"], {})
        self.assertGreaterEqual(discovery["discovery_secs"], 0)
        self.assertEqual(
            [row["host"] for row in discovery["traffic"]["rows"]], ["mpg9dh1", "mpg9dh2"]
        )
