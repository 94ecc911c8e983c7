"""
The soak's checker (L{soak.checker}) on hand-made histories: each kind of
violation is found and named with the operations involved, and legal
histories pass, the tricky ones included (an append that timed out and
was found written, a letter delivered twice, a redelivery of what was not
yet acknowledged, a damaged journal that its broker alone reported). Also
the bodies the soak's clients write (L{soak.records}), the history's
format (L{soak.history}) and the memory figures (L{soak.memory}).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from soak import history, records
from soak.checker import (
    AGAIN,
    ALONE,
    JOURNAL,
    PAIR,
    REDELIVERED,
    Report,
    Result,
    Rules,
    Sample,
    check,
)
from soak.history import FAIL, INFO, INVOKE, OK, Event
from soak.memory import figures

MIB = 2**20
STREAM = "orders"


class History:
    """Builds a history: each call adds events at the next times."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.time = 0.0
        self.serial = 0

    def at(self, time: float) -> History:
        self.time = time
        return self

    def _add(self, process: str, type_: str, f: str, op: str, value: dict[str, Any]) -> None:
        self.time += 0.01
        self.events.append(Event(self.time, process, type_, f, op, value))

    def _op(self, process: str) -> str:
        self.serial += 1
        return f"{process}:{self.serial}"

    # Appends

    def append(
        self,
        n: int,
        first: int | None,
        *,
        count: int = 2,
        store: str = "pair",
        outcome: str = OK,
        dup: bool = False,
        process: str = "a1",
    ) -> str:
        """Append key n of process C{process} (C{count} records); its op id."""
        op = self._op(process)
        recs = [[records.append_rid(process, n, j), f"{process}.s{j % 2}"] for j in range(count)]
        value = {"store": store, "stream": STREAM, "key": f"{process}-{n}", "records": recs}
        self._add(process, INVOKE, "append", op, value)
        if outcome == OK:
            assert first is not None
            answer = {"first": first, "last": first + count - 1, "dup": dup}
            self._add(process, OK, "append", op, answer)
        elif outcome == FAIL:
            self._add(process, FAIL, "append", op, {"error": "300", "code": 300})
        elif outcome == INFO:
            self._add(process, INFO, "append", op, {"error": "timeout"})
        return op

    @staticmethod
    def row(rid: str, seq: int, subject: str | None = None) -> list[Any]:
        subject = subject or f"{rid.rsplit('.', 2)[0]}.s{int(rid.rsplit('.', 1)[1]) % 2}"
        return [seq, subject, records.text_of(records.body(rid, subject))]

    def final(self, rows: list[list[Any]], store: str = "pair") -> str:
        op = self._op("final")
        value = {"store": store, "stream": STREAM, "rows": rows}
        self._add("final", OK, "final-read", op, value)
        return op

    def final_gap(self, store: str, missed: int, available: int) -> str:
        op = self._op("final")
        value = {"store": store, "stream": STREAM, "rows": [], "gaps": [[missed, available]]}
        self._add("final", OK, "final-read", op, value)
        return op

    def gap(self, missed: int, available: int, consumer: str = "c1", store: str = "h1") -> None:
        op = self._op(consumer)
        value: dict[str, Any] = {"store": store, "stream": STREAM, "consumer": consumer}
        value.update(group="", missed=missed, available=available)
        self._add(consumer, OK, "gap", op, value)

    def final_refused(self, store: str, code: int = 502) -> None:
        value = {"store": store, "stream": STREAM, "error": "read failed", "code": code}
        self._add("final", FAIL, "final-read", self._op("final"), value)

    # Letters and requests

    def send(self, rid: str, outcome: str = OK, f: str = "send", store: str = "pair") -> str:
        op = self._op("m1")
        value = {"store": store, "to": "box1", "rid": rid, "subject": "s", "via": [store]}
        self._add("m1", INVOKE, f, op, value)
        result: dict[str, dict[str, Any]] = {
            OK: {"id": 7},
            FAIL: {"error": "full", "code": 300},
            INFO: {"error": "gone"},
        }
        self._add("m1", outcome, f, op, result[outcome])
        return op

    def deliver(self, rid: str, f: str = "letter", damaged: bool = False) -> str:
        body = records.body(rid, "s")
        if damaged:
            body = body[:-1] + b"!"
        op = self._op("box1")
        value = {"store": "pair", "id": 7, "subject": "s", "body": records.text_of(body)}
        self._add("box1", OK, f, op, value)
        return op

    # Readers and groups

    def consumed(self, rid: str, seq: int, consumer: str = "c1", store: str = "pair") -> str:
        op = self._op(consumer)
        subject = f"{rid.rsplit('.', 2)[0]}.s{int(rid.rsplit('.', 1)[1]) % 2}"
        value = {
            "store": store,
            "stream": STREAM,
            "consumer": consumer,
            "seq": seq,
            "subject": subject,
            "body": records.text_of(records.body(rid, subject)),
        }
        self._add(consumer, OK, "consumed", op, value)
        return op

    def commit(self, seq: int, position: int | None, consumer: str = "c1") -> str:
        op = self._op(consumer)
        value = {"store": "pair", "stream": STREAM, "consumer": consumer, "group": "", "seq": seq}
        self._add(consumer, INVOKE, "commit", op, value)
        if position is None:
            self._add(consumer, FAIL, "commit", op, {"error": "300", "code": 300})
        else:
            self._add(consumer, OK, "commit", op, {"position": position})
        return op

    def member(self, member: str, rid: str, seq: int, commit: bool | None = True) -> str:
        """A delivery to C{member}, and its commit (acknowledged, refused with None... or not)."""
        op = self._op(member)
        subject = f"{rid.rsplit('.', 2)[0]}.s{int(rid.rsplit('.', 1)[1]) % 2}"
        value = {
            "store": "pair",
            "stream": STREAM,
            "group": "g",
            "member": member,
            "seq": seq,
            "subject": subject,
            "body": records.text_of(records.body(rid, subject)),
        }
        self._add(member, OK, "member", op, value)
        if commit is not None:
            cop = self._op(member)
            asked = {"stream": STREAM, "group": "g", "member": member, "seq": seq, "rid": rid}
            self._add(member, INVOKE, "commit", cop, asked)
            if commit:
                self._add(member, OK, "commit", cop, {"position": seq})
            else:
                self._add(member, FAIL, "commit", cop, {"error": "300", "code": 300})
        return op


PAIR_RULES = Rules({"pair": PAIR}, {"broker": 512 * MIB, "client": 256 * MIB}, True)
ALONE_RULES = Rules({"h1": ALONE, "h2": ALONE}, {"broker": 512 * MIB}, False)


def run(h: History, rules: Rules = PAIR_RULES, **kwargs: Any) -> Result:
    return check(h.events, kwargs.get("reports", []), kwargs.get("samples", []), rules)


def rid(n: int, j: int = 0, process: str = "a1") -> str:
    return records.append_rid(process, n, j)


class RecordsTests(SynchronousTestCase):
    """What the clients' bodies carry."""

    def test_goodAndDamaged(self) -> None:
        """
        A body decodes to its id, good with its own subject; a flipped bit
        anywhere, or another subject, makes it bad; bytes that are not a
        body name no id.
        """
        data = records.body("a1.3.0", "a1.s1")
        self.assertEqual(records.decode(data, "a1.s1"), records.Decoded("a1.3.0", True))
        self.assertFalse(records.decode(data, "a1.s0").good)
        for i in range(len(data)):
            flipped = data[:i] + bytes([data[i] ^ 0x04]) + data[i + 1 :]
            self.assertFalse(records.decode(flipped, "a1.s1").good, i)
        self.assertEqual(records.decode(b"\xff\x00", "x"), records.Decoded(None, False))
        self.assertEqual(records.bytes_of(records.text_of(b"\xff\x00a")), b"\xff\x00a")

    def test_writeOrder(self) -> None:
        """An append record's id gives the order its writer wrote it in."""
        self.assertEqual(records.write_order("append1-h1.12.3"), (12, 3))
        earlier, later = records.write_order("a.2.9"), records.write_order("a.10.0")
        assert earlier is not None and later is not None
        self.assertLess(earlier, later)
        self.assertIsNone(records.write_order("m1.7"))


class HistoryTests(SynchronousTestCase):
    """The history's lines."""

    def test_recorderRoundTrip(self) -> None:
        """
        A recorder's invoke, completion and observation come back from
        their lines as they were written, with fresh op ids; L{history.ops}
        pairs each invoke with its end.
        """
        out = io.StringIO()
        recorder = history.Recorder(out, "p1", 0.0)
        op = recorder.invoke("append", {"key": "k"})
        recorder.complete(op, OK, "append", {"first": 1})
        recorder.observe("letter", {"id": 3})
        events = [history.parse(line) for line in out.getvalue().splitlines()]
        self.assertEqual([e.type for e in events], [INVOKE, OK, OK])
        self.assertEqual([e.op for e in events], ["p1:1", "p1:1", "p1:2"])
        self.assertEqual(events[1].value, {"first": 1})
        [(invoke, end)] = list(history.ops(events))
        self.assertEqual((invoke.op, end and end.type), ("p1:1", OK))
        self.assertRaises(ValueError, history.parse, '{"type": "other"}')

    def test_resumeAfterACrash(self) -> None:
        """
        A restarted client reads back what it wrote, its last line cut short
        removed from the file, and numbers its ops on from the last.
        """
        path = Path(self.mktemp())
        with path.open("w") as out:
            recorder = history.Recorder(out, "p1", 0.0)
            recorder.invoke("append", {"key": "p1-000001"})
            recorder.observe("letter", {"id": 3})
            out.write('{"time": 1.0, "process": "p1", "ty')
        before = history.resume(path)
        self.assertEqual([e.op for e in before], ["p1:1", "p1:2"])
        self.assertTrue(path.read_text().endswith("}\n"))
        last = max(history.op_number(e.op) for e in before)
        with path.open("a") as out:
            history.Recorder(out, "p1", 0.0, last).observe("letter", {"id": 4})
        self.assertEqual([e.op for e in history.read(path)], ["p1:1", "p1:2", "p1:3"])
        self.assertEqual(history.resume(Path(self.mktemp())), [])


class LegalHistoryTests(SynchronousTestCase):
    """Histories without a violation pass, the tricky legal cases included."""

    def assertPasses(self, result: Result) -> None:
        self.assertEqual([v.text for v in result.violations], [])

    def test_acknowledgedAndRead(self) -> None:
        """Appends acknowledged and read back at their numbers: no violation, counted."""
        h = History()
        h.append(1, 1)
        h.append(2, 3)
        h.final(
            [h.row(rid(1, 0), 1), h.row(rid(1, 1), 2), h.row(rid(2, 0), 3), h.row(rid(2, 1), 4)]
        )
        result = run(h)
        self.assertPasses(result)
        self.assertEqual(result.counts["appends acknowledged"], 2)
        self.assertEqual(result.counts["records acknowledged"], 4)

    def test_timedOutAppendFoundWritten(self) -> None:
        """
        An append that timed out (info), tried again under its key and
        answered 208 (already written) with the first attempt's numbers,
        is read back there once: legal. So is one that timed out and was
        never acknowledged, whether its records are there or not, and one
        refused (fail) and never written.
        """
        h = History()
        h.append(1, None, outcome=INFO)
        h.append(1, 1, dup=True)
        h.append(2, None, outcome=INFO)
        h.append(3, None, outcome=INFO)
        h.append(4, None, outcome=FAIL)
        rows = [h.row(rid(1, 0), 1), h.row(rid(1, 1), 2), h.row(rid(2, 0), 5), h.row(rid(2, 1), 6)]
        h.final(rows)
        result = run(h)
        self.assertPasses(result)
        self.assertEqual(result.counts["append answers 208 (already written)"], 1)
        self.assertEqual(result.counts["appends never acknowledged"], 3)

    def test_letterDeliveredTwice(self) -> None:
        """
        A letter acknowledged and delivered twice is legal (at least once);
        one whose send timed out (info) may be delivered or not; a refused
        one (fail) that is not delivered is legal too.
        """
        h = History()
        h.send("m1.1")
        h.deliver("m1.1")
        h.deliver("m1.1")
        h.send("m1.2", outcome=INFO)
        h.deliver("m1.2")
        h.send("m1.3", outcome=INFO)
        h.send("m1.4", outcome=FAIL)
        h.send("m1.5", f="request")
        h.deliver("m1.5", f="served")
        self.assertPasses(run(h))

    def test_readerRedeliveryOfUnacknowledged(self) -> None:
        """
        A reader delivered records again that it had not acknowledged (the
        commit was refused, or not made yet) is legal; positions that only
        go forward are legal.
        """
        h = History()
        h.append(1, 1)
        h.consumed(rid(1, 0), 1)
        h.consumed(rid(1, 1), 2)
        h.commit(1, 1)
        h.consumed(rid(1, 1), 2)
        h.commit(2, None)
        h.consumed(rid(1, 1), 2)
        h.commit(2, 2)
        h.commit(2, 2)
        h.final([h.row(rid(1, 0), 1), h.row(rid(1, 1), 2)])
        self.assertPasses(run(h))

    def test_groupRedeliveryOfUnacknowledged(self) -> None:
        """
        A group member that loses a record it had not acknowledged (its
        commit refused) to another member, which gets it again and
        acknowledges it, is legal; so is a member getting again, out of
        order, records it had itself and had not acknowledged.
        """
        h = History()
        h.append(1, 1)
        h.append(2, 3)
        h.member("m1", rid(1, 0), 1)
        h.member("m1", rid(2, 0), 3, commit=False)
        h.member("m2", rid(2, 0), 3)
        h.member("m1", rid(1, 1), 2, commit=None)
        h.member("m1", rid(2, 1), 4, commit=None)
        h.member("m1", rid(1, 1), 2)
        h.member("m1", rid(2, 1), 4)
        rows = [h.row(rid(n, j), 2 * n + j - 1) for n in (1, 2) for j in (0, 1)]
        h.final(rows)
        self.assertPasses(run(h))

    def test_journalRefusedAlone(self) -> None:
        """
        A broker alone that refused its damaged journal after acknowledging
        an append (and was started afresh) is excused for it, and what it
        numbers afresh may reuse the old numbers; an append acknowledged
        after that must be there.
        """
        h = History()
        h.append(1, 1, store="h1")
        h.send("m1.1", store="h1")
        h.at(10.0)
        h.append(2, 1, store="h1")
        h.final([h.row(rid(2, 0), 1), h.row(rid(2, 1), 2)], store="h1")
        report = Report(5.0, "h1", "h1", JOURNAL, "the broker cannot start: journal ...")
        result = run(h, ALONE_RULES, reports=[report])
        self.assertPasses(result)
        self.assertEqual(sorted({e.kind for e in result.excused}), ["append", "send"])

    def test_finalReadRefusedAlone(self) -> None:
        """A broker alone whose answer to the final read is an ERROR is excused for it."""
        h = History()
        h.append(1, 1, store="h1")
        h.final_refused("h1")
        result = run(h, ALONE_RULES)
        self.assertPasses(result)
        self.assertEqual([e.kind for e in result.excused], ["append", "append"])

    def test_gapReportedAlone(self) -> None:
        """
        A broker alone that answers the final read with a STREAM_GAP over an
        acknowledged append's numbers is excused for it; a reader told of a
        gap over numbers it never got is excused for them too.
        """
        h = History()
        h.append(1, 1, store="h1")
        h.consumed(rid(1, 0), 1, store="h1")
        h.gap(2, 3)
        h.final_gap("h1", 1, 3)
        result = run(h, ALONE_RULES)
        self.assertPasses(result)
        self.assertEqual([e.kind for e in result.excused], ["append", "append"])

    def test_memoryWithinBounds(self) -> None:
        """Samples under each kind's bound pass; the figures give start, end and largest."""
        samples = [
            Sample(0.0, "h1", "broker", 60 * MIB),
            Sample(5.0, "h1", "broker", 90 * MIB),
            Sample(9.0, "h1", "broker", 70 * MIB),
            Sample(1.0, "c1", "client", 40 * MIB),
        ]
        self.assertPasses(run(History(), samples=samples))
        self.assertEqual(
            figures(samples, "broker"),
            {"h1": {"start_mib": 60.0, "end_mib": 70.0, "max_mib": 90.0}},
        )


class ViolationTests(SynchronousTestCase):
    """Each kind of violation is found, named, with the ops involved."""

    def assertOne(self, result: Result, kind: str, *ops: str) -> str:
        kinds = [v.kind for v in result.violations]
        self.assertIn(kind, kinds, [v.text for v in result.violations])
        found = next(v for v in result.violations if v.kind == kind)
        for op in ops:
            self.assertIn(op, found.ops, found.text)
        return found.text

    def test_lostAppend(self) -> None:
        """An acknowledged append not at its numbers is lost, named by its op and key."""
        h = History()
        h.append(1, 1)
        lost = h.append(2, 3)
        h.final([h.row(rid(1, 0), 1), h.row(rid(1, 1), 2)])
        result = run(h)
        text = self.assertOne(result, "lost-append", lost)
        self.assertIn("a1-2", text)
        self.assertIn(f"{rid(2, 0)}@3 (nothing is there)", text)
        self.assertEqual(len(result.violations), 1)

    def test_lostAppendOnAPairDespiteReport(self) -> None:
        """A pair is never excused: the partner's copy must serve everything."""
        h = History()
        lost = h.append(1, 1)
        h.final([])
        report = Report(5.0, "h1", "pair", JOURNAL, "the broker cannot start")
        self.assertOne(run(h, reports=[report]), "lost-append", lost)

    def test_unreadable(self) -> None:
        """
        A pair whose final read is refused (ERROR 502) cannot serve what it
        acknowledged: one violation naming the error and the appends.
        """
        h = History()
        one = h.append(1, 1)
        two = h.append(2, 3)
        h.final_refused("pair")
        result = run(h)
        text = self.assertOne(result, "unreadable", one, two)
        self.assertIn("ERROR 502", text)
        self.assertIn("4 record(s) of 2 acknowledged append(s)", text)
        self.assertEqual([v.kind for v in result.violations], ["unreadable"])

    def test_gapOnAPair(self) -> None:
        """A pair that reports a gap over acknowledged records has lost them: never excused."""
        h = History()
        lost = h.append(1, 1)
        h.final_gap("pair", 1, 3)
        self.assertOne(run(h), "lost-append", lost)

    def test_lostBeforeTheReport(self) -> None:
        """A report excuses only what was acknowledged before it: after it, a loss is a loss."""
        h = History()
        h.at(10.0)
        lost = h.append(1, 1, store="h1")
        h.final([], store="h1")
        report = Report(5.0, "h1", "h1", JOURNAL, "the broker cannot start")
        self.assertOne(run(h, ALONE_RULES, reports=[report]), "lost-append", lost)

    def test_damagedServed(self) -> None:
        """
        A record read back with a bad body is damaged-served, even where a
        report would excuse its loss; so is a damaged letter delivered.
        """
        h = History()
        h.append(1, 1, count=1, store="h1")
        row = h.row(rid(1, 0), 1)
        row[2] = row[2][:-1] + "X"
        read = h.final([row], store="h1")
        report = Report(5.0, "h1", "h1", JOURNAL, "the broker cannot start")
        self.assertOne(run(h, ALONE_RULES, reports=[report]), "damaged-served", read)
        h = History()
        h.send("m1.1")
        bad = h.deliver("m1.1", damaged=True)
        self.assertOne(run(h), "damaged-served", bad)

    def test_seqReused(self) -> None:
        """A number a reader saw one record at, and the final read another, was given twice."""
        h = History()
        h.append(1, None, count=1, outcome=INFO)
        seen = h.consumed(rid(1, 0), 1)
        read = h.final([h.row(rid(2, 0), 1)])
        text = self.assertOne(run(h), "seq-reused", seen, read)
        self.assertIn("sequence number 1", text)

    def test_writtenTwiceAndAnswersDiffer(self) -> None:
        """
        One key's records found at two numbers, and one key acknowledged
        with two different ranges, are violations.
        """
        h = History()
        h.append(1, 1, count=1)
        h.append(1, 5, count=1, dup=True)
        read = h.final([h.row(rid(1, 0), 1), h.row(rid(1, 0), 5)])
        result = run(h)
        self.assertOne(result, "append-written-twice", read)
        self.assertOne(result, "append-answers-differ")

    def test_lostLetterAndRequest(self) -> None:
        """A letter or request STORED 200 and never delivered is lost."""
        h = History()
        letter = h.send("m1.1")
        request = h.send("m1.2", f="request")
        result = run(h)
        self.assertIn("m1.1", self.assertOne(result, "lost-letter", letter))
        self.assertIn("m1.2", self.assertOne(result, "lost-request", request))

    def test_unexpected(self) -> None:
        """A letter delivered that nobody sent is a violation."""
        h = History()
        op = h.deliver("x9.1")
        self.assertOne(run(h), "unexpected", op)

    def test_positionMovedBack(self) -> None:
        """A reader's acknowledged position that moves back is a violation."""
        h = History()
        first = h.commit(5, 5)
        later = h.commit(6, 3)
        self.assertOne(run(h), "position-moved-back", first, later)

    def test_readerRedeliveredAcknowledged(self) -> None:
        """A record at or below a reader's acknowledged position delivered again: a violation."""
        h = History()
        h.append(1, 1)
        h.consumed(rid(1, 0), 1)
        h.consumed(rid(1, 1), 2)
        acked = h.commit(2, 2)
        again = h.consumed(rid(1, 1), 2)
        h.final([h.row(rid(1, 0), 1), h.row(rid(1, 1), 2)])
        self.assertOne(run(h), "redelivered-acknowledged", acked, again)

    def test_consumerMissed(self) -> None:
        """A reader never delivered an acknowledged record of its stream missed it."""
        h = History()
        h.append(1, 1)
        h.consumed(rid(1, 0), 1)
        h.final([h.row(rid(1, 0), 1), h.row(rid(1, 1), 2)])
        text = self.assertOne(run(h), "consumer-missed")
        self.assertIn(rid(1, 1), text)

    def test_groupViolations(self) -> None:
        """
        A record acknowledged by two members, one delivered after it was
        acknowledged, a subject's records out of order at a member, and a
        record no member got, are each found.
        """
        h = History()
        h.append(1, 1)
        h.append(2, 3)
        h.append(3, 5)
        first = h.member("m1", rid(1, 0), 1)
        second = h.member("m2", rid(1, 0), 1)
        early = h.member("m1", rid(3, 1), 6)
        late = h.member("m1", rid(1, 1), 2)
        h.member("m2", rid(2, 0), 3)
        h.member("m2", rid(2, 1), 4)
        h.member("m2", rid(3, 0), 5)
        rows = [h.row(rid(n, j), 2 * n + j - 1) for n in (1, 2, 3) for j in (0, 1)]
        h.final(rows)
        result = run(h)
        self.assertIn("m1, m2", self.assertOne(result, "acknowledged-twice"))
        self.assertTrue(first)
        self.assertOne(result, "redelivered-acknowledged", second)
        text = self.assertOne(result, "group-order", early, late)
        self.assertIn(rid(3, 1), text)
        self.assertNotIn("group-missed", {v.kind for v in result.violations})
        h.append(4, 7, count=1)
        self.assertOne(run(h), "group-missed")

    def test_packGroupAtLeastOnce(self) -> None:
        """
        In a pack a group is at least once across changes of its home: a
        record acknowledged by two members, or delivered after it was
        acknowledged, is counted, not a violation; one no member got still is.
        """
        pack = Rules({"h1": ALONE, "h2": ALONE}, {"broker": 512 * MIB}, False, False)
        h = History()
        h.append(1, 1, store="h1")
        h.member("m1", rid(1, 0), 1)
        h.member("m2", rid(1, 0), 1)
        h.member("m1", rid(1, 1), 2)
        h.final([h.row(rid(1, 0), 1), h.row(rid(1, 1), 2)], store="h1")
        result = run(h, pack)
        self.assertEqual([v.text for v in result.violations], [])
        self.assertEqual(result.counts[AGAIN], 1)
        self.assertEqual(result.counts[REDELIVERED], 1)
        h.append(2, 3, count=1, store="h1")
        self.assertOne(run(h, pack), "group-missed")

    def test_packGroupRedeliveryOrderNotChecked(self) -> None:
        """
        In a pack, a record another member acknowledged, delivered again
        to a member after a later record of its subject (a new home resumed
        from before it), is counted as redelivered, not out of order; a
        record of the subject no member had acknowledged, delivered so,
        is out of order all the same.
        """
        pack = Rules({"h1": ALONE, "h2": ALONE}, {"broker": 512 * MIB}, False, False)
        h = History()
        h.append(1, 1, store="h1")
        h.append(2, 3, store="h1")
        h.member("m2", rid(1, 0), 1)
        h.member("m1", rid(2, 0), 3)
        h.member("m1", rid(1, 0), 1)
        h.member("m1", rid(1, 1), 2)
        h.member("m1", rid(2, 1), 4)
        rows = [h.row(rid(n, j), 2 * n + j - 1) for n in (1, 2) for j in (0, 1)]
        h.final(rows, store="h1")
        result = run(h, pack)
        self.assertEqual([v.text for v in result.violations], [])
        self.assertEqual(result.counts[REDELIVERED], 1)
        h = History()
        h.append(1, 1, store="h1")
        h.append(2, 3, store="h1")
        h.member("m1", rid(2, 0), 3)
        late = h.member("m1", rid(1, 0), 1)
        h.member("m1", rid(1, 1), 2)
        h.member("m1", rid(2, 1), 4)
        h.final(rows, store="h1")
        self.assertOne(run(h, pack), "group-order", late)

    def test_consumerOfAStoreStartedAfresh(self) -> None:
        """
        A consumer of a broker alone that was started afresh is a new
        consumer: it is not owed what was acknowledged before (its position
        went with the journal), but is owed what came after.
        """
        h = History()
        h.append(1, 1, store="h2")
        h.at(10.0)
        h.append(2, 3, store="h2")
        h.consumed(rid(2, 0), 1, store="h1")
        h.final([h.row(rid(n, j), 2 * n + j - 1) for n in (1, 2) for j in (0, 1)], store="h2")
        report = Report(5.0, "h1", "h1", JOURNAL, "the broker cannot start: journal ...")
        text = self.assertOne(run(h, ALONE_RULES, reports=[report]), "consumer-missed")
        self.assertIn(rid(2, 1), text)
        self.assertNotIn(rid(1, 0), text)

    def test_memoryOverBound(self) -> None:
        """A process past its kind's bound is a violation naming it."""
        samples = [Sample(3.0, "h1", "broker", 600 * MIB), Sample(4.0, "h1", "broker", 100 * MIB)]
        text = self.assertOne(run(History(), samples=samples), "memory")
        self.assertIn("h1 (broker) used 600 MiB", text)
