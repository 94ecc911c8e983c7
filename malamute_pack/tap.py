"""
``twistd malamute``: the command-line options and the service they make.

The service is a L{MultiService} of, in start order: the data directory's
lock (L{malamute_pack.datadir}: one broker per data directory, journal or
not), the ZAP handler (when PLAIN is on), the journal (unless
``--no-journal``; it checks its identity against the data directory's
marker, opens and hands the letters it recovered to the broker), the
broker model (L{BrokerService}: its timers) and the ROUTER socket whose
sessions feed the model, behind a read gate the journal's backlog closes
(L{malamute_pack.transport.gate}). They stop
in the reverse order. Everything but the journal's writer and reader
threads runs in the reactor thread.

Tests: ``tests/test_tap.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import zmq
from twisted.application.service import IService, MultiService, Service
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.python import usage

from malamute_pack import settings as _settings
from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.datadir import DataDirService
from malamute_pack.journal import JOURNAL_MARKER, Journal, Recovered
from malamute_pack.journal.service import JournalService
from malamute_pack.transport.gate import ReadGate
from malamute_pack.transport.router import RouterService
from malamute_pack.transport.zap import PasswordFileError, ZapHandler, load_passwords
from malamute_pack.zpl import ZplError, load_zpl


class Options(usage.Options):
    """Options of C{twistd malamute}."""

    synopsis = "[options]"
    longdesc = (
        "Run a Malamute broker. With no options it binds ipc://@/malamute and keeps "
        "its data under ./malamute-data."
    )
    optParameters = [  # noqa: RUF012 (usage.Options reads this class attribute)
        ["config", "c", None, "ZPL config file (the C broker's malamute.cfg keys)."],
        ["timeout", "t", None, "Expire clients silent this long, in ms (default 10000).", int],
        ["data-dir", "d", None, "Directory for the broker's data (default ./malamute-data)."],
        ["passwords", "p", None, "Password file (user = password lines): require PLAIN."],
    ]
    optFlags = [  # noqa: RUF012 (usage.Options reads this class attribute)
        ["no-journal", None, "Keep nothing on disk: no stream replay, no durable mail."],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["endpoints"] = []

    def opt_endpoint(self, endpoint: str) -> None:
        """Bind this ZeroMQ endpoint (repeatable; default ipc://@/malamute)."""
        self["endpoints"].append(endpoint)

    opt_e = opt_endpoint

    def postOptions(self) -> None:
        try:
            self["settings"] = self.settings()
        except (_settings.SettingsError, ZplError, OSError) as e:
            raise usage.UsageError(str(e)) from e

    def settings(self) -> _settings.Settings:
        """The settings the config file and the options give, checked."""
        result = _settings.Settings()
        if self["config"]:
            result = _settings.from_zpl(load_zpl(Path(self["config"])), result)
        if self["endpoints"]:
            result = dataclasses.replace(result, endpoints=tuple(self["endpoints"]))
        if self["timeout"] is not None:
            result = dataclasses.replace(result, timeout_ms=self["timeout"])
        if self["data-dir"]:
            result = dataclasses.replace(result, data_dir=Path(self["data-dir"]))
        if self["passwords"]:
            result = dataclasses.replace(
                result, passwords=Path(self["passwords"]), mechanism="plain"
            )
        if self["no-journal"]:
            result = dataclasses.replace(result, journal=False)
        return _settings.check(result)


class BrokerService(Service):
    """The broker model's lifetime: its timers run while the service runs."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def startService(self) -> None:
        self.broker.start()
        super().startService()

    def stopService(self) -> None:
        super().stopService()
        self.broker.stop()


def makeBrokerService(
    settings: _settings.Settings,
    reactor: IReactorFDSet | None = None,
    context: zmq.Context[zmq.Socket[bytes]] | None = None,
) -> MultiService:
    """The broker's services for C{settings}."""
    if reactor is None:
        from twisted.internet import reactor as _reactor

        reactor = _reactor
    assert reactor is not None
    if context is None:
        context = zmq.Context()
    top = MultiService()
    # First to start, last to stop: one broker per data directory, journal or not.
    lock = DataDirService(settings.data_dir)
    lock.setName("data-dir")
    lock.setServiceParent(top)
    plain = settings.mechanism == "plain"
    if plain:
        assert settings.passwords is not None
        try:
            passwords = load_passwords(settings.passwords)
        except PasswordFileError as e:
            raise usage.UsageError(str(e)) from e
        zap = ZapHandler(reactor, context, passwords)
        zap.setName("zap")
        zap.setServiceParent(top)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    clock: IReactorTime = reactor  # type: ignore[assignment]
    journal = (
        Journal(
            settings.journal_path,
            clock,
            settings.journal_config,
            marker=settings.data_dir / JOURNAL_MARKER,
        )
        if settings.journal
        else None
    )
    broker = Broker(
        clock,
        BrokerConfig(
            timeout=settings.timeout_ms / 1000.0,
            limits=settings.limits,
            match_cache=settings.match_cache,
        ),
        journal,
    )
    if journal is not None:
        # Started first: letters are back in their queues before clients come.
        opener = JournalService(journal, lambda found: _restore(broker, found))
        opener.setName("journal")
        opener.setServiceParent(top)
    model = BrokerService(broker)
    model.setName("broker")
    model.setServiceParent(top)
    router = RouterService(
        reactor, context, broker, settings.limits, settings.endpoints, plain=plain
    )
    router.setName("router")
    router.setServiceParent(top)
    if journal is not None:
        # A journal that falls behind stops the broker reading from its
        # clients (their sends wait in ZeroMQ and TCP) until it catches up.
        gate = ReadGate(clock)
        gate.add(router)
        gate.watch(broker.listening)
        journal.watch_backlog(settings.limits.journal_backlog_bytes, gate.backlog)
    return top


def _restore(broker: Broker, found: Recovered) -> None:
    broker.restore(found.queued)


def makeService(options: Options) -> IService:
    """The service C{twistd malamute} runs."""
    return makeBrokerService(options["settings"])
