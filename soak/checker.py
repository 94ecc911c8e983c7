"""
The soak's checker: a pure function from a history (L{soak.history}: every
client operation and observation, the final reads included), what the
brokers reported they cannot serve, and the processes' memory samples, to
the violations it holds. No I/O: the same inputs give the same answer.

Stores, and what "acknowledged" means where
-------------------------------------------

A *store* is where an acknowledged write must be readable afterwards: a
broker alone (each broker of a pack, and the third broker of
C{pair-in-pack}) or a pair (its two brokers, one store: whichever is
active serves it). Every operation names its store in its C{value}.

- An append (STREAM_APPEND) is acknowledged by STREAM_APPENDED 200 or 208
  with its sequence numbers C{first}..C{last}: its records must be read
  back from that store's copy of the stream at those numbers, each with
  its own body (C{lost-append}, C{damaged-served}). An append to broker X
  of a pack lives in X's journal, at X's numbers; in a pair, in the pair's.
  All the answers one key got must name the same numbers
  (C{append-answers-differ}), and no record may be found at two numbers of
  one copy (C{append-written-twice}: the key made it idempotent). A store
  that cannot serve the stream at the end (its final read fails, and it is
  not a broker alone refusing it, below) is one violation for all it
  holds (C{unreadable}).
- A letter (MAILBOX_SEND) or a request (SERVICE_SEND) is acknowledged by
  STORED 200: it must be delivered (to the mailbox's owner, to a worker of
  the service) at least once by the end, with its body (C{lost-letter},
  C{lost-request}); more than once is allowed (at least once). Nothing is
  delivered that was never sent (C{unexpected}).
- No sequence number of a stream is given to two records in one store
  (C{seq-reused}), whoever saw them: an append's answer, a consumer's
  delivery, a group member's delivery (when the group lives in a known
  store: one store only), a final read.
- A durable reader's commit is acknowledged by STREAM_COMMITTED 200 with
  the position the broker made durable: those positions never move back
  (C{position-moved-back}); after one, no record at or below it is
  delivered to that consumer again (C{redelivered-acknowledged}); by the
  end it has been delivered every acknowledged record of its stream
  (C{consumer-missed}; in a pack its broker gets the others' records by
  forwarding); a consumer of a broker alone that was started afresh is a
  new consumer there, owed what was acknowledged from then on.
- A group member's commit of a record is acknowledged by STREAM_COMMITTED
  200: (in a topology of one store) no record is acknowledged by two
  members (C{acknowledged-twice}); none is delivered again, to any member,
  after it was acknowledged
  (C{redelivered-acknowledged}); at each member the records of each
  subject (each subject has one writer, L{soak.records}) first arrive in
  the order they were written (C{group-order}); by the end every
  acknowledged record of the stream was delivered to some member
  (C{group-missed}). A commit acknowledges the record it names; the
  others it may cover (sent before it) are not counted, so what is found
  is certain. In a pack a group is at least once across changes of its
  home (docs/pack.md): records acknowledged again, or delivered again
  after they were acknowledged, are counted (L{AGAIN}, L{REDELIVERED}) in
  the summary, not violations, and a record delivered again so is not
  checked for order (it was processed already).
- Whatever is served (delivered or read back) has the body that was
  written for its id and subject (C{damaged-served}), never excused.
- No process's resident memory passes its limit (C{memory}).

A damaged journal
-----------------

A pair's store is never excused: the partner's copy must serve everything.
A broker alone that reports damage is excused for what it says it cannot
serve, and only for that, in three ways:

- it refuses to start on its journal (its log: C{the broker cannot start:
  journal ...}) and is then started afresh by the soak on an empty journal
  (a I{journal} report): what it had acknowledged before that is excused
  (records, letters and requests held there), and from then on it is a new
  incarnation of the store (its numbers start again, its consumers'
  positions too);
- its answer to the final range read of a stream is an ERROR (a broker's
  refusal, not silence): the acknowledged records of that stream in that
  store are excused;
- it sends a STREAM_GAP (C{missed}, C{available}) for numbers of its copy,
  to the final range read or to a reader or member (the soak sets no
  retention, so a gap can only say that records are lost): the records
  at those numbers are excused (the journal's damage reporting,
  C{malamute_pack/journal/damage.py}, says so this way).

A record it serves with a bad body is never excused.

Tests: ``tests/unit/test_soak_checker.py``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from soak.history import FAIL, INFO, INVOKE, OK, Event, ops
from soak.records import Decoded, bytes_of, decode, write_order

PAIR: Final = "pair"
ALONE: Final = "alone"
# The scope of a report that the broker refused its whole journal.
JOURNAL: Final = "journal"

# In a pack (no exactly once across a group's home changes): group records
# acknowledged by a second member, and deliveries of acknowledged ones.
AGAIN: Final = "group records acknowledged again after a home change"
REDELIVERED: Final = "group deliveries of acknowledged records after a home change"

# Violations named in one run's summary at most, per kind (the count is exact).
DETAIL_LIMIT: Final = 50


@dataclass(frozen=True, slots=True)
class Report:
    """
    A broker saying what it cannot serve (see the module): C{scope} is
    L{JOURNAL} (it refused its journal at C{time} and was started afresh).
    """

    time: float
    broker: str
    store: str
    scope: str
    line: str


@dataclass(frozen=True, slots=True)
class Sample:
    """A process's resident memory at a time: C{kind} is C{broker} or C{client}."""

    time: float
    process: str
    kind: str
    rss: int


@dataclass(frozen=True, slots=True)
class Rules:
    """
    What the checker must know of the run: each store's kind (L{PAIR} or
    L{ALONE}), the memory limit of each kind of process (bytes), and
    whether group deliveries are numbered in a known store (the topology
    has one store), and whether a group promises exactly once (one store:
    a group's home never changes; in a pack a record acknowledged at a home
    that then left, or restarted, may be delivered again by the next home,
    as docs/pack.md says: counted, not a violation).
    """

    stores: Mapping[str, str]
    rss_limits: Mapping[str, int]
    numbered_groups: bool = False
    groups_exactly_once: bool = True


@dataclass(frozen=True, slots=True)
class Violation:
    """One violation: its kind, what it is, the op ids involved and their values."""

    kind: str
    text: str
    ops: tuple[str, ...] = ()
    values: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "ops": list(self.ops), "values": self.values}


@dataclass(frozen=True, slots=True)
class Excused:
    """Something acknowledged and not found that a broker's report excuses."""

    kind: str
    op: str
    reason: str


@dataclass
class Result:
    """The violations found, what was excused, and counts of what the history holds."""

    violations: list[Violation] = field(default_factory=list)
    excused: list[Excused] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(v.kind for v in self.violations))


class _Incarnations:
    """Which incarnation of a store an event belongs to (alone stores started afresh)."""

    def __init__(self, reports: Iterable[Report], stores: Mapping[str, str]) -> None:
        self._wipes: dict[str, list[float]] = defaultdict(list)
        for report in reports:
            if report.scope == JOURNAL and stores.get(report.store) == ALONE:
                self._wipes[report.store].append(report.time)
        for times in self._wipes.values():
            times.sort()

    def key(self, store: str, time: float) -> str:
        """The store's name, marked with its incarnation at C{time} (from the second on)."""
        n = bisect_right(self._wipes.get(store, []), time)
        return store if n == 0 else f"{store}#{n + 1}"

    def started(self, store: str) -> float:
        """When the store's last incarnation began (0: it was never started afresh)."""
        wipes = self._wipes.get(store)
        return wipes[-1] if wipes else 0.0

    def wiped_after(self, store: str, time: float) -> float | None:
        """When the store's journal was next refused after C{time}, if it was."""
        for t in self._wipes.get(store, []):
            if t > time:
                return t
        return None


@dataclass
class _Append:
    """Everything one append key saw: its attempts and their answers."""

    key: str
    store: str
    stream: str
    records: list[tuple[str, str]]
    invokes: list[Event] = field(default_factory=list)
    oks: list[Event] = field(default_factory=list)
    fails: int = 0
    unknown: int = 0


def _served(value: Mapping[str, Any]) -> Decoded:
    return decode(bytes_of(str(value.get("body", ""))), str(value.get("subject", "")))


class _Check:
    """One run of the checker over its inputs (see L{check})."""

    def __init__(
        self,
        events: Sequence[Event],
        reports: Sequence[Report],
        samples: Sequence[Sample],
        rules: Rules,
    ) -> None:
        self.events = events
        self.reports = reports
        self.samples = samples
        self.rules = rules
        self.result = Result()
        self.incarnations = _Incarnations(reports, rules.stores)
        self.kinds: Counter[str] = Counter()
        # (store incarnation, stream, seq) -> rid -> the op that saw it first.
        self.numbered: dict[tuple[str, str, int], dict[str, str]] = defaultdict(dict)
        self.damaged: set[tuple[str, str]] = set()
        self.sent: set[str] = set()  # every rid any client wrote or sent
        self.final: dict[tuple[str, str], dict[int, tuple[str, str]]] = {}
        self.final_ops: dict[tuple[str, str], Event] = {}
        self.final_refused: dict[tuple[str, str], str] = {}
        # Final reads that got no records: why, and the op.
        self.final_failed: dict[tuple[str, str], tuple[str, str]] = {}
        # (store, stream) -> the acknowledged records (and appends) that no
        # final read could look for: one violation each, not one per append.
        self.unread: dict[tuple[str, str], list[str]] = defaultdict(list)
        # What brokers alone said they cannot serve (STREAM_GAP, to a final
        # read or a reader): (store incarnation, stream) -> [missed, available).
        self.gaps: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
        # rids of acknowledged appends per stream, and those excused.
        self.acked_records: dict[str, dict[str, str]] = defaultdict(dict)
        self.acked_times: dict[str, float] = {}
        self.excused_rids: set[str] = set()

    # Helpers

    def violation(self, kind: str, text: str, op_ids: Iterable[str] = (), **values: Any) -> None:
        unique = tuple(dict.fromkeys(op_ids))
        self.result.violations.append(Violation(kind, text, unique, dict(values)))

    def excuse(self, kind: str, op: str, reason: str) -> None:
        self.result.excused.append(Excused(kind, op, reason))

    def saw_number(self, store: str, time: float, stream: str, seq: int, rid: str, op: str) -> None:
        self.numbered[(self.incarnations.key(store, time), stream, seq)].setdefault(rid, op)

    def served(self, event: Event, where: str) -> Decoded:
        """Decode a body served in C{event}; a bad one is a violation (once per place and id)."""
        decoded = _served(event.value)
        if not decoded.good:
            key = (where, decoded.rid or event.op)
            if key not in self.damaged:
                self.damaged.add(key)
                self.violation(
                    "damaged-served",
                    f"{where} was served a damaged record (id {decoded.rid!r}, subject "
                    f"{event.value.get('subject')!r}) at t={event.time:.3f}s: its body is not "
                    "what was written",
                    [event.op],
                    **{k: event.value.get(k) for k in ("store", "stream", "seq", "body")},
                )
        return decoded

    def gap(
        self, store: str, time: float, stream: str, missed: int, available: int, op: str
    ) -> None:
        """A broker said it cannot serve C{missed}..C{available} - 1 (kept for an alone store)."""
        if self.rules.stores.get(store) == ALONE and available > missed:
            self.gaps[(self.incarnations.key(store, time), stream)].append((missed, available, op))

    def in_gap(self, store: str, time: float, stream: str, seq: int) -> str | None:
        """The op of a gap an alone store reported over C{seq}, if any."""
        for missed, available, op in self.gaps.get(
            (self.incarnations.key(store, time), stream), []
        ):
            if missed <= seq < available:
                return op
        return None

    def gap_rids(self) -> set[str]:
        """The records at numbers an alone store reported it cannot serve."""
        rids: set[str] = set()
        for (store, stream, seq), found in self.numbered.items():
            for missed, available, _op in self.gaps.get((store, stream), []):
                if missed <= seq < available:
                    rids.update(found)
        return rids

    def excused_by_report(self, store: str, acked: float) -> Report | None:
        """The report of an alone store's journal refused after C{acked}, if any."""
        if self.rules.stores.get(store) != ALONE:
            return None
        for report in self.reports:
            if report.store == store and report.scope == JOURNAL and report.time > acked:
                return report
        return None

    # The rules

    def run(self) -> Result:
        self.collect_sent()
        self.final_reads()
        self.reported_gaps()
        self.appends()
        self.unreadable()
        self.letters("send", "letter", "lost-letter")
        self.letters("request", "served", "lost-request")
        self.readers()
        self.groups()
        self.numbers()
        self.memory()
        self.result.counts = dict(sorted(self.kinds.items()))
        return self.result

    def collect_sent(self) -> None:
        for event in self.events:
            if event.type != INVOKE:
                continue
            if event.f == "append":
                self.sent.update(rid for rid, _ in event.value.get("records", []))
            elif event.f in ("send", "request"):
                self.sent.add(str(event.value.get("rid")))

    def final_reads(self) -> None:
        for event in self.events:
            if event.f != "final-read":
                continue
            key = (str(event.value.get("store")), str(event.value.get("stream")))
            if event.type == OK:
                rows: dict[int, tuple[str, str]] = {}
                for seq, subject, body in event.value.get("rows", []):
                    rows[int(seq)] = (str(subject), str(body))
                self.final[key] = rows
                self.final_ops[key] = event
                self.final_refused.pop(key, None)
                for missed, available in event.value.get("gaps", []):
                    self.gap(key[0], event.time, key[1], int(missed), int(available), event.op)
                self.kinds["final records read"] += len(rows)
            elif event.type == FAIL and event.value.get("code"):
                self.final_refused[key] = (
                    f"ERROR {event.value.get('code')}: {event.value.get('error')}"
                )
                self.final_failed[key] = (self.final_refused[key], event.op)
            else:
                self.final_failed[key] = (str(event.value.get("error")), event.op)
        for (store, stream), rows in self.final.items():
            read = self.final_ops[(store, stream)]
            op, end = read.op, read.time
            where: dict[str, list[int]] = defaultdict(list)
            for seq, (subject, body) in sorted(rows.items()):
                value = {"store": store, "stream": stream, "seq": seq}
                value.update(subject=subject, body=body)
                fake = Event(end, "final-read", OK, "final-read", op, value)
                decoded = self.served(fake, f"the final read of {stream!r} from {store}")
                if decoded.good and decoded.rid is not None:
                    self.saw_number(store, end, stream, seq, decoded.rid, op)
                    where[decoded.rid].append(seq)
                    if decoded.rid not in self.sent:
                        self.violation(
                            "unexpected",
                            f"the final read of {stream!r} from {store} found record "
                            f"{decoded.rid!r} at {seq}, which no client wrote",
                            [op],
                            store=store,
                            stream=stream,
                            seq=seq,
                        )
            for rid, seqs in where.items():
                if len(seqs) > 1:
                    self.violation(
                        "append-written-twice",
                        f"record {rid!r} is in {store}'s copy of {stream!r} {len(seqs)} times "
                        f"(sequence numbers {seqs}): its append's key was written twice",
                        [op],
                        store=store,
                        stream=stream,
                        seqs=seqs,
                    )

    def reported_gaps(self) -> None:
        """The STREAM_GAPs readers and members were sent."""
        for event in self.events:
            if event.type == OK and event.f == "gap":
                v = event.value
                self.kinds["gaps reported to readers"] += 1
                self.gap(
                    str(v.get("store")),
                    event.time,
                    str(v.get("stream")),
                    int(v.get("missed", 0)),
                    int(v.get("available", 0)),
                    event.op,
                )

    def appends(self) -> None:
        keys: dict[tuple[str, str], _Append] = {}
        for invoke, end in ops(self.events):
            if invoke.f != "append":
                continue
            v = invoke.value
            key = (str(v.get("store")), str(v.get("key")))
            entry = keys.get(key)
            if entry is None:
                records = [(str(rid), str(subject)) for rid, subject in v.get("records", [])]
                entry = keys[key] = _Append(key[1], key[0], str(v.get("stream")), records)
            entry.invokes.append(invoke)
            if end is None or end.type == INFO:
                entry.unknown += 1
            elif end.type == FAIL:
                entry.fails += 1
            else:
                entry.oks.append(end)
        for entry in keys.values():
            self.kinds["append attempts"] += len(entry.invokes)
            self.kinds["append attempts refused"] += entry.fails
            self.kinds["append attempts unknown"] += entry.unknown
            if not entry.oks:
                self.kinds["appends never acknowledged"] += 1
                continue
            self.kinds["appends acknowledged"] += 1
            self.kinds["records acknowledged"] += len(entry.records)
            self.kinds["append answers 208 (already written)"] += sum(
                1 for e in entry.oks if e.value.get("dup")
            )
            self.one_append(entry)

    def one_append(self, entry: _Append) -> None:
        answers = {(int(e.value["first"]), int(e.value["last"])) for e in entry.oks}
        first_ok = entry.oks[0]
        ops_of = [e.op for e in entry.oks]
        if len(answers) > 1:
            self.violation(
                "append-answers-differ",
                f"append key {entry.key!r} to {entry.store} was acknowledged with different "
                f"sequence numbers: {sorted(answers)}",
                ops_of,
                store=entry.store,
                stream=entry.stream,
                answers=sorted(answers),
            )
        first, last = int(first_ok.value["first"]), int(first_ok.value["last"])
        if last - first + 1 != len(entry.records):
            self.violation(
                "append-answers-differ",
                f"append key {entry.key!r} of {len(entry.records)} records was acknowledged "
                f"with {last - first + 1} sequence numbers ({first}-{last})",
                [first_ok.op],
                store=entry.store,
            )
            return
        acked_at = first_ok.time
        report = self.excused_by_report(entry.store, acked_at)
        refused = self.final_refused.get((entry.store, entry.stream))
        stream_records = self.acked_records[entry.stream]
        rows = self.final.get((entry.store, entry.stream))
        lost: list[str] = []
        for j, (rid, _subject) in enumerate(entry.records):
            seq = first + j
            stream_records[rid] = first_ok.op
            self.acked_times[rid] = acked_at
            self.saw_number(entry.store, acked_at, entry.stream, seq, rid, first_ok.op)
            row = rows.get(seq) if rows is not None else None
            found = decode(bytes_of(row[1]), row[0]) if row is not None else None
            if found is not None and found.rid == rid:
                continue  # there (a damaged body is reported by the final read)
            if found is not None and found.rid is None:
                continue  # unreadable: reported as damaged by the final read
            if report is not None:
                self.excused_rids.add(rid)
                self.excuse(
                    "append", first_ok.op, f"{report.broker} refused its journal: {report.line}"
                )
                continue
            if refused is not None and self.rules.stores.get(entry.store) == ALONE:
                self.excused_rids.add(rid)
                self.excuse("append", first_ok.op, f"the final read was refused: {refused}")
                continue
            gap = self.in_gap(entry.store, acked_at, entry.stream, seq)
            if gap is not None:
                self.excused_rids.add(rid)
                self.excuse("append", first_ok.op, f"the broker reported a gap over it ({gap})")
                continue
            if rows is None:
                self.unread[(entry.store, entry.stream)].append(first_ok.op)
                continue
            what = "nothing is there" if found is None else f"record {found.rid!r} is there"
            lost.append(f"{rid}@{seq} ({what})")
        if lost:
            self.violation(
                "lost-append",
                f"append {first_ok.op} (key {entry.key!r}, acknowledged by {entry.store} at "
                f"t={acked_at:.3f}s with {entry.stream!r} {first}-{last}) lost "
                f"{len(lost)} of its {len(entry.records)} records: {', '.join(lost[:5])}",
                [e.op for e in entry.invokes] + ops_of,
                store=entry.store,
                stream=entry.stream,
                key=entry.key,
                first=first,
                last=last,
                lost=lost,
            )

    def unreadable(self) -> None:
        """One violation per store and stream whose acknowledged records no final read got."""
        for (store, stream), appends in sorted(self.unread.items()):
            why, op = self.final_failed.get((store, stream), ("it was never read", ""))
            self.violation(
                "unreadable",
                f"{store} could not serve {stream!r} at the end ({why}): the "
                f"{len(appends)} record(s) of {len(set(appends))} acknowledged append(s) there "
                "cannot be read back",
                [op, *sorted(set(appends))[:DETAIL_LIMIT]],
                store=store,
                stream=stream,
                error=why,
                records=len(appends),
            )

    def letters(self, f: str, delivery: str, lost_kind: str) -> None:
        delivered: dict[str, float] = {}
        for event in self.events:
            if event.type == OK and event.f == delivery:
                decoded = self.served(event, f"{event.process} ({delivery})")
                self.kinds[f"{delivery} deliveries"] += 1
                if decoded.rid is None:
                    continue
                delivered.setdefault(decoded.rid, event.time)
                if decoded.rid not in self.sent:
                    self.violation(
                        "unexpected",
                        f"{event.process} was delivered {decoded.rid!r}, which nobody sent",
                        [event.op],
                        rid=decoded.rid,
                    )
        for invoke, end in ops(self.events):
            if invoke.f != f:
                continue
            self.kinds[f"{f} attempts"] += 1
            if end is None or end.type != OK:
                self.kinds[f"{f} not acknowledged"] += 1
                continue
            self.kinds[f"{f} acknowledged"] += 1
            rid = str(invoke.value.get("rid"))
            if rid in delivered:
                continue
            stores = [str(s) for s in invoke.value.get("via", [invoke.value.get("store")])]
            report = next(
                (r for s in stores if (r := self.excused_by_report(s, end.time)) is not None),
                None,
            )
            if report is not None:
                self.excuse(f, end.op, f"{report.broker} refused its journal: {report.line}")
                continue
            self.violation(
                lost_kind,
                f"{f} {invoke.op} ({rid!r} to {invoke.value.get('to')!r} through "
                f"{invoke.value.get('store')}) was acknowledged (STORED id "
                f"{end.value.get('id')}) at t={end.time:.3f}s and never delivered",
                [invoke.op],
                rid=rid,
                to=invoke.value.get("to"),
                store=invoke.value.get("store"),
                id=end.value.get("id"),
            )

    def readers(self) -> None:
        # (incarnation, stream, consumer) -> the positions acknowledged, in time order.
        positions: dict[tuple[str, str, str], list[tuple[float, int, str]]] = defaultdict(list)
        delivered: dict[tuple[str, str], set[str]] = defaultdict(set)
        for invoke, end in ops(self.events):
            if invoke.f != "commit" or invoke.value.get("group"):
                continue
            self.kinds["reader commits"] += 1
            if end is None or end.type != OK:
                continue
            self.kinds["reader commits acknowledged"] += 1
            v = invoke.value
            store = self.incarnations.key(str(v.get("store")), end.time)
            positions[(store, str(v.get("stream")), str(v.get("consumer")))].append(
                (end.time, int(end.value.get("position", 0)), end.op)
            )
        # Per consumer, the best position acknowledged by each time (a running maximum).
        best_by: dict[tuple[str, str, str], tuple[list[float], list[tuple[int, str]]]] = {}
        for key, acked in positions.items():
            acked.sort()
            best, best_op = 0, ""
            times: list[float] = []
            bests: list[tuple[int, str]] = []
            for t, position, op in acked:
                if position < best:
                    self.violation(
                        "position-moved-back",
                        f"consumer {key[2]!r} of {key[1]!r} on {key[0]}: commit {op} was "
                        f"answered with position {position}, after {best_op} was answered "
                        f"{best}",
                        [best_op, op],
                        store=key[0],
                        stream=key[1],
                        consumer=key[2],
                    )
                if position >= best:
                    best, best_op = position, op
                times.append(t)
                bests.append((best, best_op))
            best_by[key] = (times, bests)
        for event in self.events:
            if event.type != OK or event.f != "consumed":
                continue
            v = event.value
            self.kinds["reader deliveries"] += 1
            decoded = self.served(event, f"consumer {v.get('consumer')!r} ({event.process})")
            seq = int(v.get("seq", 0))
            store = str(v.get("store"))
            stream = str(v.get("stream"))
            if decoded.good and decoded.rid is not None:
                delivered[(stream, str(v.get("consumer")))].add(decoded.rid)
                self.saw_number(store, event.time, stream, seq, decoded.rid, event.op)
            times, bests = best_by.get(
                (self.incarnations.key(store, event.time), stream, str(v.get("consumer"))),
                ([], []),
            )
            n = bisect_left(times, event.time)
            if n:
                position, op = bests[n - 1]
                if seq <= position:
                    self.violation(
                        "redelivered-acknowledged",
                        f"consumer {v.get('consumer')!r} of {stream!r} on {store} was delivered "
                        f"record {seq} ({decoded.rid!r}) at t={event.time:.3f}s, after its "
                        f"position {position} was acknowledged ({op})",
                        [op, event.op],
                        store=store,
                        stream=stream,
                        seq=seq,
                    )
        consumers: dict[tuple[str, str], set[str]] = defaultdict(set)
        for e in self.events:
            if e.f == "consumed" or (e.f == "commit" and not e.value.get("group")):
                named = (str(e.value.get("stream")), str(e.value.get("consumer")))
                consumers[named].add(str(e.value.get("store")))
        for (stream, consumer), stores in sorted(consumers.items()):
            # A consumer of a broker alone started afresh is a new consumer
            # there (its position went with the journal): it is owed what
            # was acknowledged from then on.
            since = max((self.incarnations.started(store) for store in stores), default=0.0)
            self.missed(
                "consumer-missed",
                f"consumer {consumer!r} of {stream!r}",
                stream,
                delivered[(stream, consumer)],
                since,
            )

    def missed(self, kind: str, who: str, stream: str, got: set[str], since: float = 0.0) -> None:
        wanted = self.acked_records.get(stream, {})
        excused = self.excused_rids | self.gap_rids()
        times = self.acked_times
        missing = sorted(
            (
                rid
                for rid in wanted
                if rid not in got and rid not in excused and times.get(rid, since) >= since
            ),
            key=lambda rid: (rid.rsplit(".", 2)[0], write_order(rid) or (0, 0)),
        )
        if missing:
            self.violation(
                kind,
                f"{who} was never delivered {len(missing)} acknowledged record(s) of its "
                f"stream: {', '.join(missing[:8])}",
                sorted({wanted[rid] for rid in missing})[:DETAIL_LIMIT],
                stream=stream,
                missing=missing[:DETAIL_LIMIT],
            )

    def groups(self) -> None:
        acks: dict[tuple[str, str, str], list[tuple[float, str, str]]] = defaultdict(list)
        for invoke, end in ops(self.events):
            if invoke.f != "commit" or not invoke.value.get("group"):
                continue
            self.kinds["member commits"] += 1
            if end is None or end.type != OK:
                continue
            self.kinds["member commits acknowledged"] += 1
            v = invoke.value
            acks[(str(v.get("stream")), str(v.get("group")), str(v.get("rid")))].append(
                (end.time, str(v.get("member")), end.op)
            )
        for (stream, group, rid), acked in acks.items():
            members = sorted({m for _, m, _ in acked})
            if len(members) > 1 and not self.rules.groups_exactly_once:
                self.kinds[AGAIN] += 1
            elif len(members) > 1:
                self.violation(
                    "acknowledged-twice",
                    f"record {rid!r} of {stream!r} was acknowledged by {len(members)} members of "
                    f"group {group!r}: {', '.join(members)}",
                    [op for _, _, op in acked],
                    stream=stream,
                    group=group,
                    rid=rid,
                )
        got: dict[tuple[str, str], set[str]] = defaultdict(set)
        # (group, member, subject) -> the last first delivery: (order, rid, op).
        last: dict[tuple[str, str, str], tuple[tuple[int, int], str, str]] = {}
        seen: dict[tuple[str, str], set[str]] = defaultdict(set)
        for event in self.events:
            if event.type != OK or event.f != "member":
                continue
            v = event.value
            self.kinds["member deliveries"] += 1
            stream, group, member = str(v.get("stream")), str(v.get("group")), str(v.get("member"))
            decoded = self.served(event, f"member {member!r} of group {group!r}")
            if decoded.rid is None or not decoded.good:
                continue
            rid = decoded.rid
            got[(stream, group)].add(rid)
            if self.rules.numbered_groups:
                self.saw_number(
                    str(v.get("store")), event.time, stream, int(v.get("seq", 0)), rid, event.op
                )
            acked = [a for a in acks.get((stream, group, rid), []) if a[0] < event.time]
            if acked and not self.rules.groups_exactly_once:
                # Processed already (at least once across homes): a repeat,
                # whose order among first deliveries is not checked.
                self.kinds[REDELIVERED] += 1
                continue
            if acked:
                # (Its order is not checked: being sent again at all is the violation.)
                when, by, op = min(acked)
                self.violation(
                    "redelivered-acknowledged",
                    f"member {member!r} of group {group!r} was delivered {rid!r} (seq "
                    f"{v.get('seq')}) at t={event.time:.3f}s, after member {by!r} had it "
                    f"acknowledged at t={when:.3f}s ({op})",
                    [op, event.op],
                    stream=stream,
                    group=group,
                    rid=rid,
                )
                continue
            if rid in seen[(group, member)]:
                continue  # a redelivery to this member: order is of first deliveries
            seen[(group, member)].add(rid)
            order = write_order(rid)
            if order is None:
                continue
            subject = str(v.get("subject"))
            previous = last.get((group, member, subject))
            if previous is not None and order < previous[0]:
                self.violation(
                    "group-order",
                    f"member {member!r} of group {group!r} got {rid!r} (seq {v.get('seq')}) "
                    f"after {previous[1]!r}, written after it, on subject {subject!r}",
                    [previous[2], event.op],
                    group=group,
                    member=member,
                    subject=subject,
                )
            if previous is None or order > previous[0]:
                last[(group, member, subject)] = (order, rid, event.op)
        groups = {
            (str(e.value.get("stream")), str(e.value.get("group")))
            for e in self.events
            if e.f == "member"
        }
        for stream, group in sorted(groups):
            who = f"consumer group {group!r} of {stream!r}"
            self.missed("group-missed", who, stream, got[(stream, group)])

    def numbers(self) -> None:
        for (store, stream, seq), rids in self.numbered.items():
            if len(rids) > 1:
                self.violation(
                    "seq-reused",
                    f"sequence number {seq} of {stream!r} in {store} was given to "
                    f"{len(rids)} records: {', '.join(sorted(rids))}",
                    list(rids.values()),
                    store=store,
                    stream=stream,
                    seq=seq,
                    rids=sorted(rids),
                )

    def memory(self) -> None:
        worst: dict[str, Sample] = {}
        for sample in self.samples:
            if sample.process not in worst or sample.rss > worst[sample.process].rss:
                worst[sample.process] = sample
        for process, sample in sorted(worst.items()):
            limit = self.rules.rss_limits.get(sample.kind)
            if limit is not None and sample.rss > limit:
                self.violation(
                    "memory",
                    f"{process} ({sample.kind}) used {sample.rss / 2**20:.0f} MiB at "
                    f"t={sample.time:.1f}s, over its limit of {limit / 2**20:.0f} MiB",
                    (),
                    process=process,
                    rss=sample.rss,
                    limit=limit,
                )


def check(
    events: Sequence[Event],
    reports: Sequence[Report],
    samples: Sequence[Sample],
    rules: Rules,
) -> Result:
    """
    The violations of a history (see the module): C{events} in time order,
    the final reads among them; C{reports}, what brokers said they cannot
    serve; C{samples}, the processes' memory.
    """
    return _Check(events, reports, samples, rules).run()
