"""
The journal's SQLite schema and its migrations.

``MIGRATIONS`` is an ordered list of functions; the ``schema_version``
table holds how many of them a database has had, and :func:`migrate` applies
the rest, each in its own transaction together with the version bump. A
database newer than this code is refused rather than guessed at.

Tables:

- ``stream_messages``: every retained stream message, primary key
  (stream, seq) so that range reads and prefix pruning walk one index;
  ``bytes`` is the stored content size that retention counts. Index
  (stream, ts, seq) answers "first seq at or after a time". ``origin`` and
  ``origin_seq`` say where a record a peer broker forwarded was first
  written (that broker's id and its sequence number there; ``''`` and 0
  for a local write, the defaults, which journals made before these
  columns get for every row). A partial index on (stream, origin,
  origin_seq) covers forwarded records only, so local writes do not pay
  for it; it answers "how far has each origin been received".
- ``streams``: per stream, the highest sequence number ever assigned
  (survives pruning everything, so numbers are never reused) and the count
  and bytes retained, kept in step by the writer in the same transactions.
- ``queued_messages``: mailbox and service-queue messages until confirmed;
  ``relay_origin`` and ``relay_id`` say which pack peer handed one over
  (its broker id and its own id for it; '' and 0 for the others).
- ``journal_counters``: named high-water marks (``queued_last_id``, from
  the journal's creation time in millionths of a second: a journal made
  afresh gives no letter an id an earlier one gave; after a
  salvage that lost streams' names, ``stream_floor``, where the numbers of
  a stream it does not know start) and the ``running`` flag that tells a crash from a clean close.
- ``journal_identity``: one row, the journal's identity (a random id made
  when the journal was created, or when an older journal got this table)
  and that time; the data directory's marker
  (:mod:`malamute_pack.journal.identity`) records it too.
- ``stream_appends``: the key of every idempotent append (STREAM_APPEND,
  ``docs/protocol.md``) the broker still remembers, with the sequence
  numbers its records got, written in the same transaction as they are.
- ``stream_consumers``: the position of each durable named reader and
  consumer group (kind ``reader`` or ``group``) on a stream: every record up
  to ``seq`` acknowledged, a group's acknowledgements past it in ``acked``
  (a roaring bitmap), and when it was last used (``updated``).
- ``stream_last_values``: for a last-value stream (``streams.compact`` is
  ``subject``), the sequence number of the latest record of each subject;
  retention never removes those records.
- ``stream_messages.checksum`` and ``queued_messages.checksum``: each
  record's CRC-32 (:mod:`malamute_pack.journal.checksums`), NULL for rows
  written before migration 10 (not verifiable).
- ``journal_losses``: the ranges of stream records a salvage of a damaged
  journal could not copy (:mod:`malamute_pack.journal.salvage`), with when
  and why; reads tell their readers of them as gaps.
- ``stream_skips``: the ranges of sequence numbers a stream jumped over,
  never given to a committed record (numbering past a crash or a takeover,
  or past what a pair's partner may have given), down to the stream's
  first retained record: a salvage does not count them as lost.
- ``pair_state``: named values of a broker in a primary/backup pair
  (:mod:`malamute_pack.pair`): the epoch this journal follows or leads,
  its leader, and where the last takeover began (JSON).
- ``address_owners``: which authenticated user owns each address (the
  first to open it, :class:`malamute_pack.broker.access.Owners`) and when
  it was claimed, written by the journal's writer in the order of writes
  and read back when the journal opens (:mod:`malamute_pack.journal.journal`).

The schema is made with sqlite-utils, imported without the pandas and
numpy it would load (:mod:`malamute_pack.blocked_imports`).

Tests: ``tests/unit/test_journal_schema.py``, ``tests/unit/test_journal_origin.py``,
``tests/system/test_broker_footprint.py``.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Final

from malamute_pack.blocked_imports import blocked_imports

# sqlite-utils imports pandas and numpy when they are installed (the Spark
# extra installs them), for column types the journal never uses: the
# broker goes without (malamute_pack.blocked_imports).
with blocked_imports("pandas", "numpy"):
    from sqlite_utils import Database

QUEUED_LAST_ID: Final = "queued_last_id"
# The sequence numbers a stream the journal does not know starts after: set
# by a salvage that could not read every stream's name and number
# (malamute_pack.journal.salvage), so that no number is given twice.
STREAM_FLOOR: Final = "stream_floor"
# The highest stream number the journal may have given, all streams (raised
# at each open; past a crash, by the crash skip): a copy of the streams
# table's high-water marks, so that a salvage that cannot read that table
# still numbers past them (found by the soak: a salvaged journal damaged
# again lost its streams table, and numbered from a million again).
STREAMS_NUMBERED: Final = "streams_numbered"
# 1 while a journal has the database open, 0 after a clean close: finding 1
# at open means the last run crashed.
RUNNING: Final = "running"

Migration = Callable[[Database], None]


def _create_initial_schema(db: Database) -> None:
    db.table("stream_messages").create(
        {
            "stream": str,
            "seq": int,
            "ts": float,
            "sender": str,
            "subject": str,
            "content": bytes,
            "bytes": int,
        },
        pk=("stream", "seq"),
        not_null={"stream", "seq", "ts", "sender", "subject", "content", "bytes"},
        strict=True,
    )
    db.table("stream_messages").create_index(["stream", "ts", "seq"])
    db.table("streams").create(
        {"stream": str, "last_seq": int, "message_count": int, "total_bytes": int},
        pk="stream",
        not_null={"last_seq", "message_count", "total_bytes"},
        strict=True,
    )
    db.table("queued_messages").create(
        {
            "id": int,
            "kind": str,
            "address": str,
            "sender": str,
            "subject": str,
            "tracker": str,
            "deadline": float,
            "created": float,
            "content": bytes,
        },
        pk="id",
        not_null={"kind", "address", "sender", "subject", "tracker", "created", "content"},
        strict=True,
    )
    db.table("journal_counters").create(
        {"name": str, "value": int}, pk="name", not_null={"value"}, strict=True
    )


def _add_identity(db: Database) -> None:
    db.table("journal_identity").create(
        {"id": int, "identity": str, "created": float},
        pk="id",
        not_null={"identity", "created"},
        strict=True,
    )
    db.table("journal_identity").insert(
        {"id": 1, "identity": uuid.uuid4().hex, "created": time.time()}
    )


def _add_address_owners(db: Database) -> None:
    db.table("address_owners").create(
        {"address": str, "user": str, "claimed": float},
        pk="address",
        not_null={"user", "claimed"},
        strict=True,
    )


ORIGIN_INDEX: Final = "stream_messages_origin"


def _add_stream_origin(db: Database) -> None:
    # ALTER TABLE ADD COLUMN keeps the table STRICT and fills every existing
    # row with the default: a journal's old records are all local.
    messages = db.table("stream_messages")
    messages.add_column("origin", str, not_null_default="")
    messages.add_column("origin_seq", int, not_null_default=0)
    # sqlite-utils makes no partial index. The WHERE must stay as written:
    # SQLite uses the index only for queries whose WHERE implies it.
    db.execute(
        f"CREATE INDEX {ORIGIN_INDEX} ON stream_messages (stream, origin, origin_seq) "
        "WHERE origin != ''"
    )


def _add_queued_relay(db: Database) -> None:
    # A letter a pack peer handed over remembers where from, so that the
    # same letter handed over again after a restart is known (pack/).
    queued = db.table("queued_messages")
    queued.add_column("relay_origin", str, not_null_default="")
    queued.add_column("relay_id", int, not_null_default=0)


def _add_stream_appends(db: Database) -> None:
    # The keys of idempotent appends (STREAM_APPEND), written in the same
    # transaction as their records: a key found here was written, whole.
    db.table("stream_appends").create(
        {"stream": str, "key": str, "first_seq": int, "last_seq": int, "created": float},
        pk=("stream", "key"),
        not_null={"stream", "key", "first_seq", "last_seq", "created"},
        strict=True,
    )


def _add_pair_state(db: Database) -> None:
    # What a broker of a pair knows of the history its journal follows
    # (malamute_pack.pair.replication): kept with the data it describes.
    db.table("pair_state").create(
        {"name": str, "value": str}, pk="name", not_null={"value"}, strict=True
    )


def _add_stream_consumers(db: Database) -> None:
    # The positions of the consumers the broker remembers (durable named
    # readers and consumer groups, docs/protocol.md): every record up to
    # ``seq`` acknowledged, and a group's records acknowledged past it in
    # ``acked`` (a serialized roaring bitmap of sequence numbers, empty for
    # a reader), and the user who owns it (``owner``, '' for anyone).
    # Written by the journal's writer in the order of writes.
    db.table("stream_consumers").create(
        {
            "stream": str,
            "kind": str,
            "name": str,
            "seq": int,
            "acked": bytes,
            "updated": float,
            "owner": str,
        },
        pk=("stream", "kind", "name"),
        not_null={"stream", "kind", "name", "seq", "acked", "updated", "owner"},
        strict=True,
    )


def _add_stream_last_values(db: Database) -> None:
    # A last-value stream's latest record of each subject (docs/protocol.md),
    # kept by the writer in the transaction that writes the record; the
    # ``compact`` column of ``streams`` says whether it is kept for a stream.
    db.table("stream_last_values").create(
        {"stream": str, "subject": str, "seq": int},
        pk=("stream", "subject"),
        not_null={"stream", "subject", "seq"},
        strict=True,
    )
    db.table("streams").add_column("compact", str, not_null_default="")


def _add_checksums(db: Database) -> None:
    # Each record's CRC-32 (malamute_pack.journal.checksums), computed where
    # it is written and checked by every read. NULL for the rows written
    # before: they cannot be verified.
    db.table("stream_messages").add_column("checksum", int)
    db.table("queued_messages").add_column("checksum", int)


def _add_losses(db: Database) -> None:
    # The ranges of stream records a salvage of a damaged journal could not
    # copy (malamute_pack.journal.salvage): readers are told of them as gaps.
    db.table("journal_losses").create(
        {"stream": str, "first_seq": int, "last_seq": int, "found": float, "reason": str},
        pk=("stream", "first_seq"),
        not_null={"stream", "first_seq", "last_seq", "found", "reason"},
        strict=True,
    )


def _add_skips(db: Database) -> None:
    # The numbers a stream jumped over (after a crash, a takeover, or past a
    # pair partner's): a salvage does not count them as lost (found by the
    # soak: a salvaged journal that held the pair's newer history reported
    # its takeover's jump as a million records lost, claimed no history,
    # and what it had acknowledged was cut back).
    db.table("stream_skips").create(
        {"stream": str, "first_seq": int, "last_seq": int},
        pk=("stream", "first_seq"),
        not_null={"stream", "first_seq", "last_seq"},
        strict=True,
    )


# A skip merges with a skip of the same start.
_MERGE_SKIP: Final = (
    " ON CONFLICT (stream, first_seq) DO UPDATE SET last_seq = max(last_seq, excluded.last_seq)"
)
# Records that C{stream} (?1) skips the numbers from ?2 to ?3.
ADD_SKIP: Final = (
    "INSERT INTO stream_skips (stream, first_seq, last_seq) VALUES (?, ?, ?)" + _MERGE_SKIP
)
# Records that every stream skips the numbers from after its last up to ?1.
SKIP_UP_TO: Final = (
    "INSERT INTO stream_skips (stream, first_seq, last_seq)"
    " SELECT stream, last_seq + 1, ?1 FROM streams WHERE last_seq < ?1" + _MERGE_SKIP
)


# Raises a named counter of journal_counters to a value (never lowers it).
RAISE_COUNTER: Final = (
    "INSERT INTO journal_counters (name, value) VALUES (?, ?) "
    "ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)"
)

# A journal's letter ids start past its creation time in millionths of a
# second (below).
IDS_PER_SECOND: Final = 1_000_000


def _ids_past_creation(db: Database) -> None:
    # So a journal made afresh (its files removed) never gives a letter an
    # id an earlier journal of the broker gave: a client still connected
    # drops a letter whose id it had before as a repeat (found by the
    # soak: a broker started on a new journal lost its new letters so).
    created = db.execute("SELECT created FROM journal_identity WHERE id = 1").fetchone()[0]
    db.execute(RAISE_COUNTER, (QUEUED_LAST_ID, int(created * IDS_PER_SECOND)))


MIGRATIONS: Final[Sequence[Migration]] = (
    _create_initial_schema,
    _add_identity,
    _add_address_owners,
    _add_stream_origin,
    _add_queued_relay,
    _add_stream_appends,
    _add_pair_state,
    _add_stream_consumers,
    _add_stream_last_values,
    _add_checksums,
    _add_losses,
    _ids_past_creation,
    _add_skips,
)


def journal_identity(conn: sqlite3.Connection) -> tuple[str, float]:
    """The identity of the migrated journal on ``conn`` and when it was made."""
    row = conn.execute("SELECT identity, created FROM journal_identity WHERE id = 1").fetchone()
    if row is None:
        raise ValueError("journal has no identity (its journal_identity table is empty)")
    return str(row[0]), float(row[1])


def schema_version(db: Database) -> int:
    """How many migrations ``db`` has had (0 for a new database)."""
    if not db.table("schema_version").exists():
        return 0
    row = db.execute("SELECT version FROM schema_version WHERE id = 1").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: sqlite3.Connection, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """
    Put ``conn``'s database in WAL mode and apply the migrations it has not
    had yet; return the resulting version. Raises ValueError for a database
    whose version is newer than ``migrations`` knows.
    """
    db = Database(conn, execute_plugins=False, recursive_triggers=False)
    db.enable_wal()
    db.table("schema_version").create(
        {"id": int, "version": int}, pk="id", not_null={"version"}, if_not_exists=True
    )
    current = schema_version(db)
    if current > len(migrations):
        raise ValueError(
            f"journal schema version {current} is newer than this code knows ({len(migrations)})"
        )
    for version in range(current, len(migrations)):
        with db.atomic():
            migrations[version](db)
            db.table("schema_version").upsert({"id": 1, "version": version + 1}, pk="id")
    return len(migrations)
