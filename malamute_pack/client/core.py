"""
The Malamute client's per-connection state machine, with no I/O: API calls
become frames to send, frames received become command results, deliveries
and confirmations. The Twisted client and the blocking client both drive it.

The states follow libmlm's client (``mlm_client.xml``)::

    START --connect--> CONNECTING --OK--> CONNECTED <--OK-- CONFIRMING
                                          |  --command-->  |
                       (ERROR 500 in any open state)
                  RECONNECTING: OPEN again, then replay every setting
                       (nothing heard for `timeout`)
                  DISCONNECTED: keep pinging until the broker answers
                  CLOSING --OK/ERROR/close timeout--> CLOSED

One command that expects OK/ERROR is outstanding at a time; later ones wait
in a queue. Settings the broker accepted (producer stream, consumer
patterns, consumer removals, worker offers) are recorded; when the broker
answers ERROR 500 (it does not know us: it restarted, or it expired us) the
core sends CONNECTION_OPEN again and replays the recordings in order before
the queued commands go on. A command cut short by that ERROR is sent again
once after the replay.

Protocol version 2 (``docs/protocol.md``, the default; version 1 is the
libmlm vocabulary, for the C broker):

- Stream messages arrive as STREAM_RECORD, with a sequence number. The core
  remembers which sequence numbers of each stream it handed over
  (L{SeenSequences}) and drops a record it already handed over (a
  duplicate). When a reconnection replays the consumer settings, a stream
  on which a record was seen is read again with STREAM_READ_FROM(SEQUENCE,
  highest seen + 1), every pattern from the same position, so nothing
  written while we were away is missed and nothing is delivered twice; a
  stream with no record seen yet replays its original command. The same
  memory makes several patterns read from EARLIEST on one stream (each
  moves the stream's one position back) deliver each record once. After
  remove_consumer the stream starts afresh. STREAM_GAP (retention removed
  messages we had not read) is passed on as a L{Gap}.
- Mailbox and service messages arrive as MAILBOX_RECORD / SERVICE_RECORD
  with an id, and the broker keeps each until it is answered with DONE:
  automatically when the driver hands it to the application (C{auto_done}),
  or when the application calls L{ClientCore.done}. A tracked record (one
  with a tracker) is the exception: its status belongs to the application,
  which gives it with C{confirm(tracker, ...)} as in version 1; the core
  sends that as DONE(id, status) for the oldest unanswered record with that
  tracker (the broker forwards it to the sender as a CONFIRM). Answering a
  tracked record with DONE 200 at hand-over would tell its sender "done"
  before the work is done, and the broker would then refuse the real
  CONFIRM. The broker delivers at least once (again after a reconnection or
  a broker crash); the ids of the last C{dedupe_window} records are
  remembered, and a redelivery of one is dropped and answered with the same
  DONE again (counted in C{duplicates}).
- MAILBOX_SEND and SERVICE_SEND are each answered with STORED, in the order
  they were sent; the core matches them to a FIFO of sends waiting for it
  (not to the OK/ERROR command queue). Sends made while the connection is
  not usable are held and get their STORED once sent. **At-least-once
  sends**: when the broker forgets us (ERROR 500: a restart or an expiry,
  also after a timeout) with sends not yet acknowledged, those sends are
  sent again after the replay, before the held ones. The broker did not
  acknowledge them, so they may or may not have been stored: the recipient
  may get such a message twice (a mailbox or service recipient can
  recognise it only by its content, as it gets a new id). close() waits up
  to C{close_timeout} for the STORED of the sends made before it.

Heartbeat: CONNECTION_PING every ``heartbeat`` seconds; if nothing at all
arrives for ``timeout`` seconds the connection counts as lost (the pending
command fails) and the pings go on, so the broker's ERROR 500 starts the
reconnection when it comes back.

Time comes from a clock (C{seconds()}); the driver asks L{ClientCore.wakeup_at}
when to call L{ClientCore.on_time} next.

Tests: ``tests/test_client_core.py``.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from twisted.logger import Logger

from malamute_pack.client.dedupe import ID_WINDOW, SeenIds, SeenSequences
from malamute_pack.client.errors import (
    BrokerUnreachableError,
    ClientClosedError,
    ClientError,
    MalamuteError,
    MessageDroppedError,
)
from malamute_pack.client.events import Confirmation, Delivery, DeliveryCommand, Gap
from malamute_pack.protocol import mlm

_log = Logger()

_PING: Final = mlm.encode(mlm.ConnectionPing())
_STREAM_SEND: Final = mlm.SIGNATURE + bytes((mlm.StreamSend.ID,))
MAX_CREDIT: Final = 0xFFFF  # CREDIT carries a number2
VERSIONS: Final = (1, 2)


class ClientState(enum.Enum):
    START = "start"  # not connected yet
    CONNECTING = "connecting"  # CONNECTION_OPEN sent, waiting for OK
    CONNECTED = "connected"  # open, no command outstanding
    CONFIRMING = "confirming"  # open, one command waiting for OK or ERROR
    RECONNECTING = "reconnecting"  # the broker forgot us: opening again and replaying
    DISCONNECTED = "disconnected"  # nothing heard for the timeout: waiting for the broker
    CLOSING = "closing"  # waiting for the last STOREDs, then CONNECTION_CLOSE sent
    CLOSED = "closed"


# States in which silence for the timeout means the connection is lost.
_WATCHED: Final = frozenset(
    {ClientState.CONNECTED, ClientState.CONFIRMING, ClientState.RECONNECTING}
)
# States in which messages go to the broker at once rather than being held.
_SENDING: Final = frozenset({ClientState.CONNECTED, ClientState.CONFIRMING})
# States in which messages are held until the connection is usable again.
_HOLDING: Final = frozenset(
    {ClientState.CONNECTING, ClientState.RECONNECTING, ClientState.DISCONNECTED}
)


class Clock(Protocol):
    """The part of C{IReactorTime} the core needs."""

    def seconds(self) -> float: ...


class CoreOwner(Protocol):
    """The driver: it moves frames and hands results to the application."""

    def send_frames(self, frames: list[bytes]) -> None:
        """Send one message to the broker."""

    def delivered(self, delivery: Delivery) -> None:
        """
        A stream, mailbox or service message arrived. The driver calls
        L{ClientCore.handed_over} when the application has it.
        """

    def confirmed(self, confirmation: Confirmation) -> None:
        """The broker forwarded a CONFIRM for a tracked message we sent."""

    def gap(self, gap: Gap) -> None:
        """The broker skipped stream messages retention removed (STREAM_GAP)."""


# Called once with None (success) or the error that ended a command.
Done = Callable[[ClientError | None], None]
# Called once with the id of a stored message, or the error that refused or lost it.
StoredCallback = Callable[[int | ClientError], None]

# Commands whose acceptance is recorded for replay.
Setting = (
    mlm.StreamWrite | mlm.StreamRead | mlm.StreamReadFrom | mlm.StreamCancel | mlm.ServiceOffer
)
_Reader = mlm.StreamRead | mlm.StreamReadFrom


@dataclass(eq=False, slots=True)
class _Command:
    """
    A message that expects OK or ERROR; C{done} is None for internal ones.
    C{fallback} is what a replay sends instead if the broker refuses it.
    """

    message: mlm.Message
    done: Done | None
    retried: bool = False
    fallback: Setting | None = None


@dataclass(eq=False, slots=True)
class _StoredSend:
    """A MAILBOX_SEND or SERVICE_SEND (version 2) that waits for its STORED."""

    frames: list[bytes]
    stored: StoredCallback


def _ignore_stored(result: int | ClientError) -> None:
    pass


class ClientCore:
    """
    One client connection's state, without sockets.

    @ivar state: the current L{ClientState}.
    @ivar version: the protocol version the client speaks (1 or 2).
    @ivar auto_done: (version 2) answer each untracked mailbox and service
        record with DONE 200 when the driver hands it over.
    @ivar reconnects: how many times the broker forgot us and we opened again.
    @ivar held_dropped: messages dropped because too many were held while
        the connection was not usable.
    @ivar duplicates: (version 2) redelivered records dropped: a mailbox or
        service record with an id already handed over, a stream record whose
        sequence number on its stream was already handed over.
    @ivar gaps: (version 2) STREAM_GAPs received.
    """

    def __init__(
        self,
        clock: Clock,
        owner: CoreOwner,
        address: str = "",
        timeout: float = 5.0,
        heartbeat: float = 1.0,
        close_timeout: float = 1.0,
        max_held: int = 10_000,
        version: int = 2,
        auto_done: bool = True,
        dedupe_window: int = ID_WINDOW,
    ) -> None:
        if not 0 < heartbeat < timeout:
            raise ValueError(f"need 0 < heartbeat ({heartbeat}) < timeout ({timeout})")
        if version not in VERSIONS:
            raise ValueError(f"protocol version must be 1 or 2, not {version!r}")
        mlm.encode_string(address)  # refuse an address the wire cannot carry, now
        self._clock = clock
        self._owner = owner
        self.address = address
        self.timeout = timeout
        self.heartbeat = heartbeat
        self.close_timeout = close_timeout
        self.max_held = max_held
        self.version = version
        self.auto_done = auto_done
        self.state = ClientState.START
        self.reconnects = 0
        self.held_dropped = 0
        self.duplicates = 0
        self.gaps = 0
        self._settings: list[Setting] = []
        self._queue: deque[_Command] = deque()
        self._outstanding: _Command | None = None
        self._replaying: deque[_Command] = deque()
        self._held: deque[list[bytes] | _StoredSend] = deque()
        # Sends on the wire waiting for their STORED, in the order sent.
        self._unstored: deque[_StoredSend] = deque()
        self._sequences = SeenSequences()
        self._ids = SeenIds(dedupe_window)
        # Unanswered tracked records by tracker, oldest first: confirm() answers them.
        self._tracked: dict[str, deque[int]] = {}
        self._tracker_of: dict[int, str] = {}
        # Credit granted and not yet used up, once the application uses credit.
        self._credit: int | None = None
        self._credit_unsent = 0
        self._closing = False
        self._close_command: _Command | None = None  # until the last STORED came
        self._close_waiters: list[Done] = []
        self._last_heard = 0.0
        self._next_ping: float | None = None
        self._deadline: float | None = None  # of CONNECTING or CLOSING
        self._handlers: dict[type[mlm.Message], Callable[[mlm.Message], None]] = {
            mlm.StreamDeliver: self._on_stream_deliver,  # type: ignore[dict-item]
            mlm.MailboxDeliver: self._on_letter,  # type: ignore[dict-item]
            mlm.ServiceDeliver: self._on_letter,  # type: ignore[dict-item]
            mlm.Ok: self._on_ok,
            mlm.Error: self._on_error,  # type: ignore[dict-item]
            mlm.ConnectionPong: self._on_pong,
            mlm.Confirm: self._on_confirm,  # type: ignore[dict-item]
        }
        if version == 2:
            self._handlers.update({
                mlm.StreamRecord: self._on_stream_record,  # type: ignore[dict-item]
                mlm.MailboxRecord: self._on_record,  # type: ignore[dict-item]
                mlm.ServiceRecord: self._on_record,  # type: ignore[dict-item]
                mlm.StreamGap: self._on_gap,  # type: ignore[dict-item]
                mlm.Stored: self._on_stored,  # type: ignore[dict-item]
            })

    @property
    def settings(self) -> tuple[Setting, ...]:
        """The recorded settings, in the order a reconnection replays them."""
        return tuple(self._settings)

    @property
    def unstored(self) -> int:
        """Sends (version 2) waiting for their STORED, held ones included."""
        return len(self._unstored) + sum(isinstance(m, _StoredSend) for m in self._held)

    # Commands (each answered by OK or ERROR)

    def connect(self, done: Done) -> None:
        """Send CONNECTION_OPEN; C{done} runs when OK, ERROR or the timeout comes."""
        if self.state is not ClientState.START:
            done(ClientClosedError(f"connect() in state {self.state.value}"))
            return
        now = self._clock.seconds()
        self.state = ClientState.CONNECTING
        self._last_heard = now
        self._deadline = now + self.timeout
        self._outstanding = _Command(self._open_message(), done)
        self._owner.send_frames(mlm.encode(self._outstanding.message))

    def set_producer(self, stream: str, done: Done) -> None:
        """Publish to C{stream} from now on (one stream at a time)."""
        self._command(mlm.StreamWrite(stream), done)

    def set_consumer(
        self, stream: str, pattern: str, done: Done, whence: int = mlm.LATEST, position: int = 0
    ) -> None:
        """
        Read C{stream} for subjects that C{pattern} matches, from C{whence}:
        LATEST (messages written from now on: STREAM_READ), or, with
        version 2 only, EARLIEST, SEQUENCE (from message number C{position})
        or TIME (from C{position}, milliseconds since the epoch), sent as
        STREAM_READ_FROM.

        @raise ValueError: for a whence other than LATEST with version 1,
            or an unknown whence.
        """
        if whence == mlm.LATEST:
            self._command(mlm.StreamRead(stream, pattern), done)
            return
        if whence not in (mlm.EARLIEST, mlm.SEQUENCE, mlm.TIME):
            raise ValueError(f"unknown whence {whence!r}")
        if self.version < 2:
            raise ValueError("reading from a position needs protocol version 2")
        self._command(mlm.StreamReadFrom(stream, pattern, whence, position), done)

    def remove_consumer(self, stream: str, done: Done) -> None:
        """Stop reading C{stream} (every pattern)."""
        self._command(mlm.StreamCancel(stream), done)

    def set_worker(self, service: str, pattern: str, done: Done) -> None:
        """Serve requests to C{service} whose subject C{pattern} matches."""
        self._command(mlm.ServiceOffer(service, pattern), done)

    def close(self, done: Done) -> None:
        """
        Send CONNECTION_CLOSE after the queued commands and the STOREDs of
        the sends made before (waiting at most C{close_timeout} for those)
        and wait briefly for OK; C{done} runs with None once the client is
        closed, whatever the broker said.
        """
        if self.state is ClientState.CLOSED:
            done(None)
            return
        self._close_waiters.append(done)
        if self._closing:
            return
        self._closing = True
        if self.state in (ClientState.CONNECTED, ClientState.CONFIRMING):
            self._queue.append(_Command(mlm.ConnectionClose(), None))
            self._pump()
            return
        if self.state is ClientState.RECONNECTING:
            # The broker may know us by now; tell it, without waiting.
            self._owner.send_frames(mlm.encode(mlm.ConnectionClose()))
        self._finish_close()

    def _command(self, message: mlm.Message, done: Done) -> None:
        mlm.encode_header(message)  # a name too long for the wire raises here, now
        if self._closing or self.state in (ClientState.START, ClientState.CLOSED):
            done(ClientClosedError("the client is not open"))
            return
        if self.state is ClientState.DISCONNECTED:
            done(self._unreachable())
            return
        self._queue.append(_Command(message, done))
        self._pump()

    def _open_message(self) -> mlm.ConnectionOpen:
        return mlm.ConnectionOpen(version=self.version, address=self.address)

    # Messages without a reply (with version 2, sendto and sendfor get STORED)

    def send(self, subject: str, content: Sequence[bytes]) -> None:
        """Publish to the producer stream."""
        self._post([_STREAM_SEND + mlm.encode_string(subject), *_frames(content)])

    def sendto(
        self, address: str, subject: str, content: Sequence[bytes], tracker: str = "",
        timeout_ms: int = 0, stored: StoredCallback | None = None,
    ) -> None:
        """
        Send a letter to the mailbox C{address}. With version 2, C{stored}
        runs with the message's id once the broker stored it, or with
        L{MalamuteError} if it refused it.
        """
        message = mlm.MailboxSend(address, subject, tracker, timeout_ms, _frames(content))
        self._post_stored(mlm.encode(message), stored)

    def sendfor(
        self, service: str, subject: str, content: Sequence[bytes], tracker: str = "",
        timeout_ms: int = 0, stored: StoredCallback | None = None,
    ) -> None:
        """Send a request to C{service}; C{stored} as for L{sendto}."""
        message = mlm.ServiceSend(service, subject, tracker, timeout_ms, _frames(content))
        self._post_stored(mlm.encode(message), stored)

    def confirm(self, tracker: str, status_code: int = mlm.SUCCESS, reason: str = "") -> None:
        """
        Confirm a tracked letter; the broker forwards it to the letter's
        sender. With version 2, for a record received with C{tracker} and not
        answered yet, this is DONE(id, status) of the oldest such record.
        """
        ids = self._tracked.get(tracker)
        if ids:
            if self.state in (ClientState.START, ClientState.CLOSED):
                raise ClientClosedError("the client is not open")
            self._answer(ids[0], status_code, reason)
            return
        self._post(mlm.encode(mlm.Confirm(tracker, status_code, reason)))

    def done(self, delivery: Delivery, status_code: int = mlm.SUCCESS, reason: str = "") -> None:
        """
        Answer a mailbox or service record (version 2) with DONE: the broker
        removes the message and passes the status on to a tracked message's
        sender. A record already answered is not answered again.

        @raise ValueError: if C{delivery} carries no id (a stream message,
            or any version 1 delivery).
        """
        if delivery.id is None:
            raise ValueError("only mailbox and service records (version 2) are answered by DONE")
        mlm.encode_header(mlm.Done(delivery.id, status_code, reason))  # refuse bad values now
        if self.state in (ClientState.START, ClientState.CLOSED):
            raise ClientClosedError("the client is not open")
        self._answer(delivery.id, status_code, reason)

    def handed_over(
        self, delivery: Delivery, status_code: int = mlm.SUCCESS, reason: str = ""
    ) -> None:
        """
        The driver gave C{delivery} to the application (or the application's
        callback returned, or raised: then a failure status): with
        C{auto_done}, answer a record with DONE. A tracked record is left to
        the application's confirm() unless the status is a failure. Harmless
        for other deliveries and once the client is closed.
        """
        if delivery.id is None or not self.auto_done:
            return
        if delivery.tracker and status_code == mlm.SUCCESS:
            return
        if self.state in (ClientState.START, ClientState.CLOSED):
            return  # the broker delivers it again to whoever comes next
        self._answer(delivery.id, status_code, reason)

    def _answer(self, record_id: int, status_code: int, reason: str) -> None:
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
        self._post_done(record_id, status_code, reason)

    def credit(self, amount: int) -> None:
        """
        Let the broker deliver at most C{amount} more messages. From the
        first call on, the broker throttles; the credit left is granted again
        after a reconnection.
        """
        if not 0 < amount <= MAX_CREDIT:
            raise ValueError(f"credit must be between 1 and {MAX_CREDIT}, not {amount}")
        self._check_open()
        self._credit = (self._credit or 0) + amount
        if self.state in _SENDING:
            self._owner.send_frames(mlm.encode(mlm.Credit(amount)))
        else:
            self._credit_unsent += amount

    def _check_open(self) -> None:
        if self._closing or self.state in (ClientState.START, ClientState.CLOSED):
            raise ClientClosedError("the client is not open")

    def _post(self, frames: list[bytes] | _StoredSend) -> None:
        self._check_open()
        self._send_or_hold(frames)

    def _post_stored(self, frames: list[bytes], stored: StoredCallback | None) -> None:
        if self.version < 2:
            if stored is not None:
                raise ValueError("STORED needs protocol version 2")
            self._post(frames)
            return
        self._post(_StoredSend(frames, stored or _ignore_stored))

    def _post_done(self, record_id: int, status_code: int, reason: str) -> None:
        frames = mlm.encode(mlm.Done(record_id, status_code, reason))
        if self.state is ClientState.CLOSING:
            # Still useful ahead of CONNECTION_CLOSE; after it, the broker
            # delivers the record again to whoever comes next.
            if self._close_command is not None:
                self._owner.send_frames(frames)
        elif self.state is not ClientState.CLOSED:
            self._send_or_hold(frames)

    def _send_or_hold(self, message: list[bytes] | _StoredSend) -> None:
        if self.state in _SENDING:
            self._transmit(message)
        elif len(self._held) < self.max_held:
            self._held.append(message)
        else:
            self.held_dropped += 1
            if isinstance(message, _StoredSend):
                message.stored(MessageDroppedError(
                    f"more than {self.max_held} messages held while {self.state.value}"
                ))
            if self.held_dropped == 1 or self.held_dropped % 1000 == 0:
                _log.warn(
                    "{count} messages dropped: more than {limit} held while {state}",
                    count=self.held_dropped, limit=self.max_held, state=self.state.value,
                )

    def _transmit(self, message: list[bytes] | _StoredSend) -> None:
        if isinstance(message, _StoredSend):
            self._unstored.append(message)
            self._owner.send_frames(message.frames)
        else:
            self._owner.send_frames(message)

    # Input

    def receive(self, frames: Sequence[bytes]) -> None:
        """Handle one message from the broker."""
        if self.state in (ClientState.START, ClientState.CLOSED):
            return
        try:
            message = mlm.decode(frames)
        except mlm.MalformedMessage as e:
            _log.warn("malformed message from the broker dropped: {reason}", reason=e)
            return
        self._last_heard = self._clock.seconds()
        if self.state is ClientState.DISCONNECTED and not (
            type(message) is mlm.Error and message.status_code == mlm.COMMAND_INVALID
        ):
            self._resume()  # it answers and still knows us
        handler = self._handlers.get(type(message))
        if handler is None:
            _log.warn("unexpected {name} from the broker dropped",
                      name=mlm.MESSAGE_NAMES[message.ID])
            return
        handler(message)

    def _on_stream_deliver(self, message: mlm.StreamDeliver) -> None:
        self._heard_delivery()
        self._owner.delivered(
            Delivery("STREAM_DELIVER", message.sender, message.address, message.subject, "",
                     tuple(message.content))
        )

    def _on_letter(self, message: mlm.MailboxDeliver | mlm.ServiceDeliver) -> None:
        self._heard_delivery()
        command: DeliveryCommand = (
            "MAILBOX_DELIVER" if type(message) is mlm.MailboxDeliver else "SERVICE_DELIVER"
        )
        self._owner.delivered(
            Delivery(command, message.sender, message.address, message.subject, message.tracker,
                     tuple(message.content))
        )

    def _on_stream_record(self, message: mlm.StreamRecord) -> None:
        self._heard_delivery()
        stream = message.address
        if not self._sequences.add(stream, message.sequence):
            self.duplicates += 1
            return
        self._owner.delivered(
            Delivery("STREAM_DELIVER", message.sender, stream, message.subject, "",
                     tuple(message.content), sequence=message.sequence,
                     timestamp=message.timestamp / 1000)
        )

    def _on_record(self, message: mlm.MailboxRecord | mlm.ServiceRecord) -> None:
        self._heard_delivery()
        record_id = message.id
        if record_id in self._ids:
            self.duplicates += 1
            status = self._ids.answer(record_id)
            if status is not None:
                # Our DONE was lost (or the broker crashed before storing it): again.
                self._post_done(record_id, *status)
            # Otherwise the first copy's DONE is still to come from the application.
            return
        self._ids.add(record_id)
        if message.tracker:
            self._tracked.setdefault(message.tracker, deque()).append(record_id)
            self._tracker_of[record_id] = message.tracker
        command: DeliveryCommand = (
            "MAILBOX_DELIVER" if type(message) is mlm.MailboxRecord else "SERVICE_DELIVER"
        )
        self._owner.delivered(
            Delivery(command, message.sender, message.address, message.subject, message.tracker,
                     tuple(message.content), id=record_id)
        )

    def _heard_delivery(self) -> None:
        if self._credit is not None and self._credit > 0:
            self._credit -= 1

    def _on_gap(self, message: mlm.StreamGap) -> None:
        self.gaps += 1
        _log.info("stream {stream}: messages {missed} to {last} were removed before we read "
                  "them", stream=message.address, missed=message.missed,
                  last=message.available - 1)
        self._owner.gap(Gap(message.address, message.missed, message.available))

    def _on_stored(self, message: mlm.Stored) -> None:
        if not self._unstored:
            # A late answer to a send made before the broker forgot us: it is
            # being sent again, and that send will get its own STORED.
            _log.info("STORED with no send waiting for it ignored (id {id})", id=message.id)
            return
        send = self._unstored.popleft()
        if message.status_code == mlm.SUCCESS:
            send.stored(message.id)
        else:
            send.stored(MalamuteError(message.status_code, message.status_reason))
        if self._close_command is not None and not self._unstored:
            command, self._close_command = self._close_command, None
            self._send_command(command)

    def _on_confirm(self, message: mlm.Confirm) -> None:
        self._owner.confirmed(
            Confirmation(message.tracker, message.status_code, message.status_reason)
        )

    def _on_pong(self, message: mlm.Message) -> None:
        pass  # hearing it is all that counts

    def _on_ok(self, message: mlm.Message) -> None:
        command = self._outstanding
        state = self.state
        if command is None:
            _log.info("OK with no command outstanding ignored (state {state})", state=state.value)
            return
        self._outstanding = None
        if state is ClientState.CONNECTING:
            self._deadline = None
            self.state = ClientState.CONNECTED
            self._start_heartbeat()
            self._become_usable()
            assert command.done is not None
            command.done(None)
        elif state is ClientState.RECONNECTING:
            if isinstance(command.message, mlm.ConnectionOpen):
                self.reconnects += 1
                _log.info("the broker accepted us again; replaying {n} settings",
                          n=len(self._settings))
                if self._credit is not None:
                    self._credit_unsent = 0
                    self._owner.send_frames(
                        mlm.encode(mlm.Credit(min(self._credit, MAX_CREDIT)))
                    )
                self._replaying = deque(self._replay_plan())
            self._pump()
        elif state is ClientState.CONFIRMING:
            assert isinstance(command.message, Setting) and command.done is not None
            self._record(command.message)
            self.state = ClientState.CONNECTED
            self._pump()
            command.done(None)
        elif state is ClientState.CLOSING:
            self._finish_close()

    def _on_error(self, message: mlm.Error) -> None:
        code, reason = message.status_code, message.status_reason
        command = self._outstanding
        state = self.state
        if state is ClientState.CONNECTING:
            assert command is not None and command.done is not None
            self._outstanding = None
            self._finish_close()
            command.done(MalamuteError(code, reason))
        elif state is ClientState.RECONNECTING:
            assert command is not None
            if isinstance(command.message, mlm.ConnectionOpen):
                if code != mlm.COMMAND_INVALID:
                    # Refused for real (e.g. the client limit): wait and try again.
                    _log.warn("the broker refused our new CONNECTION_OPEN: {code} {reason}",
                              code=code, reason=reason)
                    self._lose()
                # 500s here answer what we sent before the new OPEN: stale.
            elif code == mlm.COMMAND_INVALID:
                self._reopen()
            else:
                _log.warn("the broker refused the replayed {name}: {code} {reason}",
                          name=mlm.MESSAGE_NAMES[command.message.ID], code=code, reason=reason)
                self._outstanding = None
                if command.fallback is not None:
                    # Resuming from a position was refused (e.g. no journal): subscribe
                    # as the application first did.
                    self._send_command(_Command(command.fallback, None))
                    return
                self._pump()
        elif state is ClientState.CONFIRMING:
            assert command is not None and command.done is not None
            self._outstanding = None
            if code == mlm.COMMAND_INVALID and not command.retried:
                command.retried = True
                self._queue.appendleft(command)
                self._reopen()
                return
            self.state = ClientState.CONNECTED
            self._pump()
            command.done(MalamuteError(code, reason))
        elif state is ClientState.CLOSING:
            self._outstanding = None
            self._finish_close()
        elif code == mlm.COMMAND_INVALID:
            self._reopen()
        else:
            _log.warn("ERROR with no command outstanding ignored: {code} {reason}",
                      code=code, reason=reason)

    # Transitions

    def _pump(self) -> None:
        """Send the next command if none is outstanding."""
        if self._outstanding is not None:
            return
        if self.state is ClientState.RECONNECTING:
            if self._replaying:
                self._send_command(self._replaying.popleft())
                return
            self.state = ClientState.CONNECTED
            _log.info("reconnected and replayed; {n} commands waiting", n=len(self._queue))
            self._become_usable()
            return
        if self.state is ClientState.CONNECTED and self._queue:
            command = self._queue.popleft()
            if isinstance(command.message, mlm.ConnectionClose):
                self.state = ClientState.CLOSING
                self._next_ping = None
                self._deadline = self._clock.seconds() + self.close_timeout
                if self._unstored:
                    self._close_command = command  # sent when the last STORED comes
                    return
            else:
                self.state = ClientState.CONFIRMING
            self._send_command(command)

    def _send_command(self, command: _Command) -> None:
        self._outstanding = command
        self._owner.send_frames(mlm.encode(command.message))

    def _record(self, setting: Setting) -> None:
        """Remember an accepted setting for replay, dropping what it supersedes."""
        kept = self._settings
        if isinstance(setting, mlm.StreamWrite):
            kept = [s for s in kept if not isinstance(s, mlm.StreamWrite)]
        elif isinstance(setting, mlm.StreamCancel):
            self._sequences.forget(setting.stream)
            kept = [
                s for s in kept
                if not (isinstance(s, _Reader | mlm.StreamCancel) and s.stream == setting.stream)
            ]
        elif isinstance(setting, _Reader):
            if setting in kept:
                return
            # A pattern read again from another position replaces the old reading.
            kept = [
                s for s in kept
                if not (isinstance(s, _Reader)
                        and (s.stream, s.pattern) == (setting.stream, setting.pattern))
            ]
        elif setting in kept:
            return
        kept.append(setting)
        self._settings = kept

    def _replay_plan(self) -> list[_Command]:
        """
        The settings to send again: a stream with a record seen resumes right
        after it, every pattern from that same position.
        """
        plan = []
        for setting in self._settings:
            last = self._sequences.last(setting.stream) if isinstance(setting, _Reader) else None
            if last is None:
                plan.append(_Command(setting, None))
            else:
                assert isinstance(setting, _Reader)
                resume = mlm.StreamReadFrom(setting.stream, setting.pattern, mlm.SEQUENCE,
                                            last + 1)
                plan.append(_Command(resume, None, fallback=setting))
        return plan

    def _reopen(self) -> None:
        """The broker does not know us: open again, then replay."""
        _log.info("the broker does not know us (ERROR 500): opening again")
        self.state = ClientState.RECONNECTING
        self._replaying.clear()
        if self._unstored:
            # Never acknowledged: send them again after the replay (at least once).
            self._held.extendleft(reversed(self._unstored))
            self._unstored.clear()
        if self._next_ping is None:
            self._start_heartbeat()
        self._send_command(_Command(self._open_message(), None))

    def _resume(self) -> None:
        """The broker answers again and still knows us: carry on."""
        _log.info("the broker answers again")
        self.state = ClientState.CONNECTED
        self._become_usable()

    def _become_usable(self) -> None:
        """Now CONNECTED: send what waited (credit, held messages), then commands."""
        if self._credit_unsent:
            self._owner.send_frames(mlm.encode(mlm.Credit(min(self._credit_unsent, MAX_CREDIT))))
            self._credit_unsent = 0
        self._flush_held()
        self._pump()

    def _lose(self) -> None:
        """Nothing heard for the timeout: fail what waits, keep pinging."""
        if self._closing:
            self._finish_close()
            return
        _log.warn("nothing heard from the broker for {timeout}s: connection lost",
                  timeout=self.timeout)
        self.state = ClientState.DISCONNECTED
        self._replaying.clear()
        self._fail_commands(self._unreachable())

    def _unreachable(self) -> BrokerUnreachableError:
        return BrokerUnreachableError(f"nothing heard from the broker for {self.timeout}s")

    def _finish_close(self) -> None:
        self.state = ClientState.CLOSED
        self._closing = True
        self._close_command = None
        self._next_ping = None
        self._deadline = None
        unstored = [*self._unstored, *(m for m in self._held if isinstance(m, _StoredSend))]
        self._unstored.clear()
        self._held.clear()
        self._fail_commands(ClientClosedError("the client was closed"))
        for send in unstored:
            send.stored(ClientClosedError("the client was closed before the broker said STORED"))
        waiters, self._close_waiters = self._close_waiters, []
        for done in waiters:
            done(None)

    def _fail_commands(self, error: ClientError) -> None:
        failed = [c for c in (self._outstanding, *self._queue) if c is not None]
        self._outstanding = None
        self._queue.clear()
        for command in failed:
            if command.done is not None:
                command.done(error)

    def _start_heartbeat(self) -> None:
        self._next_ping = self._clock.seconds() + self.heartbeat

    def _flush_held(self) -> None:
        held = self._held
        transmit = self._transmit
        while held and self.state in _SENDING:
            transmit(held.popleft())

    # Time

    def wakeup_at(self) -> float | None:
        """When L{on_time} should run next (clock seconds), or None."""
        times = [t for t in (self._next_ping, self._deadline) if t is not None]
        if self.state in _WATCHED:
            times.append(self._last_heard + self.timeout)
        return min(times) if times else None

    def on_time(self) -> None:
        """Run whatever timers are due (harmless when called early)."""
        now = self._clock.seconds()
        if self._deadline is not None and now >= self._deadline:
            self._deadline = None
            if self.state is ClientState.CONNECTING:
                command = self._outstanding
                self._outstanding = None
                self._finish_close()
                if command is not None and command.done is not None:
                    command.done(BrokerUnreachableError(
                        f"no answer to CONNECTION_OPEN within {self.timeout}s"
                    ))
                return
            if self.state is ClientState.CLOSING:
                _log.info("no OK to CONNECTION_CLOSE (or no STORED for {n} sends) within {t}s; "
                          "closing anyway", n=len(self._unstored), t=self.close_timeout)
                if self._close_command is not None:
                    self._owner.send_frames(mlm.encode(mlm.ConnectionClose()))
                self._finish_close()
                return
        if self.state in _WATCHED and now >= self._last_heard + self.timeout:
            self._lose()
        if self._next_ping is not None and now >= self._next_ping:
            self._owner.send_frames(list(_PING))
            self._next_ping = now + self.heartbeat


def _frames(content: Sequence[bytes]) -> list[bytes]:
    """The content frames, refusing a lone bytes or str passed by mistake."""
    if isinstance(content, bytes | bytearray | str):
        raise TypeError("content is a sequence of frames, e.g. [b'payload'], not one bytes/str")
    return list(content)
