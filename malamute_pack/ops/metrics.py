"""
Prometheus metrics: the management API's figures (L{Statistics}) in the
Prometheus text format, for C{GET /metrics}.

L{StatisticsCollector} is a C{prometheus_client} custom collector that
reads the statistics at each scrape (nothing is kept or updated between
scrapes, so an unscraped broker pays nothing); L{MetricsRenderer} holds it
in a private C{CollectorRegistry} (never the process-global one, so two
brokers in one test process do not collide) together with the standard
process collector, and renders the text.

Names: counters end in C{_total}, gauges are the current depths, clients
and sizes. Per-stream, per-mailbox and per-service families carry a label
(C{stream}, C{address}, C{service}) and at most L{MAX_LABEL_SETS} label
sets each: past that, the names after the first ones in sorted order (a
stable choice between scrapes) are summed into the one label value
C{other} (the maximum, for ages). A broker that authenticates also shows
its ZAP handler's answers by domain and what its login throttle holds
(C{malamute_zap_*}: a brute force shows as refusals, throttled and
hurried ones rising); a broker in a pack, its members and the nodes a
CURVE pack turned away (C{malamute_pack_*}).

Tests: ``tests/unit/test_ops_metrics.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from malamute_pack.ops.stats import Statistics
from malamute_pack.transport.zap import ZapHandler

# Label sets per family at most; the rest are summed under OTHER.
MAX_LABEL_SETS: Final = 1000
OTHER: Final = "other"
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
PREFIX: Final = "malamute"

# overview["counters"] key: help text.
_COUNTERS: Final = {
    "stream_messages": "Messages written to streams.",
    "stream_deliveries": "Stream messages delivered to readers.",
    "mailbox_messages": "Messages sent to mailboxes.",
    "service_requests": "Requests sent to services.",
    "delivered_letters": "Mailbox letters and service requests delivered.",
    "refused": "Commands the broker refused.",
    "malformed": "Malformed messages dropped.",
    "expired_clients": "Clients expired for silence.",
}
_GAUGES: Final = {
    "clients": "Connected clients.",
    "streams": "Streams.",
    "mailboxes": "Mailboxes.",
    "services": "Services.",
}
# (key in the section's entries, metric suffix, counter?, help text, how merged)
_Column = tuple[str, str, bool, str, str]
_STREAM_COLUMNS: Final[Sequence[_Column]] = (
    ("messages", "messages_written", True, "Messages written to the stream.", "sum"),
    ("deliveries", "messages_delivered", True, "Messages of the stream delivered.", "sum"),
    ("writers", "writers", False, "Clients writing to the stream.", "sum"),
    ("readers", "readers", False, "Clients reading the stream.", "sum"),
    ("retained_records", "retained_records", False, "Records the journal keeps.", "sum"),
    ("retained_bytes", "retained_bytes", False, "Bytes the journal keeps.", "sum"),
    ("last_seq", "last_sequence", False, "The stream's last sequence number.", "max"),
    (
        "last_values",
        "last_values",
        False,
        "Subjects whose latest record a last-value stream keeps.",
        "sum",
    ),
    (
        "last_values_not_kept",
        "last_values_not_kept",
        True,
        "Records of new subjects past the limit, not kept as last values.",
        "sum",
    ),
)
_MAILBOX_COLUMNS: Final[Sequence[_Column]] = (
    ("depth", "depth", False, "Letters waiting in the mailbox.", "sum"),
    ("bytes", "bytes", False, "Bytes waiting in the mailbox.", "sum"),
    ("oldest_s", "oldest_seconds", False, "Age of the oldest letter waiting.", "max"),
)
_CONSUMER_COLUMNS: Final[Sequence[_Column]] = (
    ("position", "position", False, "The last record the consumer acknowledged.", "max"),
    ("lag", "lag", False, "Records written after the consumer's position.", "sum"),
)
_SERVICE_COLUMNS: Final[Sequence[_Column]] = (
    ("depth", "depth", False, "Requests queued for the service.", "sum"),
    ("bytes", "bytes", False, "Bytes of requests queued.", "sum"),
    ("oldest_s", "oldest_seconds", False, "Age of the oldest queued request.", "max"),
    ("workers", "workers", False, "Workers offering the service.", "sum"),
)
# DomainCounters field: help text.
_ZAP_COUNTERS: Final = (
    ("accepted", "Connections authenticated (ZAP), by domain."),
    ("refused", "Authentication attempts refused (ZAP), by domain."),
    ("throttled", "Refusals answered late: their (address, user) had failed lately."),
    ("hurried", "Late refusals answered early: too many were waiting (a flood)."),
)
_JOURNAL: Final = (
    ("size_bytes", "size_bytes", False, "Size of the journal's files."),
    ("pending_bytes", "pending_bytes", False, "Bytes waiting to be committed."),
    ("batches", "batches", True, "Commit batches written."),
    ("records_written", "records_written", True, "Records written."),
    ("bytes_written", "bytes_written", True, "Bytes written."),
    ("errors", "errors", True, "Write errors."),
    ("pruned", "pruned", True, "Records removed by retention."),
    ("damaged_records", "damaged_records", True, "Records and letters found damaged, not served."),
)


def _number(value: Any) -> float | None:
    """C{value} as a sample value, or None if it is not a number (null, a string)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


def bounded(
    rows: Iterable[Mapping[str, Any]],
    name_key: str,
    columns: Sequence[_Column],
    limit: int = MAX_LABEL_SETS,
) -> dict[str, dict[str, float]]:
    """
    C{rows} as label value to column to value, at most C{limit} label
    values: past that, the rows after the first C{limit - 1} names in
    sorted order, and any row named L{OTHER}, are merged under L{OTHER}
    (summed, or the maximum for the columns that say so).
    """
    by_name: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        by_name[str(row.get(name_key))] = row
    names = sorted(by_name)
    kept = names if len(names) <= limit else names[: limit - 1]
    result: dict[str, dict[str, float]] = {}
    for name in kept:
        if name == OTHER:
            continue
        row = by_name[name]
        values: dict[str, float] = {}
        for key, *_ in columns:
            if (value := _number(row.get(key))) is not None:
                values[key] = value
        result[name] = values
    merged = [by_name[n] for n in names[len(kept) :] if n != OTHER]
    if OTHER in by_name:
        merged.append(by_name[OTHER])
    if merged:
        other: dict[str, float] = {}
        for key, _, _, _, how in columns:
            found = [v for row in merged if (v := _number(row.get(key))) is not None]
            if found:
                other[key] = max(found) if how == "max" else sum(found)
        result[OTHER] = other
    return result


def _families(
    section: str,
    label: str,
    rows: dict[str, dict[str, float]],
    columns: Sequence[_Column],
) -> Iterator[Metric]:
    for key, suffix, counter, text, _ in columns:
        name = f"{PREFIX}_{section}_{suffix}"
        family: CounterMetricFamily | GaugeMetricFamily = (
            CounterMetricFamily(name, text, labels=[label])
            if counter
            else GaugeMetricFamily(name, text, labels=[label])
        )
        for value_name, values in rows.items():
            if key in values:
                family.add_metric([value_name], values[key])
        yield family


class StatisticsCollector(Collector):
    """
    The broker's statistics as Prometheus metric families, read at each
    collect.

    @param logins_refused: how many HTTP logins were refused (the
        management API's count), if there is an API.
    """

    def __init__(
        self, statistics: Statistics, logins_refused: Callable[[], int] | None = None
    ) -> None:
        self._statistics = statistics
        self._logins_refused = logins_refused

    def collect(self) -> Iterable[Metric]:
        statistics = self._statistics
        yield from self._overview(statistics.overview())
        yield from _families(
            "stream",
            "stream",
            bounded(statistics.streams(), "name", _STREAM_COLUMNS),
            _STREAM_COLUMNS,
        )
        yield from _families(
            "mailbox",
            "address",
            bounded(statistics.mailboxes(), "address", _MAILBOX_COLUMNS),
            _MAILBOX_COLUMNS,
        )
        yield from _families(
            "service",
            "service",
            bounded(statistics.services(), "name", _SERVICE_COLUMNS),
            _SERVICE_COLUMNS,
        )
        consumers = [{**c, "name": f"{c['stream']}/{c['name']}"} for c in statistics.consumers()]
        yield from _families(
            "consumer",
            "consumer",
            bounded(consumers, "name", _CONSUMER_COLUMNS),
            _CONSUMER_COLUMNS,
        )
        yield from self._clients(statistics.clients())
        yield from self._journal(statistics.journal())
        yield from self._limits(statistics.limits())
        if statistics.zap is not None:
            yield from self._zap(statistics.zap)
        yield from self._pack(statistics.pack_status())
        if self._logins_refused is not None:
            yield CounterMetricFamily(
                f"{PREFIX}_http_logins_refused",
                "Management API logins refused (wrong user or password).",
                value=self._logins_refused(),
            )

    def _overview(self, overview: Mapping[str, Any]) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            f"{PREFIX}_build_info", "The broker's version.", labels=["version"]
        )
        info.add_metric([str(overview.get("version"))], 1.0)
        yield info
        if (started := _number(overview.get("started"))) is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_start_time_seconds", "When the broker started (Unix time).", started
            )
        if (uptime := _number(overview.get("uptime_s"))) is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_uptime_seconds", "Seconds since the broker started.", uptime
            )
        for key, text in _GAUGES.items():
            if (value := _number(overview.get(key))) is not None:
                yield GaugeMetricFamily(f"{PREFIX}_{key}", text, value)
        counters = overview.get("counters") or {}
        for key, text in _COUNTERS.items():
            if (value := _number(counters.get(key))) is not None:
                yield CounterMetricFamily(f"{PREFIX}_{key}", text, value=value)
        by_reason = CounterMetricFamily(
            f"{PREFIX}_refused_by_reason", "Refused commands by reason.", labels=["reason"]
        )
        for reason, rows in bounded(
            (
                {"reason": reason, "n": n}
                for reason, n in (overview.get("refused_by_reason") or {}).items()
            ),
            "reason",
            (("n", "n", True, "", "sum"),),
        ).items():
            if "n" in rows:
                by_reason.add_metric([reason], rows["n"])
        yield by_reason

    def _clients(self, clients: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
        by_version: dict[str, int] = {}
        queued = held = 0.0
        for client in clients:
            if client.get("internal"):
                continue
            version = str(client.get("version"))
            by_version[version] = by_version.get(version, 0) + 1
            queued += _number(client.get("queued")) or 0.0
            held += _number(client.get("held")) or 0.0
        versions = GaugeMetricFamily(
            f"{PREFIX}_clients_by_version",
            "Connected clients (not the broker's own) by MLM protocol version.",
            labels=["version"],
        )
        for version, n in sorted(by_version.items()):
            versions.add_metric([version], n)
        yield versions
        yield GaugeMetricFamily(
            f"{PREFIX}_clients_queued", "Deliveries owed to clients, all together.", queued
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_clients_held", "Letters in flight to clients, all together.", held
        )

    def _journal(self, journal: Mapping[str, Any]) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            f"{PREFIX}_journal_enabled",
            "Whether the broker journals (1) or not (0).",
            1.0 if journal.get("enabled") else 0.0,
        )
        for key, suffix, counter, text in _JOURNAL:
            value = _number(journal.get(key))
            if value is None:
                continue
            name = f"{PREFIX}_journal_{suffix}"
            yield (
                CounterMetricFamily(name, text, value=value)
                if counter
                else GaugeMetricFamily(name, text, value)
            )
        latency = journal.get("commit_latency_ms")
        if isinstance(latency, Mapping):
            family = GaugeMetricFamily(
                f"{PREFIX}_journal_commit_latency_seconds",
                "Commit latency over recent batches (p50, p99, max).",
                labels=["quantile"],
            )
            for key, quantile in (("p50", "0.5"), ("p99", "0.99"), ("max", "1")):
                if (value := _number(latency.get(key))) is not None:
                    family.add_metric([quantile], value / 1000.0)
            yield family

    def _zap(self, zap: ZapHandler) -> Iterator[Metric]:
        """Authentication by ZAP domain, and what its login throttle holds now."""
        for field, text in _ZAP_COUNTERS:
            family = CounterMetricFamily(f"{PREFIX}_zap_{field}", text, labels=["domain"])
            for domain, counters in sorted(zap.counters.items()):
                family.add_metric([domain], getattr(counters, field))
            yield family
        yield GaugeMetricFamily(
            f"{PREFIX}_zap_pending", "Refusals waiting for their delayed answer.", zap.pending
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_zap_tracked",
            "(address, user) pairs whose recent failures the throttle remembers.",
            zap.tracked,
        )

    def _pack(self, pack: Mapping[str, Any]) -> Iterator[Metric]:
        """The pack's members and, in a CURVE pack, the brokers it turned away."""
        if not pack.get("running"):
            return
        yield GaugeMetricFamily(
            f"{PREFIX}_pack_members", "Peer brokers federated with this one.", len(pack["members"])
        )
        refused = CounterMetricFamily(
            f"{PREFIX}_pack_refused",
            "Nodes a CURVE pack turned away (a key not listed, no key, another key"
            " than its connection's, a key no longer listed), by reason.",
            labels=["reason"],
        )
        for reason, n in sorted((pack.get("refused") or {}).items()):
            refused.add_metric([reason], n)
        yield refused
        counters = pack.get("counters") or {}
        owners = CounterMetricFamily(
            f"{PREFIX}_pack_owner_claims",
            "Owner claims heard from peer brokers: learned (they changed an owner here)"
            " or ignored (an open pack believes none).",
            labels=["outcome"],
        )
        for outcome in ("learned", "ignored"):
            owners.add_metric([outcome], counters.get(f"owners_{outcome}", 0))
        yield owners
        groups = pack.get("groups") or {}
        yield GaugeMetricFamily(
            f"{PREFIX}_pack_group_memberships",
            "Clients here that are members of a consumer group homed on a peer broker.",
            groups.get("memberships_elsewhere", 0),
        )
        events = CounterMetricFamily(
            f"{PREFIX}_pack_group_events",
            "Consumer groups across the pack: members of peers that joined a group here"
            " (hosted), clients here that joined one homed on a peer (joined_elsewhere),"
            " memberships moved to a new home, records or answers for a membership"
            " gone (stale), joins the home refused.",
            labels=["event"],
        )
        for event in ("hosted", "joined_elsewhere", "moved", "stale", "refused"):
            events.add_metric([event], groups.get(event, 0))
        yield events

    def _limits(self, limits: Mapping[str, Any]) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            f"{PREFIX}_limit", "The broker's configured limits.", labels=["name"]
        )
        for name, value in sorted((limits.get("limits") or {}).items()):
            if (number := _number(value)) is not None:
                family.add_metric([name], number)
        yield family


class MetricsRenderer:
    """A private registry with the broker's statistics and the process's figures."""

    def __init__(
        self, statistics: Statistics, logins_refused: Callable[[], int] | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatisticsCollector(statistics, logins_refused))
        ProcessCollector(registry=self.registry)

    def render(self) -> bytes:
        """Every metric, in the Prometheus text format (L{CONTENT_TYPE})."""
        return generate_latest(self.registry)
