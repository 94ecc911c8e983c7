"""
The pair's settings (``docs/pair.md``): L{PairSettings}, what its config
keys (``malamute/pair/...``) and command-line options (C{--pair},
C{--pair-bind}, ...) give, and their checks.

Tests: ``tests/system/test_tap.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from malamute_pack.feature import CoreSettings, SettingsError, ZplConfig, count
from malamute_pack.pair.machine import DEFAULT_HEARTBEAT, DEFAULT_MISSES

_PREFIX: Final = "malamute/pair"
_TEXT: Final = ("role", "bind", "connect", "replication")
_NUMBERS: Final = {
    "heartbeat": "heartbeat_ms",
    "misses": "misses",
    "alone-after": "alone_after_ms",
}

CONFIG_KEYS: Final = tuple(f"{_PREFIX}/{key}" for key in (*_TEXT, "key", *_NUMBERS))


@dataclass(frozen=True)
class PairSettings:
    """
    The primary/backup pair this broker is one of (L{malamute_pack.pair}), if any.

    @ivar role: C{"primary"} or C{"backup"}; None: no pair.
    @ivar bind: the endpoint the partner's link connects to.
    @ivar connect: the partner's C{bind} endpoint.
    @ivar replication: C{"sync"} (an acknowledgement means the partner has
        it too) or C{"async"}.
    @ivar heartbeat_ms: how often the partners tell each other their state.
    @ivar misses: heartbeats missed before the partner counts as gone.
    @ivar alone_after_ms: the partner's silence after which the active goes
        on alone (acknowledges what the partner does not have) even without
        evidence that the partner's process is gone; a passive then takes
        over only within this, less a heartbeat, of hearing it. None (the
        default): never on silence alone (the writers wait for a partner
        whose host is down or cut off).
    @ivar key: the partner's public certificate: the link is CURVE and
        admits only that key; None: an open link.
    """

    role: str | None = None
    bind: str | None = None
    connect: str | None = None
    replication: str = "sync"
    heartbeat_ms: int = round(DEFAULT_HEARTBEAT * 1000)
    misses: int = DEFAULT_MISSES
    alone_after_ms: int | None = None
    key: Path | None = None


class PairOptions:
    """The pair's command-line options, a mixin of the broker's C{usage.Options}."""

    optParameters = [  # noqa: RUF012 (usage.Options reads this class attribute)
        ["pair", None, None, "Run as the primary or the backup of a pair (docs/pair.md)."],
        ["pair-bind", None, None, "The pair link's endpoint here (tcp://ADDRESS:PORT)."],
        ["pair-connect", None, None, "The partner's pair link endpoint."],
        [
            "pair-replication",
            None,
            None,
            "sync (default: acknowledged means on both brokers) or async.",
        ],
        ["pair-heartbeat", None, None, "Pair heartbeat interval in ms (default 500).", int],
        [
            "pair-alone-after",
            None,
            None,
            "ms of the partner's silence before the active acknowledges alone even without"
            " evidence the partner's process is gone (default: never; docs/pair.md).",
            int,
        ],
        [
            "pair-key",
            None,
            None,
            "The partner's public certificate: the pair link is CURVE and admits only it.",
        ],
    ]


def from_zpl(config: ZplConfig, base: PairSettings) -> PairSettings:
    """C{base} with what the C{malamute/pair/} keys of a config file give."""
    changes: dict[str, object] = {}
    for key in _TEXT:
        if values := config.get(f"{_PREFIX}/{key}"):
            changes[key] = values[-1]
    if values := config.get(f"{_PREFIX}/key"):
        changes["key"] = Path(values[-1])
    for key, name in _NUMBERS.items():
        if values := config.get(f"{_PREFIX}/{key}"):
            changes[name] = count(f"{_PREFIX}/{key}", values[-1])
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def from_options(options: Mapping[str, Any], base: PairSettings) -> PairSettings:
    """C{base} (from the config file) with what the pair's options give."""
    changes: dict[str, object] = {}
    for option, name in (
        ("pair", "role"),
        ("pair-bind", "bind"),
        ("pair-connect", "connect"),
        ("pair-replication", "replication"),
        ("pair-heartbeat", "heartbeat_ms"),
        ("pair-alone-after", "alone_after_ms"),
    ):
        if options.get(option) is not None:
            changes[name] = options[option]
    if options.get("pair-key") is not None:
        changes["key"] = Path(options["pair-key"])
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def check(pair: PairSettings, core: CoreSettings) -> PairSettings:
    """C{pair} if a broker can be one of the pair so, else L{SettingsError} saying why."""
    if pair.role is None:
        return pair
    if pair.role not in ("primary", "backup"):
        raise SettingsError(f"the pair role must be primary or backup: {pair.role!r}")
    if not pair.bind or not pair.connect:
        raise SettingsError(
            "a pair needs its link's endpoints: --pair-bind (this broker's) and"
            " --pair-connect (its partner's)"
        )
    if pair.replication not in ("sync", "async"):
        raise SettingsError(f"pair replication must be sync or async: {pair.replication!r}")
    if not core.journal:
        raise SettingsError("a pair replicates the journal: it cannot run with --no-journal")
    if pair.heartbeat_ms < 10 or pair.misses < 1:
        raise SettingsError("the pair's heartbeat must be at least 10 ms, and misses at least 1")
    least = pair.heartbeat_ms * (pair.misses + 2)
    if pair.alone_after_ms is not None and pair.alone_after_ms < least:
        raise SettingsError(
            f"the pair's alone-after ({pair.alone_after_ms} ms) must be at least the partner's"
            f" timeout and two heartbeats: {least} ms"
        )
    return pair
