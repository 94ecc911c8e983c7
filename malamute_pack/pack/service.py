"""
The pack as a Twisted service of ``twistd malamute --pack NAME``: this
broker's L{Pack} on a L{Zyre} node that joins the pack's group, with the
broker's stable identity (made once, kept in the data directory) as its
ZRE uuid and as the origin its records carry on other brokers (a pair's
two brokers share the primary's: whichever is active joins with it).

Started after the broker and its journal (the highest origin sequence
numbers already taken are read from the journal first), stopped before
them: the node says GOODBYE, and the peers' connections in the model end.

A CURVE pack (C{--pack-keys}) admits only the listed brokers' keys; the
brokers it turns away are counted and logged, each at most once per
L{STRANGER_LOG_INTERVAL} (with its key and address: never a secret). An
open pack says so in the start-up log.

Tests: ``tests/unit/test_pack_service.py``.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.broker import Broker
from malamute_pack.broker.log_limit import OncePer
from malamute_pack.datadir import pack_identity
from malamute_pack.journal import Journal
from malamute_pack.pack.config import PackSettings
from malamute_pack.pack.federation import HEADER_PACK, HEADER_PROTOCOL, PROTOCOL, Pack
from malamute_pack.pack.zyre import MAX_FRAME_BYTES, Zyre
from malamute_pack.transport.curve import LinkCurve

_log = Logger()

# Seconds before the same stranger (by key, or by address without one) is logged again.
STRANGER_LOG_INTERVAL = 600.0


class StrangerLog:
    """
    Logs the brokers a CURVE pack turns away, each at most once per
    C{interval}: a stranger's beacon comes every second, and its key and
    address are what the operator needs to see once. (The node counts
    every refusal, by reason.)
    """

    def __init__(self, clock: IReactorTime, interval: float = STRANGER_LOG_INTERVAL) -> None:
        self._once = OncePer(clock, interval)

    def __call__(self, why: str, uuid: bytes, endpoint: str, key: bytes | None) -> None:
        who = key.decode("ascii", "replace") if key is not None else endpoint or uuid.hex()
        if not self._once.due((why, who)):
            return
        text = {
            "not listed": "a broker whose key is not in --pack-keys",
            "no key": "a broker without CURVE (an open pack's, or an old version)",
            "another key": "a message or HELLO under another key than its connection's",
        }.get(why, why)
        _log.warn(
            "pack: refused {text}: key {key} uuid {uuid} at {endpoint}",
            text=text,
            key=key.decode("ascii", "replace") if key is not None else "(none)",
            uuid=uuid.hex(),
            endpoint=endpoint or "(unknown)",
        )


class PackService(Service):
    """
    This broker's membership of a pack.

    @ivar pack: the L{Pack} (its peers, counters), while running.
    @ivar zyre: the L{Zyre} node, while running.
    """

    def __init__(
        self,
        reactor: Any,
        context: zmq.Context[zmq.Socket[bytes]],
        broker: Broker,
        journal: Journal | None,
        settings: PackSettings,
        data_dir: Path,
        curve: LinkCurve | None = None,
        *,
        identity: Callable[[], bytes] | None = None,
    ) -> None:
        """
        @param curve: this broker's key pair in the pack and the keys of the
            brokers it admits (a ZAP handler serves them); None: an open pack.
        @param identity: gives the identity to join with, asked at each
            start (a pair's, shared by its two brokers); None: this broker's
            own, from C{data_dir}.
        """
        assert settings.name is not None
        self._reactor = reactor
        self._context = context
        self._broker = broker
        self._journal = journal
        self._settings = settings
        self._data_dir = data_dir
        self._identity = identity
        self._curve = curve
        self.pack: Pack | None = None
        self.zyre: Zyre | None = None
        self._paused = False
        self.strangers = StrangerLog(reactor)

    def startService(self) -> None:
        settings = self._settings
        assert settings.name is not None
        journal = self._journal.identity if self._journal is not None else None
        identity = (
            self._identity()
            if self._identity is not None
            else pack_identity(self._data_dir, journal)
        )
        marks = self._journal.origin_marks() if self._journal is not None else {}
        since = self._journal.newest_times() if self._journal is not None else {}
        broker_id = identity.hex().upper()
        # Only listed brokers are believed about owners: a CURVE pack's.
        access = self._broker.access
        owners = access.owners if access is not None and self._curve is not None else None
        pack = Pack(
            self._broker,
            self._reactor,
            settings.name,
            broker_id,
            self._whisper,
            marks,
            owners=owners,
            since=since,
        )
        zyre = Zyre(
            self._reactor,
            self._context,
            pack,
            uuid=identity,
            name=settings.broker_name or socket.gethostname(),
            headers={HEADER_PACK: settings.name, HEADER_PROTOCOL: PROTOCOL},
            groups=[settings.name],
            endpoint=settings.peer_endpoint,
            beacon_interface=settings.beacon,
            beacon_port=settings.beacon_port,
            beacon_interval=settings.beacon_interval_ms / 1000.0,
            gossip_bind=settings.gossip_bind,
            gossip_connect=settings.gossip_connect,
            evasive=settings.evasive_ms / 1000.0,
            expired=settings.expired_ms / 1000.0,
            # A forwarded message is as large as a client's may be, plus headers.
            max_frame_bytes=max(MAX_FRAME_BYTES, self._broker.limits.max_message_bytes + 65536),
            curve=self._curve,
            stranger=self.strangers,
        )
        self.pack, self.zyre = pack, zyre
        if self._paused:
            zyre.pauseReading()
        pack.start()
        zyre.startService()
        super().startService()
        _log.info(
            "Malamute pack {pack}: broker {name} ({id}) reachable by peers at {endpoint}",
            pack=settings.name,
            name=zyre.node.name,
            id=broker_id,
            endpoint=zyre.endpoint,
        )
        if self._curve is None:
            _log.warn(
                "pack {pack} is open: any broker that reaches this one on the network joins"
                " it, and its traffic crosses the network in clear; give --pack-keys DIR for"
                " a CURVE pack (docs/security.md)",
                pack=settings.name,
            )
        else:
            _log.info(
                "pack {pack}: CURVE, public key {key}, admitting the {count} brokers' keys"
                " of {listed}",
                pack=settings.name,
                key=self._curve.keys.public.decode("ascii"),
                count=len(self._curve.allowed.keys),
                listed=self._curve.allowed.listed_in,
            )

    def _whisper(self, uuid: bytes, frames: Any) -> bool:
        zyre = self.zyre
        if zyre is None:
            return False
        try:
            return zyre.node.whisper(uuid, frames)
        except KeyError:
            return False  # gone from the node: the pack hears of its exit next

    # Backpressure: what peers forward is journaled here too, so a journal
    # that falls behind stops the broker reading from them as from clients.

    def pauseReading(self) -> None:
        self._paused = True
        if self.zyre is not None:
            self.zyre.pauseReading()

    def resumeReading(self) -> None:
        self._paused = False
        if self.zyre is not None:
            self.zyre.resumeReading()

    def stopService(self) -> None:
        super().stopService()
        if self.zyre is not None:
            self.zyre.stopService()
        if self.pack is not None:
            self.pack.stop()
