"""
Tests for the multicast benchmark, L{malamute_pack.bench.multicast}: its
options, the bridge options and status lines of its brokers, the parsing
of iptables and kernel counters, its figures and table (pure), its load
roles over real sockets on loopback, and, as a slow system test (root),
the command itself with a small N.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import zmq
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from malamute_pack.bench import load
from malamute_pack.bench.__main__ import main as bench_main
from malamute_pack.bench.multicast import (
    GOAL_RATE,
    NO_LOSS,
    Delivery,
    MulticastResult,
    UdpFilter,
    bridge_status,
    group_url,
    inbound_arguments,
    inbound_counters,
    index_of,
    loss_scenario,
    outbound_arguments,
    parse,
    parse_dev_tx,
    parse_snmp,
    payload,
    rule_packets,
    unavailable,
)
from malamute_pack.bench.multicast.brokers import repairs_started
from malamute_pack.bench.multicast.command import (
    DEFAULT_LOSS_PERCENT,
    DEFAULT_MESSAGES,
    DEFAULT_RATE_KBPS,
    DEFAULT_ROUNDS,
)
from malamute_pack.bench.multicast.roles import (
    PRODUCER,
    HostContext,
    measured,
    produce,
    read_in_order,
)
from malamute_pack.broker.streams import NOTICE
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import PROJECT_ROOT
from malamute_pack.testing.netns import Host
from tests.support import skip_slow

RUN_KEYS = [
    "round",
    "scenario",
    "receiver",
    "n",
    "secs",
    "msgs_per_s",
    "delivered",
    "missing",
    "duplicates",
    "out_of_order",
    "notices",
    "udp_seen",
    "udp_dropped",
    "rcvbuf_errors",
    "loss_before_repair",
    "received",
    "written",
    "repaired",
    "repairs",
    "held",
    "shed",
    "lost",
    "repaired_fraction",
    "repairs_logged",
    "published",
    "queue_full",
    "sender_cpu_s",
    "receiver_cpu_s",
    "sender_tx_mb",
]
TABLE_HEADINGS = [
    "scenario",
    "receiver",
    "msgs/s",
    "delivered",
    "missing",
    "dups",
    "late",
    "notices",
    "udp in",
    "dropped",
    "loss before repair",
    "repaired",
    "repaired fraction",
    "A cpu s",
    "broker cpu s",
    "A sent MB",
]

IPTABLES_LISTING = """\
Chain INPUT (policy ACCEPT 0 packets, 0 bytes)
    pkts      bytes target     prot opt in     out     source               destination
   20225  4580000            17   --  eth0   *       0.0.0.0/0            0.0.0.0/0
     212    48000 DROP       17   --  eth0   *       0.0.0.0/0            0.0.0.0/0   \
         statistic mode random probability 0.00999999978
"""

SNMP = """\
Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 100
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors
Udp: 20013 0 3 12 3 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors
UdpLite: 0 0 0 0 0 0
"""

DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop
    lo:     100       2    0    0    0     0          0         0      100       2    0    0
  eth0: 5000000   40000    0    0    0     0          0         0 22400000   20300    0    0
"""


def _delivery(
    scenario: str = NO_LOSS,
    receiver: str = "B",
    *,
    round: int = 1,
    n: int = 1000,
    secs: float = 0.01,
    delivered: int = 1000,
    seen: int = 500,
    dropped: int = 0,
    bridge: dict[str, int] | None = None,
) -> Delivery:
    return Delivery(
        round=round,
        scenario=scenario,
        receiver=receiver,
        n=n,
        secs=secs,
        delivered=delivered,
        duplicates=0,
        out_of_order=0,
        notices=0,
        udp_seen=seen,
        udp_dropped=dropped,
        rcvbuf_errors=0,
        bridge=bridge,
        repairs_logged=0,
        sender={"published": n, "full": 0},
        sender_cpu_s=1.5,
        sender_tx_bytes=2_000_000,
        receiver_cpu_s=1.25,
    )


class OptionsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        """100,000 records, one round, a 1,000,000 kbit/s rate and 1% loss by default."""
        options = parse([])
        self.assertEqual(
            (options.messages, options.rounds, options.bridge_rate, options.loss),
            (DEFAULT_MESSAGES, DEFAULT_ROUNDS, DEFAULT_RATE_KBPS, DEFAULT_LOSS_PERCENT),
        )
        self.assertEqual((DEFAULT_MESSAGES, DEFAULT_ROUNDS, DEFAULT_RATE_KBPS), (100_000, 1, 10**6))
        self.assertIsNone(options.directory)

    def test_refused(self) -> None:
        """Counts below 1, a loss outside (0, 100) and a non-positive idle time are refused."""
        for argv in (
            ["--messages", "0"],
            ["--rounds", "0"],
            ["--bridge-rate", "0"],
            ["--loss", "0"],
            ["--loss", "100"],
            ["--idle", "0"],
        ):
            with (
                contextlib.redirect_stderr(io.StringIO()),
                self.assertRaises(SystemExit, msg=argv),
            ):
                parse(argv)

    def test_dispatched(self) -> None:
        """C{python -m malamute_pack.bench multicast} reaches this command's options."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.assertRaises(SystemExit) as raised:
            bench_main(["multicast", "--help"])
        self.assertEqual(raised.exception.code, 0)
        self.assertIn("python -m malamute_pack.bench multicast", out.getvalue())
        self.assertIn("--bridge-rate", out.getvalue())


class BrokerOptionTests(SynchronousTestCase):
    def test_bridgeArguments(self) -> None:
        """A publishes the stream on the group at the rate; B and C receive it into theirs."""
        url = group_url("eth0")
        self.assertEqual(url, "epgm://eth0;239.192.62.1:5555")
        self.assertEqual(
            outbound_arguments("bench", url, 500),
            ["--bridge-out", f"bench={url}", "--bridge-rate", "500"],
        )
        self.assertEqual(inbound_arguments(url, "bench"), ["--bridge-in", f"{url}=bench"])

    def test_status(self) -> None:
        """The last status line of a log is read, JSON or a dict's repr; none gives None."""
        log = (
            '2026 [x#info] multicast bridge status: {"inbound": [{"written": 1}]}\n'
            "2026 [x#info] something else\n"
            "2026 [x#info] multicast bridge status: "
            '{"outbound": [], "inbound": [{"url": "u", "flows": {}, "written": 90,'
            ' "repaired": 9, "held": 2, "paused": true}]}\n'
        )
        status = bridge_status(log)
        self.assertEqual(inbound_counters(status), {"written": 90, "repaired": 9, "held": 2})
        self.assertEqual(
            bridge_status("[x] multicast bridge status: {'inbound': [{'written': 3}]}"),
            {"inbound": [{"written": 3}]},
        )
        self.assertIsNone(bridge_status("Main loop terminated.\n"))
        self.assertIsNone(bridge_status("multicast bridge status: {not json\n"))
        self.assertIsNone(inbound_counters(None))
        self.assertIsNone(inbound_counters({"inbound": []}))

    def test_repairsStarted(self) -> None:
        """Each "lost records after N: repair from" line is one repair started."""
        line = "[i#info] <bridge>: 68AB 'bench' lost records after {}: repair from tcp://h:1\n"
        self.assertEqual(repairs_started(line.format(10) + "other\n" + line.format(900)), 2)
        self.assertEqual(repairs_started(""), 0)


class CounterTests(SynchronousTestCase):
    def test_rulePackets(self) -> None:
        """The packet counter of each rule is read in order, headings skipped."""
        self.assertEqual(rule_packets(IPTABLES_LISTING), [20225, 212])

    def test_filterRules(self) -> None:
        """A counting rule for UDP on the interface, then the random drop if asked."""
        host = Host("mpbh3", "10.77.62.3")
        self.assertEqual(UdpFilter(host, None).rules(), [["-i", "eth0", "-p", "udp"]])
        rules = UdpFilter(host, 0.01).rules()
        self.assertEqual(rules[0], ["-i", "eth0", "-p", "udp"])
        self.assertEqual(
            rules[1],
            [
                "-i",
                "eth0",
                "-p",
                "udp",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                "0.010000",
                "-j",
                "DROP",
            ],
        )
        for probability in (0.0, 1.0):
            with self.assertRaises(ValueError):
                UdpFilter(host, probability)

    def test_snmp(self) -> None:
        """The UDP counters are read by name from /proc/net/snmp's text."""
        udp = parse_snmp(SNMP)
        self.assertEqual((udp["InDatagrams"], udp["RcvbufErrors"]), (20013, 3))

    def test_dev(self) -> None:
        """An interface's transmitted bytes are read from /proc/net/dev's text."""
        self.assertEqual(parse_dev_tx(DEV, "eth0"), 22_400_000)
        self.assertEqual(parse_dev_tx(DEV, "lo"), 100)


class FigureTests(SynchronousTestCase):
    def test_delivery(self) -> None:
        """Rate, missing records, loss before repair and the repaired fraction of one receiver."""
        delivery = _delivery(
            secs=0.5,
            delivered=990,
            seen=400,
            dropped=4,
            bridge={"written": 991, "repaired": 99, "received": 900},
        )
        self.assertEqual(delivery.msgs_per_s, 1980)
        self.assertEqual(delivery.missing, 10)
        self.assertEqual(delivery.loss_before_repair, 0.01)
        self.assertAlmostEqual(delivery.repaired_fraction or 0, 99 / 991)
        kind, *fields = delivery.line().split()
        self.assertEqual(kind, "multicast_run")
        self.assertEqual([field.split("=")[0] for field in fields], RUN_KEYS)
        figures = delivery.figures()
        self.assertEqual(figures["repaired_fraction"], "0.09990")
        self.assertEqual(figures["shed"], "-")

    def test_unknowns(self) -> None:
        """With no status line and no packets seen, the derived fractions are unknown ("-")."""
        delivery = _delivery(secs=0.0, seen=0)
        self.assertEqual(delivery.msgs_per_s, 0)
        self.assertIsNone(delivery.loss_before_repair)
        self.assertIsNone(delivery.repaired_fraction)
        self.assertEqual(delivery.figures()["loss_before_repair"], "-")
        self.assertEqual(delivery.figures()["written"], "-")

    def test_table(self) -> None:
        """One row per scenario and receiver: medians over rounds, missing records summed."""
        lossy = loss_scenario(1.0)
        self.assertEqual(lossy, "loss_1pct")
        result = MulticastResult(1.0)
        for round, secs in ((1, 0.01), (2, 0.02), (3, 0.04)):
            result.runs += [
                _delivery(NO_LOSS, "B", round=round, secs=secs),
                _delivery(NO_LOSS, "C", round=round, secs=secs),
                _delivery(lossy, "B", round=round, secs=secs),
                _delivery(lossy, "C", round=round, secs=secs, delivered=998, dropped=5),
            ]
        heading, *rows = result.table()
        self.assertEqual([h.strip() for h in heading.split("  ") if h.strip()], TABLE_HEADINGS)
        self.assertEqual(
            [row.split()[:2] for row in rows],
            [[NO_LOSS, "B"], [NO_LOSS, "C"], [lossy, "B"], [lossy, "C"]],
        )
        cells = rows[3].split()
        self.assertEqual(cells[2:5], ["49900", "998", "6"])  # median rate; missing summed
        self.assertEqual(cells[10], "1.000%")
        self.assertEqual(cells[12], "-")  # no status line: no repaired fraction
        self.assertEqual(len({len(line) for line in [heading, *rows[:1]]}), 1)

    def test_goal(self) -> None:
        """The goal is met by the lossy runs' median rate and no record missing."""
        lossy = loss_scenario(1.0)
        fast = 1000 / (GOAL_RATE + 1000)
        met = MulticastResult(1.0, [_delivery(lossy, name, secs=fast) for name in "BC"])
        self.assertTrue(met.goal().endswith(": met"), met.goal())
        slow = MulticastResult(
            1.0,
            [_delivery(lossy, "B", secs=fast), _delivery(lossy, "C", secs=1.0, delivered=999)],
        )
        self.assertTrue(slow.goal().endswith("NOT met (C 999 msgs/s; C 1 missing)"), slow.goal())
        self.assertTrue(MulticastResult(1.0).goal().endswith(": not measured"))


class RoleTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)
        self.router = self.context.socket(zmq.ROUTER)
        self.addCleanup(self.router.close, 0)
        self.router.setsockopt(zmq.RCVTIMEO, 5000)
        self.router.bind("tcp://127.0.0.1:*")
        endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.link = load.Link(endpoint, ping_interval=0.2)
        self.addCleanup(self.link.context.term)
        self.addCleanup(self.link.socket.close, 0)

    def test_payload(self) -> None:
        """A record's payload is 100 bytes that carry its number; other content carries none."""
        self.assertEqual(len(payload(12345)), 100)
        self.assertEqual(index_of(payload(12345)), 12345)
        self.assertIsNone(index_of(b"x" * 100))
        self.assertIsNone(index_of(b"12"))

    def test_produce(self) -> None:
        """The producer sends records 0..n-1 in order, each with the role's header."""
        role = measured(("B",)).roles[-1]
        self.assertEqual(role.name, PRODUCER)
        report = produce(self.link, role, load.Job(5))
        self.assertEqual(report.sent, 5)
        self.assertIsNotNone(report.first_send)
        for i in range(5):
            _, header, content = self.router.recv_multipart()
            self.assertEqual(header, role.frames[0])
            self.assertEqual(index_of(content), i)

    def test_readInOrder(self) -> None:
        """The reader counts distinct records, duplicates, late ones and gap notices."""
        self.link.socket.send(b"hello")  # the router learns the reader's identity
        identity = self.router.recv_multipart()[0]

        def deliver(subject: str, content: bytes) -> None:
            message = mlm.StreamDeliver("bench", "producer", subject, [content])
            self.router.send_multipart([identity, *mlm.encode(message)])

        for number in (0, 1, 1, 3):
            deliver("bench", payload(number))
        deliver(NOTICE, b'{"first": 5, "last": 6}')
        deliver("warmup", b"x" * 100)
        deliver("bench", payload(2))
        report = read_in_order(self.link, measured(("B",)).roles[0], load.Job(4, idle=5.0))
        self.assertEqual(
            (report.received, report.duplicates, report.out_of_order),
            (4, 1, 1),
        )
        self.assertEqual((report.notices, report.others), (1, 1))
        self.assertIsNotNone(report.last_receipt)

    def test_readerGivesUp(self) -> None:
        """A reader reports what it has after the idle time without a record."""
        report = read_in_order(self.link, measured(("B",)).roles[0], load.Job(3, idle=0.2))
        self.assertEqual(report.received, 0)
        self.assertIsNone(report.last_receipt)

    def test_hostContext(self) -> None:
        """Each role runs in its host's namespace with its own broker's endpoint."""
        context = HostContext(
            {"B": "mpbh2", PRODUCER: "mpbh1"}, {"B": "ipc://@/b", PRODUCER: "tcp://a"}
        )
        role = measured(("B",)).roles[0]
        job = load.Job(1)
        process = context.Process(load.run_role, (role, "ignored", job, None))
        self.assertEqual(process.netns, "mpbh2")
        self.assertEqual(process.args, (role, "ipc://@/b", job, None))
        stranger = load.Role("Z", load.count)
        with self.assertRaises(ValueError):
            context.Process(load.run_role, (stranger, "ignored", job, None))


class CommandTests(SynchronousTestCase):
    skip = skip_slow

    def test_smallRun(self) -> None:
        """
        A run of 2,000 records prints a run line per scenario and receiver,
        a table with a row each, and the goal line.
        """
        reason = unavailable()
        if reason is not None:
            raise SkipTest(reason)
        done = subprocess.run(
            [sys.executable, "-m", "malamute_pack.bench", "multicast", "--messages", "2000"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.splitlines()
        runs = [line.split() for line in lines if line.startswith("multicast_run ")]
        self.assertEqual(len(runs), 4, done.stdout)
        lossy = loss_scenario(1.0)
        seen = []
        for run in runs:
            figures = dict(field.split("=", 1) for field in run[1:])
            self.assertEqual(list(figures), RUN_KEYS)
            seen.append((figures["scenario"], figures["receiver"]))
            self.assertEqual(figures["n"], "2000")
            self.assertGreater(float(figures["msgs_per_s"]), 0)
            self.assertEqual(int(figures["delivered"]) + int(figures["missing"]), 2000)
        self.assertEqual(seen, [(NO_LOSS, "B"), (NO_LOSS, "C"), (lossy, "B"), (lossy, "C")])
        start = next(i for i, line in enumerate(lines) if line.startswith("scenario "))
        table = lines[start : start + 5]
        self.assertEqual([row.split()[:2] for row in table[1:]], [list(s) for s in seen])
        self.assertTrue(lines[start + 5].startswith("multicast_goal at 1% loss"), lines)
