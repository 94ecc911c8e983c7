"""
What arrives for the application: stream, mailbox and service messages
(handed over as L{Delivery}s), the CONFIRMs the broker forwards, STREAM_GAPs;
and, with protocol version 2, the answers owed for them.

Version 2 records are remembered to drop redeliveries: stream records by
stream and sequence number, mailbox and service records by id
(L{SeenSequences}, L{SeenIds}). A mailbox or service record is kept by the
broker until answered with DONE: at hand-over with C{auto_done}, or by the
application's C{done()}. A tracked record (one with a tracker) is left to
the application's C{confirm(tracker, ...)}, answered as DONE(id, status) of
the oldest unanswered record with that tracker: a DONE 200 at hand-over
would tell its sender "done" before the work is. A redelivered record
already answered is answered again with the same DONE (ours may have been
lost).

Tests: ``tests/unit/test_client_inbox.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

from twisted.logger import Logger

from malamute_pack.client.dedupe import ID_WINDOW, SeenIds, SeenSequences
from malamute_pack.client.events import Confirmation, Delivery, DeliveryCommand, Gap
from malamute_pack.protocol import mlm

_log = Logger()


class Recipient(Protocol):
    """Where the inbox hands what arrived: the driver, for the application."""

    def delivered(self, delivery: Delivery) -> None:
        """
        A stream, mailbox or service message arrived. The driver calls
        C{handed_over} when the application has it.
        """

    def confirmed(self, confirmation: Confirmation) -> None:
        """The broker forwarded a CONFIRM for a tracked message we sent."""

    def gap(self, gap: Gap) -> None:
        """The broker skipped stream messages retention removed (STREAM_GAP)."""


class Inbox:
    """
    The messages arriving for one client, and the DONEs it owes for them.

    @ivar duplicates: (version 2) redelivered records dropped: a mailbox or
        service record with an id already handed over, a stream record whose
        sequence number on its stream was already handed over.
    @ivar gaps: (version 2) STREAM_GAPs received.
    """

    def __init__(
        self,
        recipient: Recipient,
        sequences: SeenSequences,
        send_done: Callable[[int, int, str], None],
        arrived: Callable[[], None],
        auto_done: bool = True,
        dedupe_window: int = ID_WINDOW,
    ) -> None:
        """
        @param send_done: sends DONE(id, status code, reason).
        @param arrived: called for each delivery (it uses a credit).
        """
        self._recipient = recipient
        self._sequences = sequences
        self._send_done = send_done
        self._arrived = arrived
        self.auto_done = auto_done
        self.duplicates = 0
        self.gaps = 0
        # Streams the broker numbered again (a journal made afresh) as we resumed them.
        self.renumbered = 0
        self._ids = SeenIds(dedupe_window)
        # Unanswered tracked records by tracker, oldest first: confirm() answers them.
        self._tracked: dict[str, deque[int]] = {}
        self._tracker_of: dict[int, str] = {}

    # What arrives

    def stream_deliver(self, message: mlm.StreamDeliver) -> None:
        self._arrived()
        self._recipient.delivered(_stream_delivery(message))

    def letter(self, message: mlm.MailboxDeliver | mlm.ServiceDeliver) -> None:
        self._arrived()
        self._recipient.delivered(_letter_delivery(message))

    def stream_record(self, message: mlm.StreamRecord) -> None:
        self._arrived()
        if not self._sequences.add(message.address, message.sequence):
            self.duplicates += 1
            return
        self._recipient.delivered(
            _stream_delivery(message, message.sequence, message.timestamp / 1000)
        )

    def record(self, message: mlm.MailboxRecord | mlm.ServiceRecord) -> None:
        self._arrived()
        record_id = message.id
        if record_id in self._ids:
            self.duplicates += 1
            status = self._ids.answer(record_id)
            if status is not None:
                # Our DONE was lost (or the broker crashed before storing it): again.
                self._send_done(record_id, *status)
            # Otherwise the first copy's DONE is still to come from the application.
            return
        self._ids.add(record_id)
        if message.tracker:
            self._tracked.setdefault(message.tracker, deque()).append(record_id)
            self._tracker_of[record_id] = message.tracker
        self._recipient.delivered(_letter_delivery(message, record_id))

    def gap(self, message: mlm.StreamGap) -> None:
        if message.available < message.missed:
            # The broker numbers the stream again (its journal was made
            # afresh): the numbers handed over before name other records.
            self.renumbered += 1
            self._sequences.forget(message.address)
            _log.warn(
                "stream {stream}: the broker numbers it again from {first} (its journal was"
                " made afresh); we had read up to {last} of its earlier numbering",
                stream=message.address,
                first=message.available,
                last=message.missed - 1,
            )
            return
        self.gaps += 1
        _log.info(
            "stream {stream}: messages {missed} to {last} were removed before we read them",
            stream=message.address,
            missed=message.missed,
            last=message.available - 1,
        )
        self._recipient.gap(Gap(message.address, message.missed, message.available))

    def confirmation(self, message: mlm.Confirm) -> None:
        self._recipient.confirmed(
            Confirmation(message.tracker, message.status_code, message.status_reason)
        )

    # The answers

    def tracks(self, tracker: str) -> bool:
        """Whether a record received with C{tracker} is still unanswered."""
        return bool(self._tracked.get(tracker))

    def confirm(self, tracker: str, status_code: int, reason: str) -> None:
        """Answer the oldest unanswered record received with C{tracker}."""
        self.answer(self._tracked[tracker][0], status_code, reason)

    def check_done(self, delivery: Delivery, status_code: int, reason: str) -> int:
        """
        The id of C{delivery}, which the application means to answer.

        @raise ValueError: if it carries no id (a stream message, or any
            version 1 delivery).
        @raise mlm.MalformedMessage: for a status the wire cannot carry.
        """
        if delivery.id is None:
            raise ValueError("only mailbox and service records (version 2) are answered by DONE")
        mlm.encode_header(mlm.Done(delivery.id, status_code, reason))  # refuse bad values now
        return delivery.id

    def handed_over(self, delivery: Delivery, status_code: int, reason: str) -> None:
        """
        The application has C{delivery} (or its callback failed: then a
        failure status): with C{auto_done}, answer a record, unless it is
        tracked and the status is a success (that is the application's
        to give).
        """
        if delivery.id is None or not self.auto_done:
            return
        if delivery.tracker and status_code == mlm.SUCCESS:
            return
        self.answer(delivery.id, status_code, reason)

    def answer(self, record_id: int, status_code: int, reason: str) -> None:
        """Send DONE for a record, once."""
        if self._ids.answer(record_id) is not None:
            _log.debug("DONE for record {id} already sent", id=record_id)
            return
        self._ids.add(record_id, (status_code, reason))
        tracker = self._tracker_of.pop(record_id, None)
        if tracker is not None:
            ids = self._tracked[tracker]
            ids.remove(record_id)
            if not ids:
                del self._tracked[tracker]
        self._send_done(record_id, status_code, reason)


# Version 2 records arrive as the deliveries of version 1, with the extra fields set.
_LETTER_COMMANDS: Final[dict[type[mlm.Message], DeliveryCommand]] = {
    mlm.MailboxDeliver: "MAILBOX_DELIVER",
    mlm.MailboxRecord: "MAILBOX_DELIVER",
    mlm.ServiceDeliver: "SERVICE_DELIVER",
    mlm.ServiceRecord: "SERVICE_DELIVER",
}


def _stream_delivery(
    message: mlm.StreamDeliver | mlm.StreamRecord,
    sequence: int | None = None,
    timestamp: float | None = None,
) -> Delivery:
    return Delivery(
        "STREAM_DELIVER",
        message.sender,
        message.address,
        message.subject,
        "",
        tuple(message.content),
        sequence=sequence,
        timestamp=timestamp,
    )


def _letter_delivery(
    message: mlm.MailboxDeliver | mlm.ServiceDeliver | mlm.MailboxRecord | mlm.ServiceRecord,
    record_id: int | None = None,
) -> Delivery:
    return Delivery(
        _LETTER_COMMANDS[type(message)],
        message.sender,
        message.address,
        message.subject,
        message.tracker,
        tuple(message.content),
        id=record_id,
    )
