"""
The SQLite journal of malamute_pack: stream messages with per-stream
sequence numbers and retention, and durable mailbox and service-queue
messages, written by one writer thread with group commit.

This module re-exports the public API. Its modules:

- C{journal}: L{Journal}, the facade the broker uses from the reactor
  thread, composed of the parts below.
- C{opening}: open a file, check its identity, migrate, recover (L{Recovered}).
- C{identity}: the journal's identity and the data directory's marker.
- C{schema}: the SQLite schema and its migrations.
- C{sequencing}: sequence numbers and ids handed out at once; the
  uncommitted tail.
- C{handover}: the hand-over to the writer thread and its reports back.
- C{writer}: the writer thread, the only code that writes (group commit).
- C{inserts}: a batch's multi-row INSERTs, and the insert process that
  writes batches of many stream records outside the broker's GIL.
- C{checksums}: each record's CRC-32, computed where rows are written.
- C{reads}: the SQL that reads a journal file, every record verified.
- C{verify}: verified reads: damaged records left out and reported.
- C{scan}: reading past what SQLite cannot read (bisection, rowid scans).
- C{damage}: what the journal cannot serve (damaged, or lost in a salvage),
  told to readers as gaps, logged and counted.
- C{checking}: finding a damaged file as it opens (quick_check, checksums).
- C{wal}: its write-ahead log checked before SQLite reads it: repaired
  where damaged in place, refused where cut short.
- C{salvage}: a damaged file kept aside, what can be saved copied into a
  new journal with the same identity, what was lost reported.
- C{reader}: the reader thread that runs those reads.
- C{replica}: a pair's replication hooks (positions, shipper, hold).
- C{backlog}: backpressure: bytes handed to the writer and not yet back.
- C{pruning}: retention applied, by a C{LoopingCall} or on demand.
- C{retention}: the retention policy and the prune step.
- C{last_values}: the last-value streams' latest records, kept by the writer.
- C{records}: stream and queued records as rows; content frames as a BLOB.
- C{config}: L{JournalConfig}: group commit, durability, retention, pruning.
- C{errors}: L{JournalError}, every SQLite failure.
- C{service}: L{malamute_pack.journal.service.JournalService}: opened when
  the broker starts, flushed and closed when it stops.
- C{feature}: the journal as a feature: its settings, keys and options.
- C{bench}: the journal's throughput benchmark
  (C{python -m malamute_pack.journal.bench}).

Tests: ``tests/unit/test_journal_*.py``.
"""

from malamute_pack.journal.config import SYNCHRONOUS_LEVELS, JournalConfig
from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.feature import FEATURE
from malamute_pack.journal.identity import JOURNAL_MARKER, JournalIdentityError
from malamute_pack.journal.journal import Journal, JournalCounters, Recovered
from malamute_pack.journal.records import QUEUED_KINDS
from malamute_pack.journal.retention import DEFAULT_RETENTION
from malamute_pack.protocol.chunks import decode_frames, encode_frames
from malamute_pack.protocol.records import QueuedRecord, RetentionPolicy, StreamRecord

__all__ = [
    "DEFAULT_RETENTION",
    "FEATURE",
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
