"""
The broker's core parts, as C{twistd malamute} (L{malamute_pack.tap})
hands them to each feature (L{malamute_pack.feature.Feature}) to make its
service from, and L{Activity}, what the tap asks of the feature that
decides whether the broker is active (a pair's).

Tests: ``tests/system/test_tap.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import zmq

from malamute_pack.broker.access import AccessControl
from malamute_pack.broker.broker import Broker
from malamute_pack.datadir import pack_identity
from malamute_pack.feature import CoreSettings, Shown
from malamute_pack.journal import Journal, Recovered
from malamute_pack.transport.curve import LinkCurve
from malamute_pack.transport.router import RouterService
from malamute_pack.transport.zap import ZapHandler


class Activity(Protocol):
    """
    A feature that decides whether this broker is active (a pair's): the
    journal's letters go to it, the clients' messages pass its gate, and
    the features that run only while the broker is active run under it.
    """

    @property
    def gate(self) -> Any:
        """What the routers feed (it feeds the broker while active)."""

    def recovered(self, found: Recovered) -> None:
        """What the journal held when it opened."""

    def add_active_service(self, service: Any) -> None:
        """Run C{service} only while this broker is active."""

    def use_security(self, security: Any) -> None:
        """The clients' security in force here."""

    @property
    def shared_identity(self) -> bytes | None:
        """
        The identity this broker shows other brokers while active, if it
        shares one (a pair's, the same on both), else None (its own).
        """


@dataclass
class BrokerParts:
    """
    The broker's core parts, which the features' services are made from
    (L{malamute_pack.tap.makeBrokerService} fills in the later ones as it
    makes them).

    @ivar restore: puts what the journal recovered back in the broker.
    @ivar shown: what the statistics show of each feature made so far.
    @ivar activity: the feature that decides whether this broker is
        active (a pair's), once made.
    """

    reactor: Any
    context: zmq.Context[zmq.Socket[bytes]]
    settings: CoreSettings
    data_dir: Path
    broker: Broker
    journal: Journal | None
    links: Mapping[bytes, LinkCurve]
    restore: Callable[[Recovered], None]
    zap: ZapHandler | None = None
    access: AccessControl | None = None
    routers: list[RouterService] = field(default_factory=list)
    shown: dict[str, Shown] = field(default_factory=dict)
    activity: Activity | None = None

    def identity(self) -> bytes:
        """
        The identity this broker shows other brokers (a pack's peers): the
        one its activity shares (a pair's), else its own (C{pack-id}).
        Asked when needed: a pair's backup learns the pair's from its primary.
        """
        shared = self.activity.shared_identity if self.activity is not None else None
        if shared is not None:
            return shared
        return pack_identity(self.data_dir, self.journal.identity if self.journal else None)
