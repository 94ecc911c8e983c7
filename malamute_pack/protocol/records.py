"""
The plain records that travel between brokers as well as into the journal:
a queued (mailbox or service) record, a stream record and a stream row as
the journal writes it, an idempotent append's key, and a stream's
retention policy. They live here, under the codecs that carry them
(L{malamute_pack.protocol.pair}), so that no codec imports the broker or
the journal; the model, the storage port (L{malamute_pack.store}) and the
journal import them from here.

Tests: ``tests/unit/test_protocol_records.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeAlias


@dataclass(frozen=True, slots=True)
class QueuedRecord:
    """
    One message waiting in a mailbox (``kind="mailbox"``, ``address`` the
    owner) or a service queue (``kind="service"``, ``address`` the service).
    ``deadline`` is absolute epoch seconds, ``None`` for no timeout.
    """

    id: int
    kind: str
    address: str
    sender: str
    subject: str
    tracker: str
    deadline: float | None
    created: float
    content: tuple[bytes, ...]
    # The pack peer that handed it over (its broker id; "" for none) and
    # that peer's id for it.
    relay_origin: str = ""
    relay_id: int = 0


# A stream message as the writer inserts it, built once in the reactor thread
# so the writer thread does no per-message Python work beyond binding it:
# (stream, seq, timestamp, sender, subject, content BLOB, BLOB size, origin,
# origin_seq), in the order of the writer's INSERT columns.
StreamRow: TypeAlias = tuple[str, int, float, str, str, bytes, int, str, int]


@dataclass(frozen=True)
class RetentionPolicy:
    """
    Limits on one stream's journal; ``None`` means no limit of that kind.
    ``max_bytes`` counts each record's stored content (its frames plus 4
    bytes of length per frame), not its subject or sender.
    """

    max_count: int | None = None
    max_age_s: float | None = None
    max_bytes: int | None = None


class StreamRecord(NamedTuple):
    """
    One stream message with its per-stream sequence number: what a reader
    is delivered, live or from the journal. (A named tuple: one is made for
    every message written, and it is the cheapest immutable record.)

    A record a peer broker forwarded has this broker's own C{seq} and
    remembers where it was first written: C{origin} and C{origin_seq}. A
    record written here has the defaults, C{""} and C{0}.

    @ivar seq: its sequence number in this broker's copy of the stream.
    @ivar timestamp: when the broker took it, in epoch seconds.
    @ivar sender: the writer's address ("" for an anonymous writer).
    @ivar origin: the id of the broker it was first written on; "" for this
        broker (a local write).
    @ivar origin_seq: its sequence number on C{origin}; 0 for a local write.
    """

    stream: str
    seq: int
    timestamp: float
    sender: str
    subject: str
    content: Sequence[bytes]
    origin: str = ""
    origin_seq: int = 0


# A consumer's kind (the ``stream_consumers`` table, docs/protocol.md).
READER: Final = "reader"  # a durable named reader
GROUP: Final = "group"  # a consumer group
# In a pack: what a group acknowledged in origin terms, as its home said
# (malamute_pack.pack.groups); seq is its reset, acked the vector as JSON.
ORIGINS: Final = "origins"


@dataclass(frozen=True, slots=True)
class ConsumerPosition:
    """
    Where a consumer the broker remembers is on ``stream``: every record up
    to ``seq`` acknowledged, and (a group) the records acknowledged past it
    in ``acked``, a serialized roaring bitmap (empty for none); ``updated``
    when it was last used (epoch seconds); ``owner`` the authenticated user
    who made it, the only one who may use it ("" for anyone).
    """

    stream: str
    kind: str
    name: str
    seq: int
    acked: bytes = b""
    updated: float = 0.0
    owner: str = ""


class AppendKey(NamedTuple):
    """The key of an idempotent append, and the sequence numbers its records got."""

    stream: str
    key: str
    first: int
    last: int
