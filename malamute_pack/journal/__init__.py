"""
The SQLite journal of malamute_pack: stream messages with per-stream
sequence numbers and retention, and durable mailbox and service-queue
messages, written by one writer thread with group commit.

This module re-exports the public API. Tests: ``tests/unit/test_journal_*.py``.
"""

from malamute_pack.journal.config import SYNCHRONOUS_LEVELS, JournalConfig
from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.identity import JOURNAL_MARKER, JournalIdentityError
from malamute_pack.journal.journal import Journal, JournalCounters, Recovered
from malamute_pack.journal.records import (
    QUEUED_KINDS,
    QueuedRecord,
    StreamRecord,
    decode_frames,
    encode_frames,
)
from malamute_pack.journal.retention import DEFAULT_RETENTION, RetentionPolicy

__all__ = [
    "DEFAULT_RETENTION",
    "JOURNAL_MARKER",
    "QUEUED_KINDS",
    "SYNCHRONOUS_LEVELS",
    "Journal",
    "JournalConfig",
    "JournalCounters",
    "JournalError",
    "JournalIdentityError",
    "QueuedRecord",
    "Recovered",
    "RetentionPolicy",
    "StreamRecord",
    "decode_frames",
    "encode_frames",
]
