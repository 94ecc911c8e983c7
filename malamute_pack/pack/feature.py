"""
The pack as a feature of the broker (L{malamute_pack.feature}): its
settings (L{malamute_pack.pack.config}), its service
(L{malamute_pack.pack.service}: last to start, first to stop, so peers
hear GOODBYE while the broker runs; in a pair only while the broker is
active, since a passive broker is not in the pack) and its section of the
statistics.

Tests: ``tests/unit/test_ops_stats.py``, ``tests/system/test_tap.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twisted.python import usage

from malamute_pack.broker_parts import BrokerParts
from malamute_pack.feature import CoreSettings, Shown, ZplConfig
from malamute_pack.pack import config as pack_config
from malamute_pack.pack.beacon import resolve_interface
from malamute_pack.pack.config import PackSettings
from malamute_pack.pack.service import PackService
from malamute_pack.transport.zap import PACK_DOMAIN


def pack_section(service: PackService, settings: PackSettings) -> dict[str, Any]:
    """The pack's section of the statistics: its members and counters."""
    pack = service.pack
    zyre = service.zyre
    if pack is None:  # not started (or a pair's passive broker)
        return {"enabled": True, "running": False, "name": settings.name, "members": []}
    members = []
    for uuid, peer in pack.peers.items():
        node_peer = zyre.node.peers.get(uuid) if zyre is not None else None
        members.append(
            {
                "name": peer.name,
                "id": peer.origin,
                "endpoint": getattr(node_peer, "endpoint", None),
                "streams": len(peer.connection.reading),
                "addresses": len(peer.addresses),
                "counters": dataclasses.asdict(peer.counters),
            }
        )
    refused: dict[str, int] = {}
    if zyre is not None:
        node = zyre.node.counters
        refused = {
            "not_listed": node.not_listed,
            "no_key": node.no_key,
            "key_mismatches": node.key_mismatches,
            "keys_dropped": node.keys_dropped,
        }
    return {
        "enabled": True,
        "running": True,
        "name": pack.name,
        "broker_id": pack.broker_id,
        "endpoint": zyre.endpoint if zyre is not None else None,
        "curve": zyre is not None and zyre.curve is not None,
        "members": members,
        "counters": dataclasses.asdict(pack.counters),
        # Consumer groups across the pack (docs/pack.md).
        "groups": {
            "memberships_elsewhere": len(pack.groups),
            **dataclasses.asdict(pack.groups.counters),
        },
        # CURVE: the nodes turned away, by reason (docs/security.md).
        "refused": refused,
    }


@dataclass(frozen=True)
class PackFeature:
    """The pack (L{malamute_pack.feature.Feature})."""

    name: str = "pack"
    field: str | None = "pack"
    section_type: type[Any] = PackSettings
    config_keys: tuple[str, ...] = pack_config.CONFIG_KEYS
    options: type = pack_config.PackOptions
    decides_activity: bool = False
    while_active: bool = True
    reads: bool = True

    def from_zpl(self, config: ZplConfig, base: PackSettings) -> PackSettings:
        return pack_config.from_zpl(config, base)

    def from_options(self, options: Mapping[str, Any], base: PackSettings) -> PackSettings:
        return pack_config.from_options(options, base)

    def check(self, section: PackSettings, core: CoreSettings) -> PackSettings:
        return pack_config.check(section)

    def make_service(self, parts: BrokerParts, section: PackSettings) -> PackService | None:
        if section.name is None:
            return None
        if section.beacon is not None:
            try:
                resolve_interface(section.beacon)
            except ValueError as e:
                raise usage.UsageError(f"--beacon: {e}") from e
        return PackService(
            parts.reactor,
            parts.context,
            parts.broker,
            parts.journal,
            section,
            parts.data_dir,
            parts.links.get(PACK_DOMAIN),
            identity=parts.identity,
        )

    def shown(self, service: PackService, section: PackSettings) -> Shown:
        return Shown(service, lambda: pack_section(service, section))


FEATURE = PackFeature()
