"""
The journal's identity, kept in two places so that a journal file that was
emptied, deleted or replaced is noticed instead of silently started afresh.

The journal stores a random identity when it is created
(:func:`malamute_pack.journal.schema.journal_identity`); the first time a
journal opens in a data directory, a small marker file there
(``<data-dir>/journal.marker``, JSON) records the journal's path, identity
and creation time (and, refreshed at each open, the highest numbers it may
have given, past its crash skip: a salvage that cannot read them in the
file numbers past them). From then on, a journal that opens with a marker must be
the one the marker names: a missing file, or one with another identity, is
refused with a :class:`JournalIdentityError` that says what happened and
what to do: restore the file, or remove the marker to start afresh (or
adopt the other journal) on purpose. An empty (truncated) file is refused
too: there is nothing in it to salvage. A file cut short or damaged is
salvaged with the marker's identity (:mod:`malamute_pack.journal.salvage`).

The marker is deliberately not named like the journal, so that removing
``journal.sqlite*`` does not remove it too.

Tests: ``tests/system/test_datadir.py`` (the marker and the broker's refusal) and
``tests/unit/test_journal_schema.py`` (the identity in the journal).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from malamute_pack.journal.errors import JournalError

JOURNAL_MARKER: Final = "journal.marker"


class JournalIdentityError(JournalError):
    """The journal file is not the one its data directory's marker records."""


@dataclass(frozen=True)
class Marker:
    """
    What a marker records: the journal's path, identity and creation time,
    and the highest stream number and letter id the journal may have given
    when it last opened (after its crash skip): a salvage of a journal that
    lost the tables that say so still numbers past them.
    """

    journal: str
    identity: str
    created: float
    numbered: int = 0
    letters: int = 0

    @property
    def created_text(self) -> str:
        return datetime.fromtimestamp(self.created, UTC).isoformat(timespec="seconds")

    def describe(self) -> str:
        return f"identity {self.identity}, created {self.created_text}"


def read_marker(path: Path) -> Marker | None:
    """
    The marker at ``path``, or None if there is none.

    @raise JournalIdentityError: it is there but cannot be read.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _unreadable(path, str(e)) from e
    try:
        fields = json.loads(data)
        return Marker(
            str(fields["journal"]),
            str(fields["identity"]),
            float(fields["created"]),
            int(fields.get("numbered", 0)),
            int(fields.get("letters", 0)),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise _unreadable(path, f"{type(e).__name__}: {e}") from e


def _unreadable(path: Path, why: str) -> JournalIdentityError:
    return JournalIdentityError(
        f"journal marker {path} cannot be read ({why}); it should record which journal "
        f"this data directory holds. Restore it, or remove it to accept the journal file "
        f"that is there as it is."
    )


def write_marker(path: Path, marker: Marker) -> None:
    """Write ``marker`` to ``path`` atomically and durably (a new file, renamed)."""
    data = json.dumps(
        {
            "journal": marker.journal,
            "identity": marker.identity,
            "created": marker.created,
            "numbered": marker.numbered,
            "letters": marker.letters,
        },
        indent=1,
    ).encode()
    partial = path.with_name(path.name + ".new")
    with partial.open("wb") as f:
        f.write(data + b"\n")
        f.flush()
        os.fsync(f.fileno())
    partial.replace(path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def check_file(journal: Path, marker_path: Path, marker: Marker) -> None:
    """
    Refuse a journal file that is missing or empty where ``marker`` says a
    journal was created.

    @raise JournalIdentityError: saying which, and what to do.
    """
    journal = journal.absolute()
    what: str | None = None
    try:
        size = journal.stat().st_size
    except FileNotFoundError:
        what = "is missing"
    else:
        if not journal.is_file():
            what = "is not a regular file"
        elif size == 0:
            what = "is empty (0 bytes: it was truncated)"
    if what is None:
        return
    raise JournalIdentityError(
        f"journal {journal} {what}, but {marker_path} records that a journal was created "
        f"there ({marker.describe()}): the letters and stream records it held are not in it, "
        f"so the broker refuses to start rather than lose them silently. Restore the journal "
        f"file (with its -wal file, if there is one) from a backup; or, to start afresh with "
        f"an empty journal on purpose, remove {marker_path}."
    )


def check_identity(journal: Path, marker_path: Path, marker: Marker, identity: str) -> None:
    """
    Refuse a journal whose ``identity`` is not the one ``marker`` records.

    @raise JournalIdentityError: saying so, and what to do.
    """
    journal = journal.absolute()
    if identity == marker.identity:
        return
    raise JournalIdentityError(
        f"journal {journal} is not the journal that was created in this data directory: "
        f"its identity is {identity}, but {marker_path} records {marker.describe()}. The file "
        f"was replaced. Put the right journal file back; or, to use this journal on purpose, "
        f"remove {marker_path}."
    )
