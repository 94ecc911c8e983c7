"""
Where a read of a stream starts or ends, as the user writes it after
C{--from} or C{--to}: C{earliest}, C{latest}, a sequence number, or a time
(ISO 8601, or Unix seconds written C{@1700000000} or with a decimal point).

Tests: ``tests/unit/test_cli_records.py``.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from datetime import datetime

from malamute_pack.protocol import mlm

_UNIX = re.compile(r"@?(\d+\.\d*|\d*\.\d+)|@(\d+)")


@dataclass(frozen=True, slots=True)
class Position:
    """
    A position in a stream: C{whence} is C{mlm.EARLIEST}, C{mlm.LATEST},
    C{mlm.SEQUENCE} (C{value} a sequence number), C{mlm.TIME} (C{value}
    milliseconds since the epoch) or C{mlm.LAST_VALUES} (a last-value
    stream's latest record of each subject, then on: C{tail --last-values}),
    as STREAM_READ_FROM and STREAM_QUERY take them.
    """

    whence: int
    value: int = 0

    def describe(self) -> str:
        """The position in words, for messages."""
        if self.whence == mlm.EARLIEST:
            return "earliest"
        if self.whence == mlm.LATEST:
            return "latest"
        if self.whence == mlm.SEQUENCE:
            return f"sequence {self.value}"
        if self.whence == mlm.LAST_VALUES:
            return "last values"
        return f"time {datetime.fromtimestamp(self.value / 1000).astimezone().isoformat()}"


EARLIEST = Position(mlm.EARLIEST)
LATEST = Position(mlm.LATEST)
LAST_VALUES = Position(mlm.LAST_VALUES)


def parse_position(text: str) -> Position:
    """
    The position C{text} names: C{earliest}, C{latest}, a sequence number
    (digits), Unix seconds (C{@1700000000}, C{1700000000.5}) or an ISO 8601
    time (C{2026-11-23T10:00:00Z}; without a zone, local time).

    @raise argparse.ArgumentTypeError: with what is accepted, if it is none of these.
    """
    word = text.strip().lower()
    if word in ("earliest", "first", "start"):
        return EARLIEST
    if word in ("latest", "last", "now", "end"):
        return LATEST
    if word.isdigit():
        sequence = int(word)
        if sequence < 1:
            raise argparse.ArgumentTypeError("sequence numbers start at 1")
        return Position(mlm.SEQUENCE, sequence)
    unix = _UNIX.fullmatch(word)
    if unix:
        return Position(mlm.TIME, round(float(unix.group(1) or unix.group(2)) * 1000))
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a position: use earliest, latest, a sequence number, "
            "an ISO 8601 time (2026-11-23T10:00:00Z) or Unix seconds (@1700000000)"
        ) from None
    return Position(mlm.TIME, round(when.timestamp() * 1000))
