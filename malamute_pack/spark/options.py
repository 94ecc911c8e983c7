"""
The options of the ``malamute`` data source, checked once on the driver and
turned into frozen, picklable settings (:class:`ReadOptions`,
:class:`WriteOptions`) that travel to the executors inside partitions and
writers. Spark hands options over case-insensitively (lower-cased); every
name is matched that way, and a name the source does not know, or one that
does not apply (a writer option on a read, ``end`` on a streaming read...)
is refused with an :class:`OptionError` that says why.

The options themselves are documented in :mod:`malamute_pack.spark.source`.

Tests: ``tests/system/test_spark_units.py``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from malamute_pack.matching.base import PatternError
from malamute_pack.matching.patterns import validate_pattern
from malamute_pack.protocol import mlm

DEFAULT_ENDPOINT: Final = "ipc://@/malamute"
DEFAULT_TIMEOUT: Final = 30.0
# Sequence numbers per partition when neither partitions nor rowsPerPartition is given.
DEFAULT_ROWS_PER_PARTITION: Final = 100_000
DEFAULT_SUBJECT_COLUMN: Final = "subject"
DEFAULT_FRAMES_COLUMN: Final = "frames"
DEFAULT_VALUE_COLUMN: Final = "value"
# An idempotency key is at most 255 bytes: leave room for what follows the writer id.
MAX_WRITER_ID_BYTES: Final = 160

_CONNECTION: Final = ("endpoint", "user", "password", "timeout")
BATCH_READ_OPTIONS: Final = (
    *_CONNECTION,
    "journal",
    "stream",
    "pattern",
    "start",
    "end",
    "partitions",
    "rowsPerPartition",
    "failOnDataLoss",
    "lastValues",
)
STREAM_READ_OPTIONS: Final = (
    *(name for name in BATCH_READ_OPTIONS if name not in ("end", "lastValues")),
    "maxRowsPerBatch",
)
WRITE_OPTIONS: Final = (
    *_CONNECTION,
    "stream",
    "subjectColumn",
    "framesColumn",
    "valueColumn",
    "writerId",
)
_EVERY_OPTION: Final = dict.fromkeys((*STREAM_READ_OPTIONS, "end", *WRITE_OPTIONS))
# Options Spark adds itself (a streaming query's sink gets its checkpoint).
SPARK_OWN_OPTIONS: Final = frozenset({"checkpointlocation"})


class OptionError(ValueError):
    """An option of the ``malamute`` source is unknown, missing, misplaced or malformed."""


@dataclass(frozen=True, slots=True)
class Position:
    """
    A position in a stream as the broker takes it: ``whence`` is
    L{mlm.EARLIEST}, L{mlm.LATEST}, L{mlm.SEQUENCE} (``value`` a sequence
    number) or L{mlm.TIME} (``value`` milliseconds since the epoch).
    """

    whence: int
    value: int = 0

    def __str__(self) -> str:
        if self.whence == mlm.EARLIEST:
            return "earliest"
        if self.whence == mlm.LATEST:
            return "latest"
        if self.whence == mlm.SEQUENCE:
            return str(self.value)
        return f"time:{self.value}"


EARLIEST: Final = Position(mlm.EARLIEST)
LATEST: Final = Position(mlm.LATEST)


@dataclass(frozen=True, slots=True)
class Target:
    """
    Where records come from or go to: the broker at ``endpoint``, or (reads
    only) the journal file ``journal``. ``user`` and ``password`` are PLAIN
    credentials (both or neither); ``timeout`` is the seconds of broker
    silence that count as unreachable.
    """

    endpoint: str = DEFAULT_ENDPOINT
    journal: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT

    def describe(self) -> str:
        """Where, for a message."""
        return f"journal file {self.journal}" if self.journal else f"broker {self.endpoint}"


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """
    A read's settings. ``streams`` empty means every stream of the journal
    file (a broker read always names its streams). ``end`` is exclusive
    (the first position not read). ``rows_per_partition`` and
    ``partitions`` count sequence numbers; exactly one is set.
    ``last_values``: a batch read of the latest record of each subject
    (one partition per stream).
    """

    target: Target
    streams: tuple[str, ...]
    pattern: str = ""
    start: Position = EARLIEST
    end: Position = LATEST
    rows_per_partition: int | None = DEFAULT_ROWS_PER_PARTITION
    partitions: int | None = None
    max_rows_per_batch: int | None = None
    fail_on_data_loss: bool = True
    last_values: bool = False


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """
    A write's settings; a column option is None unless given (its default
    then applies if the schema has such a column, see
    :mod:`malamute_pack.spark.writer`).
    """

    target: Target
    stream: str
    subject_column: str | None = None
    frames_column: str | None = None
    value_column: str | None = None
    writer_id: str | None = None


def parse_read_options(options: Mapping[str, Any], *, streaming: bool) -> ReadOptions:
    """The settings of a batch (or, if ``streaming``, a streaming) read; OptionError if bad."""
    what = "a streaming read" if streaming else "a batch read"
    given = _known(options, STREAM_READ_OPTIONS if streaming else BATCH_READ_OPTIONS, what)
    journal = given.get("journal")
    if journal is not None and "endpoint" in given:
        raise OptionError("give either endpoint (a broker) or journal (a journal file), not both")
    if journal is not None and not journal:
        raise OptionError("option journal: give the path of a journal file")
    streams = parse_streams(given.get("stream", ""))
    if not streams and journal is None:
        raise OptionError(
            "option stream is required: the stream to read (several: comma-separated)"
        )
    pattern = given.get("pattern", "")
    if pattern:
        try:
            validate_pattern(pattern)
        except PatternError as e:
            raise OptionError(f"option pattern {pattern!r}: {e}") from None
    if "partitions" in given and "rowsPerPartition" in given:
        raise OptionError("give partitions or rowsPerPartition, not both")
    last_values = _boolean(given, "lastValues", False)
    if last_values:
        for name in ("start", "partitions", "rowsPerPartition"):
            if name in given:
                raise OptionError(
                    f"option {name} does not apply with lastValues (the latest record of each"
                    " subject among every record retained, up to end: one partition a stream)"
                )
    partitions = _positive_int(given, "partitions")
    rows_per_partition = _positive_int(given, "rowsPerPartition")
    if partitions is None and rows_per_partition is None:
        rows_per_partition = DEFAULT_ROWS_PER_PARTITION
    return ReadOptions(
        target=_target(given),
        streams=streams,
        pattern=pattern,
        start=parse_position(given["start"], "start")
        if "start" in given
        else (LATEST if streaming else EARLIEST),
        end=parse_position(given["end"], "end") if "end" in given else LATEST,
        rows_per_partition=rows_per_partition,
        partitions=partitions,
        max_rows_per_batch=_positive_int(given, "maxRowsPerBatch"),
        fail_on_data_loss=_boolean(given, "failOnDataLoss", True),
        last_values=last_values,
    )


def parse_write_options(options: Mapping[str, Any]) -> WriteOptions:
    """The settings of a write (batch or streaming); OptionError if bad."""
    given = _known(options, WRITE_OPTIONS, "a write")
    streams = parse_streams(given.get("stream", ""))
    if len(streams) != 1:
        raise OptionError("option stream: a write needs exactly one stream to publish into")
    writer_id = given.get("writerId")
    if writer_id is not None and not 0 < len(writer_id.encode()) <= MAX_WRITER_ID_BYTES:
        raise OptionError(f"option writerId: 1 to {MAX_WRITER_ID_BYTES} bytes of UTF-8")
    if "framesColumn" in given and "valueColumn" in given:
        raise OptionError("give framesColumn or valueColumn, not both")
    columns = {
        name: given[name]
        for name in ("subjectColumn", "framesColumn", "valueColumn")
        if name in given
    }
    for name, value in columns.items():
        if not value:
            raise OptionError(f"option {name}: give a column name")
    return WriteOptions(
        target=_target(given),
        stream=streams[0],
        subject_column=columns.get("subjectColumn"),
        frames_column=columns.get("framesColumn"),
        value_column=columns.get("valueColumn"),
        writer_id=writer_id,
    )


def parse_streams(text: str) -> tuple[str, ...]:
    """The stream names of a comma-separated list, blanks trimmed, each once, in order."""
    names = [name.strip() for name in text.split(",")] if text.strip() else []
    if any(not name for name in names):
        raise OptionError(f"option stream {text!r}: an empty stream name")
    return tuple(dict.fromkeys(names))


def parse_position(text: str, option: str) -> Position:
    """
    ``earliest``, ``latest``, a sequence number, ``time:EPOCH_MS`` or an
    ISO 8601 time with its zone (``2024-05-01T12:00:00Z``, ``...+02:00``).
    """
    value = text.strip()
    lowered = value.lower()
    if lowered == "earliest":
        return EARLIEST
    if lowered == "latest":
        return LATEST
    if value.isdigit():
        return Position(mlm.SEQUENCE, int(value))
    if lowered.startswith("time:"):
        try:
            return Position(mlm.TIME, int(value[5:]))
        except ValueError:
            raise OptionError(
                f"option {option} {text!r}: time:EPOCH_MS needs whole milliseconds"
            ) from None
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise OptionError(
            f"option {option} {text!r}: expected earliest, latest, a sequence number, "
            "an ISO 8601 time with its zone or time:EPOCH_MS"
        ) from None
    if when.tzinfo is None:
        raise OptionError(
            f"option {option} {text!r}: an ISO 8601 time needs its zone (Z or +HH:MM)"
        )
    since_epoch = when - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    # Rounded up: a time inside a millisecond starts after that millisecond's messages.
    return Position(mlm.TIME, -(-since_epoch // datetime.timedelta(milliseconds=1)))


def _known(options: Mapping[str, Any], allowed: Iterable[str], what: str) -> dict[str, str]:
    """``options`` under their canonical names; OptionError for one not ``allowed``."""
    allowed_names = {name.lower(): name for name in allowed}
    every_name = {name.lower(): name for name in _EVERY_OPTION}
    given: dict[str, str] = {}
    for key, value in options.items():
        lowered = key.lower()
        if lowered in SPARK_OWN_OPTIONS:
            continue
        name = allowed_names.get(lowered)
        if name is None:
            if lowered in every_name:
                raise OptionError(f"option {every_name[lowered]} does not apply to {what}")
            known = ", ".join(sorted(allowed_names.values(), key=str.lower))
            raise OptionError(f"unknown option {key!r} for {what} (known: {known})")
        given[name] = "" if value is None else str(value)
    return given


def _target(given: Mapping[str, str]) -> Target:
    user, password = given.get("user"), given.get("password")
    if (user is None) != (password is None):
        raise OptionError("options user and password (PLAIN) go together")
    timeout = DEFAULT_TIMEOUT
    if "timeout" in given:
        try:
            timeout = float(given["timeout"])
        except ValueError:
            timeout = -1.0
        if not 0 < timeout < float("inf"):
            raise OptionError(f"option timeout {given['timeout']!r}: seconds, more than 0")
    endpoint = given.get("endpoint", DEFAULT_ENDPOINT)
    if not endpoint:
        raise OptionError("option endpoint: give a ZeroMQ endpoint (tcp://host:port, ipc://...)")
    return Target(
        endpoint=endpoint,
        journal=given.get("journal"),
        user=user,
        password=password,
        timeout=timeout,
    )


def _positive_int(given: Mapping[str, str], name: str) -> int | None:
    if name not in given:
        return None
    text = given[name].strip()
    if not text.isdigit() or int(text) < 1:
        raise OptionError(f"option {name} {given[name]!r}: a whole number, at least 1")
    return int(text)


def _boolean(given: Mapping[str, str], name: str, default: bool) -> bool:
    if name not in given:
        return default
    text = given[name].strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"option {name} {given[name]!r}: true or false")
    return text == "true"
