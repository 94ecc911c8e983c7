"""
The broker's statistics as the management API, the C{$broker} service and
the dashboard show them: plain JSON-ready values read from the model (the
broker's registry, streams and post office), the journal, the settings and
the optional parts (pack, pair, bridges), with rates from counters sampled
once a second on the injected clock.

Pure logic: no sockets. What costs more than reading attributes (the
journal's per-stream totals, a query on its reader thread) is fetched once
a second by the sampler and served from that copy, so a request never
touches the disk and the broker's hot paths only bump counters.

Tests: ``tests/unit/test_ops_stats.py``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from importlib import metadata
from typing import TYPE_CHECKING, Any, Final

import psutil
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.broker.broker import Broker
from malamute_pack.broker.connection import Connection
from malamute_pack.broker.letters import LetterQueue
from malamute_pack.broker.limits import Limits
from malamute_pack.feature import Shown
from malamute_pack.journal import Journal
from malamute_pack.journal.salvage import Salvage
from malamute_pack.ops.config import OpsView
from malamute_pack.ops.rates import Rates

if TYPE_CHECKING:
    from malamute_pack.transport.zap import ZapHandler

_log = Logger()

SECTIONS: Final = (
    "overview",
    "clients",
    "streams",
    "mailboxes",
    "services",
    "consumers",
    "journal",
    "limits",
    "pack",
    "pair",
    "bridges",
    "history",
)

# The counters whose rates are kept (overview "rates", and "history").
RATED: Final = ("stream_messages", "stream_deliveries", "mailbox_messages", "service_requests")

# The sections the features show (L{Statistics.show}), and what each is
# while its feature does not run.
FEATURE_SECTIONS: Final = ("pack", "pair", "bridges")
_OFF: Final = {"enabled": False}

# Seconds between samples.
SAMPLE_INTERVAL: Final = 1.0


def broker_version() -> str:
    """This package's installed version ("0+unknown" when it is not installed)."""
    try:
        return metadata.version("malamute_pack")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def limit_name(field: str) -> str:
    """A limit's name as the config file spells it (C{max_clients}: C{max-clients})."""
    return field.replace("_", "-")


def _percentile(ordered: list[float], fraction: float) -> float:
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


class Statistics:
    """
    What the broker shows of itself, section by section (L{SECTIONS}).

    @ivar shown: what each feature that runs shows, by section
        (L{FEATURE_SECTIONS}; L{show}).
    @ivar zap: the ZAP handler, when endpoints or links authenticate (its
        counters and throttle are exported as metrics).
    @ivar bound: the endpoints the broker's sockets are bound to, as
        ZeroMQ reports them (the configured ones until set).
    @ivar refreshing: a read of the journal's per-stream totals is under way.
    """

    def __init__(
        self,
        clock: IReactorTime,
        broker: Broker,
        journal: Journal | None,
        settings: OpsView,
        started: float | None = None,
    ) -> None:
        self._clock = clock
        self._broker = broker
        self._journal = journal
        self.started = clock.seconds() if started is None else started
        self.shown: dict[str, Shown] = {}
        self.zap: ZapHandler | None = None
        self.bound: Callable[[], list[str]] = lambda: list(settings.endpoints)
        self._rates = Rates()
        self._stream_rates = Rates(history=1)
        # The journal's per-stream (records, bytes) retained, a second old at most.
        self._totals: dict[str, tuple[int, int]] = {}
        self.refreshing = False
        self._loop = LoopingCall(self.sample)
        self._loop.clock = clock
        self._process = psutil.Process(os.getpid())

    def show(self, name: str, shown: Shown) -> None:
        """Show a feature that runs as the section C{name} (one of L{FEATURE_SECTIONS})."""
        self.shown[name] = shown

    def _service(self, name: str) -> object | None:
        shown = self.shown.get(name)
        return shown.service if shown is not None else None

    @property
    def pack(self) -> object | None:
        """The pack's service, when this broker is in a pack."""
        return self._service("pack")

    @property
    def pair(self) -> object | None:
        """The pair's service, when this broker is one of a pair."""
        return self._service("pair")

    @property
    def bridges(self) -> object | None:
        """The multicast bridges' service, when there are bridges."""
        return self._service("bridges")

    def not_ready(self) -> str | None:
        """Why a feature keeps the broker from serving (a pair's passive), or None."""
        for shown in self.shown.values():
            reason = shown.not_ready()
            if reason is not None:
                return reason
        return None

    # Sampling

    def start(self) -> None:
        """Sample the counters now and every second."""
        if not self._loop.running:
            self._loop.start(SAMPLE_INTERVAL, now=True)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def sample(self) -> None:
        """Take one sample of the counters (and refresh the journal's totals)."""
        now = self._clock.seconds()
        self._rates.add(now, self.counters())
        self._stream_rates.add(
            now, {name: s.messages for name, s in self._broker.streams.streams.items()}
        )
        self._refresh_totals()

    def _refresh_totals(self) -> None:
        journal = self._journal
        if journal is None or not journal.is_open or self.refreshing:
            return
        self.refreshing = True

        def got(totals: dict[str, tuple[int, int]]) -> None:
            self._totals = totals

        def failed(failure: Failure) -> None:
            _log.warn("statistics: the journal's totals: {error}", error=failure.value)

        def done(_: object) -> None:
            self.refreshing = False

        try:
            reading = journal.stream_totals()
        except Exception as e:  # closed between the check and the read
            self.refreshing = False
            _log.warn("statistics: the journal's totals: {error}", error=e)
            return
        reading.addCallbacks(got, failed).addBoth(done)

    def counters(self) -> dict[str, int]:
        """The broker's cumulative counters (the overview's C{counters})."""
        broker = self._broker
        post = broker.post
        counters = broker.counters
        return {
            "stream_messages": sum(s.messages for s in broker.streams.streams.values()),
            "stream_deliveries": broker.streams.delivered,
            "mailbox_messages": post.stored - post.stored_requests,
            "service_requests": post.stored_requests,
            "delivered_letters": post.delivered,
            "refused": counters.refused,
            "malformed": counters.malformed,
            "expired_clients": counters.expired_clients,
        }

    def rates(self) -> dict[str, float]:
        """Per second over the last 5 s, of the counters in L{RATED}."""
        rates = self._rates.rates()
        return {name: rates.get(name, 0.0) for name in RATED}

    # Sections

    def section(self, name: str) -> Any:
        """The section called C{name} (one of L{SECTIONS}); KeyError if there is none."""
        sections: dict[str, Callable[[], Any]] = {
            "overview": self.overview,
            "clients": self.clients,
            "streams": self.streams,
            "mailboxes": self.mailboxes,
            "services": self.services,
            "consumers": self.consumers,
            "journal": self.journal,
            "limits": self.limits,
            "pack": self.pack_status,
            "pair": self.pair_status,
            "bridges": self.bridges_status,
            "history": self.history,
        }
        return sections[name]()

    def overview(self) -> dict[str, Any]:
        broker = self._broker
        now = self._clock.seconds()
        try:
            rss: int | None = self._process.memory_info().rss
        except psutil.Error:
            rss = None
        return {
            "version": broker_version(),
            "uptime_s": round(max(0.0, now - self.started), 3),
            "started": self.started,
            "pid": os.getpid(),
            "rss_bytes": rss,
            "endpoints": self.bound(),
            "journal": self._journal is not None,
            "clients": sum(1 for c in broker.registry if not (c.internal or c.remote)),
            "streams": len(broker.streams.streams),
            "mailboxes": len(broker.post.mailboxes),
            "services": len(broker.post.services),
            "counters": self.counters(),
            "rates": self.rates(),
            "refused_by_reason": dict(broker.counters.by_reason),
        }

    def clients(self) -> list[dict[str, Any]]:
        """Every connection: clients, and the broker's own parts and peers (C{internal})."""
        now = self._clock.seconds()
        return [self._client(c, now) for c in self._broker.registry]

    def _client(self, connection: Connection, now: float) -> dict[str, Any]:
        session = connection.session
        dialect = getattr(session, "dialect", None)
        version = getattr(dialect, "version", None)
        return {
            "id": client_id(connection),
            "address": connection.address,
            "user": session.user,
            "version": version if isinstance(version, int) and version > 0 else None,
            "credit": connection.credit,
            "subscriptions": connection.subscriptions(),
            "queued": self._owed(connection),
            "held": connection.held_count(),
            "connected_s": round(max(0.0, now - connection.opened), 3),
            "internal": connection.internal or connection.remote,
        }

    def _owed(self, connection: Connection) -> int:
        """Deliveries owed: its mail waiting, and the streams it is behind on (at most)."""
        owed = 0
        if connection.address:
            mailbox = self._broker.post.mailboxes.get(connection.address)
            if mailbox is not None:
                owed += len(mailbox)
        streams = self._broker.streams
        for name, wanted in connection.behind.items():
            owed += max(0, streams.last_seq(name) + 1 - wanted)
        return owed

    def streams(self) -> list[dict[str, Any]]:
        broker = self._broker
        journal = self._journal
        writers: dict[str, int] = {}
        for connection in broker.registry:
            if connection.writer is not None:
                name = connection.writer.name
                writers[name] = writers.get(name, 0) + 1
        rates = self._stream_rates.rates()
        found = []
        for name, stream in sorted(broker.streams.streams.items()):
            last = broker.streams.last_seq(name)
            first: int | None = None
            records: int | None = 0
            size: int | None = 0
            # A last-value stream's (docs/protocol.md): its subjects kept, and
            # the records of new subjects past the limit not kept.
            compact: str | None = None
            last_values: int | None = None
            not_kept: int | None = None
            if journal is not None:
                first = journal.first_seq(name)
                records, size = self._totals.get(name, (None, None))
                compact = "subject" if journal.compacted(name) else ""
                if compact:
                    last_values, not_kept = journal.last_value_stats(name)
            found.append(
                {
                    "name": name,
                    "writers": writers.get(name, 0),
                    "readers": stream.readers.owner_count(),
                    "messages": stream.messages,
                    "deliveries": stream.delivered,
                    "rate": rates.get(name, 0.0),
                    "first_seq": first if first is not None and first <= last else None,
                    "last_seq": last,
                    "retained_records": records,
                    "retained_bytes": size,
                    "compact": compact,
                    "last_values": last_values,
                    "last_values_not_kept": not_kept,
                }
            )
        return found

    def _queue(self, queue: LetterQueue, now: float) -> dict[str, Any]:
        first = queue.first()
        oldest = min((letter.created for letter in queue), default=None) if first else None
        return {
            "depth": len(queue),
            "bytes": queue.bytes,
            "oldest_s": round(max(0.0, now - oldest), 3) if oldest is not None else None,
        }

    def mailboxes(self) -> list[dict[str, Any]]:
        now = self._clock.seconds()
        holder = self._broker.registry.holder
        return [
            {
                "address": address,
                **self._queue(queue, now),
                "connected": holder(address) is not None,
            }
            for address, queue in sorted(self._broker.post.mailboxes.items())
        ]

    def consumers(self) -> list[dict[str, Any]]:
        """
        The consumers the broker remembers: position, lag, idle time,
        whether a connection reads as it (a reader's holder, any member of
        a group) and a group's members.
        """
        now = self._clock.seconds()
        return [
            {
                "stream": view.stream,
                "name": view.name,
                "kind": view.kind,
                "position": view.position,
                "last": view.last,
                "lag": view.lag,
                "idle_s": max(0.0, now - view.updated),
                "connected": view.holder is not None,
                "members": list(view.members),
            }
            for view in self._broker.consumers.views()
        ]

    def services(self) -> list[dict[str, Any]]:
        now = self._clock.seconds()
        found = []
        for name, service in sorted(self._broker.post.services.items()):
            workers = service.offers.owners()
            found.append(
                {
                    "name": name,
                    **self._queue(service.queue, now),
                    "workers": len(workers),
                    "offers": sum(len(w.offers.get(name, ())) for w in workers),
                }
            )
        return found

    def journal(self) -> dict[str, Any]:
        journal = self._journal
        if journal is None:
            return {
                "enabled": False,
                "path": None,
                "size_bytes": None,
                "pending_bytes": None,
                "pending_writes": None,
                "commit_latency_ms": None,
                "batches": None,
                "records_written": None,
                "bytes_written": None,
                "errors": None,
                "pruned": None,
                "writer_failure": None,
                "damaged_records": None,
                "salvage": None,
            }
        counters = journal.counters
        failure = journal.writer_failure
        salvaged = journal.salvaged
        latencies = sorted(journal.commit_latencies)
        latency = (
            {
                "p50": round(_percentile(latencies, 0.5) * 1000, 3),
                "p99": round(_percentile(latencies, 0.99) * 1000, 3),
                "max": round(latencies[-1] * 1000, 3),
            }
            if latencies
            else None
        )
        return {
            "enabled": True,
            "path": str(journal.path),
            "size_bytes": _file_size(str(journal.path)),
            "pending_bytes": journal.backlog_bytes,
            "pending_writes": journal.pending_writes,
            "commit_latency_ms": latency,
            "batches": counters.batches,
            "records_written": counters.records_written,
            "bytes_written": counters.bytes_written,
            "errors": counters.errors,
            "pruned": counters.pruned,
            # Why every write fails (its writer broke on a bug), else None.
            "writer_failure": None if failure is None else str(failure),
            # Records and letters reads found damaged (each once): never served.
            "damaged_records": counters.damaged_records,
            # The salvage of a damaged file at the last open, if one ran.
            "salvage": None if salvaged is None else salvage_section(salvaged),
        }

    def limits(self) -> dict[str, Any]:
        limits = self._broker.limits
        return {
            "limits": {
                limit_name(f.name): getattr(limits, f.name) for f in dataclasses.fields(Limits)
            },
            "refused": dict(self._broker.counters.by_reason),
        }

    def _feature(self, name: str) -> dict[str, Any]:
        shown = self.shown.get(name)
        return shown.section() if shown is not None else dict(_OFF)

    def pack_status(self) -> dict[str, Any]:
        return self._feature("pack")

    def pair_status(self) -> dict[str, Any]:
        return self._feature("pair")

    def bridges_status(self) -> dict[str, Any]:
        return self._feature("bridges")

    def history(self) -> list[dict[str, Any]]:
        """The last 300 one-second samples of the rates, oldest first."""
        return [
            {"t": entry["t"], **{name: round(entry.get(name, 0.0), 3) for name in RATED}}
            for entry in self._rates.history
        ]


def client_id(connection: Connection) -> str:
    """
    A connection's id in the management API: its routing id (hex) for a
    client of a socket, else a number unique while it is open.
    """
    route = getattr(connection.session, "route", None)
    if isinstance(route, bytes):
        return route.hex()
    return f"x{id(connection):x}"


def salvage_section(salvaged: Salvage) -> dict[str, Any]:
    """What the journal section shows of a salvage of a damaged file."""
    return {
        "reason": salvaged.reason,
        "damaged_file": str(salvaged.aside),
        "lost_records": {
            stream: [list(stretch) for stretch in stretches]
            for stream, stretches in sorted(salvaged.lost.items())
        },
        "lost_letters": list(salvaged.letters),
        "unreadable_rows": dict(salvaged.unreadable),
        "lost_rows": {
            table: [list(key) for key in keys] for table, keys in sorted(salvaged.lost_rows.items())
        },
    }


def _file_size(path: str) -> int | None:
    """Bytes of a SQLite database with its write-ahead log, or None if missing."""
    total = 0
    found = False
    for name in (path, path + "-wal"):
        try:
            total += os.stat(name).st_size
            found = True
        except OSError:
            pass
    return total if found else None
