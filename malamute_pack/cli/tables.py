"""
Plain text tables for a terminal: columns as wide as their widest cell,
numbers aligned right, and key/value lists. Values are shown for people:
None as C{-}, booleans as yes/no, byte counts and durations in units.

Tests: ``tests/unit/test_cli_tables.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_GAP = "  "
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def plain(value: Any) -> str:
    """A value as text: None as C{-}, booleans as yes/no, floats to 3 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, list | tuple):
        return ", ".join(plain(item) for item in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={plain(v)}" for k, v in value.items()) or "-"
    return str(value)


def size(value: Any) -> str:
    """A byte count in binary units (C{1.5 KiB}); C{-} if not a number."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return plain(value)
    amount = float(value)
    for unit in _BYTE_UNITS:
        if abs(amount) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{int(amount)} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def duration(value: Any) -> str:
    """Seconds as C{4.2s}, C{3m07s}, C{2h05m} or C{3d04h}; C{-} if not a number."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return plain(value)
    seconds = float(value)
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def rate(value: Any) -> str:
    """A rate per second, C{12.5/s}; C{-} if not a number."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return plain(value)
    return f"{plain(float(value))}/s"


@dataclass(frozen=True, slots=True)
class Column:
    """
    A column: the key of each row it shows, its heading, how a value is
    shown, and whether it is aligned right (numbers).
    """

    key: str
    heading: str
    show: Callable[[Any], str] = field(default=plain)
    right: bool = False


def render_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """C{rows} as a table with a heading line; each column as wide as its widest cell."""
    cells = [[column.heading for column in columns]]
    cells += [[column.show(row.get(column.key)) for column in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = []
    for line in cells:
        parts = [
            cell.rjust(width) if column.right else cell.ljust(width)
            for cell, width, column in zip(line, widths, columns, strict=True)
        ]
        lines.append(_GAP.join(parts).rstrip())
    return "\n".join(lines)


def render_pairs(pairs: Sequence[tuple[str, str]]) -> str:
    """Key/value lines, the values lined up after the longest key."""
    if not pairs:
        return ""
    width = max(len(key) for key, _ in pairs)
    return "\n".join(f"{key + ':':<{width + 1}} {value}".rstrip() for key, value in pairs)
