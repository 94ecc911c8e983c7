"""
The pack's settings (``docs/pack.md``): L{PackSettings}, what its config
keys (``malamute/pack/...``) and command-line options (C{--pack},
C{--beacon}, ...) give, and their checks.

Tests: ``tests/system/test_tap.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from malamute_pack.feature import SettingsError, ZplConfig, count

_PREFIX: Final = "malamute/pack"

# The config keys under malamute/pack/, by their PackSettings field.
_TEXT: Final = {
    "name": "name",
    "beacon": "beacon",
    "peer-endpoint": "peer_endpoint",
    "broker-name": "broker_name",
}
_PATHS: Final = {"keys": "keys", "secret": "secret"}
_NUMBERS: Final = {
    "beacon-port": "beacon_port",
    "beacon-interval": "beacon_interval_ms",
    "evasive": "evasive_ms",
    "expired": "expired_ms",
}
_REPEATED: Final = {"gossip-bind": "gossip_bind", "gossip-connect": "gossip_connect"}

CONFIG_KEYS: Final = tuple(
    f"{_PREFIX}/{key}" for keys in (_TEXT, _PATHS, _NUMBERS, _REPEATED) for key in keys
)


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


class PackOptions:
    """The pack's command-line options, a mixin of the broker's C{usage.Options}."""

    optParameters = [  # noqa: RUF012 (usage.Options reads this class attribute)
        ["pack", None, None, "Join the pack of this name (docs/pack.md)."],
        [
            "beacon",
            None,
            None,
            "Find the pack's brokers with UDP beacons on this interface (name or address).",
        ],
        ["beacon-port", None, None, "UDP port of the beacons (default 5670).", int],
        [
            "peer-endpoint",
            None,
            None,
            "TCP endpoint peer brokers reach this one at (default tcp://BEACON-ADDRESS:*).",
        ],
        ["broker-name", None, None, "This broker's name in the pack (default: the host name)."],
        [
            "pack-keys",
            None,
            None,
            "The public certificates of the brokers allowed in the pack (a directory):"
            " the pack is CURVE only and admits no other broker.",
        ],
        [
            "pack-secret",
            None,
            None,
            "The pack's own secret certificate (default: the broker's CURVE key).",
        ],
    ]

    def opt_gossip_bind(self, endpoint: str) -> None:
        """Serve zgossip on this endpoint, for brokers with no broadcast (repeatable)."""
        self._repeated("gossip-bind").append(endpoint)

    def opt_gossip_connect(self, endpoint: str) -> None:
        """
        Find the pack's brokers through the zgossip server at this endpoint
        (repeatable); ENDPOINT|PUBLIC_KEY in a CURVE pack.
        """
        self._repeated("gossip-connect").append(endpoint)

    def _repeated(self, key: str) -> list[str]:
        options: dict[str, Any] = self  # type: ignore[assignment]
        return options.setdefault(key, [])  # type: ignore[no-any-return]


def from_zpl(config: ZplConfig, base: PackSettings) -> PackSettings:
    """C{base} with what the C{malamute/pack/} keys of a config file give."""
    changes: dict[str, object] = {}
    for key, name in _TEXT.items():
        if values := config.get(f"{_PREFIX}/{key}"):
            changes[name] = values[-1]
    for key, name in _PATHS.items():
        if values := config.get(f"{_PREFIX}/{key}"):
            changes[name] = Path(values[-1])
    for key, name in _NUMBERS.items():
        if values := config.get(f"{_PREFIX}/{key}"):
            changes[name] = count(f"{_PREFIX}/{key}", values[-1])
    for key, name in _REPEATED.items():
        if values := config.get(f"{_PREFIX}/{key}"):
            changes[name] = tuple(values)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def from_options(options: Mapping[str, Any], base: PackSettings) -> PackSettings:
    """C{base} (from the config file) with what the pack's options give."""
    changes: dict[str, object] = {}
    for option, name in (
        ("pack", "name"),
        ("beacon", "beacon"),
        ("beacon-port", "beacon_port"),
        ("peer-endpoint", "peer_endpoint"),
        ("broker-name", "broker_name"),
    ):
        if options.get(option) is not None:
            changes[name] = options[option]
    for option, name in (("pack-keys", "keys"), ("pack-secret", "secret")):
        if options.get(option) is not None:
            changes[name] = Path(options[option])
    for option, name in _REPEATED.items():
        if options.get(option):
            changes[name] = tuple(options[option])
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def check(pack: PackSettings) -> PackSettings:
    """C{pack} if a broker can join it so, else L{SettingsError} saying why."""
    if pack.name is None:
        return pack
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
    return pack
