"""
``twistd malamute``: the command-line options and the service they make.

The service is a L{MultiService} of, in start order: the data directory's
lock (L{malamute_pack.datadir}: one broker per data directory, journal or
not), the ZAP handler (when an endpoint requires PLAIN or CURVE, or a
CURVE pack or pair link admits only the listed brokers' keys), the
journal (unless ``--no-journal``; it checks its identity against the data
directory's marker, opens and hands the letters it recovered to the
broker), the broker model (L{BrokerService}: its timers), the security
files (L{malamute_pack.transport.security}: when clients authenticate,
passwords, CURVE client keys and the access-control file, the owners of
addresses being kept by the journal and read back with the letters; the
brokers' keys of a CURVE pack or pair link; all reloaded on SIGHUP), and
one ROUTER socket per security mechanism the endpoints require, whose
sessions feed the model, behind a read gate the journal's backlog closes
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

Tests: ``tests/system/test_tap.py``.
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
from malamute_pack.transport.curve import (
    CurveError,
    KeyPair,
    LinkCurve,
    broker_key_pair,
    load_client_keys,
)
from malamute_pack.transport.gate import Pausable, ReadGate
from malamute_pack.transport.router import RouterService
from malamute_pack.transport.security import SecurityFileError, SecurityService
from malamute_pack.transport.zap import (
    PACK_DOMAIN,
    PAIR_DOMAIN,
    KeyAllowList,
    PasswordFileError,
    ZapHandler,
)
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
        [
            "pack-keys",
            None,
            None,
            "The public certificates of the brokers allowed in the pack (a directory):"
            " the pack is CURVE only and admits no other broker.",
        ],
        [
            "pack-secret",
            None,
            None,
            "The pack's own secret certificate (default: the broker's CURVE key).",
        ],
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
            "pair-key",
            None,
            None,
            "The partner's public certificate: the pair link is CURVE and admits only it.",
        ],
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
        """
        Find the pack's brokers through the zgossip server at this endpoint
        (repeatable); ENDPOINT|PUBLIC_KEY in a CURVE pack.
        """
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
        if self["pair-key"] is not None:
            pair["key"] = Path(self["pair-key"])
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
        for option, name in (("pack-keys", "keys"), ("pack-secret", "secret")):
            if self[option] is not None:
                changes[name] = Path(self[option])
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
    keys = _BrokerKeys(settings)
    try:
        links = _link_curves(settings, keys)
    except CurveError as e:
        raise usage.UsageError(str(e)) from e
    zap: ZapHandler | None = None
    if secured or links:
        # Its passwords and keys come from the security service, below.
        zap = ZapHandler(reactor, context, {}, allow_null="null" in groups)
        for domain, link in links.items():
            zap.serve(domain, link.allowed)
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
        try:
            pair = PairService(
                reactor,
                context,
                settings.pair,
                journal,
                broker,
                lambda found: _restore(broker, found),
                data_dir=settings.data_dir,
                curve=links.get(PAIR_DOMAIN),
            )
        except ValueError as e:  # a --pair-key that lists several keys
            raise usage.UsageError(str(e)) from e
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
    if zap is not None:
        security = _secure(broker, zap, settings, journal, reactor, top, secured, links)
        if pair is not None:
            pair.use_security(security)  # the partner's clients' security follows this one's
    routers: list[RouterService] = []
    for mechanism, endpoints in groups.items():
        try:
            secret = keys.pair().secret if mechanism == "curve" else None
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
        pack = PackService(
            reactor,
            context,
            broker,
            journal,
            settings.pack,
            settings.data_dir,
            links.get(PACK_DOMAIN),
        )
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
    operations.statistics.zap = zap
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
    zap: ZapHandler,
    settings: _settings.Settings,
    journal: Journal | None,
    reactor: IReactorFDSet,
    top: MultiService,
    clients: set[str],
    links: dict[bytes, LinkCurve],
) -> SecurityService:
    """
    The security files, loaded now and on SIGHUP: the clients' (when some
    endpoints authenticate: with access control, and the owners of
    addresses kept in the journal, if there is one) and the keys of the
    brokers a CURVE pack or pair link admits.
    """
    clock: IReactorTime = reactor  # type: ignore[assignment]
    access: AccessControl | None = None
    if clients:
        access = AccessControl(clock)
        broker.access = access
        if journal is not None:
            # Claims go in the journal's writes (a pair's partner gets them);
            # _restore reads them back when the journal opens.
            access.owners.store = journal
    try:
        security = SecurityService(
            reactor,  # type: ignore[arg-type]
            settings,
            zap,
            access,
            [(path, links[domain].allowed) for domain, path in _link_key_files(settings).items()],
        )
    except SecurityFileError as e:
        raise usage.UsageError(_security_file_message(e)) from e
    security.setName("security")
    security.setServiceParent(top)
    return security


class _BrokerKeys:
    """The broker's own CURVE key pair, read (or made) once when first needed."""

    def __init__(self, settings: _settings.Settings) -> None:
        self._settings = settings
        self._pair: KeyPair | None = None

    def pair(self) -> KeyPair:
        if self._pair is None:
            self._pair = broker_key_pair(self._settings.curve_secret, self._settings.data_dir)
        return self._pair


def _link_key_files(settings: _settings.Settings) -> dict[bytes, Path]:
    """The files of the keys each CURVE link between brokers admits, by ZAP domain."""
    files: dict[bytes, Path] = {}
    if settings.pack.name is not None and settings.pack.keys is not None:
        files[PACK_DOMAIN] = settings.pack.keys
    if settings.pair.role is not None and settings.pair.key is not None:
        files[PAIR_DOMAIN] = settings.pair.key
    return files


def _link_curves(settings: _settings.Settings, keys: _BrokerKeys) -> dict[bytes, LinkCurve]:
    """
    The CURVE links between brokers (a pack given --pack-keys, a pair given
    --pair-key), by ZAP domain: the key pair each uses (the pack's own with
    --pack-secret, else the broker's) and the keys it admits.
    """
    links: dict[bytes, LinkCurve] = {}
    for domain, path in _link_key_files(settings).items():
        if domain == PACK_DOMAIN:
            name, option = "pack peer", "--pack-keys"
            secret = settings.pack.secret
            pair = KeyPair.load(secret) if secret is not None else keys.pair()
        else:
            name, option = "pair partner", "--pair-key"
            pair = keys.pair()
        allowed = KeyAllowList(name, load_client_keys(path), f"{option} {path}")
        if not allowed.keys:
            raise CurveError(f"{option} {path}: no public certificate (*.key) there")
        links[domain] = LinkCurve(pair, allowed)
    return links


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


def _restore(broker: Broker, found: Recovered) -> None:
    broker.restore(found.queued)
    broker.streams.appends.restore(found.appends)
    if broker.access is not None:
        broker.access.owners.load(found.owners)
        count = len(found.owners)
        _log.info(
            "{count} {have} owners",
            count=count,
            have="address has" if count == 1 else "addresses have",
        )


def makeService(options: Options) -> IService:
    """
    The service C{twistd malamute} runs: one that cannot be made or started
    is one line on stderr and exit status 1 (L{malamute_pack.startup}).
    """
    return make_or_exit("malamute", lambda: makeBrokerService(options["settings"]))
