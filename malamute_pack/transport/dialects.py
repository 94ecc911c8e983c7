"""
The dialects an MLM session speaks: protocol version 1 (libmlm's, the C
broker's) and our version 2 (``docs/protocol.md``). A dialect decides how
the model's deliveries and answers are encoded, through the codec, and the
policy that goes with them:

  - version 1: STREAM_DELIVER, MAILBOX_DELIVER and SERVICE_DELIVER; no
    STORED (a refused letter's sender hears of it only by a CONFIRM, and
    only if it gave a tracker); no STREAM_GAP; a tracked service request is
    held until its CONFIRM, a tracked mailbox letter only so that its
    CONFIRM reaches the sender, anything else is done at hand-over;
  - version 2: STREAM_RECORD (with sequence number and time), MAILBOX_RECORD
    and SERVICE_RECORD (with the letter's id), STORED for every letter sent,
    STREAM_GAP, STREAM_READ_FROM and DONE, the bulk reads and appends
    (STREAM_QUERY, STREAM_READ_RANGE, STREAM_APPEND); every letter held
    until answered.

A stream message is encoded once per fan-out: the model hands the same
record to every reader, and a dialect keeps the frames of the last record
it encoded. The start of a stream header (stream name and writer) is
encoded once per writer.

Tests: ``tests/unit/test_transport_sessions.py``.
"""

from __future__ import annotations

from typing import Final

from malamute_pack.broker.letters import Kind, Letter
from malamute_pack.broker.receipts import Receipt
from malamute_pack.broker.session import Hold
from malamute_pack.protocol import chunks, mlm
from malamute_pack.protocol.chunks import ChunkRow
from malamute_pack.protocol.records import StreamRecord

# A stream header's start (stream, writer) repeats for every message a writer
# sends: it is encoded once (and kept, a bounded number of them) and each
# message encodes only the rest.
_STARTS_KEPT: Final = 4096
_stream_deliver_tail = mlm.header_tail_encoder(mlm.StreamDeliver, 2)
_stream_record_tail = mlm.header_tail_encoder(mlm.StreamRecord, 2)
_letter_delivers: Final = {
    Kind.MAILBOX: mlm.header_encoder(mlm.MailboxDeliver),
    Kind.SERVICE: mlm.header_encoder(mlm.ServiceDeliver),
}
_letter_records: Final = {
    Kind.MAILBOX: mlm.header_encoder(mlm.MailboxRecord),
    Kind.SERVICE: mlm.header_encoder(mlm.ServiceRecord),
}
_confirm = mlm.header_encoder(mlm.Confirm)
_stream_chunk = mlm.header_encoder(mlm.StreamChunk)
_stored = mlm.header_encoder(mlm.Stored)

# Commands only a version 2 session may send.
_VERSION_2_COMMANDS: Final = frozenset(
    {
        mlm.StreamReadFrom,
        mlm.Done,
        mlm.StreamQuery,
        mlm.StreamReadRange,
        mlm.StreamAppend,
        mlm.StreamConsume,
        mlm.StreamCommit,
    }
)


class MlmDialect:
    """What versions 1 and 2 share: the stream cache, and the default policy."""

    version = 0
    _stream_message: type[mlm.Message] = mlm.StreamDeliver

    def __init__(self) -> None:
        # The last record encoded, and its frames: what every other reader
        # of the same fan-out is sent.
        self.last_record: StreamRecord | None = None
        self.last_frames: list[bytes] = []
        # Stream name to writer to the encoded start of their headers.
        self._starts: dict[str, dict[str, bytes]] = {}
        self._start_count = 0

    def speaks(self, command: type[mlm.Message]) -> bool:
        return True

    def hold(self, letter: Letter) -> Hold:
        return Hold.UNTIL_ANSWERED

    def stream_frames(self, record: StreamRecord) -> list[bytes]:
        """The frames of C{record}, encoded once for a whole fan-out."""
        if record is self.last_record:
            return self.last_frames
        by_writer = self._starts.get(record.stream)
        start = by_writer.get(record.sender) if by_writer is not None else None
        if start is None:
            start = self._new_start(record.stream, record.sender)
        self.last_record = record
        self.last_frames = [start + self._stream_tail(record), *record.content]
        return self.last_frames

    def _new_start(self, stream: str, sender: str) -> bytes:
        if self._start_count >= _STARTS_KEPT:
            self._starts.clear()
            self._start_count = 0
        start = mlm.header_start(self._stream_message, stream, sender)
        self._starts.setdefault(stream, {})[sender] = start
        self._start_count += 1
        return start

    def _stream_tail(self, record: StreamRecord) -> bytes:
        """The stream header's fields after the stream name and the writer."""
        raise NotImplementedError

    def letter_frames(self, letter: Letter) -> list[bytes]:
        raise NotImplementedError

    def stored_frames(self, receipt: Receipt) -> list[bytes] | None:
        """What the sender is told of a settled letter, if anything."""
        raise NotImplementedError

    def gap_frames(self, stream: str, missed: int, available: int) -> list[bytes] | None:
        """What a reader is told of messages lost to retention, if anything."""
        raise NotImplementedError

    def chunk_frames(self, stream: str, rows: list[ChunkRow]) -> list[bytes]:
        """A STREAM_CHUNK (only a version 2 session makes the range reads it answers)."""
        return [_stream_chunk(stream, len(rows)), chunks.encode_chunk(rows)]

    def __repr__(self) -> str:
        return f"MLM v{self.version}"


class MlmVersion1(MlmDialect):
    """libmlm's protocol."""

    version = 1

    def speaks(self, command: type[mlm.Message]) -> bool:
        return command not in _VERSION_2_COMMANDS

    def hold(self, letter: Letter) -> Hold:
        if not letter.tracker:
            return Hold.NOTHING
        return Hold.UNTIL_ANSWERED if letter.kind is Kind.SERVICE else Hold.FOR_CONFIRM

    def _stream_tail(self, record: StreamRecord) -> bytes:
        return _stream_deliver_tail(record.subject)

    def letter_frames(self, letter: Letter) -> list[bytes]:
        header = _letter_delivers[letter.kind](
            letter.sender, letter.address, letter.subject, letter.tracker
        )
        return [header, *letter.content]

    def stored_frames(self, receipt: Receipt) -> list[bytes] | None:
        if not receipt.refused or not receipt.tracker:
            return None
        assert receipt.code is not None
        return [_confirm(receipt.tracker, receipt.code, mlm.fit_string(receipt.reason))]

    def gap_frames(self, stream: str, missed: int, available: int) -> list[bytes] | None:
        return None


class MlmVersion2(MlmDialect):
    """Our extension: sequence numbers, STORED, DONE, positions, gaps."""

    version = 2
    _stream_message = mlm.StreamRecord

    def _stream_tail(self, record: StreamRecord) -> bytes:
        return _stream_record_tail(record.subject, record.seq, int(record.timestamp * 1000))

    def letter_frames(self, letter: Letter) -> list[bytes]:
        header = _letter_records[letter.kind](
            letter.id, letter.sender, letter.address, letter.subject, letter.tracker
        )
        return [header, *letter.content]

    def stored_frames(self, receipt: Receipt) -> list[bytes] | None:
        assert receipt.code is not None
        reason = mlm.fit_string(receipt.reason)
        return [_stored(receipt.id, receipt.tracker, receipt.code, reason)]

    def gap_frames(self, stream: str, missed: int, available: int) -> list[bytes] | None:
        return mlm.encode(mlm.StreamGap(stream, missed, available))
