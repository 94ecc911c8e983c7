"""
What a Malamute client hands to the application: deliveries (stream,
mailbox and service messages) and the confirmations the broker forwards.

Tests: ``tests/test_client_core.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DeliveryCommand = Literal["STREAM_DELIVER", "MAILBOX_DELIVER", "SERVICE_DELIVER"]


@dataclass(frozen=True, slots=True)
class Delivery:
    """
    One message the broker delivered.

    @ivar command: which kind of delivery it is.
    @ivar sender: the sender's address ("" for an anonymous sender).
    @ivar address: the stream name (STREAM_DELIVER), the mailbox owner
        (MAILBOX_DELIVER) or the service name (SERVICE_DELIVER).
    @ivar tracker: the sender's tracker ("" for stream messages and for
        untracked letters); a tracked letter waits for L{confirm}.
    """

    command: DeliveryCommand
    sender: str
    address: str
    subject: str
    tracker: str
    content: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Confirmation:
    """A CONFIRM the broker forwarded about a tracked message this client sent."""

    tracker: str
    status_code: int
    status_reason: str
