"""
``twistd malamute``: the command-line options and the service they make.

The service is a L{MultiService} of, in start order: the data directory's
lock (L{malamute_pack.datadir}: one broker per data directory, journal or
not), the ZAP handler (when an endpoint requires PLAIN or CURVE), the
journal (unless ``--no-journal``; it checks its identity against the data
directory's marker, opens and hands the letters it recovered to the
broker), the broker model (L{BrokerService}: its timers), when clients
authenticate the owners of addresses (L{malamute_pack.journal.owners}) and
the security files (L{malamute_pack.transport.security}: passwords, CURVE
client keys and the access-control file, reloaded on SIGHUP), and one
ROUTER socket per security mechanism the endpoints require, whose
sessions feed the model,
behind a read gate the journal's backlog closes
(L{malamute_pack.transport.gate}), and, with ``--pack``, the pack
(L{malamute_pack.pack.service}), and the multicast bridges
(L{malamute_pack.multicast.service}). With ``--pair``, the pair
(L{malamute_pack.pair.service}) starts next: the journal's letters go to
the model only when this broker becomes active, the clients' messages pass
its gate, and the pack and the bridges run only while it is active. The
operations (L{malamute_pack.ops.service}: statistics, the C{$broker}
service, C{--stats-interval}'s log line, C{--http}'s management API) start
next, then the garbage collector's settings (L{malamute_pack.gcservice}:
what start-up made is frozen) and last the systemd notifier. They stop in
the reverse order.
Everything but the journal's writer and reader threads runs in the reactor
thread.

Tests: ``tests/test_tap.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import zmq
from twisted.application.service import IService, MultiService, Service
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.logger import Logger
from twisted.python import usage

from malamute_pack import settings as _settings
from malamute_pack.broker.access import AccessControl, AccessFileError
from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.datadir import DataDirService, pack_identity, prepare
from malamute_pack.gcservice import GarbageCollectorService
from malamute_pack.journal import JOURNAL_MARKER, Journal, Recovered
from malamute_pack.journal.owners import OwnerJournal, OwnerJournalService
from malamute_pack.journal.service import JournalService
from malamute_pack.multicast.config import BridgeConfigError
from malamute_pack.multicast.service import BridgeService
from malamute_pack.multicast.tap import BRIDGE_PARAMETERS, BridgeOptionsMixin
from malamute_pack.ops.sdnotify import SystemdNotifier, status_line
from malamute_pack.ops.service import OperationsService
from malamute_pack.pack.beacon import resolve_interface
from malamute_pack.pack.service import PackService
from malamute_pack.pair.service import PairService
from malamute_pack.startup import OneLineOptions, make_or_exit, read_config
from malamute_pack.transport.curve import CurveError, load_server_secret, server_secret
from malamute_pack.transport.gate import Pausable, ReadGate
from malamute_pack.transport.router import RouterService
from malamute_pack.transport.security import SecurityFileError, SecurityService
from malamute_pack.transport.zap import PasswordFileError, ZapHandler
from malamute_pack.zpl import ZplError

_log = Logger()


class Options(BridgeOptionsMixin, OneLineOptions):
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
        [
            "curve",
            None,
            None,
            "Require CURVE; the clients' keys are the certificates in this directory (the "
            "broker's own key pair is made in DATA-DIR/curve on its first start).",
        ],
        [
            "curve-secret",
            None,
            None,
            "The broker's CURVE secret certificate, instead of DATA-DIR/curve's: require CURVE.",
        ],
        [
            "curve-clients",
            None,
            None,
            "CURVE clients' keys: a directory of certificates or a file.",
        ],
        ["acl", None, None, "Access-control file (docs/security.md); reloaded on SIGHUP."],
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
        ["pair", None, None, "Run as the primary or the backup of a pair (docs/pair.md)."],
        ["pair-bind", None, None, "The pair link's endpoint here (tcp://ADDRESS:PORT)."],
        ["pair-connect", None, None, "The partner's pair link endpoint."],
        [
            "pair-replication",
            None,
            None,
            "sync (default: acknowledged means on both brokers) or async.",
        ],
        ["pair-heartbeat", None, None, "Pair heartbeat interval in ms (default 500).", int],
        [
            "http",
            None,
            None,
            "Serve the management API and dashboard on this strports endpoint"
            " (e.g. tcp:8180:interface=127.0.0.1); off by default.",
        ],
        ["stats-interval", None, None, "Log a line of counters every SECONDS."],
        *BRIDGE_PARAMETERS,
    ]
    optFlags = [  # noqa: RUF012 (usage.Options reads this class attribute)
        ["no-journal", None, "Keep nothing on disk: no stream replay, no durable mail."],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["endpoints"] = []
        self["gossip-bind"] = []
        self["gossip-connect"] = []

    def opt_endpoint(self, endpoint: str) -> None:
        """
        Bind this ZeroMQ endpoint (repeatable; default ipc://@/malamute);
        a null:, plain: or curve: prefix sets the security it requires.
        """
        self["endpoints"].append(endpoint)

    opt_e = opt_endpoint

    def opt_gossip_bind(self, endpoint: str) -> None:
        """Serve zgossip on this endpoint, for brokers with no broadcast (repeatable)."""
        self["gossip-bind"].append(endpoint)

    def opt_gossip_connect(self, endpoint: str) -> None:
        """Find the pack's brokers through the zgossip server at this endpoint (repeatable)."""
        self["gossip-connect"].append(endpoint)

    def postOptions(self) -> None:
        try:
            self["settings"] = self.settings()
        except (_settings.SettingsError, BridgeConfigError, ZplError, OSError) as e:
            raise usage.UsageError(str(e)) from e

    def settings(self) -> _settings.Settings:
        """The settings the config file and the options give, checked."""
        result = _settings.Settings()
        if self["config"]:
            result = read_config(
                Path(self["config"]),
                lambda tree: _settings.from_zpl(tree, result),
                (_settings.SettingsError,),
            )
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
        if self["curve-secret"]:
            result = dataclasses.replace(
                result, curve_secret=Path(self["curve-secret"]), mechanism="curve"
            )
        if self["curve"]:
            result = dataclasses.replace(
                result, curve_clients=Path(self["curve"]), mechanism="curve"
            )
        if self["curve-clients"]:
            result = dataclasses.replace(result, curve_clients=Path(self["curve-clients"]))
        if self["acl"]:
            result = dataclasses.replace(result, access_file=Path(self["acl"]))
        if self["no-journal"]:
            result = dataclasses.replace(result, journal=False)
        if self["http"] is not None:
            result = dataclasses.replace(result, http=self["http"])
        if self["stats-interval"] is not None:
            interval = _settings.parse_seconds("--stats-interval", self["stats-interval"])
            result = dataclasses.replace(result, stats_interval=interval)
        result = dataclasses.replace(result, pack=self.pack_settings(result.pack))
        pair: dict[str, object] = {}
        for option, name in (
            ("pair", "role"),
            ("pair-bind", "bind"),
            ("pair-connect", "connect"),
            ("pair-replication", "replication"),
            ("pair-heartbeat", "heartbeat_ms"),
        ):
            if self[option] is not None:
                pair[name] = self[option]
        if pair:
            result = dataclasses.replace(
                result,
                pair=dataclasses.replace(result.pair, **pair),  # type: ignore[arg-type]
            )
        result = dataclasses.replace(result, bridge=self.bridge_settings(result.bridge))
        return _settings.check(result)

    def pack_settings(self, base: _settings.PackSettings) -> _settings.PackSettings:
        """C{base} (from the config file) with what the pack's options give."""
        changes: dict[str, object] = {}
        for option, name in (
            ("pack", "name"),
            ("beacon", "beacon"),
            ("beacon-port", "beacon_port"),
            ("peer-endpoint", "peer_endpoint"),
            ("broker-name", "broker_name"),
        ):
            if self[option] is not None:
                changes[name] = self[option]
        if self["gossip-bind"]:
            changes["gossip_bind"] = tuple(self["gossip-bind"])
        if self["gossip-connect"]:
            changes["gossip_connect"] = tuple(self["gossip-connect"])
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


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
    groups = settings.endpoints_by_mechanism()
    secured = set(groups) - {"null"}
    zap: ZapHandler | None = None
    if secured:
        # Its passwords and keys come from the security service, below.
        zap = ZapHandler(reactor, context, {}, allow_null="null" in groups)
        zap.setName("zap")
        zap.setServiceParent(top)
    prepare(settings.data_dir)
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
    pair: PairService | None = None
    if settings.pair.role is not None:
        assert journal is not None  # settings.check refuses a pair without one
        pair = PairService(
            reactor,
            context,
            settings.pair,
            journal,
            broker,
            lambda found: _restore(broker, found),
            data_dir=settings.data_dir,
        )
        pair.setName("pair")
    if journal is not None:
        # Started first: letters are back in their queues before clients come
        # (in a pair, once this broker is the active one).
        opener = JournalService(
            journal, pair.recovered if pair is not None else lambda found: _restore(broker, found)
        )
        opener.setName("journal")
        opener.setServiceParent(top)
    model = BrokerService(broker)
    model.setName("broker")
    model.setServiceParent(top)
    if secured:
        _secure(broker, zap, settings, journal, reactor, top)
    routers: list[RouterService] = []
    for mechanism, endpoints in groups.items():
        try:
            secret = _curve_secret(settings) if mechanism == "curve" else None
        except CurveError as e:
            raise usage.UsageError(str(e)) from e
        router = RouterService(
            reactor,
            context,
            pair.gate if pair is not None else broker,
            settings.limits,
            endpoints,
            mechanism,
            secret,
        )
        # The first is "router"; one more socket per other security.
        router.setName("router" if not routers else f"router-{mechanism}")
        router.setServiceParent(top)
        routers.append(router)
    readers: list[Pausable] = list(routers)
    pack: PackService | None = None
    bridges: BridgeService | None = None
    if settings.pack.name is not None:
        if settings.pack.beacon is not None:
            try:
                resolve_interface(settings.pack.beacon)
            except ValueError as e:
                raise usage.UsageError(f"--beacon: {e}") from e
        # Last to start, first to stop: peers hear GOODBYE while the broker runs.
        pack = PackService(reactor, context, broker, journal, settings.pack, settings.data_dir)
        pack.setName("pack")
        if pair is None:
            pack.setServiceParent(top)
        else:
            pair.add_active_service(pack)  # a passive broker is not in the pack
        readers.append(pack)
    if settings.bridge.any:
        bridges = _bridges(reactor, context, settings, broker, journal)
        if pair is None:
            bridges.setServiceParent(top)
        else:
            pair.add_active_service(bridges)  # a passive broker bridges nothing
        readers.append(bridges)
    if pair is not None:
        pair.setServiceParent(top)
        readers.append(pair)
    # Started after everything it shows, stopped first.
    operations = _operations(reactor, broker, journal, settings, routers, top, pack, bridges, pair)
    if journal is not None:
        # A journal that falls behind stops the broker reading from its
        # clients and peers (their sends wait in ZeroMQ and TCP) until it
        # catches up.
        gate = ReadGate(clock)
        for reader in readers:
            gate.add(reader)
        gate.watch(broker.listening)
        journal.watch_backlog(settings.limits.journal_backlog_bytes, gate.backlog)
    # Once everything above has started: what start-up made is frozen.
    collector = GarbageCollectorService()
    collector.setName("gc")
    collector.setServiceParent(top)
    # Last to start, first to stop: tells systemd (Type=notify) the broker is
    # ready once all the above has started, and that it stops (a no-op
    # without $NOTIFY_SOCKET; docs/operations.md).
    notifier = SystemdNotifier(
        lambda: status_line(operations.ready(), [e for r in routers for e in r.bound]), clock
    )
    notifier.setName("sd-notify")
    notifier.setServiceParent(top)
    return top


def _operations(
    reactor: IReactorFDSet,
    broker: Broker,
    journal: Journal | None,
    settings: _settings.Settings,
    routers: list[RouterService],
    top: MultiService,
    pack: PackService | None,
    bridges: BridgeService | None,
    pair: PairService | None,
) -> OperationsService:
    """
    The statistics, the C{$broker} service, the counters' log line and
    (with C{--http}) the management API, showing the broker's parts.
    """
    if settings.http is not None:
        try:
            serverFromString(reactor, settings.http)
        except ValueError as e:
            raise usage.UsageError(
                f"--http {settings.http!r} is not a server endpoint ({e}); for example"
                " tcp:8180:interface=127.0.0.1"
            ) from e
    operations = OperationsService(reactor, broker, journal, settings, routers, broker.access)
    statistics = operations.statistics
    statistics.pack = pack
    statistics.bridges = bridges
    statistics.pair = pair
    operations.setName("operations")
    operations.setServiceParent(top)
    return operations


def _bridges(
    reactor: IReactorFDSet,
    context: zmq.Context[zmq.Socket[bytes]],
    settings: _settings.Settings,
    broker: Broker,
    journal: Journal | None,
) -> BridgeService:
    """The multicast bridges, named by this broker's identity."""
    if settings.bridge.outbound and not settings.bridge.endpoint:
        _log.warn(
            "multicast bridges: receivers cannot repair what they lose, for no endpoint of"
            " this broker names its address: give --bridge-endpoint tcp://ADDRESS:PORT"
        )
    bridges = BridgeService(
        reactor,
        context,
        settings.bridge,
        broker,
        pack_identity(settings.data_dir).hex().upper(),
        journal.origin_marks if journal is not None else dict,
    )
    bridges.setName("bridges")
    return bridges


def _secure(
    broker: Broker,
    zap: ZapHandler | None,
    settings: _settings.Settings,
    journal: Journal | None,
    reactor: IReactorFDSet,
    top: MultiService,
) -> None:
    """
    Access control for a broker whose clients authenticate: the owners of
    addresses (kept in the journal, if there is one), and the security
    files, loaded now and on SIGHUP.
    """
    clock: IReactorTime = reactor  # type: ignore[assignment]
    access = AccessControl(clock)
    broker.access = access
    if journal is not None:
        owners = OwnerJournal(journal.path, clock)
        access.owners.store = owners
        keeper = OwnerJournalService(owners, access.owners.load)
        keeper.setName("owners")
        keeper.setServiceParent(top)  # after the journal, which makes its table
    try:
        security = SecurityService(reactor, settings, zap, access)  # type: ignore[arg-type]
    except SecurityFileError as e:
        raise usage.UsageError(_security_file_message(e)) from e
    security.setName("security")
    security.setServiceParent(top)


def _security_file_message(error: Exception) -> str:
    """The line for a security file the broker cannot use, with what to give instead."""
    cause = error.__cause__
    if isinstance(error, PasswordFileError):
        what, fix = "password file", "-p names a file of 'user = password' lines"
    elif isinstance(error, AccessFileError):
        what, fix = "access file", "--acl names an access-control file: docs/security.md"
    else:
        what, fix = "CURVE keys", "docs/security.md says how to make them"
    if isinstance(cause, OSError) and cause.filename is not None:
        return f"cannot read {what} {cause.filename}: {cause.strerror or cause} ({fix})"
    return f"{error} ({fix})"


def _curve_secret(settings: _settings.Settings) -> bytes:
    """The broker's CURVE secret key: the configured one, or its data directory's."""
    if settings.curve_secret is not None:
        return load_server_secret(settings.curve_secret)
    secret, public = server_secret(settings.data_dir)
    _log.info("CURVE: the broker's public certificate is {path}", path=str(public))
    return secret


def _restore(broker: Broker, found: Recovered) -> None:
    broker.restore(found.queued)
    broker.streams.appends.restore(found.appends)


def makeService(options: Options) -> IService:
    """
    The service C{twistd malamute} runs: one that cannot be made or started
    is one line on stderr and exit status 1 (L{malamute_pack.startup}).
    """
    return make_or_exit("malamute", lambda: makeBrokerService(options["settings"]))
