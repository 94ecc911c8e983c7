"""
What a feature of the broker (the journal, the pack, the pair, the
multicast bridges, operations) says about itself, so that the settings
(L{malamute_pack.settings}) and C{twistd malamute}
(L{malamute_pack.tap}) compose every feature by looping over one list
instead of naming each: its settings section (its config keys, how it
reads them and its command-line options, its checks), the service it
runs, whether that service runs only while the broker is active (a
pair's), whether the journal's backlog gate pauses it, and what the
statistics show of it.

Each feature package exports one such description as C{FEATURE} in its
C{feature} module; L{malamute_pack.settings.FEATURES} lists them.

Tests: ``tests/unit/test_feature.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from twisted.application.service import IService

Section = TypeVar("Section")
Parts = TypeVar("Parts", contravariant=True)

# A parsed config file: each key's values, in file order (L{malamute_pack.zpl}).
ZplConfig = Mapping[str, list[str]]


class SettingsError(ValueError):
    """A setting with a value the broker cannot use."""


def whole_number(key: str, value: str, allow_max: bool = False) -> int | None:
    """
    C{value} (of the config key or option C{key}) as a whole number of 0 or
    more; None for C{max} when C{allow_max}; else L{SettingsError}.
    """
    if allow_max and value.strip().lower() == "max":
        return None
    try:
        number = int(value)
    except ValueError:
        raise SettingsError(f"{key}: {value!r} is not a whole number") from None
    if number < 0:
        raise SettingsError(f"{key}: {value!r} is negative")
    return number


def count(key: str, value: str) -> int:
    """C{value} as a whole number of 0 or more (L{whole_number} without C{max})."""
    number = whole_number(key, value)
    assert number is not None
    return number


def parse_seconds(key: str, value: str) -> float:
    """C{value}, a positive number of seconds, or L{SettingsError} naming C{key}."""
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"{key}: {value!r} is not a number of seconds") from None
    if not 0 < number < float("inf"):
        raise SettingsError(f"{key}: {value!r} must be more than 0 seconds")
    return number


def last(config: ZplConfig, key: str) -> str | None:
    """The last value C{config} gives C{key} (a later line overrides), or None."""
    values = config.get(key)
    return values[-1] if values else None


class CoreSettings(Protocol):
    """What a feature may read of the broker's own settings (L{malamute_pack.settings.Settings})."""

    @property
    def endpoints(self) -> tuple[str, ...]: ...

    @property
    def journal(self) -> bool: ...

    @property
    def passwords(self) -> Path | None: ...


def always_ready() -> str | None:
    """Nothing of this feature keeps the broker from serving."""
    return None


@dataclass(frozen=True)
class Shown:
    """
    What the statistics show of a feature that runs (L{malamute_pack.ops.stats}).

    @ivar service: the feature's service.
    @ivar section: its section of the statistics (JSON-ready).
    @ivar not_ready: why the broker does not serve yet because of it, or None.
    """

    service: object
    section: Callable[[], dict[str, Any]]
    not_ready: Callable[[], str | None] = always_ready


class Feature(Protocol[Section, Parts]):
    """
    A feature of the broker, as the settings and the tap compose it; its
    service is made of C{Parts} (the tap's
    L{malamute_pack.broker_parts.BrokerParts}).

    @ivar name: its service's name (and its section's in the statistics).
    @ivar field: the L{malamute_pack.settings.Settings} field its section
        is; None: its section's fields are fields of the settings
        themselves (the journal's C{journal} and C{journal_config}).
    @ivar section_type: the dataclass of its section.
    @ivar config_keys: the config file keys it reads; a C{*} part is any
        one name (C{malamute/journal/streams/*/max-count}).
    @ivar options: a mixin of C{usage.Options} with its command-line
        options (C{optParameters}, C{optFlags}, C{opt_} methods).
    @ivar decides_activity: its service is an L{Activity} (the pair).
    @ivar while_active: its service runs only while the broker is active.
    @ivar reads: the journal's backlog gate pauses its service's reading.
    """

    @property
    def name(self) -> str: ...

    @property
    def field(self) -> str | None: ...

    @property
    def section_type(self) -> type[Any]: ...

    @property
    def config_keys(self) -> tuple[str, ...]: ...

    @property
    def options(self) -> type: ...

    @property
    def decides_activity(self) -> bool: ...

    @property
    def while_active(self) -> bool: ...

    @property
    def reads(self) -> bool: ...

    def from_zpl(self, config: ZplConfig, base: Section) -> Section:
        """C{base} with what its keys in C{config} give (L{SettingsError} if refused)."""

    def from_options(self, options: Mapping[str, Any], base: Section) -> Section:
        """C{base} with what its command-line options give."""

    def check(self, section: Section, core: CoreSettings) -> Section:
        """C{section} if the feature can run so (completed), else L{SettingsError}."""

    def make_service(self, parts: Parts, section: Section) -> IService | None:
        """Its service for C{section}, or None when it is off."""

    def shown(self, service: Any, section: Section) -> Shown | None:
        """What the statistics show of its C{service} (None: nothing)."""
