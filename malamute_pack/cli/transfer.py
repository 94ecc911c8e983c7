"""
C{malamute export} and C{malamute import}: a stream's records to a file
and back, through the bulk client (range reads paced by credit; appends
written all or none under a key). A progress bar goes to stderr when it is
a terminal (or with C{--progress}).

An import writes its records as the importing client (the sender is its
address) with new sequence numbers and times: subjects and bodies are
kept. Each batch is appended under a key made from the file's content and
the batch's place in it, so running the same import again (after a
failure half-way, say) writes nothing twice; C{--key} gives another
prefix to import the same file again on purpose.

Tests: ``tests/system/test_cli.py`` (against a broker), ``tests/unit/test_cli_files.py``.
"""

from __future__ import annotations

import hashlib
import secrets
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final, Never

from tqdm import tqdm

from malamute_pack.cli.connection import ConnectionSettings, open_bulk, stream_with_records
from malamute_pack.cli.errors import CommandError
from malamute_pack.cli.files import Row, open_writer, read_rows
from malamute_pack.cli.positions import Position
from malamute_pack.cli.records import records_from_chunk
from malamute_pack.client.bulk import BulkClient, RangeGap
from malamute_pack.protocol import mlm
from malamute_pack.text import plural

# Records in one append at most (each append is one journal transaction).
APPEND_RECORDS: Final = 1000
# Per record in an append: subject length byte, frames' total length, each frame's length.
_RECORD_OVERHEAD: Final = 1 + 4


def _bar(total: int | None, unit: str, progress: bool) -> tqdm[Never]:
    return tqdm(
        total=total,
        unit=unit,
        unit_scale=True,
        file=sys.stderr,
        disable=not (progress or sys.stderr.isatty()),
        leave=False,
    )


def _sequence_at(bulk: BulkClient, stream: str, position: Position, *, end: bool) -> int:
    """
    The sequence number C{position} names: the first to read, or with
    C{end} the last (for a time, the last record before it).
    """
    status = bulk.status(stream, position.whence, position.value)
    if not end:
        return status.position
    if position.whence == mlm.LATEST:
        return status.last
    if position.whence == mlm.TIME:
        return status.position - 1
    return status.position


def export(
    settings: ConnectionSettings,
    stream: str,
    start: Position,
    stop: Position,
    name: str,
    pattern: str,
    progress: bool,
) -> int:
    """Write C{stream}'s records from C{start} to C{stop} (both included) to the file C{name}."""
    with open_bulk(settings) as bulk:
        status = stream_with_records(bulk, stream)
        first = max(_sequence_at(bulk, stream, start, end=False), status.first)
        last = min(_sequence_at(bulk, stream, stop, end=True), status.last)
        writer = open_writer(name)
        written = lost = 0
        try:
            with _bar(max(0, last - first + 1), "rec", progress) as bar:
                position = first
                for item in bulk.read_range(stream, first, last, pattern) if first <= last else ():
                    if isinstance(item, RangeGap):
                        lost += item.available - item.missed
                        print(
                            f"records {item.missed} to {item.available - 1} were removed by "
                            "retention while exporting",
                            file=sys.stderr,
                        )
                        continue
                    records = records_from_chunk(item)
                    writer.write(records)
                    written += len(records)
                    bar.update(item.seq[-1] + 1 - position)
                    position = item.seq[-1] + 1
        finally:
            writer.close()
    span = f"sequence {first} to {last}" if first <= last else "an empty range"
    where = "stdout" if name == "-" else name
    print(
        f"exported {plural(written, 'record')} of stream {stream} ({span}) to {where}"
        + (f"; {lost} lost to retention" if lost else ""),
        file=sys.stderr,
    )
    return 0


def _file_key(name: str) -> str:
    """A key prefix from the file's content (stdin: none can be made; a random one then)."""
    if name == "-":
        return ""
    digest = hashlib.sha256()
    try:
        with Path(name).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise CommandError(f"cannot read {name}: {(e.strerror or str(e)).lower()}") from None
    return "import-" + digest.hexdigest()[:32]


def batches(rows: Iterable[Row], max_bytes: int) -> Iterator[list[Row]]:
    """C{rows} in appends of at most L{APPEND_RECORDS} records and C{max_bytes} bytes."""
    batch: list[Row] = []
    size = 0
    for subject, frames in rows:
        record = len(subject.encode("utf-8")) + _RECORD_OVERHEAD + sum(4 + len(f) for f in frames)
        if record > max_bytes:
            raise CommandError(
                f"a record of {record} bytes (subject {subject!r}) is larger than the broker "
                f"takes in one append ({max_bytes} bytes)"
            )
        if batch and (len(batch) >= APPEND_RECORDS or size + record > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append((subject, frames))
        size += record
    if batch:
        yield batch


def import_file(
    settings: ConnectionSettings, name: str, stream: str, key: str | None, progress: bool
) -> int:
    """Append the records of the file C{name} to C{stream}; say how many."""
    prefix = key or _file_key(name)
    if not prefix:
        prefix = "import-" + secrets.token_hex(16)
    written = again = 0
    first = last = None
    with open_bulk(settings) as bulk, _bar(None, "rec", progress) as bar:
        for index, batch in enumerate(batches(read_rows(name), bulk.max_append_bytes)):
            appended = bulk.append(stream, f"{prefix}-{index}", batch)
            if appended.duplicate:
                again += len(batch)
            else:
                written += len(batch)
                first = appended.first if first is None else first
                last = appended.last
            bar.update(len(batch))
    span = "" if first is None else f" (sequence {first} to {last})"
    print(
        f"imported {plural(written, 'record')} into stream {stream}{span}"
        + (
            f"; {plural(again, 'record')} already imported from this file before, "
            "not written again (--key to import it again)"
            if again
            else ""
        ),
        file=sys.stderr,
    )
    return 0
