"""
Tests for L{malamute_pack.bench.pack}: its pure parts (log lines, who
joined whom, figures, tables, comparisons open against CURVE, arguments,
keys, counters) without namespaces; its load roles run as subprocesses
against a real broker; and, as slow system tests run as root, the command
end to end on namespaces of its own per test (10.77.49.0/24) with tiny
counts, open and with C{--security open --security curve}.
"""

from __future__ import annotations

import argparse
import io
import json
import stat
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import ClassVar

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from malamute_pack.bench import __main__ as bench_main
from malamute_pack.bench import load, pack, scenarios
from malamute_pack.testing.brokerprocess import BrokerProcess, checkout_environment
from malamute_pack.testing.netns import Host, Lan, netns_available
from malamute_pack.transport.curve import KeyPair, load_client_keys
from tests.support import skip_slow

# This helper's share of the project's addresses, for the tests (each test
# that runs the command has its own prefix: PackCommandTests.PREFIXES).
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
        stream, trips, rtt, group = result.summary()
        self.assertEqual(
            stream,
            {
                "security": pack.OPEN,
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
        self.assertEqual((group["measure"], group[pack.CROSS_HOST]), ("stream_group1 msgs/s", None))
        lines = result.lines()
        self.assertEqual(lines[0].split(), ["measure", *PAIR_COLUMNS])
        self.assertEqual(
            lines[1].split(), ["stream_1to1", "msgs/s", "200", "500", "0.40", "3", "3"]
        )
        self.assertEqual(
            lines[3].split()[:5], ["service_rr", "avg_rtt_us", "1000.0", "200.0", "5.00"]
        )

    def test_pairComparisons(self) -> None:
        """
        Played in an open and a CURVE pack, the two-broker summary is per
        security, and each measure and placement is compared: the medians
        of each pack's rounds and their ratio CURVE/open (the ratio of the
        medians, not a median of the rounds' ratios).
        """
        result = pack.PairResult()
        for security, rates in ((pack.OPEN, (100, 300, 200)), (pack.CURVE, (90, 150, 500))):
            for number, rate in enumerate(rates, 1):
                for placement in (pack.CROSS_HOST, pack.SINGLE_HOST):
                    result.rounds.append(
                        {"round": str(number), "security": security, "placement": placement}
                        | {"scenario": pack.STREAM, "msgs_per_s": str(rate), "lost": "0"}
                    )
        self.assertEqual(result.securities, [pack.OPEN, pack.CURVE])
        self.assertEqual(result.summary(pack.CURVE)[0][pack.CROSS_HOST], 150.0)
        self.assertEqual(result.summary(pack.OPEN)[0][pack.CROSS_HOST], 200.0)
        comparisons = result.comparisons()
        self.assertEqual(
            [(c.measure, c.case) for c in comparisons[:2]],
            [("stream_1to1 msgs/s", pack.CROSS_HOST), ("stream_1to1 msgs/s", pack.SINGLE_HOST)],
        )
        stream = comparisons[0]
        self.assertEqual((list(stream.open), list(stream.curve)), ([100, 300, 200], [90, 150, 500]))
        self.assertEqual(stream.ratio, 0.75)
        self.assertEqual(
            stream.row(), ["stream_1to1 msgs/s", "cross_host", "200", "150", "0.75", "3/3"]
        )
        self.assertEqual(
            stream.as_json(),
            {
                "measure": "stream_1to1 msgs/s",
                "case": "cross_host",
                "open": 200.0,
                "curve": 150.0,
                "ratio": 0.75,
                "open_values": [100.0, 300.0, 200.0],
                "curve_values": [90.0, 150.0, 500.0],
            },
        )
        # service_rr was not played: its comparisons have no figures.
        self.assertEqual(comparisons[2].row()[2:], ["-", "-", "-", "0/0"])

    def test_comparisonTable(self) -> None:
        """The comparison table: measure, case, medians open and CURVE, ratio, samples."""
        lines = pack.comparison_lines(
            [pack.Comparison("discovery_s", "beacon n=16", [0.5, 0.25], [0.5, 1.0, 0.75], 3)]
        )
        self.assertEqual(lines[0].split(), pack.COMPARISON_HEADERS)
        self.assertEqual(
            lines[0].split(), ["measure", "case", "open", "curve", "curve/open", "samples"]
        )
        self.assertEqual(
            lines[1].split(), ["discovery_s", "beacon", "n=16", "0.375", "0.750", "2.00", "2/3"]
        )

    def test_discoveryComparisons(self) -> None:
        """
        Discovery is compared per mode and size, in the order first run:
        discovery_s and formed_s over the runs that completed in each pack,
        then the traffic figures of the median broker where both packs
        have them.
        """
        runs = [
            discovery_result(pack.BEACON, pack.OPEN, 1, 16, 0.2, 0.5),
            discovery_result(pack.BEACON, pack.CURVE, 1, 16, 0.3, 0.8),
            discovery_result(pack.BEACON, pack.CURVE, 2, 16, None, None),
            discovery_result(pack.BEACON, pack.OPEN, 2, 16, 0.4, 0.7),
            discovery_result(pack.GOSSIP, pack.OPEN, 1, 16, 0.1, 0.2),
        ]
        for run, idle_rate, sent in ((runs[0], 100.0, 1000.0), (runs[1], 150.0, 3000.0)):
            run.traffic = pack.TrafficResult(pack.BEACON, 16, 10, 5.0, run.security)
            run.traffic.rows = [pack.TrafficRow("h1", idle_rate, sent, 10.0, 2 * sent, 20.0)]
        comparisons = pack.discovery_comparisons(runs)
        self.assertEqual(
            [(c.measure, c.case) for c in comparisons],
            [
                ("discovery_s", "beacon n=16"),
                ("formed_s", "beacon n=16"),
                ("idle B/s", "beacon n=16"),
                ("directory B/entry", "beacon n=16"),
                ("interest B/entry", "beacon n=16"),
                ("discovery_s", "gossip n=16"),
                ("formed_s", "gossip n=16"),
            ],
        )
        discovery, formed, idle, directory, interest, gossip, _ = comparisons
        self.assertEqual((list(discovery.open), list(discovery.curve)), ([0.2, 0.4], [0.3]))
        self.assertAlmostEqual(discovery.ratio or 0, 1.0)
        self.assertAlmostEqual(formed.ratio or 0, 0.8 / 0.6)
        self.assertEqual((idle.ratio, directory.ratio, interest.ratio), (1.5, 3.0, 3.0))
        self.assertEqual((list(directory.open), list(directory.curve)), ([100.0], [300.0]))
        self.assertEqual(gossip.row()[2:], ["0.100", "-", "-", "1/0"])

    def test_report(self) -> None:
        """
        The report prints a two-broker table per pack and, only when both
        an open and a CURVE pack were measured, the comparison table last;
        its JSON document has the security of every summary row, round and
        discovery run, and the comparisons (none with one pack).
        """
        options = argparse.Namespace(rounds=1)
        result = pack.PairResult()
        for security, rate in ((pack.OPEN, 200), (pack.CURVE, 170)):
            for placement in (pack.CROSS_HOST, pack.SINGLE_HOST):
                result.rounds.append(
                    {"round": "1", "security": security, "placement": placement}
                    | {"scenario": pack.STREAM, "msgs_per_s": str(rate), "lost": "0"}
                )
        report = pack.PackReport(pair=result)
        lines = report.lines(options)
        headers = [line for line in lines if line.startswith("#")]
        self.assertEqual(len(headers), 3, lines)
        self.assertTrue(headers[0].startswith("# two brokers in a pack (open, beacons)"))
        self.assertTrue(headers[1].startswith("# two brokers in a pack (curve, beacons)"))
        self.assertTrue(headers[2].startswith("# curve against open"))
        self.assertEqual(
            lines[-8].split()[:6], ["stream_1to1", "msgs/s", "cross_host", "200", "170", "0.85"]
        )
        document = report.as_json()
        self.assertEqual(
            [row["security"] for row in document["pair"]["summary"]],
            [pack.OPEN] * 4 + [pack.CURVE] * 4,
        )
        self.assertEqual(document["comparison"][0]["ratio"], 0.85)
        self.assertEqual(document["discovery"], [])

        alone = pack.PackReport(pair=pack.PairResult(rounds=result.rounds[:2]))
        self.assertEqual(alone.comparisons(), [])
        self.assertEqual(alone.as_json()["comparison"], [])
        self.assertEqual(len(alone.lines(options)), 6)

    def test_discoveryMedians(self) -> None:
        """
        With several runs of a case, the report adds their medians (over
        the complete runs) and how many completed; the rows have the
        security and the round.
        """
        report = pack.PackReport(
            discovery=[
                discovery_result(pack.BEACON, pack.OPEN, 1, 4, 0.2, 0.5),
                discovery_result(pack.BEACON, pack.OPEN, 2, 4, None, None),
                discovery_result(pack.BEACON, pack.OPEN, 3, 4, 0.4, 0.7),
            ]
        )
        self.assertEqual(
            report.discovery_medians(),
            [["beacon", "open", "4", "3", "2", "1.00", "0.300", "0.60"]],
        )
        lines = report.lines(argparse.Namespace(rounds=1))
        self.assertEqual(lines[2].split()[:4], ["beacon", "open", "1", "4"])
        self.assertEqual(lines[6].split(), pack.DISCOVERY_MEDIAN_HEADERS)
        self.assertEqual(len(lines), 8)

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


def discovery_result(
    mode: str,
    security: str,
    number: int,
    n: int,
    discovery: float | None,
    formed: float | None,
) -> pack.DiscoveryResult:
    """A discovery run's result: complete unless its times are None."""
    missing = {} if discovery is not None else {"h1": ["h2"]}
    return pack.DiscoveryResult(
        mode, security, number, n, 1.0, discovery, formed, {}, missing, [], 100.0
    )


class NotableLinesTests(SynchronousTestCase):
    def test_merged(self) -> None:
        """
        The brokers' warnings and errors, time stamps taken off, in the order
        first logged: a line several brokers logged is given once, with
        how many others logged it.
        """
        base = Path(self.mktemp())
        logs = {
            "h1": [
                "2026-11-23T12:09:47+0000 [x#warn] open",
                "2026-11-23T12:09:48+0000 [x#info] ok",
            ],
            "h2": [
                "2026-11-23T12:09:49+0000 [x#warn] open",
                "2026-11-23T12:09:49+0000 [y#error] boom",
            ],
            "h3": ["2026-11-23T12:09:50+0000 [x#warn] open"],
        }
        brokers = {}
        for name, lines in logs.items():
            broker = BrokerProcess(base / name)
            broker.directory.mkdir(parents=True)
            broker.log.write_text("".join(f"{line}\n" for line in lines))
            brokers[name] = broker
        self.assertEqual(
            pack.notable_lines(brokers),
            ["h1 and 2 others: [x#warn] open", "h2: [y#error] boom"],
        )
        del brokers["h3"]
        self.assertEqual(pack.notable_lines(brokers)[0], "h1 and 1 other: [x#warn] open")


class PackKeysTests(SynchronousTestCase):
    def test_make(self) -> None:
        """
        A key pair per host, the secret certificates readable by their owner
        only, and a pack-keys directory holding exactly the public
        certificates, which the broker reads as the brokers allowed in.
        """
        keys = pack.PackKeys.make(Path(self.mktemp()), ["h1", "h2"])
        self.assertEqual(sorted(p.name for p in keys.directory.iterdir()), ["h1.key", "h2.key"])
        self.assertEqual(sorted(keys.secrets), ["h1", "h2"])
        for name, secret in keys.secrets.items():
            self.assertEqual(stat.S_IMODE(secret.stat().st_mode), 0o600)
            self.assertEqual(KeyPair.load(secret).public.decode(), keys.public[name])
            self.assertEqual(len(keys.public[name]), 40)
        allowed = load_client_keys(keys.directory)
        self.assertEqual(
            {user: key.decode() for key, user in allowed.items()},
            {"h1": keys.public["h1"], "h2": keys.public["h2"]},
        )
        self.assertNotEqual(keys.public["h1"], keys.public["h2"])


KEYS = pack.PackKeys(
    Path("/k/pack-keys"),
    {name: Path(f"/k/certificates/{name}.key_secret") for name in ("mpg9dh1", "mpg9dh2")},
    {"mpg9dh1": "A" * 40, "mpg9dh2": "B" * 40},
)


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

    def test_curveBeacon(self) -> None:
        """
        In a CURVE pack with beacons each broker is also given the pack-keys
        directory and its host's secret certificate, and the beacon port
        when one is asked.
        """
        first, other = Host("mpg9dh1", "10.77.49.1"), Host("mpg9dh2", "10.77.49.2")
        secret = "/k/certificates/mpg9dh2.key_secret"
        self.assertEqual(
            pack.pack_arguments(pack.BEACON, "p", other, first, KEYS, 5671),
            [
                *("--pack", "p", "--broker-name", "mpg9dh2", "--beacon", "eth0"),
                *("--beacon-port", "5671", "--pack-keys", "/k/pack-keys", "--pack-secret", secret),
            ],
        )

    def test_curveGossip(self) -> None:
        """
        In a CURVE pack with gossip the server binds as in an open one, and
        each client reaches it at ENDPOINT|KEY, the server's public key;
        every one has --pack-keys and its own --pack-secret.
        """
        first, other = Host("mpg9dh1", "10.77.49.1"), Host("mpg9dh2", "10.77.49.2")
        self.assertEqual(
            pack.pack_arguments(pack.GOSSIP, "p", first, first, KEYS)[4:],
            [
                *(
                    "--gossip-bind",
                    "tcp://10.77.49.1:5680",
                    "--peer-endpoint",
                    "tcp://10.77.49.1:*",
                ),
                *("--pack-keys", "/k/pack-keys"),
                *("--pack-secret", "/k/certificates/mpg9dh1.key_secret"),
            ],
        )
        self.assertEqual(
            pack.pack_arguments(pack.GOSSIP, "p", other, first, KEYS)[4:],
            [
                *("--gossip-connect", f"tcp://10.77.49.1:5680|{'A' * 40}"),
                *("--peer-endpoint", "tcp://10.77.49.2:*", "--pack-keys", "/k/pack-keys"),
                *("--pack-secret", "/k/certificates/mpg9dh2.key_secret"),
            ],
        )

    def test_pairEndpoints(self) -> None:
        """The two packs side by side: each broker its own client endpoint and beacon port."""
        self.assertEqual(
            {pack.client_endpoint(s) for s in pack.SECURITIES},
            {f"{pack.CLIENT_ENDPOINT}-open", f"{pack.CLIENT_ENDPOINT}-curve"},
        )
        self.assertEqual(pack.BEACON_PORTS, {pack.OPEN: None, pack.CURVE: 5671})

    def test_securities(self) -> None:
        """C{--security} is repeatable, in the order given, each once."""
        options = pack.parse(["--security", "curve", "--security", "open", "--security", "curve"])
        self.assertEqual(options.security, [pack.CURVE, pack.OPEN])
        self.assertEqual(pack.parse(["--discovery-rounds", "3"]).discovery_rounds, 3)

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
        """By default: both parts, 3 rounds, discovery once at 4, 8 and 16 both ways, open."""
        options = pack.parse([])
        self.assertIsNone(options.only)
        self.assertEqual(options.rounds, 3)
        self.assertEqual(options.brokers, [4, 8, 16])
        self.assertEqual(options.discovery, [pack.BEACON, pack.GOSSIP])
        self.assertEqual((options.prefix, options.subnet), ("mpg1", "10.77.41"))
        self.assertEqual((options.security, options.discovery_rounds), ([pack.OPEN], 1))

    def test_refused(self) -> None:
        """Bad sizes, counts, prefixes and subnets are refused."""
        for argv in (
            ["--brokers", "1"],
            ["--brokers", "4,x"],
            ["--brokers", ""],
            ["--rounds", "0"],
            ["--discovery-rounds", "0"],
            ["--security", "plain"],
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


TINY = ("--subnet", SUBNET, "--traffic-secs", "1", "--entries", "5")


class PackCommandTests(SynchronousTestCase):
    """
    The command end to end, as root, on namespaces of the test's prefix.

    @cvar PREFIXES: each test method's C{--prefix} (the command's Lans add
        C{t} and C{d} to it), used by no other test: tests run side by
        side, and a Lan's create() deletes what its prefix names.
    """

    skip = skip_slow
    PREFIXES: ClassVar[dict[str, str]] = {
        "test_tinyRun": "mpg6",
        "test_tinyCurveRun": "mpg7",
        "test_json": "mpg8",
    }

    def setUp(self) -> None:
        reason = netns_available()
        if reason is not None:
            raise SkipTest(reason)
        self.prefix = self.PREFIXES[self._testMethodName]
        for lan in (Lan(f"{self.prefix}t", SUBNET, 2), Lan(f"{self.prefix}d", SUBNET, 3)):
            self.addCleanup(self.assertEqual, lan.existing(), [])

    def test_tinyRun(self) -> None:
        """
        With tiny counts the command prints the two-broker table of an open
        pack (four measures, all figures positive, nothing lost), the
        discovery table (beacons and gossip, open, 3 brokers, each
        complete) and a traffic table per discovery (a row per host and a
        median, directory and interest bytes positive), and no comparison;
        it exits 0, its brokers shut down cleanly, and its namespaces are
        gone.
        """
        result = _bench_pack(
            *("--prefix", self.prefix, *TINY),
            *("--rounds", "1", "--messages", "2000", "--round-trips", "100", "--brokers", "3"),
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertTrue(
            lines[0].startswith("# two brokers in a pack (open, beacons)"), result.stdout
        )
        self.check_pair(lines[1:6])
        self.assertTrue(lines[6].startswith("# discovery"), result.stdout)
        self.assertEqual(lines[7].split(), pack.DISCOVERY_HEADERS)
        for line, mode in zip(lines[8:10], ("beacon", "gossip"), strict=True):
            cells = line.split()
            self.assertEqual(cells[:4] + cells[-1:], [mode, "open", "1", "3", "yes"], line)
            self.assertGreaterEqual(float(cells[5]), 0, line)
        for start, mode in ((10, "beacon"), (16, "gossip")):
            self.assertTrue(
                lines[start].startswith(f"# traffic, {mode} open pack of 3"), result.stdout
            )
            self.check_traffic(lines[start + 1 : start + 6], 3)
        self.assertEqual(len(lines), 22, result.stdout)

    def check_pair(self, lines: list[str]) -> None:
        """A two-broker table: four measures, all figures positive, nothing lost."""
        self.assertEqual(lines[0].split(), ["measure", *PAIR_COLUMNS])
        measures = [" ".join(line.split()[:2]) for line in lines[1:5]]
        self.assertEqual(
            measures,
            [
                "stream_1to1 msgs/s",
                "service_rr trips/s",
                "service_rr avg_rtt_us",
                "stream_group1 msgs/s",
            ],
        )
        for line in lines[1:5]:
            cells = line.split()
            self.assertGreater(float(cells[2]), 0, line)
            self.assertGreater(float(cells[3]), 0, line)
            self.assertEqual(cells[5:], ["0", "0"], line)

    def check_traffic(self, lines: list[str], n: int) -> None:
        """A traffic table: a row per host and a median, directory and interest bytes positive."""
        rows = [line.split() for line in lines[1:]]
        hosts = [f"{self.prefix}dh{i}" for i in range(1, n + 1)]
        self.assertEqual([row[0] for row in rows], [*hosts, "median"])
        self.assertGreater(float(rows[-1][2]), 0, lines)
        self.assertGreater(float(rows[-1][6]), 0, lines)

    def test_tinyCurveRun(self) -> None:
        """
        With C{--security open --security curve} and tiny counts: a
        two-broker table for each pack (figures positive, nothing lost),
        discovery in each pack with beacons and with gossip (complete,
        the order of the packs as given in this single round), traffic
        tables in each, then the comparison table: per measure and case,
        the medians open and CURVE and their ratio, which is the ratio of
        the medians shown. No broker logged anything notable but the open
        packs' warning that they are open.
        """
        result = _bench_pack(
            *("--prefix", self.prefix, "--subnet", SUBNET, "--traffic-secs", "1", "--entries", "2"),
            *("--security", "open", "--security", "curve", "--rounds", "1"),
            *("--messages", "500", "--round-trips", "20", "--brokers", "2"),
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertTrue(
            lines[0].startswith("# two brokers in a pack (open, beacons)"), result.stdout
        )
        self.check_pair(lines[1:6])
        self.assertTrue(
            lines[6].startswith("# two brokers in a pack (curve, beacons)"), result.stdout
        )
        self.check_pair(lines[7:12])
        self.assertTrue(lines[12].startswith("# discovery"), result.stdout)
        runs = [line.split() for line in lines[14:18]]
        self.assertEqual(
            [row[:4] + row[-1:] for row in runs],
            [
                [mode, security, "1", "2", "yes"]
                for mode in ("beacon", "gossip")
                for security in ("open", "curve")
            ],
            result.stdout,
        )
        for start in (18, 23, 28, 33):
            self.assertTrue(lines[start].startswith("# traffic, "), result.stdout)
            self.check_traffic(lines[start + 1 : start + 5], 2)
        self.assertEqual(
            [lines[start].split()[2:4] for start in (18, 23, 28, 33)],
            [["beacon", "open"], ["beacon", "curve"], ["gossip", "open"], ["gossip", "curve"]],
        )
        self.assertTrue(lines[38].startswith("# curve against open"), result.stdout)
        self.assertEqual(lines[39].split(), pack.COMPARISON_HEADERS)
        comparisons = lines[40:]
        cases = [" ".join(line.split()[:-4]) for line in comparisons]
        pair = [
            f"{measure} {placement}"
            for measure in (
                "stream_1to1 msgs/s",
                "service_rr trips/s",
                "service_rr avg_rtt_us",
                "stream_group1 msgs/s",
            )
            for placement in ("cross_host", "single_host")
        ]
        discovery = [
            f"{measure} {mode} n=2"
            for mode in ("beacon", "gossip")
            for measure in (
                "discovery_s",
                "formed_s",
                "idle B/s",
                "directory B/entry",
                "interest B/entry",
            )
        ]
        self.assertEqual(cases, pair + discovery, result.stdout)
        for number, line in enumerate(comparisons):
            opened, curved, ratio, samples = line.split()[-4:]
            self.assertEqual(samples, "1/1", line)
            if number < len(pair):
                # Figures large enough that their rounding does not show in the ratio.
                self.assertLessEqual(abs(float(ratio) - float(curved) / float(opened)), 0.01)
        notable = [line for line in result.stderr.splitlines() if line.startswith("log: ")]
        self.assertEqual(len(notable), 3, result.stderr)
        for line in notable:
            self.assertIn("#warn] pack bench-", line)
            self.assertIn("-open is open: any broker", line)

    def test_json(self) -> None:
        """
        With C{--json}, C{--only discovery}, both securities and two
        discovery rounds it prints one JSON document: no pair, four
        discoveries of 2 brokers with beacons, complete, the packs' order
        alternating round by round; traffic per host in the first round
        only; and the comparisons of discovery_s and formed_s from both
        rounds, and of the traffic figures from the first.
        """
        result = _bench_pack(
            *("--prefix", self.prefix, *TINY),
            *("--only", "discovery", "--discovery", "beacon", "--brokers", "2", "--json"),
            *("--security", "open", "--security", "curve", "--discovery-rounds", "2"),
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        document = json.loads(result.stdout)
        self.assertNotIn("pair", document)
        runs = document["discovery"]
        self.assertEqual(
            [(r["mode"], r["brokers"], r["security"], r["round"]) for r in runs],
            [
                ("beacon", 2, "open", 1),
                ("beacon", 2, "curve", 1),
                ("beacon", 2, "curve", 2),
                ("beacon", 2, "open", 2),
            ],
        )
        for run in runs:
            self.assertEqual(run["missing"], {})
            self.assertGreaterEqual(run["discovery_secs"], 0)
        for run in runs[:2]:
            self.assertEqual(
                [row["host"] for row in run["traffic"]["rows"]],
                [f"{self.prefix}dh{i}" for i in (1, 2)],
            )
            self.assertEqual(run["traffic"]["security"], run["security"])
        self.assertEqual([run["traffic"] for run in runs[2:]], [None, None])
        comparisons = {c["measure"]: c for c in document["comparison"]}
        self.assertEqual(
            list(comparisons),
            ["discovery_s", "formed_s", "idle B/s", "directory B/entry", "interest B/entry"],
        )
        discovery = comparisons["discovery_s"]
        self.assertEqual(discovery["case"], "beacon n=2")
        self.assertEqual(
            discovery["open_values"], [runs[0]["discovery_secs"], runs[3]["discovery_secs"]]
        )
        self.assertEqual(
            discovery["curve_values"], [runs[1]["discovery_secs"], runs[2]["discovery_secs"]]
        )
        self.assertEqual(discovery["open"], sum(discovery["open_values"]) / 2)
        if discovery["open"] > 0:
            self.assertAlmostEqual(discovery["ratio"], discovery["curve"] / discovery["open"])
        self.assertEqual(len(comparisons["idle B/s"]["open_values"]), 1)
