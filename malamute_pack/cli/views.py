"""
How each section of the broker's C{$broker} service is shown as text: the
overview as key/value lines, clients, streams, mailboxes and services as
tables, the pack as its state and a table of members. The JSON shapes are
those of ``malamute_pack/ops/stats.py``; a key that is missing shows as
C{-}, and a section of a shape not known here is printed as JSON.

Tests: ``tests/unit/test_cli_tables.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from malamute_pack.cli.tables import Column, duration, plain, rate, render_pairs, render_table, size

# The sections the command shows (command name -> section name).
SECTIONS: Final = {
    "status": "overview",
    "clients": "clients",
    "streams": "streams",
    "mailboxes": "mailboxes",
    "services": "services",
    "consumers": "consumers",
    "pack": "pack",
}


def _credit(value: Any) -> str:
    return "unlimited" if value is None else plain(value)


def _count(value: Any) -> str:
    return plain(value)


CLIENTS: Final = (
    Column("address", "ADDRESS"),
    Column("user", "USER"),
    Column("version", "V", right=True),
    Column("credit", "CREDIT", _credit, right=True),
    Column("subscriptions", "SUBS", right=True),
    Column("queued", "QUEUED", right=True),
    Column("held", "HELD", right=True),
    Column("connected_s", "CONNECTED", duration, right=True),
    Column("id", "ID"),
)
STREAMS: Final = (
    Column("name", "STREAM"),
    Column("writers", "WRITERS", right=True),
    Column("readers", "READERS", right=True),
    Column("messages", "MESSAGES", right=True),
    Column("deliveries", "DELIVERIES", right=True),
    Column("rate", "RATE", rate, right=True),
    Column("first_seq", "FIRST", right=True),
    Column("last_seq", "LAST", right=True),
    Column("retained_records", "RETAINED", right=True),
    Column("retained_bytes", "BYTES", size, right=True),
    Column("compact", "COMPACT", lambda value: plain(value or None)),
    Column("last_values", "LAST VALUES", right=True),
)
MAILBOXES: Final = (
    Column("address", "MAILBOX"),
    Column("depth", "DEPTH", right=True),
    Column("bytes", "BYTES", size, right=True),
    Column("oldest_s", "OLDEST", duration, right=True),
    Column("connected", "CONNECTED"),
)
SERVICES: Final = (
    Column("name", "SERVICE"),
    Column("depth", "DEPTH", right=True),
    Column("bytes", "BYTES", size, right=True),
    Column("oldest_s", "OLDEST", duration, right=True),
    Column("workers", "WORKERS", right=True),
    Column("offers", "OFFERS"),
)


def _names(value: Any) -> str:
    """A group's members: the first three names, then how many more."""
    names = list(value or ())
    if not names:
        return "-"
    shown = ",".join(map(str, names[:3]))
    return shown if len(names) <= 3 else f"{shown} +{len(names) - 3}"


CONSUMERS: Final = (
    Column("stream", "STREAM"),
    Column("name", "CONSUMER"),
    Column("kind", "KIND"),
    Column("position", "POSITION", right=True),
    Column("lag", "LAG", right=True),
    Column("idle_s", "IDLE", duration, right=True),
    Column("connected", "CONNECTED"),
    Column("members", "MEMBERS", _names),
)
MEMBERS: Final = (
    Column("name", "MEMBER"),
    Column("endpoint", "ENDPOINT"),
    Column("streams", "STREAMS", right=True),
)


def _rows(data: Any, columns: tuple[Column, ...], empty: str) -> str:
    if not isinstance(data, list) or not all(isinstance(row, Mapping) for row in data):
        return json.dumps(data, indent=2)
    if not data:
        return empty
    rows = [row for row in data if not row.get("internal")]
    hidden = len(data) - len(rows)
    table = render_table(rows, columns) if rows else empty
    return table + (f"\n({hidden} internal not shown; --json shows them)" if hidden else "")


def overview(data: Any) -> str:
    """The overview: identity, sizes, then counters, rates and refusals."""
    if not isinstance(data, Mapping):
        return json.dumps(data, indent=2)
    pairs = [
        ("version", plain(data.get("version"))),
        ("uptime", duration(data.get("uptime_s"))),
        ("pid", plain(data.get("pid"))),
        ("memory", size(data.get("rss_bytes"))),
        ("endpoints", plain(data.get("endpoints"))),
        ("journal", plain(data.get("journal"))),
        ("clients", plain(data.get("clients"))),
        ("streams", plain(data.get("streams"))),
        ("mailboxes", plain(data.get("mailboxes"))),
        ("services", plain(data.get("services"))),
    ]
    counters = data.get("counters")
    rates = data.get("rates")
    if isinstance(counters, Mapping):
        rates_by_name = rates if isinstance(rates, Mapping) else {}
        for name, value in counters.items():
            shown = plain(value)
            if name in rates_by_name:
                shown += f" ({rate(rates_by_name[name])})"
            pairs.append((name.replace("_", " "), shown))
    refused = data.get("refused_by_reason")
    if isinstance(refused, Mapping):
        for reason, count in refused.items():
            pairs.append((f"refused: {reason}", plain(count)))
    return render_pairs(pairs)


def clients(data: Any) -> str:
    return _rows(data, CLIENTS, "(no clients)")


def streams(data: Any) -> str:
    return _rows(data, STREAMS, "(no streams)")


def mailboxes(data: Any) -> str:
    return _rows(data, MAILBOXES, "(no mailboxes)")


def services(data: Any) -> str:
    return _rows(data, SERVICES, "(no services)")


def consumers(data: Any) -> str:
    return _rows(data, CONSUMERS, "(no consumers)")


def pack(data: Any) -> str:
    """The pack: whether there is one, its other keys, then its members."""
    if not isinstance(data, Mapping):
        return json.dumps(data, indent=2)
    if not data.get("enabled"):
        return "no pack: this broker runs alone (start it with the pack options to join one)"
    pairs = [
        (key.replace("_", " "), plain(value))
        for key, value in data.items()
        if key not in ("enabled", "members")
    ]
    text = render_pairs(pairs)
    members = data.get("members")
    if isinstance(members, list) and all(isinstance(m, Mapping) for m in members):
        table = render_table(members, MEMBERS) if members else "(no members yet)"
        text = f"{text}\n\n{table}" if text else table
    return text


VIEWS: Final[dict[str, Callable[[Any], str]]] = {
    "overview": overview,
    "clients": clients,
    "streams": streams,
    "mailboxes": mailboxes,
    "services": services,
    "consumers": consumers,
    "pack": pack,
}


def render_section(name: str, data: Any) -> str:
    """Section C{name}'s data as text (JSON, indented, for a section without a view)."""
    view = VIEWS.get(name)
    return view(data) if view is not None else json.dumps(data, indent=2)
