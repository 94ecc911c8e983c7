"""
What a Malamute client hands to the application: deliveries (stream,
mailbox and service messages), the confirmations the broker forwards, and
stream gaps (protocol version 2).

Tests: ``tests/unit/test_client_core.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

DeliveryCommand = Literal["STREAM_DELIVER", "MAILBOX_DELIVER", "SERVICE_DELIVER"]


@dataclass(frozen=True, slots=True)
class Delivery:
    """
    One message the broker delivered.

    With protocol version 2 the broker sends STREAM_RECORD, MAILBOX_RECORD
    and SERVICE_RECORD; they arrive as the same deliveries (same C{command}
    strings as version 1) with the extra fields set.

    @ivar command: which kind of delivery it is.
    @ivar sender: the sender's address ("" for an anonymous sender).
    @ivar address: the stream name (STREAM_DELIVER), the mailbox owner
        (MAILBOX_DELIVER) or the service name (SERVICE_DELIVER).
    @ivar tracker: the sender's tracker ("" for stream messages and for
        untracked letters); a tracked letter waits for L{confirm}.
    @ivar sequence: (version 2 stream messages) the message's number in its
        stream: 1, 2, 3... without gaps.
    @ivar timestamp: (version 2 stream messages) when the broker stored it,
        in seconds since the epoch.
    @ivar id: (version 2 mailbox and service messages) the message's id in
        the broker's journal, stable across broker restarts; the message is
        kept until it is answered with DONE.
    """

    command: DeliveryCommand
    sender: str
    address: str
    subject: str
    tracker: str
    content: tuple[bytes, ...]
    sequence: int | None = None
    timestamp: float | None = None
    id: int | None = None


def partition(
    deliveries: Iterable[Delivery], stale: Callable[[Delivery], bool]
) -> tuple[list[Delivery], list[Delivery]]:
    """C{deliveries} split, in order, into those C{stale} keeps and those it picks."""
    kept: list[Delivery] = []
    dropped: list[Delivery] = []
    for delivery in deliveries:
        (dropped if stale(delivery) else kept).append(delivery)
    return kept, dropped


@dataclass(frozen=True, slots=True)
class Confirmation:
    """A CONFIRM the broker forwarded about a tracked message this client sent."""

    tracker: str
    status_code: int
    status_reason: str


@dataclass(frozen=True, slots=True)
class Gap:
    """
    STREAM_GAP (version 2): retention removed stream messages this reader
    had not received yet; delivery goes on from C{available}.

    @ivar stream: the stream.
    @ivar missed: the first sequence number the reader wanted.
    @ivar available: the first sequence number still retained.
    """

    stream: str
    missed: int
    available: int
