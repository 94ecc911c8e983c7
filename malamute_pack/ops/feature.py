"""
Operations as a feature of the broker (L{malamute_pack.feature}): their
settings (L{malamute_pack.ops.config}) and their service
(L{malamute_pack.ops.service}: the statistics, which show every feature
made before it, the C{$broker} service, the counters' log line and the
management API), started after everything it shows and stopped first: it
is the last of L{malamute_pack.settings.FEATURES}.

Tests: ``tests/system/test_ops_service.py``, ``tests/unit/test_ops_stats.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet.endpoints import serverFromString
from twisted.python import usage

from malamute_pack.broker_parts import BrokerParts
from malamute_pack.feature import CoreSettings, Shown, ZplConfig
from malamute_pack.ops import config as ops_config
from malamute_pack.ops.config import OpsSettings
from malamute_pack.ops.service import OperationsService


@dataclass(frozen=True)
class _BrokerOps:
    """What operations read of the broker's settings (an L{ops_config.OpsView})."""

    endpoints: tuple[str, ...]
    passwords: Path | None
    http: str | None
    stats_interval: float | None


@dataclass(frozen=True)
class OpsFeature:
    """Operations (L{malamute_pack.feature.Feature})."""

    name: str = "operations"
    field: str | None = None
    section_type: type[Any] = OpsSettings
    config_keys: tuple[str, ...] = ops_config.CONFIG_KEYS
    options: type = ops_config.OpsOptions
    decides_activity: bool = False
    while_active: bool = False
    reads: bool = False

    def from_zpl(self, config: ZplConfig, base: OpsSettings) -> OpsSettings:
        return ops_config.from_zpl(config, base)

    def from_options(self, options: Mapping[str, Any], base: OpsSettings) -> OpsSettings:
        return ops_config.from_options(options, base)

    def check(self, section: OpsSettings, core: CoreSettings) -> OpsSettings:
        return section

    def make_service(self, parts: BrokerParts, section: OpsSettings) -> OperationsService:
        """
        The statistics, the C{$broker} service, the counters' log line and
        (with C{--http}) the management API, showing the broker's parts.
        """
        if section.http is not None:
            try:
                serverFromString(parts.reactor, section.http)  # type: ignore[no-untyped-call]
            except ValueError as e:
                raise usage.UsageError(
                    f"--http {section.http!r} is not a server endpoint ({e}); for example"
                    " tcp:8180:interface=127.0.0.1"
                ) from e
        core = parts.settings
        operations = OperationsService(
            parts.reactor,
            parts.broker,
            parts.journal,
            _BrokerOps(core.endpoints, core.passwords, section.http, section.stats_interval),
            parts.routers,
            parts.access,
        )
        operations.statistics.zap = parts.zap
        for name, shown in parts.shown.items():
            operations.statistics.show(name, shown)
        return operations

    def shown(self, service: OperationsService, section: OpsSettings) -> Shown | None:
        return None  # it shows the others


FEATURE = OpsFeature()
