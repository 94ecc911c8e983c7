"""
Unknown keys in a config file: a key no part of the broker reads (a typo,
C{server/timout}) would otherwise be ignored and the broker run on its
defaults, so start-up refuses it (L{malamute_pack.startup.read_config}),
naming the line and the known key it is nearest to.

The known keys are the ones the broker and its features declare
(L{malamute_pack.settings.CONFIG_KEYS}); a C{*} part of one stands for any
one name (C{malamute/journal/streams/*/max-count}: a stream's).

Tests: ``tests/unit/test_config_keys.py``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class UnknownKey:
    """
    A key of a config file that no part of the broker reads.

    @ivar line: the line it is first given on (0: not known).
    @ivar nearest: the known key it is nearest to, if one is near.
    """

    key: str
    line: int
    nearest: str | None

    def describe(self, path: object) -> str:
        """The one line that says so, of the config file at C{path}."""
        where = f"{path} line {self.line}" if self.line else f"{path}"
        text = f"config error: {where}: unknown key {self.key}"
        return f"{text}; did you mean {self.nearest}?" if self.nearest else text


def matches(key: str, pattern: str) -> bool:
    """Whether C{key} is the known C{pattern} (whose C{*} parts are any one name)."""
    parts, wanted = key.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(
        want in ("*", part) for part, want in zip(parts, wanted, strict=True)
    )


def _as_spelled(key: str, pattern: str) -> str:
    """C{pattern} with its C{*} parts filled from C{key}'s (when as long), to compare."""
    parts, wanted = key.split("/"), pattern.split("/")
    if len(parts) != len(wanted):
        return pattern
    return "/".join(part if want == "*" else want for part, want in zip(parts, wanted, strict=True))


def nearest(key: str, known: Sequence[str]) -> str | None:
    """The known key C{key} is nearest to (its spelling), or None if none is near."""
    candidates = {_as_spelled(key, pattern): None for pattern in known}
    found = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def first_unknown(
    keys: Sequence[str], known: Sequence[str], lines: Mapping[str, int] | None = None
) -> UnknownKey | None:
    """
    The first of C{keys} (in file order, by C{lines}) that none of
    C{known} is, or None when all are known.
    """
    where = lines or {}
    for key in sorted(keys, key=lambda k: where.get(k, 0)):
        if not any(matches(key, pattern) for pattern in known):
            return UnknownKey(key, where.get(key, 0), nearest(key, known))
    return None
