"""
The bridges' command-line options, shared by ``twistd malamute`` (a broker
with bridges) and ``twistd malamute-bridge`` (just a bridge: it reads
streams from a broker over TCP and re-broadcasts them over multicast, or
receives nothing, with no broker, journal or data of its own), whose
C{Options} and C{makeService} are here.

Tests: ``tests/unit/test_multicast_tap.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zmq
from twisted.application.service import IService, MultiService
from twisted.python import usage

from malamute_pack.client.options import ClientOptions
from malamute_pack.multicast import config
from malamute_pack.multicast.config import BridgeConfigError, BridgeSettings
from malamute_pack.multicast.service import BridgeService
from malamute_pack.startup import OneLineOptions, make_or_exit, read_config
from malamute_pack.zpl import ZplError

BRIDGE_PARAMETERS: list[list[Any]] = [
    [
        "bridge-rate",
        None,
        None,
        f"Multicast rate of every bridge, kbit/s (default {config.DEFAULT_RATE_KBPS}).",
        int,
    ],
    [
        "bridge-recovery",
        None,
        None,
        "How long a multicast sender keeps data for receivers' repairs, ms"
        f" (default {config.DEFAULT_RECOVERY_MS}).",
        int,
    ],
    ["bridge-hops", None, None, f"Multicast hops (TTL; default {config.DEFAULT_HOPS}).", int],
    [
        "bridge-endpoint",
        None,
        None,
        "The TCP endpoint receivers repair lost records from (default: the first"
        " tcp:// endpoint with an address).",
    ],
    [
        "bridge-source",
        None,
        None,
        "Read the --bridge-out streams from the broker at this endpoint (a proxy).",
    ],
]


class BridgeOptionsMixin:
    """C{--bridge-out}, C{--bridge-in} and the C{BRIDGE_PARAMETERS}."""

    def opt_bridge_out(self, spec: str) -> None:
        """
        Publish a stream over multicast: STREAM[:PATTERN]=URL, where URL is
        epgm://IFACE;GROUP:PORT, pgm://... or norm://... (repeatable).
        """
        self._bridges("bridge-out").append(spec)

    def opt_bridge_in(self, spec: str) -> None:
        """Write what a multicast group brings into a local stream: URL=STREAM (repeatable)."""
        self._bridges("bridge-in").append(spec)

    def _bridges(self, key: str) -> list[str]:
        options: dict[str, Any] = self  # type: ignore[assignment]
        return options.setdefault(key, [])  # type: ignore[no-any-return]

    def bridge_settings(self, base: BridgeSettings) -> BridgeSettings:
        """C{base} (from a config file) with what the options give."""
        options: dict[str, Any] = self  # type: ignore[assignment]
        return bridge_settings(options, base)


class BrokerBridgeOptions(BridgeOptionsMixin):
    """The bridges' options of C{twistd malamute}: the mixin with the C{BRIDGE_PARAMETERS}."""

    optParameters = BRIDGE_PARAMETERS


def bridge_settings(options: Mapping[str, Any], base: BridgeSettings) -> BridgeSettings:
    """
    C{base} (from a config file) with what the bridges' C{options} give.

    @raise BridgeConfigError: a C{--bridge-out} or C{--bridge-in} that is not one.
    """
    changes: dict[str, object] = {}
    if options.get("bridge-out"):
        changes["outbound"] = tuple(map(config.parse_outbound, options["bridge-out"]))
    if options.get("bridge-in"):
        changes["inbound"] = tuple(map(config.parse_inbound, options["bridge-in"]))
    for option, name in (
        ("bridge-rate", "rate_kbps"),
        ("bridge-recovery", "recovery_ms"),
        ("bridge-hops", "hops"),
        ("bridge-endpoint", "endpoint"),
        ("bridge-source", "source"),
    ):
        if options.get(option) is not None:
            changes[name] = options[option]
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


class Options(BridgeOptionsMixin, OneLineOptions):
    """Options of C{twistd malamute-bridge}."""

    program = "malamute-bridge"

    synopsis = "--bridge-source EP --bridge-out STREAM[:PATTERN]=URL [options]"
    longdesc = (
        "Read streams from a Malamute broker over TCP and publish them on multicast groups"
        " (PGM or NORM), for receivers to write into their own brokers' streams."
    )
    optParameters = [  # noqa: RUF012 (usage.Options reads this class attribute)
        ["config", "c", None, "ZPL config file with malamute/bridge/ keys."],
        [
            "origin",
            None,
            None,
            "The name records from the source go by in headers (default: the source endpoint).",
        ],
        *BRIDGE_PARAMETERS,
    ]

    def postOptions(self) -> None:
        try:
            base = BridgeSettings()
            if self["config"]:
                base = read_config(
                    Path(self["config"]),
                    lambda tree: config.from_zpl(tree, base),
                    (BridgeConfigError,),
                )
            settings = self.bridge_settings(base)
            if self["origin"]:
                settings = dataclasses.replace(settings, origin=self["origin"])
            if not settings.source:
                raise BridgeConfigError("say which broker to read: --bridge-source EP")
            if settings.inbound:
                raise BridgeConfigError(
                    "--bridge-in writes into a broker's stream: run it in twistd malamute"
                )
            config.check(settings)
        except (BridgeConfigError, ZplError, OSError) as e:
            raise usage.UsageError(str(e)) from e
        self["settings"] = config.repair_endpoint(settings, ())


def makeBridgeService(
    settings: BridgeSettings,
    reactor: Any = None,
    context: zmq.Context[zmq.Socket[bytes]] | None = None,
    client_options: ClientOptions | None = None,
) -> MultiService:
    """The services of a bridge with no broker of its own."""
    if reactor is None:
        from twisted.internet import reactor
    top = MultiService()
    bridges = BridgeService(
        reactor,
        context or zmq.Context(),
        settings,
        None,
        settings.origin or settings.source,
        client_options=client_options,
    )
    bridges.setName("bridges")
    bridges.setServiceParent(top)
    return top


def makeService(options: Options) -> IService:
    """
    The service C{twistd malamute-bridge} runs: one that cannot be made or
    started is one line on stderr and exit status 1 (L{malamute_pack.startup}).
    """
    return make_or_exit("malamute-bridge", lambda: makeBridgeService(options["settings"]))
