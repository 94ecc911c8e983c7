"""
The files C{malamute export} writes and C{malamute import} reads: JSON
lines (one record a line, as L{malamute_pack.cli.records.record_json}
makes them), or Parquet when the name ends C{.parquet} and pyarrow is
installed (the columns of the Spark source, less C{fields}: stream, seq,
timestamp in microseconds UTC, sender, subject, frames as a list of
binaries). C{-} is stdout or stdin, as JSON lines.

Tests: ``tests/unit/test_cli_files.py``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from malamute_pack.cli.errors import CommandError
from malamute_pack.cli.records import Record, frames_from_json, record_json, subject_from_json

# Records read back for an import: (subject, frames).
Row = tuple[str, tuple[bytes, ...]]


def is_parquet(name: str) -> bool:
    return name.lower().endswith(".parquet")


def _need_pyarrow(name: str) -> None:
    if importlib.util.find_spec("pyarrow") is None:
        raise CommandError(
            f"{name}: Parquet needs pyarrow, which is not installed: `pip install pyarrow`, "
            "or use a .jsonl name for JSON lines"
        )


def _reason(error: OSError) -> str:
    return (error.strerror or str(error)).lower()


class RecordWriter(Protocol):
    """Where exported records go."""

    def write(self, records: Sequence[Record]) -> None: ...

    def close(self) -> None: ...


class JsonLinesWriter:
    """Records as JSON lines, to a file or stdout (C{-})."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._file: IO[str]
        if name == "-":
            self._file = sys.stdout
        else:
            try:
                self._file = open(name, "w", encoding="utf-8")  # noqa: SIM115 (closed in close)
            except OSError as e:
                raise CommandError(f"cannot write {name}: {_reason(e)}") from None

    def write(self, records: Sequence[Record]) -> None:
        try:
            self._file.writelines(
                json.dumps(record_json(record), ensure_ascii=False) + "\n" for record in records
            )
        except OSError as e:
            raise CommandError(f"cannot write {self.name}: {_reason(e)}") from None

    def close(self) -> None:
        try:
            if self._file is sys.stdout:
                self._file.flush()
            else:
                self._file.close()
        except OSError as e:
            raise CommandError(f"cannot write {self.name}: {_reason(e)}") from None


class ParquetWriter:
    """Records as a Parquet file, a row group per batch written."""

    def __init__(self, name: str) -> None:
        _need_pyarrow(name)
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.name = name
        self._pa = pa
        self._schema = pa.schema(
            [
                ("stream", pa.string()),
                ("seq", pa.int64()),
                ("timestamp", pa.timestamp("us", tz="UTC")),
                ("sender", pa.string()),
                ("subject", pa.string()),
                ("frames", pa.list_(pa.binary())),
            ]
        )
        try:
            self._writer: Any = pq.ParquetWriter(name, self._schema)
        except OSError as e:
            raise CommandError(f"cannot write {name}: {e}") from None

    def write(self, records: Sequence[Record]) -> None:
        if not records:
            return
        pa = self._pa
        table = pa.Table.from_pydict(
            {
                "stream": [r.stream for r in records],
                "seq": [r.seq for r in records],
                "timestamp": [
                    None if r.timestamp is None else round(r.timestamp * 1_000_000) for r in records
                ],
                "sender": [r.sender for r in records],
                "subject": [r.subject for r in records],
                "frames": [list(r.frames) for r in records],
            },
            schema=self._schema,
        )
        try:
            self._writer.write_table(table)
        except OSError as e:
            raise CommandError(f"cannot write {self.name}: {e}") from None

    def close(self) -> None:
        self._writer.close()


def open_writer(name: str) -> RecordWriter:
    """The writer for C{name}: Parquet for C{.parquet}, else JSON lines (C{-}: stdout)."""
    return ParquetWriter(name) if is_parquet(name) else JsonLinesWriter(name)


def _json_rows(name: str, lines: IO[str]) -> Iterator[Row]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            if not isinstance(item, dict):
                raise ValueError("not a JSON object")
            yield subject_from_json(item), frames_from_json(item)
        except ValueError as e:
            raise CommandError(
                f"{name} line {number}: {e} (expected one JSON object a line, as export writes)"
            ) from None


def _parquet_rows(name: str) -> Iterator[Row]:
    _need_pyarrow(name)
    import pyarrow.parquet as pq

    try:
        parquet: Any = pq.ParquetFile(name)
    except OSError as e:
        raise CommandError(f"cannot read {name}: {e}") from None
    except Exception as e:  # pyarrow's ArrowInvalid: not a Parquet file
        raise CommandError(f"cannot read {name} as Parquet: {e}") from None
    missing = {"subject", "frames"} - set(parquet.schema_arrow.names)
    if missing:
        raise CommandError(
            f"{name} has no {' or '.join(sorted(missing))} column (as export writes)"
        )
    for batch in parquet.iter_batches(columns=["subject", "frames"]):
        for subject, frames in zip(
            batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True
        ):
            yield str(subject), tuple(frames or ())


def read_rows(name: str) -> Iterator[Row]:
    """
    The records of C{name} (Parquet for C{.parquet}, else JSON lines; C{-}
    stdin), as (subject, frames), read as they are iterated.

    @raise CommandError: if the file cannot be read or holds something else.
    """
    if is_parquet(name):
        yield from _parquet_rows(name)
        return
    if name == "-":
        yield from _json_rows("stdin", sys.stdin)
        return
    try:
        with Path(name).open(encoding="utf-8") as lines:
            yield from _json_rows(name, lines)
    except OSError as e:
        raise CommandError(f"cannot read {name}: {_reason(e)}") from None
    except UnicodeDecodeError as e:
        raise CommandError(f"{name} is not UTF-8 text: {e} (a .parquet file?)") from None
