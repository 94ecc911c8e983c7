"""
MLM sessions: the parties on the other end of a ROUTER socket, one per
routing id, as the broker model's L{Session}s.

L{MlmSessions} is the socket-free half of the broker's ROUTER: it decodes
what a routing id sent, finds (or makes) that peer's L{MlmSession}, checks
the message at the door (well formed, its strings UTF-8, within the size
limits) and hands it to the L{Receiver} (the broker), or tells the broker
what was wrong with it. A session the broker has not registered a connection for is not
kept, so a peer that never opens costs nothing. An L{MlmSession} answers
and delivers through an output function (the socket's send, or a recorder
in tests), in the dialect its CONNECTION_OPEN asked for
(L{malamute_pack.transport.dialects}). On an authenticated socket each
session has the user of its connection; a message from a kept routing id
with another user is a new party (the old session's connection ends).

Tests: ``tests/unit/test_transport_sessions.py``, ``tests/unit/test_broker_access.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Final

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from malamute_pack.broker.letters import Letter
from malamute_pack.broker.limits import Limits
from malamute_pack.broker.receipts import Receipt
from malamute_pack.broker.session import Hold, Receiver
from malamute_pack.protocol import mlm
from malamute_pack.protocol.chunks import ChunkRow
from malamute_pack.protocol.records import StreamRecord
from malamute_pack.transport.dialects import MlmDialect, MlmVersion1, MlmVersion2

# Sends one message (its frames after the routing id) to a routing id;
# False if the peer's queue is full (or the peer is gone): not sent.
Output = Callable[[bytes, Sequence[bytes]], bool]
# As Output, but it may send later, in order with the rest of what is being
# handled (ZmqSocket.defer): then it says True now and calls the function
# given if the message could not go after all.
DeferredOutput = Callable[[bytes, Sequence[bytes], Callable[[], None]], bool]


def _send_now(output: Output) -> DeferredOutput:
    """A L{DeferredOutput} that sends at once through C{output}."""

    def send(route: bytes, frames: Sequence[bytes], undelivered: Callable[[], None]) -> bool:
        return output(route, frames)

    return send


decode_checked = mlm.decode_checked
_OK: Final = mlm.encode(mlm.Ok())
_PONG: Final = mlm.encode(mlm.ConnectionPong())


class MlmSession:
    """
    One MLM peer of a ROUTER socket.

    @ivar route: its routing id.
    @ivar dialect: the protocol version it opened with (version 1 until
        then: what a stranger is answered in does not depend on it).
    @ivar user: the user ZeroMQ's authentication (ZAP) gave its
        connection, or None on an endpoint without authentication.
    """

    __slots__ = (
        "_backlog",
        "_deferred",
        "_opening",
        "_output",
        "_table",
        "dialect",
        "route",
        "user",
    )

    def __init__(
        self,
        route: bytes,
        dialect: MlmDialect,
        output: Output,
        table: MlmSessions,
        user: str | None = None,
    ) -> None:
        self.route = route
        self.user = user
        self.dialect = dialect
        self._output = output
        self._deferred = table.deferred_output
        self._table = table
        self._opening: MlmDialect | None = None
        # Answers its queue had no room for, oldest first: sent before
        # anything else, never dropped (see MlmSessions.flush).
        self._backlog: deque[Sequence[bytes]] | None = None

    def __repr__(self) -> str:
        return f"<MLM session {self.route.hex()} {self.dialect!r}>"

    def _send(self, frames: Sequence[bytes] | None) -> None:
        if frames is not None:
            self._reply(frames)

    def _reply(self, frames: Sequence[bytes]) -> None:
        """
        Send an answer (OK, ERROR, STORED...), which must not be lost: if
        the peer's queue is full it waits in the backlog, in order.
        """
        if self._backlog is None:
            if self._output(self.route, frames):
                return
            self._backlog = deque()
            self._table.backlogged(self)
        self._backlog.append(frames)
        if len(self._backlog) > self._table.max_backlog:
            self._backlog = None
            self._table.give_up(self)

    def flush(self) -> bool:
        """Send what the backlog holds while the peer takes it; whether it is empty now."""
        backlog = self._backlog
        if backlog is None:
            return True
        output, route = self._output, self.route
        while backlog:
            if not output(route, backlog[0]):
                return False
            backlog.popleft()
        self._backlog = None
        return True

    # Policy

    def speaks(self, command: type[mlm.Message]) -> bool:
        return self.dialect.speaks(command)

    def hold(self, letter: Letter) -> Hold:
        return self.dialect.hold(letter)

    # Lifecycle

    def opening(self, dialect: MlmDialect) -> None:
        """It sent CONNECTION_OPEN for C{dialect}: spoken from when the broker accepts it."""
        self._opening = dialect

    def attached(self) -> None:
        if self._opening is not None:
            self.dialect, self._opening = self._opening, None
        self._table.keep(self)

    def detached(self) -> None:
        self._table.drop(self)

    # Answers and deliveries

    def ok(self) -> None:
        self._reply(_OK)

    def error(self, code: int, reason: str) -> None:
        self._reply(mlm.encode(mlm.Error(code, mlm.fit_string(reason))))

    def pong(self) -> None:
        self._reply(_PONG)

    # A delivery never overtakes an answer still in the backlog.

    def deliver_stream(self, record: StreamRecord) -> bool:
        # Sent with the rest of the batch being handled, if it is one: a
        # record that cannot go then is reported to the broker (undelivered).
        if self._backlog is not None and not self.flush():
            return False
        dialect = self.dialect
        if record is dialect.last_record:  # the rest of a fan-out: no call
            frames = dialect.last_frames
        else:
            frames = dialect.stream_frames(record)
        return self._deferred(self.route, frames, partial(self._table.undelivered, self, record))

    def deliver_letter(self, letter: Letter) -> bool:
        if self._backlog is not None and not self.flush():
            return False
        return self._output(self.route, self.dialect.letter_frames(letter))

    def gap(self, stream: str, missed: int, available: int) -> None:
        self._send(self.dialect.gap_frames(stream, missed, available))

    def stored(self, receipt: Receipt) -> None:
        self._send(self.dialect.stored_frames(receipt))

    def confirm(self, tracker: str, code: int, reason: str) -> None:
        self._reply(mlm.encode(mlm.Confirm(tracker, code, mlm.fit_string(reason))))

    # Bulk reads and appends (only version 2 sessions make them)

    def stream_status(self, stream: str, first: int, last: int, position: int) -> None:
        self._reply(mlm.encode(mlm.StreamStatus(stream, first, last, position)))

    def deliver_chunk(self, stream: str, rows: list[ChunkRow]) -> bool:
        if self._backlog is not None and not self.flush():
            return False
        return self._output(self.route, self.dialect.chunk_frames(stream, rows))

    def range_end(self, stream: str, last: int) -> None:
        self._reply(mlm.encode(mlm.StreamEnd(stream, last)))

    def appended(
        self, stream: str, key: str, first: int, last: int, code: int, reason: str
    ) -> None:
        answer = mlm.StreamAppended(stream, key, first, last, code, mlm.fit_string(reason))
        self._reply(mlm.encode(answer))

    def committed(self, stream: str, sequence: int, code: int, reason: str) -> None:
        self._reply(mlm.encode(mlm.StreamCommitted(stream, sequence, code, mlm.fit_string(reason))))


class MlmSessions:
    """
    The MLM peers of one ROUTER socket, by routing id: input decoded,
    checked against the size limits and handed to C{receiver}.

    @ivar received: messages received.
    @ivar malformed: messages that did not decode.
    @ivar invalid: messages with a string that is not valid UTF-8.
    @ivar reused: routing ids taken over by a connection of another user.
    @ivar max_backlog: answers a session may have waiting for room in its
        queue (besides the queue's own C{send_queue}) before it is given up:
        as many as the queue holds.
    @ivar given_up: sessions given up for not reading their answers.
    """

    def __init__(
        self,
        receiver: Receiver,
        output: Output,
        limits: Limits,
        clock: IReactorTime | None = None,
        retry: float = 0.05,
        deferred_output: DeferredOutput | None = None,
    ) -> None:
        """
        @param clock: retries sending the sessions' backlogs every C{retry}
            seconds while there are any (without it, only L{flush} does).
        @param deferred_output: what live stream records are sent with
            (default: C{output}, at once).
        """
        self._receiver = receiver
        self._output = output
        self.deferred_output = deferred_output or _send_now(output)
        self._clock = clock
        self._retry = retry
        self._retrying: IDelayedCall | None = None
        self._backlogged: set[MlmSession] = set()
        self.max_backlog = limits.send_queue
        self.given_up = 0
        self._max_frames = limits.max_frames
        self._max_bytes = limits.max_message_bytes
        self._sessions: dict[bytes, MlmSession] = {}
        # One of each dialect for all sessions: each keeps the last stream
        # record it encoded, so one fan-out encodes it once per dialect.
        self._version1 = MlmVersion1()
        self._version2 = MlmVersion2()
        self.received = 0
        self.malformed = 0
        self.invalid = 0
        self.reused = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def session(self, route: bytes, user: str | None = None) -> MlmSession:
        """
        The session of C{route}: the kept one, or a new one of C{user}
        (kept once the broker opens it).
        """
        session = self._sessions.get(route)
        if session is None:
            session = MlmSession(route, self._version1, self._output, self, user)
        return session

    def undelivered(self, session: MlmSession, record: StreamRecord) -> None:
        """A stream record C{session} was said to be sent could not go after all."""
        self._receiver.undelivered(session, record)

    def backlogged(self, session: MlmSession) -> None:
        """C{session}'s answers wait for room: retry them until they are sent."""
        self._backlogged.add(session)
        self._schedule_retry()

    def _schedule_retry(self) -> None:
        if self._clock is not None and self._retrying is None:
            self._retrying = self._clock.callLater(self._retry, self._retry_backlogs)

    def _retry_backlogs(self) -> None:
        self._retrying = None
        if not self.flush():
            self._schedule_retry()

    def flush(self) -> bool:
        """Send what the sessions' backlogs hold while there is room; whether all are empty."""
        for session in [s for s in self._backlogged if s.flush()]:
            self._backlogged.discard(session)
        return not self._backlogged

    def give_up(self, session: MlmSession) -> None:
        """
        C{session} does not read even the answers to its own commands: the
        broker ends its connection rather than hold more for it.
        """
        self._backlogged.discard(session)
        self.given_up += 1
        reason = f"it does not read its answers ({self.max_backlog} waiting)"
        if self._clock is None:
            self._receiver.unresponsive(session, reason)
        else:
            # Not in the middle of the broker's handling of an event.
            self._clock.callLater(0, self._receiver.unresponsive, session, reason)

    def stop(self) -> None:
        """Stop retrying (the socket is closing)."""
        if self._retrying is not None and self._retrying.active():
            self._retrying.cancel()
        self._retrying = None

    def keep(self, session: MlmSession) -> None:
        self._sessions[session.route] = session

    def drop(self, session: MlmSession) -> None:
        self._backlogged.discard(session)
        if self._sessions.get(session.route) is session:
            del self._sessions[session.route]

    def _reused(self, session: MlmSession, user: str | None) -> MlmSession:
        """
        A connection of another user sends from the routing id of C{session}
        (a peer may choose its routing id, and take one a closed connection
        left): that is a new party. The old one is gone; its connection
        ends, so nothing of its user's reaches the new one.
        """
        self.reused += 1
        self._receiver.unresponsive(
            session, f"its routing id was taken by a connection of another user ({user!r})"
        )
        self.drop(session)
        return MlmSession(session.route, self._version1, self._output, self, user)

    def receive(self, route: bytes, frames: Sequence[bytes], user: str | None = None) -> None:
        """
        Handle one message (its frames after the routing id) from C{route},
        whose connection authenticated as C{user} (None: no authentication).
        """
        self.received += 1
        session = self._sessions.get(route)
        if session is None:
            session = self.session(route, user)
        elif session.user != user:
            session = self._reused(session, user)
        try:
            message = decode_checked(frames)
        except mlm.InvalidText as e:
            # Well formed, but a name the broker must not take: refused as the
            # protocol answers that message, the session stays open.
            self.invalid += 1
            self._receiver.rejected(session, e.message, str(e))
            return
        except mlm.MalformedMessage as e:
            self.malformed += 1
            self._receiver.malformed(session, str(e))
            return
        if type(message) is mlm.ConnectionOpen:
            session.opening(self._version2 if message.version >= 2 else self._version1)
        if len(frames) > self._max_frames or sum(map(len, frames)) > self._max_bytes:
            reason = (
                f"message too large: the limits are {self._max_frames} frames"
                f" and {self._max_bytes} bytes"
            )
            self._receiver.rejected(session, message, reason)
            return
        self._receiver.receive(session, message)
