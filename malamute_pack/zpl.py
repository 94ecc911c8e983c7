"""
A reader for ZPL (ZeroMQ Property Language, RFC 4), the format of the C
broker's ``malamute.cfg``: indentation by four spaces makes the hierarchy,
``name = value`` sets a value, ``#`` starts a comment, values may be quoted.

The result (L{ZplTree}) maps each path (``server/timeout``) to its values,
in file order (a name may repeat, as ``bind/endpoint`` does for several
endpoints), and knows the line each path is first given on.

Tests: ``tests/unit/test_zpl.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

_LINE = re.compile(
    r"^(?P<indent>(?:    )*)(?P<name>[A-Za-z0-9$\-_@.&+/]+)\s*(?:=\s*(?P<value>.*))?$"
)


class ZplError(ValueError):
    """A line that is not ZPL, with its number."""


class ZplTree(dict[str, list[str]]):
    """
    A parsed ZPL file: each path's values, in file order.

    @ivar lines: the number of the line each path is first given on.
    """

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, int] = {}


def _value(raw: str, number: int) -> str:
    raw = raw.strip()
    if raw[:1] in ("'", '"'):
        quote = raw[0]
        end = raw.find(quote, 1)
        if end < 0:
            raise ZplError(f"line {number}: unterminated quoted value")
        rest = raw[end + 1 :].strip()
        if rest and not rest.startswith("#"):
            raise ZplError(f"line {number}: text after the quoted value")
        return raw[1:end]
    return raw.split("#", 1)[0].strip()


def parse_zpl(text: str) -> ZplTree:
    """Parse ZPL C{text} into path -> values."""
    result = ZplTree()
    path: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.match(line.rstrip())
        if match is None:
            raise ZplError(f"line {number}: not a ZPL line: {line.strip()!r}")
        depth = len(match["indent"]) // 4
        if depth > len(path):
            raise ZplError(f"line {number}: indented too deep")
        del path[depth:]
        path.append(match["name"])
        if match["value"] is not None:
            key = "/".join(path)
            result.setdefault(key, []).append(_value(match["value"], number))
            result.lines.setdefault(key, number)
    return result


def load_zpl(path: Path) -> ZplTree:
    """Read and parse the ZPL file at C{path}."""
    return parse_zpl(path.read_text(encoding="utf-8"))
