"""
The broker's explicit bounds, every one configurable, with sane defaults.

Tests: ``tests/unit/test_broker_limits.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from malamute_pack.broker.errors import Refused

# Limits for which 0 means "none".
_MAY_BE_ZERO = frozenset({"service_lease", "group_lease"})


@dataclass(frozen=True, slots=True)
class Limits:
    """
    Bounds the broker enforces on what clients send and what it holds.

    @ivar max_message_bytes: the most bytes in all frames of one message.
    @ivar max_frames: the most frames in one message (header included).
    @ivar max_subject: the longest subject, in bytes (the wire allows 255).
    @ivar max_address: the longest address, stream or service name.
    @ivar mailbox_max_messages: messages one mailbox holds before refusing.
    @ivar mailbox_max_bytes: content bytes one mailbox holds before refusing.
    @ivar service_max_messages: requests one service queue holds.
    @ivar service_max_bytes: content bytes one service queue holds.
    @ivar max_clients: connected clients at once.
    @ivar max_subscriptions: stream patterns plus service offers per client.
    @ivar service_lease: seconds a worker may hold a service request it has
        not answered before it goes back to the queue (0: no lease, held
        until answered or the worker is lost).
    @ivar letters_max_bytes: bytes of letters (mailbox messages and service
        requests, queued or held until answered, each with a fixed overhead)
        the whole broker holds before refusing more ("retry later").
    @ivar journal_backlog_bytes: bytes of writes handed to the journal and
        not yet committed (stream messages waiting in memory included)
        before the broker stops reading from its clients until the journal
        catches up (backpressure on the producers).
    @ivar send_queue: messages ZeroMQ queues to one peer; a peer with that
        many not yet taken does not drain: it is stalled (stream readers
        fall behind onto the journal, letters wait in their queue).
    @ivar receive_queue: messages ZeroMQ queues from one peer that the
        broker has not read yet; beyond it the peer's sends wait (ZeroMQ
        and TCP backpressure).
    @ivar append_keys: keys of idempotent appends (STREAM_APPEND) the
        broker remembers, in all streams; the oldest are forgotten first.
    @ivar consumers: consumer positions (durable named readers and groups)
        the broker remembers, in all streams; past it a new name is refused
        (a position is forgotten only when unused for C{consumer_ttl}, never
        to make room for another).
    @ivar consumers_per_user: consumer and group names one user (or the
        anonymous clients, together) may have remembered at once; past it
        that user's new names are refused, never another user's evicted.
    @ivar consumers_per_connection: new consumer and group names one
        connection may make in its life (a flood of names from one client
        is refused before it fills its user's share).
    @ivar consumer_ttl: seconds after which the position of a consumer
        nobody used (consumed or committed) is forgotten.
    @ivar group_lease: seconds a member of a consumer group may hold a
        record unacknowledged before its records go to the other members
        (0: never).
    @ivar group_unacked_bytes: content bytes a member of a consumer group
        may hold unacknowledged; past them it is sent more once it commits.
    """

    max_message_bytes: int = 4 * 1024 * 1024
    max_frames: int = 64
    max_subject: int = 255
    max_address: int = 255
    mailbox_max_messages: int = 100_000
    mailbox_max_bytes: int = 256 * 1024 * 1024
    service_max_messages: int = 100_000
    service_max_bytes: int = 256 * 1024 * 1024
    max_clients: int = 10_000
    max_subscriptions: int = 1_000
    service_lease: int = 0
    letters_max_bytes: int = 48 * 1024 * 1024
    journal_backlog_bytes: int = 32 * 1024 * 1024
    send_queue: int = 4_000
    receive_queue: int = 1_000
    append_keys: int = 100_000
    last_value_subjects: int = 1_000_000
    consumers: int = 10_000
    consumers_per_user: int = 1_000
    consumers_per_connection: int = 100
    consumer_ttl: int = 7 * 24 * 3600
    group_lease: int = 30
    group_unacked_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            least = 0 if name in _MAY_BE_ZERO else 1
            if not isinstance(value, int) or value < least:
                kind = "a whole number of at least 0" if least == 0 else "a positive integer"
                raise ValueError(f"limit {name} must be {kind}, not {value!r}")
        for name in ("max_subject", "max_address"):
            if getattr(self, name) > 255:
                raise ValueError(f"limit {name} cannot exceed the wire's 255 bytes")


def longer_than(text: str, limit: int) -> bool:
    """
    Whether C{text} takes more than C{limit} bytes in UTF-8 (a character
    takes at most 4, so short texts are answered without encoding them).
    """
    if len(text) * 4 <= limit:
        return False
    return len(text.encode("utf-8", "surrogateescape")) > limit


def check_name(what: str, name: str, limit: int, allow_empty: bool = False) -> None:
    """
    Refuse an empty name (unless allowed), one longer than C{limit} bytes,
    or one with a NUL (the broker joins names with NUL in its own keys and
    marks, so a name holding one could pass for another).
    """
    if not name and not allow_empty:
        raise Refused(f"invalid {what}: it is empty")
    if longer_than(name, limit):
        raise Refused(f"invalid {what}: longer than {limit} bytes")
    if "\x00" in name:
        raise Refused(f"invalid {what}: it contains a NUL character")
