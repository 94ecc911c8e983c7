"""
The pack as a Twisted service of ``twistd malamute --pack NAME``: this
broker's L{Pack} on a L{Zyre} node that joins the pack's group, with the
broker's stable identity (made once, kept in the data directory) as its
ZRE uuid and as the origin its records carry on other brokers.

Started after the broker and its journal (the highest origin sequence
numbers already taken are read from the journal first), stopped before
them: the node says GOODBYE, and the peers' connections in the model end.

Tests: ``tests/test_pack_service.py``.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import zmq
from twisted.application.service import Service
from twisted.logger import Logger

from malamute_pack.broker.broker import Broker
from malamute_pack.datadir import pack_identity
from malamute_pack.journal import Journal
from malamute_pack.pack.federation import HEADER_PACK, HEADER_PROTOCOL, PROTOCOL, Pack
from malamute_pack.pack.zyre import MAX_FRAME_BYTES, Zyre
from malamute_pack.settings import PackSettings

_log = Logger()


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
    ) -> None:
        assert settings.name is not None
        self._reactor = reactor
        self._context = context
        self._broker = broker
        self._journal = journal
        self._settings = settings
        self._data_dir = data_dir
        self.pack: Pack | None = None
        self.zyre: Zyre | None = None
        self._paused = False

    def startService(self) -> None:
        settings = self._settings
        assert settings.name is not None
        identity = pack_identity(self._data_dir)
        marks = self._journal.origin_marks() if self._journal is not None else {}
        broker_id = identity.hex().upper()
        pack = Pack(self._broker, self._reactor, settings.name, broker_id, self._whisper, marks)
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
