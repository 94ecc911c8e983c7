"""
The C{$broker} management service: a part of the broker (an internal
session of the model, like a multicast bridge's) that offers the service
L{SERVICE} for every subject and answers each request with the section of
the statistics its subject names, as a MAILBOX message to the requester:
subject = the request's subject, tracker = the request's tracker, one
frame of UTF-8 JSON. An unknown subject is answered with subject C{error}
and C{{"error": "..."}}; admin actions (C{admin/...}) are not offered over
MLM. The C{malamute} command line asks it; access control applies as for
any service (C{call $broker}).

A request from an anonymous client cannot be answered (it has no mailbox):
it is counted and logged.

Tests: ``tests/system/test_ops_management.py``.
"""

from __future__ import annotations

import json
from typing import Final

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.broker import Broker
from malamute_pack.broker.connection import Connection
from malamute_pack.broker.letters import Kind, Letter
from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.broker.post_office import Posted
from malamute_pack.broker.session import PartySession
from malamute_pack.ops.stats import SECTIONS, Statistics
from malamute_pack.protocol import mlm

_log = Logger()

# The service's name: what the command line sends its requests to.
SERVICE: Final = "$broker"
# The subject of the answer to a request that cannot be answered.
ERROR_SUBJECT: Final = "error"
# Every subject (a regular expression, as version 1 clients send).
_EVERY_SUBJECT: Final = ".*"


def answer(statistics: Statistics, subject: str) -> tuple[str, bytes]:
    """The subject and body that answer a request with C{subject}."""
    if subject == "admin" or subject.startswith("admin/"):
        return _error("admin actions are not offered over MLM: use the management API (--http)")
    if subject not in SECTIONS:
        return _error(f"unknown section {subject!r}; known: {', '.join(SECTIONS)}")
    try:
        body = json.dumps(statistics.section(subject), separators=(",", ":"))
    except Exception as e:  # a section must never take the service down
        _log.failure("$broker: section {section} failed", section=subject)
        return _error(f"section {subject!r} failed: {e}")
    return subject, body.encode("utf-8")


def _error(reason: str) -> tuple[str, bytes]:
    return ERROR_SUBJECT, json.dumps({"error": reason}).encode("utf-8")


class ManagementSession(PartySession):
    """
    The model's view of the C{$broker} service: a worker that takes every
    request at once and answers it in the next reactor turn.

    @ivar answered: requests answered (errors included).
    @ivar unanswerable: requests from anonymous clients (no mailbox to answer).
    @ivar refused: answers the requester's mailbox refused (full).
    """

    def __init__(self, clock: IReactorTime, broker: Broker, statistics: Statistics) -> None:
        self._clock = clock
        self._broker = broker
        self._statistics = statistics
        self._log_limit = LogLimit(clock, _log)
        self.connection: Connection | None = None
        self._pending: list[IDelayedCall] = []
        self.answered = 0
        self.unanswerable = 0
        self.refused = 0

    def __repr__(self) -> str:
        return f"<management service {SERVICE}>"

    def attach(self) -> None:
        """Offer the service (every subject)."""
        if self.connection is None:
            self.connection = self._broker.attach_internal(self)
            self._broker.post.offer(self.connection, SERVICE, _EVERY_SUBJECT)

    def detach(self) -> None:
        """Withdraw the service; requests queued and not answered are dropped."""
        for call in self._pending:
            if call.active():
                call.cancel()
        self._pending = []
        if self.connection is not None:
            self._broker.detach_remote(self)
            self.connection = None

    def error(self, code: int, reason: str) -> None:
        _log.warn("{service}: {code} {reason}", service=self, code=code, reason=reason)

    def deliver_letter(self, letter: Letter) -> bool:
        # Answered in the next turn: not inside the post office's dispatch.
        call = self._clock.callLater(0, self._answer, letter.sender, letter.subject, letter.tracker)
        self._pending = [c for c in self._pending if c.active()]
        self._pending.append(call)
        return True

    def _answer(self, requester: str, subject: str, tracker: str) -> None:
        connection = self.connection
        if connection is None:
            return
        if not requester:
            self.unanswerable += 1
            self._log_limit.info(
                "anonymous",
                "{service}: a request from an anonymous client cannot be answered"
                " (open with an address)",
                service=self,
            )
            return
        reply_subject, body = answer(self._statistics, subject)
        message = mlm.MailboxSend(
            address=requester, subject=reply_subject, tracker=tracker, content=[body]
        )
        try:
            outcome = self._broker.post.post(Kind.MAILBOX, connection, message)
        except Exception:  # the journal closed under it (a pair's takeover...)
            _log.failure(
                "{service}: the answer to {requester!r} failed", service=self, requester=requester
            )
            return
        if outcome.status is Posted.REFUSED:
            self.refused += 1
            self._log_limit.info(
                "refused",
                "{service}: the answer to {requester!r} was refused: {reason}",
                service=self,
                requester=requester,
                reason=outcome.refusal,
            )
            return
        self.answered += 1
