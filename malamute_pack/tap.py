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
The features (L{malamute_pack.settings.FEATURES}: the pack, the bridges,
the pair, operations) are made in one loop, each from what it says of
itself (L{malamute_pack.feature}), the way C{twisted.names.tap} composes
its resolvers; their options come from each feature's mixin.
Everything but the journal's writer and reader threads runs in the reactor
thread.

Tests: ``tests/system/test_tap.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import cast

import zmq
from twisted.application.service import IService, MultiService, Service
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.logger import Logger
from twisted.python import usage

from malamute_pack import settings as _settings
from malamute_pack.broker.access import AccessControl, AccessFileError
from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.broker_parts import Activity, BrokerParts
from malamute_pack.datadir import DataDirService, prepare
from malamute_pack.gcservice import GarbageCollectorService
from malamute_pack.journal import JOURNAL_MARKER, Journal, Recovered
from malamute_pack.journal.service import JournalService
from malamute_pack.multicast.config import BridgeConfigError
from malamute_pack.ops.sdnotify import SystemdNotifier, status_line
from malamute_pack.ops.service import OperationsService
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


class BrokerOptions(OneLineOptions):
    """
    The broker's own options of C{twistd malamute}; L{Options} adds each
    feature's (L{malamute_pack.feature.Feature.options}).
    """

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
    ]

    def __init__(self) -> None:
        super().__init__()
        self["endpoints"] = []

    def opt_endpoint(self, endpoint: str) -> None:
        """
        Bind this ZeroMQ endpoint (repeatable; default ipc://@/malamute);
        a null:, plain: or curve: prefix sets the security it requires.
        """
        self["endpoints"].append(endpoint)

    opt_e = opt_endpoint

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
                _settings.CONFIG_KEYS,
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
        return _settings.check(_settings.from_options(self, result))


# Options of C{twistd malamute}: the broker's own, then each feature's.
Options = cast(
    type[BrokerOptions],
    type(
        "Options",
        (BrokerOptions, *(feature.options for feature in _settings.FEATURES)),
        {"__doc__": "Options of C{twistd malamute}.", "__module__": __name__},
    ),
)


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
            # The limit on last values is the broker's (malamute/limits/...).
            dataclasses.replace(
                settings.journal_config,
                last_value_subjects=settings.limits.last_value_subjects,
            ),
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
    parts = BrokerParts(
        reactor,
        context,
        settings,
        settings.data_dir,
        broker,
        journal,
        links,
        lambda found: _restore(broker, found),
        zap,
    )
    # The feature that decides whether this broker is active (a pair's) is
    # made first: the journal's letters and the clients' messages go through it.
    made = {
        feature.name: feature.make_service(parts, _settings.section(settings, feature))
        for feature in _settings.FEATURES
        if feature.decides_activity
    }
    activity = next((cast(Activity, s) for s in made.values() if s is not None), None)
    parts.activity = activity
    if journal is not None:
        # Started first: letters are back in their queues before clients come
        # (in a pair, once this broker is the active one).
        opener = JournalService(
            journal, activity.recovered if activity is not None else parts.restore
        )
        opener.setName("journal")
        opener.setServiceParent(top)
    model = BrokerService(broker)
    model.setName("broker")
    model.setServiceParent(top)
    if zap is not None:
        security = _secure(broker, zap, settings, journal, reactor, top, secured, links)
        if activity is not None:
            activity.use_security(security)  # the partner's clients' security follows this one's
    parts.access = broker.access
    for mechanism, endpoints in groups.items():
        try:
            secret = keys.pair().secret if mechanism == "curve" else None
        except CurveError as e:
            raise usage.UsageError(str(e)) from e
        router = RouterService(
            reactor,
            context,
            activity.gate if activity is not None else broker,
            settings.limits,
            endpoints,
            mechanism,
            secret,
        )
        # The first is "router"; one more socket per other security.
        router.setName("router" if not parts.routers else f"router-{mechanism}")
        router.setServiceParent(top)
        parts.routers.append(router)
    readers: list[Pausable] = list(parts.routers)
    for feature in _settings.FEATURES:
        section = _settings.section(settings, feature)
        if feature.decides_activity:
            service = made[feature.name]
        else:
            service = feature.make_service(parts, section)
        if service is None:
            continue
        service.setName(feature.name)
        if feature.while_active and activity is not None:
            activity.add_active_service(service)
        else:
            service.setServiceParent(top)
        if feature.reads:
            readers.append(cast(Pausable, service))
        shown = feature.shown(service, section)
        if shown is not None:
            parts.shown[feature.name] = shown
    # Started after everything it shows, stopped first (the last feature).
    operations = top.getServiceNamed("operations")
    assert isinstance(operations, OperationsService)
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
    routers = parts.routers
    notifier = SystemdNotifier(
        lambda: status_line(operations.ready(), [e for r in routers for e in r.bound]), clock
    )
    notifier.setName("sd-notify")
    notifier.setServiceParent(top)
    return top


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
            settings.security_files(),
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
    # Every stream the journal holds is listed from now on, before any
    # client names one.
    broker.streams.restore(found.streams)
    broker.streams.appends.restore(found.appends)
    broker.consumers.restore(found.consumers)
    if broker.access is not None:
        broker.access.owners.load(found.owners)
        count = len(found.owners)
        _log.info(
            "{count} {have} owners",
            count=count,
            have="address has" if count == 1 else "addresses have",
        )


def makeService(options: BrokerOptions) -> IService:
    """
    The service C{twistd malamute} runs: one that cannot be made or started
    is one line on stderr and exit status 1 (L{malamute_pack.startup}).
    """
    return make_or_exit("malamute", lambda: makeBrokerService(options["settings"]))
