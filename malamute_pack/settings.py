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
``malamute/journal/streams/<stream>/max-count`` (and so on); the pack's
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

Tests: ``tests/system/test_tap.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from malamute_pack.broker.limits import Limits
from malamute_pack.journal import JournalConfig, RetentionPolicy
from malamute_pack.multicast import config as bridge_config
from malamute_pack.multicast.config import BridgeSettings
from malamute_pack.pair.machine import DEFAULT_HEARTBEAT, DEFAULT_MISSES

DEFAULT_ENDPOINT = "ipc://@/malamute"
DEFAULT_DATA_DIR = Path("malamute-data")
MECHANISMS = ("null", "plain", "curve")


class SettingsError(ValueError):
    """A setting with a value the broker cannot use."""


@dataclass(frozen=True)
class PackSettings:
    """
    The pack this broker joins (L{malamute_pack.pack}), if any.

    @ivar name: the pack's name (its brokers' ZRE group); None: no pack.
    @ivar beacon: the interface (name or IPv4 address) to send and hear
        UDP beacons on; None: no beacons (gossip only).
    @ivar peer_endpoint: the TCP endpoint peer brokers reach this one at
        (bound; ``*`` as the port picks one); default: the beacon
        interface's address, any port.
    @ivar broker_name: the name peers know this broker by (default: the
        host's name).
    @ivar keys: the public certificates of the brokers allowed in the pack
        (a directory, or one file as for CURVE clients): with them the pack
        is CURVE only and admits no one else; None: an open pack.
    @ivar secret: the pack's own secret certificate; None: the broker's
        (C{--curve-secret}, or the one made in the data directory).
    """

    name: str | None = None
    beacon: str | None = None
    beacon_port: int = 5670
    beacon_interval_ms: int = 1000
    gossip_bind: tuple[str, ...] = ()
    gossip_connect: tuple[str, ...] = ()
    peer_endpoint: str | None = None
    broker_name: str | None = None
    evasive_ms: int = 5000
    expired_ms: int = 30000
    keys: Path | None = None
    secret: Path | None = None

    @property
    def curve(self) -> bool:
        """Whether the pack is CURVE only (its brokers' keys are listed)."""
        return self.keys is not None


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
    @ivar key: the partner's public certificate: the link is CURVE and
        admits only that key; None: an open link.
    """

    role: str | None = None
    bind: str | None = None
    connect: str | None = None
    replication: str = "sync"
    heartbeat_ms: int = round(DEFAULT_HEARTBEAT * 1000)
    misses: int = DEFAULT_MISSES
    key: Path | None = None


@dataclass(frozen=True)
class Settings:
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


def _int(key: str, value: str, allow_max: bool = False) -> int | None:
    if allow_max and value.strip().lower() == "max":
        return None
    try:
        number = int(value)
    except ValueError:
        raise SettingsError(f"{key}: {value!r} is not a whole number") from None
    if number < 0:
        raise SettingsError(f"{key}: {value!r} is negative")
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


def from_zpl(config: dict[str, list[str]], base: Settings = Settings()) -> Settings:
    """C{base} with every setting that C{config} gives replaced."""
    changes: dict[str, object] = {}
    limits: dict[str, int] = {}

    def last(key: str) -> str | None:
        values = config.get(key)
        return values[-1] if values else None

    if (value := last("server/timeout")) is not None:
        changes["timeout_ms"] = _int("server/timeout", value)
    if (value := last("server/auth/plain")) is not None:
        changes["passwords"] = Path(value)
    if (value := last("mlm_server/security/mechanism")) is not None:
        changes["mechanism"] = value.lower()
    if (value := last("server/auth/curve/secret")) is not None:
        changes["curve_secret"] = Path(value)
    if (value := last("server/auth/curve/clients")) is not None:
        changes["curve_clients"] = Path(value)
    if (value := last("server/auth/acl")) is not None:
        changes["access_file"] = Path(value)
    if config.get("mlm_server/bind/endpoint"):
        changes["endpoints"] = tuple(config["mlm_server/bind/endpoint"])
    for key, name in (
        ("mlm_server/mailbox/size-limit", "mailbox_max_bytes"),
        ("mlm_server/service/queue/size-limit", "service_max_bytes"),
    ):
        if (value := last(key)) is not None and (n := _int(key, value, True)) is not None:
            limits[name] = n
    if (value := last("malamute/data-dir")) is not None:
        changes["data_dir"] = Path(value)
    if (value := last("malamute/match-cache")) is not None:
        changes["match_cache"] = _int("malamute/match-cache", value)
    known = {f.name for f in dataclasses.fields(Limits)}
    for key, values in config.items():
        if key.startswith("malamute/limits/"):
            name = key.removeprefix("malamute/limits/").replace("-", "_")
            if name not in known:
                names = ", ".join(sorted(k.replace("_", "-") for k in known))
                raise SettingsError(f"{key}: unknown limit; known: {names}")
            n = _int(key, values[-1])
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
    if (value := last("malamute/http/endpoint")) is not None:
        changes["http"] = value
    if (value := last("malamute/stats/interval")) is not None:
        changes["stats_interval"] = parse_seconds("malamute/stats/interval", value)
    if (value := last("malamute/journal/enabled")) is not None:
        changes["journal"] = _int("malamute/journal/enabled", value) != 0
    changes["journal_config"] = _journal_config(config, base.journal_config)
    changes["pack"] = _pack(config, base.pack)
    changes["pair"] = _pair(config, base.pair)
    try:
        changes["bridge"] = bridge_config.from_zpl(config, base.bridge)
    except bridge_config.BridgeConfigError as e:
        raise SettingsError(str(e)) from e
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _pack(config: dict[str, list[str]], base: PackSettings) -> PackSettings:
    changes: dict[str, object] = {}
    for key, name in (
        ("name", "name"),
        ("beacon", "beacon"),
        ("peer-endpoint", "peer_endpoint"),
        ("broker-name", "broker_name"),
    ):
        if values := config.get(f"malamute/pack/{key}"):
            changes[name] = values[-1]
    for key, name in (("keys", "keys"), ("secret", "secret")):
        if values := config.get(f"malamute/pack/{key}"):
            changes[name] = Path(values[-1])
    for key, name in (
        ("beacon-port", "beacon_port"),
        ("beacon-interval", "beacon_interval_ms"),
        ("evasive", "evasive_ms"),
        ("expired", "expired_ms"),
    ):
        if values := config.get(f"malamute/pack/{key}"):
            changes[name] = _int(f"malamute/pack/{key}", values[-1])
    for key, name in (("gossip-bind", "gossip_bind"), ("gossip-connect", "gossip_connect")):
        if values := config.get(f"malamute/pack/{key}"):
            changes[name] = tuple(values)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _pair(config: dict[str, list[str]], base: PairSettings) -> PairSettings:
    changes: dict[str, object] = {}
    for key in ("role", "bind", "connect", "replication"):
        if values := config.get(f"malamute/pair/{key}"):
            changes[key] = values[-1]
    if values := config.get("malamute/pair/key"):
        changes["key"] = Path(values[-1])
    for key, name in (("heartbeat", "heartbeat_ms"), ("misses", "misses")):
        if values := config.get(f"malamute/pair/{key}"):
            changes[name] = _int(f"malamute/pair/{key}", values[-1])
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


_RETENTION_KEYS = {"max-count": "max_count", "max-age": "max_age_s", "max-bytes": "max_bytes"}


def _retention(config: dict[str, list[str]], prefix: str, base: RetentionPolicy) -> RetentionPolicy:
    changes: dict[str, float | int] = {}
    for key, name in _RETENTION_KEYS.items():
        values = config.get(f"{prefix}/{key}")
        if values:
            n = _int(f"{prefix}/{key}", values[-1])
            assert n is not None
            changes[name] = float(n) if name == "max_age_s" else n
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _journal_config(config: dict[str, list[str]], base: JournalConfig) -> JournalConfig:
    prefix = "malamute/journal"
    changes: dict[str, object] = {}
    numbers = {
        "commit-interval": ("commit_interval_s", 1000.0),
        "commit-batch": ("commit_max_batch", 0.0),
        "prune-interval": ("prune_interval_s", 1.0),
        "crash-skip": ("crash_skip", 0.0),
    }
    for key, (name, per_second) in numbers.items():
        values = config.get(f"{prefix}/{key}")
        if values:
            n = _int(f"{prefix}/{key}", values[-1])
            assert n is not None
            changes[name] = n / per_second if per_second else n
    for key in ("stream-synchronous", "queue-synchronous"):
        values = config.get(f"{prefix}/{key}")
        if values:
            changes[key.replace("-", "_")] = values[-1].upper()
    changes["retention"] = _retention(config, f"{prefix}/retention", base.retention)
    per_stream = dict(base.per_stream_retention)
    streams = f"{prefix}/streams/"
    for key in config:
        if key.startswith(streams) and key.count("/") == 4:
            name = key[len(streams) :].rsplit("/", 1)[0]
            per_stream[name] = _retention(
                config,
                streams + name,
                per_stream.get(name, changes["retention"]),  # type: ignore[arg-type]
            )
    changes["per_stream_retention"] = per_stream
    try:
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
    except ValueError as e:
        # JournalConfig names its fields; the user wrote the config's keys.
        message = str(e)
        for name, key in _JOURNAL_KEYS.items():
            message = message.replace(name, f"{prefix}/{key}")
        raise SettingsError(message) from e


# JournalConfig's fields as the config file spells them.
_JOURNAL_KEYS = {
    "commit_interval_s": "commit-interval",
    "commit_max_batch": "commit-batch",
    "prune_interval_s": "prune-interval",
    "crash_skip": "crash-skip",
    "stream_synchronous": "stream-synchronous",
    "queue_synchronous": "queue-synchronous",
}


def check(settings: Settings) -> Settings:
    """C{settings} if they are consistent, else L{SettingsError} saying why."""
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
    _check_pack(settings.pack)
    _check_pair(settings)
    bridge = settings.bridge
    try:
        bridge_config.check(bridge)
    except bridge_config.BridgeConfigError as e:
        raise SettingsError(str(e)) from e
    return dataclasses.replace(
        settings, bridge=bridge_config.repair_endpoint(bridge, settings.endpoints)
    )


def _check_pair(settings: Settings) -> None:
    pair = settings.pair
    if pair.role is None:
        return
    if pair.role not in ("primary", "backup"):
        raise SettingsError(f"the pair role must be primary or backup: {pair.role!r}")
    if not pair.bind or not pair.connect:
        raise SettingsError(
            "a pair needs its link's endpoints: --pair-bind (this broker's) and"
            " --pair-connect (its partner's)"
        )
    if pair.replication not in ("sync", "async"):
        raise SettingsError(f"pair replication must be sync or async: {pair.replication!r}")
    if not settings.journal:
        raise SettingsError("a pair replicates the journal: it cannot run with --no-journal")
    if pair.heartbeat_ms < 10 or pair.misses < 1:
        raise SettingsError("the pair's heartbeat must be at least 10 ms, and misses at least 1")


def _check_pack(pack: PackSettings) -> None:
    if pack.name is None:
        return
    if not pack.name or len(pack.name.encode()) > 255:
        raise SettingsError("the pack's name must be 1 to 255 bytes")
    if pack.beacon is None and not (pack.gossip_bind or pack.gossip_connect):
        raise SettingsError(
            "a pack needs a way to find its brokers: beacons (--beacon IFACE) on a LAN,"
            " or gossip (--gossip-bind / --gossip-connect) where there is no broadcast"
        )
    if pack.beacon is None and pack.peer_endpoint is None:
        raise SettingsError(
            "without beacons, say which TCP endpoint peers reach this broker at"
            " (--peer-endpoint tcp://ADDRESS:PORT, or tcp://ADDRESS:* for any port)"
        )
    if pack.peer_endpoint is not None and not pack.peer_endpoint.startswith("tcp://"):
        raise SettingsError(f"the peer endpoint must be tcp://...: {pack.peer_endpoint!r}")
    if not 0 < pack.beacon_port < 65536:
        raise SettingsError(f"beacon port {pack.beacon_port} is not a UDP port")
    if pack.beacon_interval_ms < 10:
        raise SettingsError("the beacon interval must be at least 10 ms")
    if not 0 < pack.evasive_ms < pack.expired_ms:
        raise SettingsError("a pack peer must be evasive (ping) before it is expired")
    for endpoint in pack.gossip_connect:
        _, bar, key = endpoint.partition("|")
        if pack.curve and not (bar and key):
            raise SettingsError(
                f"gossip server {endpoint!r}: a CURVE pack (--pack-keys) reaches its gossip"
                " servers with CURVE: give ENDPOINT|PUBLIC_KEY (the server's key in Z85)"
            )
        if not pack.curve and bar:
            raise SettingsError(
                f"gossip server {endpoint!r} is given a CURVE key, and this pack is open:"
                " give --pack-keys DIR (the brokers allowed in) to make it a CURVE pack"
            )
    if pack.secret is not None and not pack.curve:
        raise SettingsError(
            "a pack secret (--pack-secret, malamute/pack/secret) needs --pack-keys DIR"
            " (the brokers allowed in the pack)"
        )
