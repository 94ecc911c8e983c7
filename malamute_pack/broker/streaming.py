"""
Streams: writing, live delivery to matching readers, and delivery from the
journal for readers that are behind (out of credit, or reading from a
position) until they catch up with the live stream.

A reader is either live on a stream or behind it, with the sequence number
it needs next in C{client.behind}. A live message skips a reader that is
behind: the message is in the journal and reaches it in order from there.
A reader that runs out of credit becomes behind at the message it could not
take. Reading from the journal goes a batch at a time, only while the
reader has credit, and ends when it has reached the stream's last sequence
number, at which point it is live again: no gap, no duplicate.

Tests: ``tests/test_broker_model.py``, ``tests/test_broker_durable.py``.
"""

from __future__ import annotations

import struct
from typing import Final

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.broker.client import Client, State
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.interfaces import FrameSink, Store
from malamute_pack.broker.streams import Stream
from malamute_pack.journal import StreamRecord
from malamute_pack.matching import PatternError, validate_pattern
from malamute_pack.protocol import mlm

_log = Logger()

_SEQ_AND_TIME: Final = struct.Struct(">QQ")


def check_pattern(pattern: str) -> None:
    """Refuse a pattern that does not compile, with the reason."""
    try:
        validate_pattern(pattern)
    except PatternError as e:
        raise Refused(f"invalid pattern: {e}") from e


class Streams:
    """
    Every stream of the broker, and delivery to their readers.

    @ivar stream_delivered: deliveries made (live and from the journal).
    @ivar stream_dropped: messages a reader missed (no journal to replay from).
    @ivar gaps: times a reader lost messages to retention.
    """

    def __init__(
        self,
        sink: FrameSink,
        clock: IReactorTime,
        store: Store | None,
        match_cache: int,
        replay_batch: int,
        max_subject: int = 255,
    ) -> None:
        self._sink = sink
        self._max_subject = max_subject
        self._clock = clock
        self._store = store
        self._match_cache = match_cache
        self._replay_batch = replay_batch
        self.streams: dict[str, Stream] = {}
        self._last_seq: dict[str, int] = {}  # sequence numbers when there is no journal
        self.delivered = 0
        self.dropped = 0
        self.gaps = 0

    def require(self, name: str) -> Stream:
        stream = self.streams.get(name)
        if stream is None:
            stream = self.streams[name] = Stream(name, self._match_cache)
        return stream

    def set_writer(self, client: Client, name: str) -> None:
        stream = self.require(name)
        client.writer = stream
        names = mlm.encode_string(stream.name) + mlm.encode_string(client.address)
        client.deliver_prefix = mlm.SIGNATURE + bytes((mlm.StreamDeliver.ID,)) + names
        client.record_prefix = mlm.SIGNATURE + bytes((mlm.StreamRecord.ID,)) + names

    def subscribe(self, client: Client, name: str, pattern: str) -> None:
        check_pattern(pattern)
        stream = self.require(name)
        if stream.readers.subscribe(client, pattern):
            client.reading.setdefault(name, set()).add(pattern)

    def cancel(self, client: Client, name: str) -> None:
        stream = self.streams.get(name)
        client.behind.pop(name, None)
        if client.reading.pop(name, None) is not None and stream is not None:
            stream.readers.unsubscribe_owner(client)

    def forget(self, client: Client) -> None:
        """Drop every reading of a client that is gone."""
        for name in client.reading:
            self.streams[name].readers.unsubscribe_owner(client)
        client.reading.clear()
        client.behind.clear()
        client.writer = None

    # Writing and live delivery

    def write(self, client: Client, message: mlm.StreamSend) -> None:
        """Journal C{message} on the client's stream and deliver it live."""
        stream = client.writer
        if stream is None:
            raise Refused("no stream: send STREAM_WRITE before STREAM_SEND")
        subject = mlm.encode_string(message.subject)
        if len(subject) > self._max_subject + 1:
            raise Refused(f"invalid subject: longer than {self._max_subject} bytes")
        now = self._clock.seconds()
        name = stream.name
        if self._store is not None:
            seq = self._store.append_stream(
                name, client.address, message.subject, message.content, now
            )
        else:
            seq = self._last_seq.get(name, 0) + 1
            self._last_seq[name] = seq
        stream.messages += 1
        readers = stream.readers.match(message.subject)
        if not readers:
            return
        v1: list[bytes] | None = None
        v2: list[bytes] | None = None
        send = self._sink.send
        delivered = 0
        for reader in readers:
            if reader is client or (reader.behind and name in reader.behind):
                continue
            if reader.credit is not None:
                if reader.credit <= 0:
                    self._fall_behind(reader, stream, seq)
                    continue
                reader.credit -= 1
            if reader.version == 1:
                if v1 is None:
                    v1 = [client.deliver_prefix + subject, *message.content]
                send(reader.route, v1)
            else:
                if v2 is None:
                    stamp = _SEQ_AND_TIME.pack(seq, int(now * 1000))
                    v2 = [client.record_prefix + subject + stamp, *message.content]
                send(reader.route, v2)
            delivered += 1
        stream.delivered += delivered
        self.delivered += delivered

    def _fall_behind(self, reader: Client, stream: Stream, seq: int) -> None:
        if self._store is None:
            # Nothing to replay from: the miss is counted.
            stream.dropped += 1
            reader.dropped += 1
            self.dropped += 1
        else:
            reader.behind[stream.name] = seq

    # Reading from a position

    def read_from(self, client: Client, name: str, pattern: str, whence: int, pos: int) -> None:
        """Subscribe C{client} and move its position on the stream to C{whence}/C{pos}."""
        if whence not in (mlm.LATEST, mlm.EARLIEST, mlm.SEQUENCE, mlm.TIME):
            raise Refused(f"invalid position: whence {whence} is not 0, 1, 2 or 3")
        store = self._store
        if store is None and whence != mlm.LATEST:
            raise Refused("not implemented: reading from a position needs the journal", 501)
        self.subscribe(client, name, pattern)
        if store is None or whence == mlm.LATEST:
            return
        if whence == mlm.EARLIEST:
            client.behind[name] = store.first_seq(name)
        elif whence == mlm.SEQUENCE:
            client.behind[name] = max(1, pos)
        else:
            # Hold live delivery from now on; replay from the time once found
            # (until then a journal read is under way: nothing else starts).
            client.behind[name] = min(client.behind.get(name, 1 << 63), store.last_seq(name) + 1)
            client.replaying.add(name)
            store.seq_at_time(name, pos / 1000.0).addCallbacks(
                self._found_time, self._replay_failed,
                callbackArgs=(client, name), errbackArgs=(client, name),
            )  # fmt: skip

    def _found_time(self, seq: int, client: Client, name: str) -> None:
        client.replaying.discard(name)
        if client.state is not State.GONE and name in client.behind:
            client.behind[name] = min(client.behind[name], seq)
            self.resume(client, name)

    # Delivery from the journal

    def resume_all(self, client: Client) -> None:
        """Continue every journal delivery C{client} is owed (after CREDIT)."""
        for name in list(client.behind):
            self.resume(client, name)

    def resume(self, client: Client, name: str) -> None:
        """Deliver from the journal to C{client} on C{name} while it has credit."""
        store = self._store
        if store is None:
            return
        if name not in client.behind or name in client.replaying or client.state is State.GONE:
            return
        wanted = client.behind[name]
        first = store.first_seq(name)
        if wanted < first:
            self._gap(client, name, wanted, first)
            wanted = client.behind[name] = first
        if wanted > store.last_seq(name):
            del client.behind[name]  # caught up: live from here on
            return
        if not client.can_take():
            return
        # A read served from the journal's in-memory tail fires at once, one
        # from disk later; either way _read_done continues from there
        # (nesting at most tail/batch deep).
        client.replaying.add(name)
        store.read_stream(name, wanted, self._replay_batch).addCallbacks(
            self._read_done, self._replay_failed,
            callbackArgs=(client, name), errbackArgs=(client, name),
        )  # fmt: skip

    def _read_done(self, records: list[StreamRecord], client: Client, name: str) -> None:
        client.replaying.discard(name)
        if client.state is State.GONE or name not in client.behind:
            return
        self._deliver_records(client, name, records)
        self.resume(client, name)

    def _deliver_records(self, client: Client, name: str, records: list[StreamRecord]) -> None:
        stream = self.streams[name]
        if not records:
            # Retained but unreadable (a journal batch failed): skip the hole.
            assert self._store is not None
            _log.warn(
                "stream {stream!r}: records from {seq} could not be read; skipped",
                stream=name,
                seq=client.behind[name],
            )
            client.behind[name] = self._store.last_seq(name) + 1
            return
        matches = stream.readers.owner_matches
        for record in records:
            if record.seq < client.behind[name]:
                continue
            own = record.sender != "" and record.sender == client.address
            if not own and matches(client, record.subject):
                if not client.can_take():
                    client.behind[name] = record.seq
                    return
                self._deliver_record(client, record)
            client.behind[name] = record.seq + 1

    def _deliver_record(self, client: Client, record: StreamRecord) -> None:
        message: mlm.Message
        if client.version == 1:
            message = mlm.StreamDeliver(
                record.stream, record.sender, record.subject, list(record.content)
            )
        else:
            message = mlm.StreamRecord(
                record.stream,
                record.sender,
                record.subject,
                record.seq,
                int(record.timestamp * 1000),
                list(record.content),
            )
        if client.credit is not None:
            client.credit -= 1
        self._sink.send(client.route, mlm.encode(message))
        self.streams[record.stream].delivered += 1
        self.delivered += 1

    def _gap(self, client: Client, name: str, missed: int, available: int) -> None:
        self.gaps += 1
        _log.info(
            "{client} lost messages {missed}-{last} of stream {stream!r} to retention",
            client=client, missed=missed, last=available - 1, stream=name,
        )  # fmt: skip
        if client.version >= 2:
            self._sink.send(client.route, mlm.encode(mlm.StreamGap(name, missed, available)))

    def _replay_failed(self, failure: Failure, client: Client, name: str) -> None:
        client.replaying.discard(name)
        _log.failure(
            "reading stream {stream!r} from the journal for {client} failed",
            failure, stream=name, client=client,
        )  # fmt: skip
