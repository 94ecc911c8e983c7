"""
The broker's explicit bounds, every one configurable, with sane defaults.

Tests: ``tests/test_broker_limits.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from malamute_pack.broker.errors import Refused


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

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"limit {name} must be a positive integer, not {value!r}")
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
    """Refuse an empty name (unless allowed) or one longer than C{limit} bytes."""
    if not name and not allow_empty:
        raise Refused(f"invalid {what}: it is empty")
    if longer_than(name, limit):
        raise Refused(f"invalid {what}: longer than {limit} bytes")
