"""
What the operations tests share: the keys of each statistics section (the
JSON the management API, the C{$broker} service and the dashboard read;
docs/operations.md), checked by ``tests/unit/test_ops_stats.py`` and
``tests/system/test_ops_http.py``; and a broker model with traffic to show
(``tests/unit/test_ops_metrics.py``, ``tests/system/test_ops_http.py``).
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.ops.stats import Statistics
from malamute_pack.protocol import mlm
from malamute_pack.settings import Settings
from tests.broker_support import BrokerHarness

# The keys every entry of each section has (docs/operations.md, the contract).
SCHEMA: dict[str, set[str]] = {
    "overview": {
        "version",
        "uptime_s",
        "started",
        "pid",
        "rss_bytes",
        "endpoints",
        "journal",
        "clients",
        "streams",
        "mailboxes",
        "services",
        "counters",
        "rates",
        "refused_by_reason",
    },
    "clients": {
        "id",
        "address",
        "user",
        "version",
        "credit",
        "subscriptions",
        "queued",
        "held",
        "connected_s",
        "internal",
    },
    "streams": {
        "name",
        "writers",
        "readers",
        "messages",
        "deliveries",
        "rate",
        "first_seq",
        "last_seq",
        "retained_records",
        "retained_bytes",
        "compact",
        "last_values",
        "last_values_not_kept",
    },
    "mailboxes": {"address", "depth", "bytes", "oldest_s", "connected"},
    "services": {"name", "depth", "bytes", "oldest_s", "workers", "offers"},
    "consumers": {"stream", "name", "kind", "position", "last", "lag", "idle_s", "connected"},
    "journal": {
        "enabled",
        "path",
        "size_bytes",
        "pending_bytes",
        "commit_latency_ms",
        "batches",
        "records_written",
        "bytes_written",
        "errors",
        "pruned",
    },
    "limits": {"limits", "refused"},
    "pack": {"enabled"},
    "pair": {"enabled"},
    "bridges": {"enabled"},
    "history": {
        "t",
        "stream_messages",
        "stream_deliveries",
        "mailbox_messages",
        "service_requests",
    },
}
COUNTERS = {
    "stream_messages",
    "stream_deliveries",
    "mailbox_messages",
    "service_requests",
    "delivered_letters",
    "refused",
    "malformed",
    "expired_clients",
}
RATES = {"stream_messages", "stream_deliveries", "mailbox_messages", "service_requests"}


WRITER = b"writer"
READER = b"reader"
OWNER = b"inbox-owner"
CONSUMER = b"consumer"


def busy_broker(
    case: SynchronousTestCase, journal_at: Path | None = None
) -> tuple[BrokerHarness, Statistics]:
    """
    A broker model with traffic, and its statistics: a writer that wrote
    three messages to the stream C{weather}, a reader of it, two letters
    waiting in the mailbox C{inbox} (its owner gone) and one request
    queued for the service C{echo} (no worker); journaled at C{journal_at}
    if given, with the consumer C{billing} of C{weather} (gone, its position
    2 remembered).
    """
    harness = BrokerHarness(journal_at=journal_at)
    case.addCleanup(harness.close)
    harness.open(WRITER, "writer")
    harness.command(WRITER, mlm.StreamWrite("weather"))
    harness.open(READER, "reader")
    harness.command(READER, mlm.StreamRead("weather", ""))
    for n in range(3):
        harness.send(WRITER, mlm.StreamSend(f"temp.{n}", [b"x" * 10]))
    harness.open(OWNER, "inbox")
    harness.send(OWNER, mlm.ConnectionClose())
    for n in range(2):
        harness.send(WRITER, mlm.MailboxSend("inbox", f"letter {n}", "", 0, [b"hello"]))
    harness.send(WRITER, mlm.ServiceSend("echo", "ping", "", 0, [b"p"]))
    harness.take(WRITER)
    harness.take(READER)
    if journal_at is not None:
        harness.open(CONSUMER, "", version=2)
        harness.command(CONSUMER, mlm.StreamConsume("weather", "", "billing"))
        harness.command(CONSUMER, mlm.StreamCommit("weather", 2))
        harness.send(CONSUMER, mlm.ConnectionClose())
        harness.take(CONSUMER)
    statistics = Statistics(harness.clock, harness.broker, harness.journal, Settings())
    return harness, statistics
