"""
The broker's settings, read from a ZPL config file (the C broker's
``malamute.cfg`` keys plus our own under ``malamute/``) and then overridden
by command-line options.

Keys of the C broker that are honoured:
``server/timeout`` (ms), ``server/auth/plain`` (password file),
``mlm_server/security/mechanism`` (``null``, ``plain`` or ``curve``: the
security of endpoints without a ``null:``, ``plain:`` or ``curve:`` prefix),
``mlm_server/bind/endpoint`` (repeatable),
``mlm_server/mailbox/size-limit`` and ``mlm_server/service/queue/size-limit``
(bytes, or ``max``). Our own: ``malamute/data-dir``,
``malamute/match-cache``, ``malamute/limits/<name>`` for each field of
L{Limits} with dashes (``malamute/limits/max-clients = 500``), the
security's (``docs/security.md``): ``server/auth/curve/secret`` (the
broker's secret certificate), ``server/auth/curve/clients`` (the clients'
certificates: a directory or a file), ``server/auth/acl`` (the
access-control file), and the
journal's: ``malamute/journal/enabled`` (1 or 0),
``malamute/journal/commit-interval`` (ms), ``malamute/journal/commit-batch``,
``malamute/journal/stream-synchronous`` and ``.../queue-synchronous``
(OFF, NORMAL, FULL, EXTRA), ``malamute/journal/prune-interval`` (s),
``malamute/journal/crash-skip``, and
retention ``malamute/journal/retention/max-count``, ``.../max-age`` (s),
``.../max-bytes``, also per stream under
``malamute/journal/streams/<stream>/max-count`` (and so on), and the
last-value streams, ``malamute/streams/<stream>/compact = subject``; the pack's
(``docs/pack.md``): ``malamute/pack/name``, ``malamute/pack/beacon`` (an
interface name or address), ``malamute/pack/beacon-port``,
``malamute/pack/beacon-interval``, ``malamute/pack/evasive`` and
``malamute/pack/expired`` (ms: ZRE's peer timers), ``malamute/pack/gossip-bind`` and
``malamute/pack/gossip-connect`` (repeatable), ``malamute/pack/peer-endpoint``,
``malamute/pack/broker-name``, ``malamute/pack/keys`` (the public
certificates of the brokers allowed in: a CURVE pack) and
``malamute/pack/secret`` (the pack's own secret certificate); the pair's (``docs/pair.md``):
``malamute/pair/role`` (primary or backup), ``malamute/pair/bind``,
``malamute/pair/connect``, ``malamute/pair/replication`` (sync or async),
``malamute/pair/heartbeat`` (ms), ``malamute/pair/misses`` and
``malamute/pair/key`` (the partner's public certificate: a CURVE link); the
multicast bridges' (``docs/multicast.md``, L{malamute_pack.multicast.config}):
``malamute/bridge/out`` and ``malamute/bridge/in`` (repeatable),
``malamute/bridge/rate``, ``.../recovery``, ``.../hops``, ``.../endpoint``;
operations' (``docs/operations.md``): ``malamute/http/endpoint`` (the
management API's strports endpoint, e.g. ``tcp:8180:interface=127.0.0.1``;
off when absent) and ``malamute/stats/interval`` (seconds between counter
log lines; off when absent).

The settings are composed of the broker's own (its endpoints, security,
limits, data directory) and each feature's section (L{FEATURES}: the
journal, the pack, the multicast bridges, the pair, operations), which the
feature reads, checks and declares the keys of (L{malamute_pack.feature}).
A config file may hold no other key (L{CONFIG_KEYS}); the C broker's own
keys that this broker does not use (C{server/verbose}, ...) are accepted
and ignored, so its config files still serve.

Tests: ``tests/system/test_tap.py``, ``tests/unit/test_settings.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from malamute_pack import journal as _journal
from malamute_pack.broker.limits import Limits
from malamute_pack.feature import (
    Feature,
    SettingsError,
    ZplConfig,
    last,
    parse_seconds,
    whole_number,
)
from malamute_pack.journal import JournalConfig
from malamute_pack.multicast import feature as _bridges
from malamute_pack.multicast.config import BridgeSettings
from malamute_pack.ops import feature as _ops
from malamute_pack.pack import feature as _pack
from malamute_pack.pack.config import PackSettings
from malamute_pack.pair import feature as _pair
from malamute_pack.pair.config import PairSettings
from malamute_pack.transport.security import SecurityFiles

__all__ = [
    "CONFIG_KEYS",
    "DEFAULT_DATA_DIR",
    "DEFAULT_ENDPOINT",
    "FEATURES",
    "MECHANISMS",
    "PackSettings",
    "PairSettings",
    "Settings",
    "SettingsError",
    "check",
    "from_options",
    "from_zpl",
    "parse_seconds",
]

DEFAULT_ENDPOINT = "ipc://@/malamute"
DEFAULT_DATA_DIR = Path("malamute-data")
MECHANISMS = ("null", "plain", "curve")

# The features, in the order their services start (operations last: they
# show the others).
FEATURES: Final[tuple[Feature[Any, Any], ...]] = (
    _journal.FEATURE,
    _pack.FEATURE,
    _bridges.FEATURE,
    _pair.FEATURE,
    _ops.FEATURE,
)

# The broker's own keys.
_CORE_KEYS: Final = (
    "server/timeout",
    "server/auth/plain",
    "server/auth/curve/secret",
    "server/auth/curve/clients",
    "server/auth/acl",
    "mlm_server/security/mechanism",
    "mlm_server/bind/endpoint",
    "mlm_server/mailbox/size-limit",
    "mlm_server/service/queue/size-limit",
    "malamute/data-dir",
    "malamute/match-cache",
    # Any name: from_zpl refuses one that is no limit, listing those there are.
    "malamute/limits/*",
)
# The C broker's keys that this broker has no use for: accepted, so that
# the C broker's malamute.cfg still serves.
_C_BROKER_KEYS: Final = (
    "server/background",
    "server/workdir",
    "server/verbose",
    "server/auth/verbose",
    "mlm_server/verbose",
    "mlm_server/echo",
)

# Every key a config file may hold (a * part: any one name).
CONFIG_KEYS: Final = (
    *_CORE_KEYS,
    *_C_BROKER_KEYS,
    *(key for feature in FEATURES for key in feature.config_keys),
)


@dataclass(frozen=True)
class Settings:
    """
    Everything the broker runs with: its own settings, then each
    feature's section (the journal's and operations' fields are
    the settings' own; L{FEATURES}).
    """

    endpoints: tuple[str, ...] = (DEFAULT_ENDPOINT,)
    timeout_ms: int = 10_000
    mechanism: str = "null"
    passwords: Path | None = None
    curve_secret: Path | None = None
    curve_clients: Path | None = None
    access_file: Path | None = None
    data_dir: Path = DEFAULT_DATA_DIR
    match_cache: int = 10_000
    limits: Limits = field(default_factory=Limits)
    journal: bool = True
    journal_config: JournalConfig = field(default_factory=JournalConfig)
    pack: PackSettings = field(default_factory=PackSettings)
    pair: PairSettings = field(default_factory=PairSettings)
    bridge: BridgeSettings = field(default_factory=BridgeSettings)
    # The management API's strports endpoint (None: off), and seconds
    # between counter log lines (None: none).
    http: str | None = None
    stats_interval: float | None = None

    @property
    def journal_path(self) -> Path:
        return self.data_dir / "journal.sqlite"

    def endpoints_by_mechanism(self) -> dict[str, list[str]]:
        """
        The endpoints to bind, by the security each requires: its prefix
        (C{curve:tcp://*:9999}) or else the default C{mechanism}; in the
        order the first of each appears.
        """
        groups: dict[str, list[str]] = {}
        for endpoint in self.endpoints:
            mechanism, sep, rest = endpoint.partition(":")
            if sep and mechanism in MECHANISMS and "://" in rest:
                groups.setdefault(mechanism, []).append(rest)
            else:
                groups.setdefault(self.mechanism, []).append(endpoint)
        return groups

    def security_files(self) -> SecurityFiles:
        """The clients' security files, and which endpoints need them."""
        return SecurityFiles(
            frozenset(self.endpoints_by_mechanism()),
            self.passwords,
            self.curve_clients,
            self.access_file,
        )


def section(settings: Settings, feature: Feature[Any, Any]) -> Any:
    """C{feature}'s section of C{settings}."""
    if feature.field is not None:
        return getattr(settings, feature.field)
    fields = _fields(feature)
    return feature.section_type(**{name: getattr(settings, name) for name in fields})


def with_section(settings: Settings, feature: Feature[Any, Any], found: Any) -> Settings:
    """C{settings} with C{found} as C{feature}'s section."""
    if feature.field is not None:
        return dataclasses.replace(settings, **{feature.field: found})
    return dataclasses.replace(
        settings, **{name: getattr(found, name) for name in _fields(feature)}
    )


def _fields(feature: Feature[Any, Any]) -> list[str]:
    """The names of a section's fields (the settings' own, when its C{field} is None)."""
    return [f.name for f in dataclasses.fields(feature.section_type)]


def from_zpl(config: ZplConfig, base: Settings = Settings()) -> Settings:
    """C{base} with every setting that C{config} gives replaced."""
    changes: dict[str, object] = {}
    limits: dict[str, int] = {}
    if (value := last(config, "server/timeout")) is not None:
        changes["timeout_ms"] = whole_number("server/timeout", value)
    if (value := last(config, "server/auth/plain")) is not None:
        changes["passwords"] = Path(value)
    if (value := last(config, "mlm_server/security/mechanism")) is not None:
        changes["mechanism"] = value.lower()
    if (value := last(config, "server/auth/curve/secret")) is not None:
        changes["curve_secret"] = Path(value)
    if (value := last(config, "server/auth/curve/clients")) is not None:
        changes["curve_clients"] = Path(value)
    if (value := last(config, "server/auth/acl")) is not None:
        changes["access_file"] = Path(value)
    if config.get("mlm_server/bind/endpoint"):
        changes["endpoints"] = tuple(config["mlm_server/bind/endpoint"])
    for key, name in (
        ("mlm_server/mailbox/size-limit", "mailbox_max_bytes"),
        ("mlm_server/service/queue/size-limit", "service_max_bytes"),
    ):
        if (value := last(config, key)) is not None and (
            n := whole_number(key, value, True)
        ) is not None:
            limits[name] = n
    if (value := last(config, "malamute/data-dir")) is not None:
        changes["data_dir"] = Path(value)
    if (value := last(config, "malamute/match-cache")) is not None:
        changes["match_cache"] = whole_number("malamute/match-cache", value)
    known = {f.name for f in dataclasses.fields(Limits)}
    for key, values in config.items():
        if key.startswith("malamute/limits/"):
            name = key.removeprefix("malamute/limits/").replace("-", "_")
            if name not in known:
                names = ", ".join(sorted(k.replace("_", "-") for k in known))
                raise SettingsError(f"{key}: unknown limit; known: {names}")
            n = whole_number(key, values[-1])
            assert n is not None
            limits[name] = n
    if limits:
        try:
            changes["limits"] = dataclasses.replace(base.limits, **limits)
        except ValueError as e:
            # Limits names its fields; the user wrote the config's keys (max-clients).
            message = str(e)
            for name in known:
                message = message.replace(f"limit {name} ", f"limit {name.replace('_', '-')} ")
            raise SettingsError(message) from e
    result = dataclasses.replace(base, **changes)  # type: ignore[arg-type]
    for feature in FEATURES:
        result = with_section(result, feature, feature.from_zpl(config, section(result, feature)))
    return result


def from_options(options: Mapping[str, Any], base: Settings) -> Settings:
    """C{base} with what each feature's command-line C{options} give."""
    for feature in FEATURES:
        found = feature.from_options(options, section(base, feature))
        base = with_section(base, feature, found)
    return base


def check(settings: Settings) -> Settings:
    """C{settings} if they are consistent (completed), else L{SettingsError} saying why."""
    if settings.mechanism not in MECHANISMS:
        raise SettingsError(
            f"security mechanism {settings.mechanism!r} is not supported (null, plain or curve)"
        )
    used = settings.endpoints_by_mechanism()
    if "plain" in used and settings.passwords is None:
        raise SettingsError(
            "PLAIN security needs a password file: give -p FILE"
            " (server/auth/plain in a config file)"
        )
    if "curve" in used and settings.curve_clients is None:
        raise SettingsError(
            "CURVE security needs the clients' keys: give --curve DIR (server/auth/curve/clients"
            " in a config file); the broker's own secret certificate (server/auth/curve/secret)"
            " is made in the data directory when not given"
        )
    if settings.access_file is not None and set(used) == {"null"}:
        raise SettingsError(
            "an access file (--acl, server/auth/acl) needs authentication: give a password"
            " file (-p) or the CURVE clients' keys (--curve) too"
        )
    if settings.timeout_ms < 1:
        raise SettingsError("the client timeout must be at least 1 ms")
    if not settings.endpoints:
        raise SettingsError("no endpoint to bind")
    for feature in FEATURES:
        settings = with_section(
            settings, feature, feature.check(section(settings, feature), settings)
        )
    return settings
