"""
System tests of packs: three real brokers, each in a network namespace of
its own joined by a bridge (one host each), federated with ZRE beacons (or
gossip only), and clients (L{tests.pack_agent}) on those hosts. What
``docs/pack.md`` promises, checked end to end: stream fan-out exactly once,
credit and replay on a remote reader's broker, letters to an address on
another host or on none yet, service requests served on another host,
a broker SIGKILLed under load and a broker restarted. And the agent
itself, against one broker process: it pings only once open.

Needs root and iproute2 (skipped otherwise), and is slow
(C{MALAMUTE_SKIP_SLOW=1} skips it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from time import monotonic, sleep
from typing import Any, ClassVar

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import BrokerProcess
from tests.pack_agent import PING_INTERVAL, Agent
from tests.pack_system_support import PackCase, joined, left
from tests.support import skip_slow

Event = dict[str, Any]


def subjects(events: Sequence[Event], prefix: str) -> list[str]:
    """The subjects of C{events} that start with C{prefix}, in order."""
    return [e["s"] for e in events if e.get("s", "").startswith(prefix)]


def tally(got: Sequence[str], expected: Sequence[str]) -> tuple[int, list[str], list[str]]:
    """Duplicates, missing and unexpected subjects of C{got} against C{expected}."""
    counts = Counter(got)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    missing = [s for s in expected if s not in counts]
    wanted = set(expected)
    unexpected = sorted(s for s in counts if s not in wanted)
    return duplicates, missing, unexpected


def numbered(prefix: str, count: int, width: int = 6) -> list[str]:
    """The subjects an agent's C{send} makes."""
    return [f"{prefix}{i:0{width}d}" for i in range(count)]


class AgentTests(SynchronousTestCase):
    """The pack tests' client (L{tests.pack_agent}) against one broker process."""

    skip = skip_slow

    def test_openAfterIdle(self) -> None:
        """
        An agent left idle longer than its ping interval before its test
        asks it to open (a loaded machine) has sent no ping, which the
        broker would answer ERROR before the open's OK: its CONNECTION_OPEN
        is answered OK. Once open it pings when idle, and the ping is no
        error (the next command's OK is the next reply).
        """
        with BrokerProcess(Path(self.mktemp())) as broker:
            agent = Agent(broker.endpoint)
            self.addCleanup(agent.context.destroy)
            agent._last_send -= PING_INTERVAL  # idle for a ping interval
            agent.tick()
            self.assertEqual(agent.op_open(version=2, address="idle"), {})
            idle_since = agent._last_send - PING_INTERVAL
            agent._last_send = idle_since
            agent.tick()
            self.assertGreater(agent._last_send, idle_since, "no ping once open")
            self.assertEqual(agent.op_write("idle-stream"), {})
            self.assertEqual(agent.events, [])


class PackStreamTests(PackCase):
    """Streams across a pack of three brokers with beacons."""

    LANS: ClassVar[dict[str, tuple[str, str]]] = {
        "test_fanOutExactlyOnce": ("mpf1", "10.77.31"),
        "test_slowRemoteReader": ("mpf2", "10.77.32"),
        "test_lateJoinerReplay": ("mpf3", "10.77.33"),
    }

    def test_fanOutExactlyOnce(self) -> None:
        """
        2000 messages written on h1 reach the matching readers on h2 and h3
        each exactly once and in order; a reader on h3 whose pattern
        matches none of them gets nothing.
        """
        writer = self.agent(1, "writer")
        reader2 = self.agent(2, "reader2")
        reader3 = self.agent(3, "reader3")
        other3 = self.agent(3, "other3")
        writer.call("open", address="writer")
        writer.call("write", stream="fan")
        for reader in (reader2, reader3):
            reader.call("open")
            reader.call("read", stream="fan", pattern="^(fan|probe)-")
        other3.call("open")
        other3.call("read", stream="fan", pattern="^nomatch-")
        self.open_route(writer, [reader2, reader3])

        started = monotonic()
        expected = numbered("fan-", 2000)
        writer.call("send", prefix="fan-", count=2000)
        report = []
        for reader in (reader2, reader3):
            got = reader.collect(count=2000, prefix="fan-", timeout=30.0)
            got += reader.collect(quiet=0.5, timeout=5.0)  # any late duplicate
            fan = subjects(got, "fan-")
            duplicates, missing, unexpected = tally(fan, expected)
            report.append((reader.name, len(fan), duplicates, len(missing), unexpected))
            self.assertEqual(
                (duplicates, missing[:10], len(missing), unexpected),
                (0, [], 0, []),
                f"{reader.name}: {len(fan)} received",
            )
            self.assertEqual(fan, expected, f"{reader.name}: out of order")
        elapsed = monotonic() - started
        nothing = other3.collect(quiet=1.0, timeout=3.0)
        self.assertEqual(nothing, [], "the non-matching reader on h3 got messages")
        print(f"\nfan-out: 2000 x 2 readers in {elapsed:.2f}s: {report}")

    def test_slowRemoteReader(self) -> None:
        """
        A version 2 reader on h2 that grants credit slowly (20 at a time)
        while h1 writes 1000 messages fast gets every one once, without a
        gap: its sequence numbers are consecutive.
        """
        writer = self.agent(1, "writer")
        reader = self.agent(2, "slow")
        writer.call("open")
        writer.call("write", stream="slow")
        reader.call("open", version=2)
        reader.call("credit", amount=20)
        reader.call("pace", batch=20, delay=0.02)
        reader.call("read", stream="slow", pattern="")
        self.open_route(writer, [reader])
        started = monotonic()
        writer.call("send", prefix="slow-", count=1000)
        got = reader.collect(["stream", "gap"], count=1000, prefix="slow-", timeout=40.0)
        got += reader.collect(["stream", "gap"], quiet=0.5, timeout=5.0)
        elapsed = monotonic() - started
        gaps = [e for e in got if e["k"] == "gap"]
        self.assertEqual(gaps, [])
        expected = numbered("slow-", 1000)
        slow = subjects(got, "slow-")
        duplicates, missing, unexpected = tally(slow, expected)
        self.assertEqual((duplicates, len(missing), unexpected), (0, 0, []), missing[:10])
        self.assertEqual(slow, expected)
        sequences = [e["q"] for e in got]
        self.assertEqual(
            sequences,
            list(range(sequences[0], sequences[0] + len(sequences))),
            "sequence numbers not consecutive",
        )
        print(f"\nslow reader: 1000 in {elapsed:.2f}s")

    def test_lateJoinerReplay(self) -> None:
        """
        A version 2 reader that joins on h3 after h1 wrote 100 messages
        (with no reader anywhere) and reads from the earliest gets those
        100, then the ones written after it joined, each once, in order.
        """
        writer = self.agent(1, "writer")
        writer.call("open")
        writer.call("write", stream="late")
        writer.call("send", prefix="early-", count=100)
        reader = self.agent(3, "late")
        reader.call("open", version=2)
        reader.call("read_from", stream="late", pattern="", whence=mlm.EARLIEST, position=0)
        early = reader.collect(count=100, prefix="early-", timeout=15.0)
        writer.call("send", prefix="live-", count=50)
        live = reader.collect(count=50, prefix="live-", timeout=15.0)
        live += reader.collect(quiet=0.5, timeout=5.0)
        got = subjects(early + live, "")
        expected = numbered("early-", 100) + numbered("live-", 50)
        duplicates, missing, unexpected = tally(got, expected)
        self.assertEqual(
            (duplicates, missing[:10], len(missing), unexpected), (0, [], 0, []), got[:20]
        )
        self.assertEqual(got, expected)
        sequences = [e["q"] for e in early + live]
        self.assertEqual(sequences, sorted(set(sequences)))


class PackLetterTests(PackCase):
    """Mailboxes and services across a pack of three brokers with beacons."""

    LANS: ClassVar[dict[str, tuple[str, str]]] = {
        "test_letterToAnotherHost": ("mpf4", "10.77.34"),
        "test_letterToLaterAddress": ("mpf5", "10.77.35"),
        "test_serviceOnAnotherHost": ("mpf6", "10.77.36"),
    }

    def test_letterToAnotherHost(self) -> None:
        """
        A letter sent on h1 (version 2: STORED 200) to an address whose
        client is connected to h2 reaches that client, once.
        """
        sender = self.agent(1, "sender")
        box = self.agent(2, "box")
        box.call("open", version=2, address="box-h2")
        sender.call("open", version=2, address="sender-h1")
        stored = sender.call(
            "post", kind="mailbox", address="box-h2", subjects=["hello"], wait="each"
        )["stored"]
        self.assertEqual([s[1] for s in stored], [mlm.SUCCESS], stored)
        got = box.collect(["mail"], count=1, timeout=15.0)
        got += box.collect(["mail"], quiet=0.5, timeout=3.0)
        self.assertEqual([(e["s"], e["from"]) for e in got], [("hello", "sender-h1")])

    def test_letterToLaterAddress(self) -> None:
        """
        Letters sent on h1 to an address connected nowhere are stored
        (STORED 200) and reach the client that then opens with that
        address on h3, each once.
        """
        sender = self.agent(1, "sender")
        sender.call("open", version=2, address="sender-h1")
        letters = [f"letter-{i}" for i in range(5)]
        stored = sender.call(
            "post", kind="mailbox", address="late-h3", subjects=letters, wait="all"
        )["stored"]
        self.assertEqual([s and s[1] for s in stored], [mlm.SUCCESS] * 5, stored)
        late = self.agent(3, "late")
        late.call("open", version=2, address="late-h3")
        got = late.collect(["mail"], count=5, timeout=15.0)
        got += late.collect(["mail"], quiet=0.5, timeout=3.0)
        self.assertEqual(sorted(subjects(got, "")), letters, got)

    def test_serviceOnAnotherHost(self) -> None:
        """
        Requests sent on h1 to a service offered only by a worker on h2
        are served there, and the worker's replies (MAILBOX_SEND to the
        requester's address) reach the requester on h1.
        """
        worker = self.agent(2, "worker")
        worker.call("open", version=2, address="worker-h2")
        worker.call("offer", service="echo", pattern=".*")
        worker.call("serve", reply=True, done=True)
        asker = self.agent(1, "asker")
        asker.call("open", version=2, address="asker-h1")
        jobs = [f"job-{i}" for i in range(5)]
        stored = asker.call("post", kind="service", address="echo", subjects=jobs, wait="all")[
            "stored"
        ]
        self.assertEqual([s and s[1] for s in stored], [mlm.SUCCESS] * 5, stored)
        replies = asker.collect(["mail"], count=5, timeout=15.0)
        replies += asker.collect(["mail"], quiet=0.5, timeout=3.0)
        self.assertEqual(sorted(subjects(replies, "")), [f"re:{j}" for j in jobs], replies)
        self.assertEqual({e["from"] for e in replies}, {"worker-h2"})
        served = worker.collect(["service"], quiet=0.2, timeout=3.0)
        self.assertEqual(sorted(subjects(served, "")), jobs)


class PackGossipTests(PackCase):
    """A pack that finds itself through zgossip only (no beacons)."""

    gossip = True
    LANS: ClassVar[dict[str, tuple[str, str]]] = {
        "test_gossipFederates": ("mpf7", "10.77.37"),
    }

    def test_gossipFederates(self) -> None:
        """
        Brokers with beacons off (h1 serving zgossip, h2 and h3 its
        clients, each with its own peer endpoint) federate, and stream
        messages written on h1 reach readers on h2 and h3 once each.
        """
        for broker in self.brokers:
            self.assertNotIn("beacon", " ".join(broker.args))
        writer = self.agent(1, "writer")
        readers = [self.agent(2, "reader2"), self.agent(3, "reader3")]
        writer.call("open")
        writer.call("write", stream="gossip")
        for reader in readers:
            reader.call("open")
            reader.call("read", stream="gossip", pattern="")
        self.open_route(writer, readers)
        writer.call("send", prefix="g-", count=100)
        for reader in readers:
            got = reader.collect(count=100, prefix="g-", timeout=15.0)
            got += reader.collect(quiet=0.3, timeout=3.0)
            self.assertEqual(subjects(got, "g-"), numbered("g-", 100), reader.name)
        print(f"\ngossip pack federated in {self.setup_seconds:.2f}s (from the first start)")


class PackFailureTests(PackCase):
    """
    Brokers that die or restart. ZRE's expiry is cut to 3 s (the pack's
    C{expired} config key) so that a killed broker is expired within the
    test's time.
    """

    expired_ms = 3000
    LANS: ClassVar[dict[str, tuple[str, str]]] = {
        "test_sigkillUnderLoad": ("mpf8", "10.77.38"),
        "test_restartResumesForwarding": ("mpf9", "10.77.39"),
    }

    def test_sigkillUnderLoad(self) -> None:
        """
        Service requests sent from h1 one after the other (each once it is
        STORED 200) to "work", offered by version 2 workers on h2 and h3;
        the broker of h2 is SIGKILLed half way. The others expire it, and
        every request STORED 200 is served: by h2's worker before the kill
        or by h3's afterwards (none lost; redeliveries counted).
        """
        # Each request held 20 ms: h2's worker most likely holds one at the kill.
        workers, asker = self.workers_and_asker("asker-h1")
        jobs = [f"job-{i:04d}" for i in range(200)]
        started = monotonic()
        asker.send(
            "post",
            kind="service",
            address="work",
            subjects=jobs,
            wait="each",
            stored_timeout=10.0,
            interval=0.01,
        )
        sleep(1.0)
        self.broker(2).kill()
        killed_at = monotonic() - started
        # The asker goes on sending meanwhile (it answers once all are sent).
        expired_in = self.wait_logs(
            [(1, left("h2"), 1), (3, left("h2"), 1)], 20.0, "h2 was not expired"
        )
        posted = asker.answer(timeout=60.0)
        stored = posted["stored"]
        sent_for = monotonic() - started
        confirmed = [job for job, s in zip(jobs, stored, strict=True) if s and s[1] == mlm.SUCCESS]
        not_stored = [(job, s) for job, s in zip(jobs, stored, strict=True) if not s or s[1] != 200]
        served: dict[str, list[str]] = {}
        for worker in workers:
            served[worker.name] = []

        def all_served() -> bool:
            for worker in workers:
                got = worker.collect(["service"], quiet=0.0, timeout=0.2)
                served[worker.name] += subjects(got, "job-")
            union = set(served["worker2"]) | set(served["worker3"])
            return all(job in union for job in confirmed)

        try:
            self.wait_until(all_served, 30.0, "requests served after the kill")
        finally:
            everything = served["worker2"] + served["worker3"]
            duplicates = sum(n - 1 for n in Counter(everything).values() if n > 1)
            union = set(everything)
            lost = [job for job in confirmed if job not in union]
            print(
                f"\nkill -9 under load: h2 killed at {killed_at:.1f}s, sending took"
                f" {sent_for:.1f}s, {len(confirmed)} STORED 200 (slowest"
                f" {posted['slowest']:.2f}s), {len(not_stored)} not,"
                f" expired after {expired_in:.1f}s; served by h2's worker"
                f" {len(served['worker2'])}, by h3's {len(served['worker3'])},"
                f" duplicates {duplicates}, lost {len(lost)} {lost[:10]}"
            )
        self.assertEqual(not_stored, [], "h1 refused or did not store requests")
        self.assertEqual(lost, [])

    def test_restartResumesForwarding(self) -> None:
        """
        h2 stops cleanly: the others see it leave at once, and see it join
        again when it starts on the same data directory. Messages h1 wrote
        while it was down reach a reader on h2 that reads from the
        sequence number after the last one it had: none missing, none
        twice, consecutive, then live ones.
        """
        writer = self.agent(1, "writer")
        writer.call("open")
        writer.call("write", stream="resume")
        before = self.agent(2, "before")
        before.call("open", version=2)
        before.call("read", stream="resume", pattern="")
        self.open_route(writer, [before])
        writer.call("send", prefix="up-", count=100)
        got = before.collect(count=100, prefix="up-", timeout=15.0)
        got += before.collect(quiet=0.3, timeout=3.0)
        self.assertEqual(subjects(got, "up-"), numbered("up-", 100))
        last = max(e["q"] for e in got)
        before.kill()

        self.broker(2).stop()
        self.wait_logs([(1, left("h2"), 1), (3, left("h2"), 1)], 5.0, "h2's GOODBYE")
        writer.call("send", prefix="down-", count=200)
        sleep(0.5)
        self.broker(2).start()
        rejoined = [(1, joined("h2"), 2), (3, joined("h2"), 2)]
        self.wait_logs(
            [*rejoined, (2, joined("h1"), 1), (2, joined("h3"), 1)],
            20.0,
            "h2 did not rejoin",
        )
        after = self.agent(2, "after")
        after.call("open", version=2)
        after.call("read_from", stream="resume", pattern="", whence=mlm.SEQUENCE, position=last + 1)
        down = after.collect(count=200, prefix="down-", timeout=15.0)
        writer.call("send", prefix="again-", count=50)
        again = after.collect(count=50, prefix="again-", timeout=15.0)
        again += after.collect(quiet=0.5, timeout=3.0)
        events = down + again
        got_subjects = [s for s in subjects(events, "") if not s.startswith("probe-")]
        expected = numbered("down-", 200) + numbered("again-", 50)
        duplicates, missing, unexpected = tally(got_subjects, expected)
        self.assertEqual(
            (duplicates, missing[:10], len(missing), unexpected),
            (0, [], 0, []),
            f"{len(got_subjects)} received; first {got_subjects[:5]}",
        )
        self.assertEqual(got_subjects, expected)
        sequences = [e["q"] for e in events]
        self.assertEqual(sequences[0], last + 1, "the first after the restart")
        self.assertEqual(sequences, list(range(last + 1, last + 1 + len(sequences))))
