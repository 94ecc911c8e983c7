"""
The journal as a feature of the broker (L{malamute_pack.feature}): its
settings, C{--no-journal} and the C{malamute/journal/...} keys of a
config file (commit, synchronous levels, pruning, the check for damage at
open, retention, also per
stream under C{malamute/journal/streams/<stream>/}), and the last-value
streams (C{malamute/streams/<stream>/compact = subject}). Its service is no
feature's own: the journal is the broker model's store, which
C{twistd malamute} (L{malamute_pack.tap}) makes and opens before the
model starts, so L{JournalFeature.make_service} makes nothing.

Tests: ``tests/system/test_tap.py``, ``tests/system/test_startup.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from malamute_pack.feature import CoreSettings, SettingsError, Shown, ZplConfig, count, last
from malamute_pack.journal.config import JournalConfig
from malamute_pack.protocol.records import RetentionPolicy

_PREFIX: Final = "malamute/journal"
_RETENTION_KEYS: Final = {
    "max-count": "max_count",
    "max-age": "max_age_s",
    "max-bytes": "max_bytes",
}
# Numbers of the config file, by JournalConfig field and how many make one
# of the field's unit (0: the number as it is).
_NUMBERS: Final = {
    "commit-interval": ("commit_interval_s", 1000.0),
    "commit-batch": ("commit_max_batch", 0.0),
    "prune-interval": ("prune_interval_s", 1.0),
    "crash-skip": ("crash_skip", 0.0),
}
_LEVELS: Final = ("stream-synchronous", "queue-synchronous")
# JournalConfig's fields as the config file spells them.
_KEYS: Final = {
    "commit_interval_s": "commit-interval",
    "commit_max_batch": "commit-batch",
    "prune_interval_s": "prune-interval",
    "crash_skip": "crash-skip",
    "stream_synchronous": "stream-synchronous",
    "queue_synchronous": "queue-synchronous",
    "check_at_open": "check-at-open",
}

# A last-value stream (docs/protocol.md): its one value, the compaction.
_COMPACT: Final = ("malamute/streams/", "/compact")
SUBJECT: Final = "subject"

# When the file is checked for damage as it opens (JournalConfig.check_at_open).
_CHECK: Final = "check-at-open"

CONFIG_KEYS: Final = (
    f"{_PREFIX}/enabled",
    f"{_PREFIX}/{_CHECK}",
    *(f"{_PREFIX}/{key}" for key in (*_NUMBERS, *_LEVELS)),
    *(f"{_PREFIX}/retention/{key}" for key in _RETENTION_KEYS),
    *(f"{_PREFIX}/streams/*/{key}" for key in _RETENTION_KEYS),
    f"{_COMPACT[0]}*{_COMPACT[1]}",
)


@dataclass(frozen=True)
class JournalSettings:
    """
    The journal's section of the settings (its fields are the broker's
    settings' own: L{malamute_pack.settings.Settings}).

    @ivar journal: whether the broker keeps a journal (C{--no-journal}: not).
    @ivar journal_config: how it keeps it.
    """

    journal: bool = True
    journal_config: JournalConfig = field(default_factory=JournalConfig)


class JournalOptions:
    """The journal's command-line option, a mixin of the broker's C{usage.Options}."""

    optFlags = [  # noqa: RUF012 (usage.Options reads this class attribute)
        ["no-journal", None, "Keep nothing on disk: no stream replay, no durable mail."],
    ]


def _retention(config: ZplConfig, prefix: str, base: RetentionPolicy) -> RetentionPolicy:
    changes: dict[str, float | int] = {}
    for key, name in _RETENTION_KEYS.items():
        values = config.get(f"{prefix}/{key}")
        if values:
            n = count(f"{prefix}/{key}", values[-1])
            changes[name] = float(n) if name == "max_age_s" else n
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def journal_config(config: ZplConfig, base: JournalConfig) -> JournalConfig:
    """C{base} with what the C{malamute/journal/} keys of C{config} give."""
    changes: dict[str, object] = {}
    for key, (name, per_second) in _NUMBERS.items():
        values = config.get(f"{_PREFIX}/{key}")
        if values:
            n = count(f"{_PREFIX}/{key}", values[-1])
            changes[name] = n / per_second if per_second else n
    for key in _LEVELS:
        values = config.get(f"{_PREFIX}/{key}")
        if values:
            changes[key.replace("-", "_")] = values[-1].upper()
    if (check := last(config, f"{_PREFIX}/{_CHECK}")) is not None:
        changes["check_at_open"] = check.strip().lower()
    retention = _retention(config, f"{_PREFIX}/retention", base.retention)
    changes["retention"] = retention
    per_stream = dict(base.per_stream_retention)
    streams = f"{_PREFIX}/streams/"
    for key in config:
        if key.startswith(streams) and key.count("/") == 4:
            name = key[len(streams) :].rsplit("/", 1)[0]
            per_stream[name] = _retention(config, streams + name, per_stream.get(name, retention))
    changes["per_stream_retention"] = per_stream
    changes["compacted"] = compacted_streams(config, base.compacted)
    try:
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
    except ValueError as e:
        # JournalConfig names its fields; the user wrote the config's keys.
        message = str(e)
        for name, key in _KEYS.items():
            message = message.replace(name, f"{_PREFIX}/{key}")
        raise SettingsError(message) from e


def compacted_streams(config: ZplConfig, base: frozenset[str]) -> frozenset[str]:
    """
    C{base} with the streams C{config} compacts (C{malamute/streams/NAME/compact
    = subject}) added, and those it gives an empty value removed; any other
    value is a L{SettingsError}.
    """
    head, tail = _COMPACT
    found = set(base)
    for key, values in config.items():
        if not (key.startswith(head) and key.endswith(tail) and key.count("/") == 3):
            continue
        name = key[len(head) : -len(tail)]
        value = values[-1].strip()
        if value == SUBJECT:
            found.add(name)
        elif not value:
            found.discard(name)
        else:
            raise SettingsError(
                f"{key}: {value!r} is not a compaction: give {SUBJECT} (keep each subject's"
                " latest record), or nothing for a stream that is not compacted"
            )
    return frozenset(found)


@dataclass(frozen=True)
class JournalFeature:
    """The journal (L{malamute_pack.feature.Feature})."""

    name: str = "journal"
    field: str | None = None
    section_type: type[Any] = JournalSettings
    config_keys: tuple[str, ...] = CONFIG_KEYS
    options: type = JournalOptions
    decides_activity: bool = False
    while_active: bool = False
    reads: bool = False

    def from_zpl(self, config: ZplConfig, base: JournalSettings) -> JournalSettings:
        enabled = base.journal
        if (value := last(config, f"{_PREFIX}/enabled")) is not None:
            enabled = count(f"{_PREFIX}/enabled", value) != 0
        return JournalSettings(enabled, journal_config(config, base.journal_config))

    def from_options(self, options: Mapping[str, Any], base: JournalSettings) -> JournalSettings:
        if options.get("no-journal"):
            return dataclasses.replace(base, journal=False)
        return base

    def check(self, section: JournalSettings, core: CoreSettings) -> JournalSettings:
        return section

    def make_service(self, parts: object, section: JournalSettings) -> None:
        return None

    def shown(self, service: object, section: JournalSettings) -> Shown | None:
        return None


FEATURE = JournalFeature()
