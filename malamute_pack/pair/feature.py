"""
The pair as a feature of the broker (L{malamute_pack.feature}): its
settings (L{malamute_pack.pair.config}), its service
(L{malamute_pack.pair.service}), which decides whether this broker is
active (the journal's letters go to the model, the clients' messages pass
its gate and the other features run only then), and its section of the
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
from malamute_pack.pair import config as pair_config
from malamute_pack.pair.config import PairSettings
from malamute_pack.pair.service import PairService
from malamute_pack.transport.zap import PAIR_DOMAIN


def pair_section(service: PairService) -> dict[str, Any]:
    """The pair's section of the statistics: its status and its link's."""
    return {
        "enabled": True,
        **dataclasses.asdict(service.status()),
        # Its link's security and counters, strangers refused included.
        "link": dataclasses.asdict(service.link.status()),
    }


def pair_not_ready(service: PairService) -> str | None:
    """Why a broker of a pair does not serve: it is not the active one."""
    if service.gate.is_open:
        return None
    status = service.status()
    return f"this broker is the pair's {status.role} and {status.state}, not active"


@dataclass(frozen=True)
class PairFeature:
    """The pair (L{malamute_pack.feature.Feature})."""

    name: str = "pair"
    field: str | None = "pair"
    section_type: type[Any] = PairSettings
    config_keys: tuple[str, ...] = pair_config.CONFIG_KEYS
    options: type = pair_config.PairOptions
    decides_activity: bool = True
    while_active: bool = False
    reads: bool = True

    def from_zpl(self, config: ZplConfig, base: PairSettings) -> PairSettings:
        return pair_config.from_zpl(config, base)

    def from_options(self, options: Mapping[str, Any], base: PairSettings) -> PairSettings:
        return pair_config.from_options(options, base)

    def check(self, section: PairSettings, core: CoreSettings) -> PairSettings:
        return pair_config.check(section, core)

    def make_service(self, parts: BrokerParts, section: PairSettings) -> PairService | None:
        if section.role is None:
            return None
        assert parts.journal is not None  # check refuses a pair without one
        try:
            return PairService(
                parts.reactor,
                parts.context,
                section,
                parts.journal,
                parts.broker,
                parts.restore,
                data_dir=parts.data_dir,
                curve=parts.links.get(PAIR_DOMAIN),
            )
        except ValueError as e:  # a --pair-key that lists several keys
            raise usage.UsageError(str(e)) from e

    def shown(self, service: PairService, section: PairSettings) -> Shown:
        return Shown(service, lambda: pair_section(service), lambda: pair_not_ready(service))


FEATURE = PairFeature()
