"""
MLM sessions: the parties on the other end of a ROUTER socket, one per
routing id, as the broker model's L{Session}s.

L{MlmSessions} is the socket-free half of the broker's ROUTER: it decodes
what a routing id sent, finds (or makes) that peer's L{MlmSession}, checks
the size limits and hands the decoded message to the L{Receiver} (the
broker). A session the broker has not registered a connection for is not
kept, so a peer that never opens costs nothing. An L{MlmSession} answers
and delivers through an output function (the socket's send, or a recorder
in tests), in the dialect its CONNECTION_OPEN asked for
(L{malamute_pack.transport.dialects}).

Tests: ``tests/test_transport_sessions.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from malamute_pack.broker.letters import Letter
from malamute_pack.broker.limits import Limits
from malamute_pack.broker.receipts import Receipt
from malamute_pack.broker.session import Hold, Receiver
from malamute_pack.broker.store import StreamRecord
from malamute_pack.protocol import mlm
from malamute_pack.transport.dialects import MlmDialect, MlmVersion1, MlmVersion2

# Sends one message (its frames after the routing id) to a routing id.
Output = Callable[[bytes, Sequence[bytes]], object]

_OK: Final = mlm.encode(mlm.Ok())
_PONG: Final = mlm.encode(mlm.ConnectionPong())


class MlmSession:
    """
    One MLM peer of a ROUTER socket.

    @ivar route: its routing id.
    @ivar dialect: the protocol version it opened with (version 1 until
        then: what a stranger is answered in does not depend on it).
    """

    __slots__ = ("_opening", "_output", "_table", "dialect", "route")

    def __init__(
        self, route: bytes, dialect: MlmDialect, output: Output, table: MlmSessions
    ) -> None:
        self.route = route
        self.dialect = dialect
        self._output = output
        self._table = table
        self._opening: MlmDialect | None = None

    def __repr__(self) -> str:
        return f"<MLM session {self.route.hex()} {self.dialect!r}>"

    def _send(self, frames: Sequence[bytes] | None) -> None:
        if frames is not None:
            self._output(self.route, frames)

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
        self._output(self.route, _OK)

    def error(self, code: int, reason: str) -> None:
        self._output(self.route, mlm.encode(mlm.Error(code, mlm.fit_string(reason))))

    def pong(self) -> None:
        self._output(self.route, _PONG)

    def deliver_stream(self, record: StreamRecord) -> None:
        dialect = self.dialect
        if record is dialect.last_record:  # the rest of a fan-out: no call
            self._output(self.route, dialect.last_frames)
        else:
            self._output(self.route, dialect.stream_frames(record))

    def deliver_letter(self, letter: Letter) -> None:
        self._output(self.route, self.dialect.letter_frames(letter))

    def gap(self, stream: str, missed: int, available: int) -> None:
        self._send(self.dialect.gap_frames(stream, missed, available))

    def stored(self, receipt: Receipt) -> None:
        self._send(self.dialect.stored_frames(receipt))

    def confirm(self, tracker: str, code: int, reason: str) -> None:
        self._output(self.route, mlm.encode(mlm.Confirm(tracker, code, mlm.fit_string(reason))))


class MlmSessions:
    """
    The MLM peers of one ROUTER socket, by routing id: input decoded,
    checked against the size limits and handed to C{receiver}.

    @ivar received: messages received.
    @ivar malformed: messages that did not decode.
    """

    def __init__(self, receiver: Receiver, output: Output, limits: Limits) -> None:
        self._receiver = receiver
        self._output = output
        self._max_frames = limits.max_frames
        self._max_bytes = limits.max_message_bytes
        self._sessions: dict[bytes, MlmSession] = {}
        # One of each dialect for all sessions: each keeps the last stream
        # record it encoded, so one fan-out encodes it once per dialect.
        self._version1 = MlmVersion1()
        self._version2 = MlmVersion2()
        self.received = 0
        self.malformed = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def session(self, route: bytes) -> MlmSession:
        """The session of C{route}: the kept one, or a new one (kept once the broker opens it)."""
        session = self._sessions.get(route)
        if session is None:
            session = MlmSession(route, self._version1, self._output, self)
        return session

    def keep(self, session: MlmSession) -> None:
        self._sessions[session.route] = session

    def drop(self, session: MlmSession) -> None:
        if self._sessions.get(session.route) is session:
            del self._sessions[session.route]

    def receive(self, route: bytes, frames: Sequence[bytes]) -> None:
        """Handle one message (its frames after the routing id) from C{route}."""
        self.received += 1
        session = self._sessions.get(route) or self.session(route)
        try:
            message = mlm.decode(frames)
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
            self._receiver.oversized(session, message, reason)
            return
        self._receiver.receive(session, message)
