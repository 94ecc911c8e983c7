"""
The multicast bridges as a feature of the broker (L{malamute_pack.feature}):
their settings (L{malamute_pack.multicast.config}, the options of
L{malamute_pack.multicast.tap}), their service
(L{malamute_pack.multicast.service}; in a pair only while the broker is
active, since a passive broker bridges nothing) and their section of the
statistics.

Tests: ``tests/unit/test_multicast_tap.py``, ``tests/unit/test_ops_stats.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twisted.logger import Logger

from malamute_pack.broker_parts import BrokerParts
from malamute_pack.datadir import pack_identity
from malamute_pack.feature import CoreSettings, SettingsError, Shown, ZplConfig
from malamute_pack.multicast import config as bridge_config
from malamute_pack.multicast.config import BridgeConfigError, BridgeSettings
from malamute_pack.multicast.service import BridgeService
from malamute_pack.multicast.tap import BrokerBridgeOptions, bridge_settings

# The tap's namespace: the broker's log names the warning as it always has.
_log = Logger(namespace="malamute_pack.tap")


@dataclass(frozen=True)
class BridgesFeature:
    """The multicast bridges (L{malamute_pack.feature.Feature})."""

    name: str = "bridges"
    field: str | None = "bridge"
    section_type: type[Any] = BridgeSettings
    config_keys: tuple[str, ...] = bridge_config.CONFIG_KEYS
    options: type = BrokerBridgeOptions
    decides_activity: bool = False
    while_active: bool = True
    reads: bool = True

    def from_zpl(self, config: ZplConfig, base: BridgeSettings) -> BridgeSettings:
        try:
            return bridge_config.from_zpl(config, base)
        except BridgeConfigError as e:
            raise SettingsError(str(e)) from e

    def from_options(self, options: Mapping[str, Any], base: BridgeSettings) -> BridgeSettings:
        return bridge_settings(options, base)

    def check(self, section: BridgeSettings, core: CoreSettings) -> BridgeSettings:
        try:
            bridge_config.check(section)
        except BridgeConfigError as e:
            raise SettingsError(str(e)) from e
        return bridge_config.repair_endpoint(section, core.endpoints)

    def make_service(self, parts: BrokerParts, section: BridgeSettings) -> BridgeService | None:
        """The multicast bridges, named by this broker's identity (None: no bridge)."""
        if not section.any:
            return None
        if section.outbound and not section.endpoint:
            _log.warn(
                "multicast bridges: receivers cannot repair what they lose, for no endpoint of"
                " this broker names its address: give --bridge-endpoint tcp://ADDRESS:PORT"
            )
        journal = parts.journal
        return BridgeService(
            parts.reactor,
            parts.context,
            section,
            parts.broker,
            pack_identity(parts.data_dir).hex().upper(),
            journal.origin_marks if journal is not None else dict,
        )

    def shown(self, service: BridgeService, section: BridgeSettings) -> Shown:
        return Shown(service, lambda: {"enabled": True, **service.status()})


FEATURE = BridgesFeature()
