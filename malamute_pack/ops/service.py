"""
Operations as a Twisted service of ``twistd malamute``: the statistics'
sampling, the C{$broker} management service, a line of counters in the log
every C{--stats-interval} seconds when asked, and with C{--http} the
management API (L{malamute_pack.ops.http}) listening on its strports
endpoint. Started after the broker model and its sockets, stopped before
them.

Tests: ``tests/system/test_ops_service.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, fail, gatherResults, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IReactorTime, IStreamServerEndpoint
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.broker.access import AccessControl
from malamute_pack.broker.broker import Broker
from malamute_pack.journal import Journal
from malamute_pack.ops.admin import Admin
from malamute_pack.ops.config import OpsView
from malamute_pack.ops.listen_hint import cannot_listen
from malamute_pack.ops.management import ManagementSession
from malamute_pack.ops.stats import Statistics
from malamute_pack.startup import StartupError
from malamute_pack.text import plural

if TYPE_CHECKING:
    from malamute_pack.transport.router import RouterService

_log = Logger()


def stats_line(statistics: Statistics) -> str:
    """The one line of counters the log gets every C{--stats-interval} seconds."""
    overview = statistics.overview()
    rates = overview["rates"]
    line = (
        f"stats: {plural(overview['clients'], 'client')}, "
        f"{plural(overview['streams'], 'stream')}; "
        f"stream messages {rates['stream_messages']:g}/s, "
        f"deliveries {rates['stream_deliveries']:g}/s, "
        f"mailbox messages {rates['mailbox_messages']:g}/s, "
        f"service requests {rates['service_requests']:g}/s"
    )
    journal = statistics.journal()
    if journal["enabled"]:
        line += (
            f"; journal pending {plural(journal['pending_writes'], 'write')}"
            f" ({journal['pending_bytes']} bytes)"
        )
    return line


def url_host(host: str) -> str:
    """A listening address as a URL's host (an IPv6 one in brackets)."""
    return f"[{host}]" if ":" in host else host


class OperationsService(MultiService):
    """
    The broker's operations: statistics, C{$broker}, the counters' log
    line and the management API.

    @ivar statistics: the L{Statistics} (the features that run shown
        there by the tap: L{malamute_pack.ops.feature}).
    @ivar admin: the L{Admin} actions.
    @ivar management: the C{$broker} session, while running.
    @ivar port: the management API's listening port, once listening.
    @ivar url: the management API's URL (C{http://HOST:PORT/}), once listening.
    """

    def __init__(
        self,
        reactor: Any,
        broker: Broker,
        journal: Journal | None,
        settings: OpsView,
        routers: Sequence[RouterService] = (),
        access: AccessControl | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._reactor = reactor
        self._clock: IReactorTime = reactor
        self._broker = broker
        self._journal = journal
        self._settings = settings
        self._routers = tuple(routers)
        self._access = access
        self.statistics = Statistics(self._clock, broker, journal, settings)
        if self._routers:
            self.statistics.bound = self._bound
        self.admin = Admin(broker, journal)
        self.management: ManagementSession | None = None
        self.port: IListeningPort | None = None
        self.url: str | None = None
        self._log_loop: LoopingCall | None = None
        self._listening: Deferred[None] | None = None

    def _bound(self) -> list[str]:
        return [endpoint for router in self._routers for endpoint in router.bound]

    def ready(self) -> str | None:
        """None when the broker serves; otherwise the reason it does not (yet)."""
        if not self.running:
            return "the broker is starting"
        for router in self._routers:
            if not router.bound:
                return f"not bound to {', '.join(router.endpoints)} yet"
        if self._journal is not None and not self._journal.is_open:
            return "the journal is not open"
        return self.statistics.not_ready()

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.statistics.start()
        self.management = ManagementSession(self._clock, self._broker, self.statistics)
        self.management.attach()
        interval = self._settings.stats_interval
        if interval is not None:
            self._log_loop = LoopingCall(self._log_stats)
            self._log_loop.clock = self._clock
            self._log_loop.start(interval, now=False)
        if self._settings.http is not None:
            self._listening = self._listen(self._settings.http)

    def _log_stats(self) -> None:
        try:
            _log.info("{line}", line=stats_line(self.statistics))
        except Exception:
            _log.failure("stats: the counters' line failed")

    def _listen(self, description: str) -> Deferred[None]:
        """
        Listen on C{description}. TCP and unix endpoints listen at once: a
        port that cannot be had then fails the broker's start (one line,
        exit status 1, L{malamute_pack.startup}) rather than leaving it
        running without the API it was asked for.
        """
        # Imported here: the web server is loaded only when asked for.
        from malamute_pack.ops.http import HttpAccess, make_site

        access = HttpAccess.from_settings(self._settings, self._access, self._clock)
        site = make_site(self.statistics, self.admin, access, self.ready)
        endpoint: IStreamServerEndpoint = serverFromString(  # type: ignore[no-untyped-call]
            self._reactor, description
        )
        try:
            listening: Deferred[IListeningPort] = endpoint.listen(site)
        except Exception:
            listening = fail()
        failed: list[Failure] = []
        done = listening.addCallbacks(self._listened, failed.append)
        if failed:
            raise StartupError(cannot_listen(description, failed[0]))
        return done.addErrback(self._listen_failed, description)

    def _listened(self, port: IListeningPort) -> None:
        if not self.running:  # stopped while it was starting to listen
            port.stopListening()
            return
        self.port = port
        address = port.getHost()
        host = getattr(address, "host", None)
        number = getattr(address, "port", None)
        self.url = f"http://{url_host(str(host))}:{number}/"
        _log.info("management API at {url}", url=self.url)

    def _listen_failed(self, failure: Failure, description: str) -> None:
        _log.error(
            "management API: cannot listen on {endpoint}: {reason}; the broker runs without it"
            " (fix --http)",
            endpoint=description,
            reason=failure.getErrorMessage(),
        )

    def stopService(self) -> Deferred[Any]:
        if self._log_loop is not None and self._log_loop.running:
            self._log_loop.stop()
        self._log_loop = None
        if self.management is not None:
            self.management.detach()
            self.management = None
        self.statistics.stop()
        stopped: list[Deferred[Any]] = []
        if self.port is not None:
            port, self.port = self.port, None
            stopped.append(maybeDeferred(port.stopListening))
        parent = super().stopService()  # type: ignore[no-untyped-call]
        if parent is not None:
            stopped.append(parent)
        return gatherResults(stopped).addCallback(lambda _: None)
