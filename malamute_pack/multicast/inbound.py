"""
An inbound bridge's logic: what arrives from a multicast group, written
into a local stream once each and in order per origin, with what the group
lost repaired from the origin's journal. No socket here: the SUB socket's
glue hands it batches (L{InboundBridge.received}) and a L{Repairs}
(L{malamute_pack.multicast.repair}) reads what was lost.

Records are kept apart per I{flow}: one origin broker's stream. Each flow
has a I{mark}, the origin's sequence number of the last record written
here (kept in the journal with each record, so it survives a restart).
A record is taken when it follows the mark: its header names the record
published before it (C{prev}), and that one is written already. Otherwise
records are missing: the record is held (the held records of a bridge are
bounded in bytes; past the bound a record is dropped and the repair brings
it too), and a repair reads the flow's stream from the origin, with the
bridge's pattern, from the mark on. Repaired and held records are written
in sequence order, each once, until the held ones follow the mark: the
repair then stops.

A flow's first record is taken whatever came before it: a receiver joins
live, as a reader from the latest does. A record with no C{prev} (its
bridge restarted) after others is taken only once the repair has read up
to it. What the origin no longer has (retention), or what cannot be
repaired (no endpoint, the origin unreachable), or what is over this
broker's limits (live or repaired), is written as a I{notice}
(subject L{NOTICE}) that every reader of the stream gets, saying which
sequence numbers of which origin stream were lost: never hidden.

A bridge that has published nothing for a second sends a beat naming the
last number it published: a flow whose mark is below it lost the tail of a
burst, and is repaired up to it without waiting for a later record.

While the broker's journal is behind (its read gate is closed) the bridge
sheds what arrives instead of letting ZeroMQ queue it without bound (a PGM
socket cannot be left unread: L{malamute_pack.multicast.sockets}); once
the gate opens, the shed records are repaired like any loss.

Tests: ``tests/unit/test_multicast_inbound.py``.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.broker import Broker
from malamute_pack.broker.limits import longer_than
from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.broker.streams import NOTICE
from malamute_pack.multicast.sessions import InboundSession
from malamute_pack.protocol import multicast
from malamute_pack.protocol.multicast import Record
from malamute_pack.protocol.records import StreamRecord

_log = Logger()

# Records held while a repair runs, in all flows of one bridge.
MAX_HELD_BYTES = 32 * 1024 * 1024
# Origin streams one bridge follows at once (the rest are dropped, counted).
MAX_FLOWS = 1_000
# What a held record costs beyond its frames.
_OVERHEAD = 200

# Highest origin sequence number taken, by (local stream, flow key).
Marks = MutableMapping[tuple[str, str], int]


class Repairs(Protocol):
    """Reads lost records from their origin (L{malamute_pack.multicast.repair})."""

    def start(self, flow: Flow, bridge: InboundBridge) -> None:
        """
        Read C{flow.stream} with C{flow.pattern} at C{flow.endpoint} from
        C{flow.mark + 1} on, handing what comes to C{bridge}: records to
        L{InboundBridge.repaired}, retention's losses to L{InboundBridge.lost},
        and a repair that cannot go on to L{InboundBridge.failed}.
        """

    def stop(self, flow: Flow) -> None:
        """The flow has what it needed: stop reading (nothing more is handed)."""


@dataclass(eq=False)
class Flow:
    """
    One origin broker's stream, as one inbound bridge receives it.

    @ivar key: what its records are journaled with as their origin.
    @ivar mark: the origin sequence number of the last record written here.
    @ivar endpoint: where the origin serves replays (from its last header).
    @ivar pattern: what its bridge reads (from its last header).
    @ivar highest: the highest origin sequence number held or dropped while
        held was full: a repair goes on until the mark reaches it.
    """

    origin: str
    stream: str
    key: str
    mark: int
    endpoint: str = ""
    pattern: str = ""
    held: deque[Record] = field(default_factory=deque)
    repairing: bool = False
    highest: int = 0

    def follows(self, record: Record) -> bool:
        """Whether C{record} is the next one to write."""
        return self.mark == 0 or _needed(record) <= self.mark


def _needed(record: Record) -> int:
    """The origin's last record before C{record} that the bridge may have sent."""
    return record.prev or record.seq - 1


@dataclass
class InboundCounters:
    """What one inbound bridge counted."""

    received: int = 0  # records, beats, and malformed messages
    written: int = 0
    duplicates: int = 0
    malformed: int = 0  # messages dropped, whatever they carried
    # Of them, messages of another version of the bridge protocol.
    other_version: int = 0
    refused: int = 0  # too large for this broker's limits, or too many flows
    held: int = 0
    overflow: int = 0  # dropped while held was full (the repair brings them)
    shed: int = 0  # dropped while the journal was behind (repaired after)
    beats: int = 0  # heard from idle bridges (see protocol.multicast)
    repairs: int = 0
    repaired: int = 0  # records written from repairs
    # Origin sequence numbers reported lost in notices (with a pattern, not
    # all of them were records this bridge would have sent).
    lost: int = 0
    notices: int = 0


class InboundBridge:
    """
    Writes what one multicast group brings into one local stream.

    @ivar flows: the origin streams heard, by (origin, stream).
    """

    def __init__(
        self,
        clock: IReactorTime,
        broker: Broker,
        stream: str,
        url: str,
        marks: Marks,
        repairs: Repairs,
        max_held_bytes: int = MAX_HELD_BYTES,
    ) -> None:
        """
        @param marks: the journal's origin marks (L{Journal.origin_marks}),
            updated as records are written.
        """
        self._clock = clock
        self._broker = broker
        self.stream = stream
        self.url = url
        self._marks = marks
        self._repairs = repairs
        self._max_held_bytes = max_held_bytes
        self._held_bytes = 0
        self.session = InboundSession(stream, url)
        self._connection = broker.attach_internal(self.session)
        self.flows: dict[tuple[str, str], Flow] = {}
        self.counters = InboundCounters()
        self._log = LogLimit(clock, _log)
        self.shedding = False

    def pause(self) -> None:
        """The journal is behind: drop what arrives until L{resume}."""
        self.shedding = True

    def resume(self) -> None:
        """Take what arrives again, and repair what was shed meanwhile."""
        self.shedding = False
        for flow in self.flows.values():
            if not flow.repairing and flow.highest > flow.mark:
                self._start_repair(flow)

    def __repr__(self) -> str:
        return repr(self.session)

    def close(self) -> None:
        """Stop every repair and leave the broker."""
        for flow in self.flows.values():
            if flow.repairing:
                flow.repairing = False
                self._repairs.stop(flow)
            flow.held.clear()
        self._held_bytes = 0
        self._broker.detach_remote(self.session)

    # From the group

    def received(self, batch: Sequence[Sequence[bytes]]) -> None:
        """Messages from the SUB socket: packs of records, and beats."""
        counters = self.counters
        for frames in batch:
            try:
                pack = multicast.decode_pack(frames)
            except multicast.OtherVersion as e:
                counters.received += 1
                counters.malformed += 1
                counters.other_version += 1
                self._log.info(
                    "version",
                    "{bridge}: dropped a message of another bridge protocol ({error}):"
                    " the publishing broker needs the same version as this one",
                    bridge=self,
                    error=e,
                )
                continue
            except multicast.MalformedBridgeMessage as e:
                counters.received += 1
                counters.malformed += 1
                self._log.info("malformed", "{bridge}: dropped: {error}", bridge=self, error=e)
                continue
            flow = self._flow(pack.origin, pack.stream)
            if flow is None:
                counters.received += len(pack.records) or 1
                counters.refused += len(pack.records) or 1
                continue
            flow.endpoint = pack.endpoint
            flow.pattern = pack.pattern
            if pack.beat:
                counters.received += 1
                counters.beats += 1
                if flow.mark and pack.beat > flow.mark:  # the tail of a burst was lost
                    flow.highest = max(flow.highest, pack.beat)
                    if not flow.repairing and not self.shedding:
                        self._start_repair(flow)
            else:
                self._records(flow, pack.records)

    def _records(self, flow: Flow, records: list[Record]) -> None:
        """The records of a pack, in order."""
        counters = self.counters
        counters.received += len(records)
        for record in records:
            seq = record.seq
            if not self._fits(flow, seq, record.sender, record.subject, record.content):
                counters.refused += 1
            elif self.shedding:
                counters.shed += 1
                if flow.mark:  # a flow not joined yet joins later
                    flow.highest = max(flow.highest, seq)
            elif seq <= flow.mark:
                counters.duplicates += 1
            elif not flow.repairing and (flow.mark == 0 or (record.prev or seq - 1) <= flow.mark):
                # flow.follows(record), inline: the path of every record
                self._write(
                    flow, seq, record.timestamp / 1e6, record.content, record.sender, record.subject
                )
            else:
                self._hold(flow, record)

    def _flow(self, origin: str, stream: str) -> Flow | None:
        flow = self.flows.get((origin, stream))
        if flow is None:
            if len(self.flows) >= MAX_FLOWS:
                self._log.info(
                    "flows",
                    "{bridge}: more than {most} origin streams; {origin} {stream!r} dropped",
                    bridge=self,
                    most=MAX_FLOWS,
                    origin=origin,
                    stream=stream,
                )
                return None
            key = f"{origin}/{stream}"
            mark = self._marks.get((self.stream, key), 0)
            flow = self.flows[origin, stream] = Flow(origin, stream, key, mark)
        return flow

    def _fits(
        self, flow: Flow, seq: int, sender: str, subject: str, content: Sequence[bytes]
    ) -> bool:
        """A record is held to the limits a client's is."""
        limits = self._broker.limits
        if (
            len(content) >= limits.max_frames
            or sum(map(len, content)) > limits.max_message_bytes
            or longer_than(subject, limits.max_subject)
            or longer_than(sender, limits.max_address)
        ):
            self._log.info(
                "refused",
                "{bridge}: record {seq} of {origin} {stream!r} is over this broker's limits",
                bridge=self,
                seq=seq,
                origin=flow.origin,
                stream=flow.stream,
            )
            return False
        return True

    def _hold(self, flow: Flow, record: Record) -> None:
        size = sum(map(len, record.content)) + _OVERHEAD
        flow.highest = max(flow.highest, record.seq)
        if self._held_bytes + size > self._max_held_bytes:
            self.counters.overflow += 1
        else:
            self._held_bytes += size
            flow.held.append(record)
            self.counters.held += 1
        if not flow.repairing:
            self._start_repair(flow)

    def _start_repair(self, flow: Flow) -> None:
        flow.repairing = True
        self.counters.repairs += 1
        _log.info(
            "{bridge}: {origin} {stream!r} lost records after {mark}: repair from {endpoint}",
            bridge=self,
            origin=flow.origin,
            stream=flow.stream,
            mark=flow.mark,
            endpoint=flow.endpoint or "(no endpoint)",
        )
        self._repairs.start(flow, self)

    # From the repair

    def repaired(
        self,
        flow: Flow,
        seq: int,
        timestamp: float,
        sender: str,
        subject: str,
        content: Sequence[bytes],
    ) -> None:
        """A record read from the origin (C{timestamp} in seconds)."""
        if not flow.repairing:
            return
        if seq > flow.mark:
            if self._fits(flow, seq, sender, subject, content):
                self._write(flow, seq, timestamp, content, sender, subject)
                self.counters.repaired += 1
            else:
                self.counters.refused += 1
                self._notice(flow, seq, "over this broker's limits")
        self._flush(flow)

    def lost(self, flow: Flow, missed: int, available: int) -> None:
        """The origin no longer has records C{missed} to C{available - 1} (retention)."""
        if not flow.repairing:
            return
        reason = "removed by the origin's retention"
        # Held records among them were received: written, not reported.
        self._release(flow, available, reason)
        self._notice(flow, available - 1, reason)
        self._flush(flow)

    def failed(self, flow: Flow, reason: str) -> None:
        """The repair cannot go on: what is still missing is reported lost."""
        if not flow.repairing:
            return
        _log.warn(
            "{bridge}: repair of {key} failed: {reason}", bridge=self, key=flow.key, reason=reason
        )
        self._release(flow, None, f"not repaired: {reason}")
        # Records dropped while held was full are missing too.
        self._notice(flow, flow.highest, f"not repaired: {reason}")
        flow.repairing = False
        self._repairs.stop(flow)

    def _release(self, flow: Flow, below: int | None, reason: str) -> None:
        """
        Write the held records numbered below C{below} (None: all), each
        hole before one reported lost for C{reason}.
        """
        held = flow.held
        while held and (below is None or held[0].seq < below):
            record = held.popleft()
            self._held_bytes -= sum(map(len, record.content)) + _OVERHEAD
            if record.seq <= flow.mark:
                continue
            if not flow.follows(record):
                self._notice(flow, _needed(record), reason)
            self._write_held(flow, record)

    def _flush(self, flow: Flow) -> None:
        """
        Write the held records that follow the mark; stop repairing once
        none is left and the mark has reached every record received.
        """
        held = flow.held
        while held and flow.follows(held[0]):
            record = held.popleft()
            self._held_bytes -= sum(map(len, record.content)) + _OVERHEAD
            if record.seq > flow.mark:
                self._write_held(flow, record)
        if not held and flow.mark >= flow.highest:
            flow.repairing = False
            self._repairs.stop(flow)
            _log.info(
                "{bridge}: {key} repaired up to {mark}", bridge=self, key=flow.key, mark=flow.mark
            )

    # Into the stream

    def _write_held(self, flow: Flow, record: Record) -> None:
        self._write(
            flow, record.seq, record.timestamp / 1e6, record.content, record.sender, record.subject
        )

    def _write(
        self,
        flow: Flow,
        seq: int,
        timestamp: float,
        content: Sequence[bytes],
        sender: str,
        subject: str,
    ) -> None:
        record = StreamRecord(
            self.stream, 0, timestamp, sender, subject, tuple(content), flow.key, seq
        )
        self._broker.streams.write_forwarded(self._connection, self.stream, record)
        self._advance(flow, seq)
        self.counters.written += 1

    def _notice(self, flow: Flow, last: int, reason: str) -> None:
        """Records after the mark up to C{last} are lost: every reader hears."""
        first = flow.mark + 1
        if last < first:
            return
        body = {
            "origin": flow.origin,
            "stream": flow.stream,
            "first": first,
            "last": last,
            "reason": reason,
        }
        record = StreamRecord(
            self.stream,
            0,
            self._clock.seconds(),
            "",
            NOTICE,
            (json.dumps(body).encode(),),
            flow.key,
            last,
        )
        self._broker.streams.write_forwarded(self._connection, self.stream, record, everyone=True)
        self._advance(flow, last)
        self.counters.notices += 1
        self.counters.lost += last - first + 1
        _log.warn(
            "{bridge}: records {first} to {last} of {origin} {stream!r} are lost: {reason}",
            bridge=self,
            first=first,
            last=last,
            origin=flow.origin,
            stream=flow.stream,
            reason=reason,
        )

    def _advance(self, flow: Flow, seq: int) -> None:
        flow.mark = seq
        self._marks[self.stream, flow.key] = seq
