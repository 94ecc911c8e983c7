"""
Operations' settings (``docs/operations.md``): the management API's
strports endpoint (C{--http}, C{malamute/http/endpoint}; off when absent)
and the seconds between counter log lines (C{--stats-interval},
C{malamute/stats/interval}; none when absent), and L{OpsView}, what the
operations read of the broker's settings (so they need not import them).

Tests: ``tests/system/test_ops_service.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from malamute_pack.feature import ZplConfig, last, parse_seconds

CONFIG_KEYS: Final = ("malamute/http/endpoint", "malamute/stats/interval")


@dataclass(frozen=True)
class OpsSettings:
    """
    Operations' section of the settings (its fields are the broker's
    settings' own: L{malamute_pack.settings.Settings}).

    @ivar http: the management API's strports endpoint; None: off.
    @ivar stats_interval: seconds between counter log lines; None: none.
    """

    http: str | None = None
    stats_interval: float | None = None


class OpsView(Protocol):
    """What operations read of the broker's settings (L{malamute_pack.settings.Settings} is one)."""

    @property
    def endpoints(self) -> tuple[str, ...]: ...

    @property
    def passwords(self) -> Path | None: ...

    @property
    def http(self) -> str | None: ...

    @property
    def stats_interval(self) -> float | None: ...


class OpsOptions:
    """Operations' command-line options, a mixin of the broker's C{usage.Options}."""

    optParameters = [  # noqa: RUF012 (usage.Options reads this class attribute)
        [
            "http",
            None,
            None,
            "Serve the management API and dashboard on this strports endpoint"
            " (e.g. tcp:8180:interface=127.0.0.1); off by default.",
        ],
        ["stats-interval", None, None, "Log a line of counters every SECONDS."],
    ]


def from_zpl(config: ZplConfig, base: OpsSettings) -> OpsSettings:
    """C{base} with what C{malamute/http/endpoint} and C{malamute/stats/interval} give."""
    changes: dict[str, object] = {}
    if (value := last(config, "malamute/http/endpoint")) is not None:
        changes["http"] = value
    if (value := last(config, "malamute/stats/interval")) is not None:
        changes["stats_interval"] = parse_seconds("malamute/stats/interval", value)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def from_options(options: Mapping[str, Any], base: OpsSettings) -> OpsSettings:
    """C{base} (from the config file) with what C{--http} and C{--stats-interval} give."""
    changes: dict[str, object] = {}
    if options.get("http") is not None:
        changes["http"] = options["http"]
    if options.get("stats-interval") is not None:
        changes["stats_interval"] = parse_seconds("--stats-interval", options["stats-interval"])
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
