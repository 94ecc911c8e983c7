"""
What an operator may do to a running broker (the management API's admin
actions): purge a mailbox or a service queue, delete a stream's retained
records, disconnect a client, change retention, make a stream a
last-value stream or not. Each acts on the model and the journal as the
broker itself would, and returns what it did as a JSON-ready dict; a name
that does not exist is an L{AdminError}. A stream's delete, a retention
change and a compaction change are writes of the journal, so a pair's
active ships them to its partner like its records (purges remove letters,
which it ships too).

Tests: ``tests/unit/test_ops_admin.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.broker.broker import Broker
from malamute_pack.broker.connection import Connection
from malamute_pack.broker.letters import LetterQueue
from malamute_pack.broker.machine import Unresponsive
from malamute_pack.journal import Journal, RetentionPolicy
from malamute_pack.journal.feature import SUBJECT
from malamute_pack.ops.stats import client_id

_log = Logger()

UNTIL_RESTART = (
    "in effect until the broker restarts: set it in the config file"
    " (malamute/journal/retention/..., malamute/journal/streams/NAME/...) to keep it"
)

UNTIL_RESTART_COMPACT = (
    "in effect until the broker restarts: set it in the config file"
    " (malamute/streams/NAME/compact = subject) to keep it"
)


class AdminError(Exception):
    """An admin action that cannot be done (an unknown name, a bad value); the reason."""


class Admin:
    """The operator's actions on C{broker} and its C{journal} (None: no journal)."""

    def __init__(self, broker: Broker, journal: Journal | None) -> None:
        self._broker = broker
        self._journal = journal

    # Letters

    def purge_mailbox(self, address: str) -> dict[str, Any]:
        """Drop every letter waiting in the mailbox of C{address}, for good."""
        queue = self._broker.post.mailboxes.get(address)
        if queue is None:
            raise AdminError(f"no mailbox {address!r}")
        return {"mailbox": address, **self._purge(queue, f"mailbox {address!r}")}

    def purge_service(self, service: str) -> dict[str, Any]:
        """Drop every request waiting in the queue of C{service}, for good."""
        found = self._broker.post.services.get(service)
        if found is None:
            raise AdminError(f"no service {service!r}")
        return {"service": service, **self._purge(found.queue, f"service {service!r}")}

    def _purge(self, queue: LetterQueue, what: str) -> dict[str, Any]:
        purged, size = self._broker.post.purge(queue)
        _log.info(
            "admin: purged {what}: {count} letters, {size} bytes",
            what=what,
            count=purged,
            size=size,
        )
        return {"purged": purged, "bytes": size, "journaled": self._journal is not None}

    # Streams

    def delete_stream(self, stream: str) -> dict[str, Any]:
        """
        Delete every record C{stream} retains: readers behind it skip to
        what is written next (they are told of the gap); the file's rows
        go in the journal's next transaction (and on a pair's partner too).
        """
        streams = self._broker.streams
        journal = self._journal
        known = stream in streams.streams or (journal is not None and journal.last_seq(stream))
        if not known:
            raise AdminError(f"no stream {stream!r}")
        if journal is None:
            return {
                "stream": stream,
                "records": 0,
                "bytes": 0,
                "note": "no journal: the broker retains no stream records",
            }
        first, last = journal.first_seq(stream), journal.last_seq(stream)
        records = max(0, last - first + 1)
        deleting = journal.delete_stream(stream)

        def deleted(result: tuple[int, int]) -> None:
            _log.info(
                "admin: stream {stream!r} deleted through {last}: {count} records,"
                " {size} bytes from the journal",
                stream=stream,
                last=last,
                count=result[0],
                size=result[1],
            )

        def failed(failure: Failure) -> None:
            _log.error(
                "admin: deleting stream {stream!r} from the journal failed: {error}",
                stream=stream,
                error=failure.value,
            )

        deleting.addCallbacks(deleted, failed)
        return {
            "stream": stream,
            "records": records,
            "deleted_through": last,
            "first_seq": last + 1,
        }

    def set_retention(
        self,
        stream: str | None,
        max_age_s: float | None,
        max_bytes: int | None,
        max_records: int | None,
    ) -> dict[str, Any]:
        """
        Change the retention of C{stream} (None: the default of every
        stream without its own): None leaves a limit as it is, 0 removes
        it. Pruned by the new policy at once, and until the broker restarts
        (a pair's partner prunes by it too, and keeps it if it takes over).
        """
        journal = self._journal
        if journal is None:
            raise AdminError("no journal: the broker retains no stream records")
        for name, value in (
            ("max_age_s", max_age_s),
            ("max_bytes", max_bytes),
            ("max_records", max_records),
        ):
            if value is not None and (isinstance(value, bool) or value < 0):
                raise AdminError(f"{name} must be 0 (no limit) or more, not {value!r}")
        if stream is not None and not (
            stream in self._broker.streams.streams or journal.last_seq(stream)
        ):
            raise AdminError(f"no stream {stream!r}")
        config = journal.config
        before = config.retention if stream is None else config.retention_for(stream)

        def pick(value: float | None, current: float | None) -> float | None:
            if value is None:
                return current
            return value or None

        age = pick(max_age_s, before.max_age_s)
        size = pick(max_bytes, before.max_bytes)
        count = pick(max_records, before.max_count)
        policy = RetentionPolicy(
            max_count=None if count is None else int(count),
            max_age_s=None if age is None else float(age),
            max_bytes=None if size is None else int(size),
        )
        if stream is None:
            config = dataclasses.replace(config, retention=policy)
        else:
            config = dataclasses.replace(
                config, per_stream_retention={**config.per_stream_retention, stream: policy}
            )
        journal.set_retention(config)
        _log.info(
            "admin: retention of {what} is now {policy} (until the broker restarts)",
            what=f"stream {stream!r}" if stream is not None else "every stream",
            policy=policy,
        )
        journal.prune().addErrback(
            lambda failure: _log.error("admin: pruning failed: {error}", error=failure.value)
        )
        return {
            "stream": stream,
            "retention": _policy(policy),
            "previous": _policy(before),
            "until_restart": True,
            "note": UNTIL_RESTART,
        }

    def set_compaction(self, stream: str, compact: str) -> dict[str, Any]:
        """
        Make C{stream} a last-value stream (C{compact} C{"subject"}: the
        journal keeps each subject's latest record, built at once from the
        records retained) or an ordinary one (C{""}: its last values are
        forgotten), in the order of writes (a pair's partner follows),
        until the broker restarts.
        """
        journal = self._journal
        if journal is None:
            raise AdminError("no journal: the broker retains no stream records")
        if compact not in (SUBJECT, ""):
            raise AdminError(
                f"compact must be {SUBJECT!r} (keep each subject's latest record) or ''"
                f" (not compacted), not {compact!r}"
            )
        if not (stream in self._broker.streams.streams or journal.last_seq(stream)):
            raise AdminError(f"no stream {stream!r}")
        before = SUBJECT if journal.compacted(stream) else ""

        def done(kept: int) -> None:
            _log.info(
                "admin: stream {stream!r} is now {what} ({kept} last values; until the broker"
                " restarts)",
                stream=stream,
                what="a last-value stream" if compact else "not compacted",
                kept=kept,
            )

        def failed(failure: Failure) -> None:
            _log.error(
                "admin: changing the compaction of stream {stream!r} failed: {error}",
                stream=stream,
                error=failure.value,
            )

        journal.set_compaction(stream, compact == SUBJECT).addCallbacks(done, failed)
        return {
            "stream": stream,
            "compact": compact,
            "previous": before,
            "until_restart": True,
            "note": UNTIL_RESTART_COMPACT,
        }

    # Clients

    def disconnect(self, client: str) -> dict[str, Any]:
        """
        End the connection of a client (by address, or by its id in the
        clients section) as an expiry would: what it held goes back to
        its queues, and it must open again.
        """
        connection = self._find(client)
        if connection.internal or connection.remote:
            raise AdminError(f"{client!r} is a part of the broker or a peer, not a client")
        held = sum(1 for letter in connection.held.values() if letter.requeue_on_loss)
        self._broker.receive(connection.session, Unresponsive("disconnected by an operator"))
        _log.info(
            "admin: disconnected {connection} (user {user})",
            connection=connection,
            user=connection.session.user,
        )
        return {
            "client": client_id(connection),
            "address": connection.address,
            "user": connection.session.user,
            "disconnected": self._broker.registry.get(connection.session) is None,
            "requeued": held,
        }

    def _find(self, client: str) -> Connection:
        registry = self._broker.registry
        if client:
            found = registry.holder(client)
            if found is not None:
                return found
        for connection in registry:
            if client_id(connection) == client:
                return connection
        raise AdminError(f"no client {client!r} (an address or an id from the clients list)")


def _policy(policy: RetentionPolicy) -> dict[str, Any]:
    return {
        "max_age_s": policy.max_age_s,
        "max_bytes": policy.max_bytes,
        "max_records": policy.max_count,
    }
