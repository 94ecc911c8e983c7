"""
The Malamute client's connection with no I/O: the parts that each do one
job, composed, behind the one interface both drivers use. API calls become
frames to send; frames received become command results, deliveries and
confirmations.

- L{CommandChannel}: the state (the table in L{malamute_pack.client.machine})
  and the commands that expect OK/ERROR, with reopen and replay;
- L{Subscriptions}: the accepted settings and the replay plan;
- L{Outbox}: messages sent or held, STORED tracking (version 2);
- L{Inbox}: deliveries, dedupe of redeliveries, DONE (version 2);
- L{Heartbeat}: pings and the silence timer;
- L{Credit}: flow control granted by the application.

The core routes each decoded message to its part, and answers the
channel's requests to the others (L{ChannelOwner}). Which states send,
hold or refuse messages is in L{malamute_pack.client.machine} too.

Protocol version 2 (``docs/protocol.md``, the default; version 1 is the
libmlm vocabulary, for the C broker) adds stream records with sequence
numbers (read from a position, resumed after a reconnection, deduplicated),
mailbox and service records kept until DONE, and STORED for every
MAILBOX_SEND and SERVICE_SEND; close() waits up to C{close_timeout} for the
STOREDs of the sends made before it. A consumer's commits wait for their
STREAM_COMMITTED (L{Commits}) at most C{commit_timeout} seconds each.

With several endpoints (a primary/backup pair: L{EndpointRing}), the core
moves to the next one when the broker it is on answers ERROR 503 (not
active), goes silent, or does not answer CONNECTION_OPEN in time; the
driver makes the new connection (L{CoreOwner.connect_to}), and the core
opens and replays there as after a restart (``machine.FAILOVER_MACHINE``).
Not to wait for silence, the driver watches its connection (a socket
monitor) and tells the core when it is up (L{ClientCore.connection_made})
and when it breaks (L{ClientCore.connection_lost}: the broker is left at
once), and when the broker refused the security handshake
(L{ClientCore.connection_refused}: connect() fails at once with
L{AuthenticationRefusedError}, one endpoint or several); its socket queues
only on a connection that is up
(L{CoreOwner.try_send}), so that an endpoint nobody listens on is left
after a short grace instead of its share of the timeout.

Time comes from a clock (C{seconds()}); the driver asks L{ClientCore.wakeup_at}
when to call L{ClientCore.on_time} next.

Tests: ``tests/unit/test_client_core.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from twisted.logger import Logger

from malamute_pack.client.channel import ChannelOwner, CommandChannel, Done
from malamute_pack.client.commits import CommitCallback, Commits
from malamute_pack.client.credit import Credit, check_credit
from malamute_pack.client.dedupe import SeenSequences
from malamute_pack.client.endpoints import EndpointRing
from malamute_pack.client.errors import ClientClosedError, ClientError
from malamute_pack.client.events import Delivery
from malamute_pack.client.heartbeat import Clock, Heartbeat
from malamute_pack.client.inbox import Inbox, Recipient
from malamute_pack.client.machine import HOLDING, LISTENING, USABLE, WATCHED, ClientState
from malamute_pack.client.options import ClientOptions
from malamute_pack.client.outbox import Outbox, Outgoing, StoredCallback, StoredSend
from malamute_pack.client.subscriptions import ReplayStep, Setting, Subscriptions
from malamute_pack.protocol import mlm

__all__ = ["ClientCore", "ClientState", "CoreOwner", "Done", "StoredCallback"]

_log = Logger()

_stream_send_header: Final = mlm.header_encoder(mlm.StreamSend)
# States in which the application may send.
_OPEN: Final = USABLE | HOLDING


class CoreOwner(Recipient, Protocol):
    """The driver: it moves frames and hands results to the application."""

    def send_frames(self, frames: list[bytes]) -> None:
        """Send one message to the broker."""

    def connect_to(self, endpoint: str) -> None:
        """
        (Several endpoints only) close the connection to the current
        endpoint, dropping what is queued for it, and connect to
        C{endpoint}: later frames go there.
        """

    def try_send(self, frames: list[bytes]) -> bool:
        """
        (Several endpoints only) send one message if the connection can
        take it now: False, and nothing sent, if it is not up (yet).
        """

    def withdraw(self, stale: Callable[[Delivery], bool]) -> list[Delivery]:
        """
        Drop the deliveries not yet handed to the application that C{stale}
        picks; return them.
        """


def _ignore_stored(result: int | ClientError) -> None:
    pass


class ClientCore(ChannelOwner):
    """
    One client connection's state, without sockets.

    @ivar options: the L{ClientOptions} it runs with.
    """

    def __init__(
        self,
        clock: Clock,
        owner: CoreOwner,
        options: ClientOptions | None = None,
        endpoints: Sequence[str] = (),
    ) -> None:
        """
        @param endpoints: the brokers' endpoints, in the order to try them
            (the driver is connected to the first); with more than one, the
            core fails over between them. Names only: the driver connects.
        """
        options = ClientOptions() if options is None else options
        self.options = options
        self._clock = clock
        self._owner = owner
        self._ring = EndpointRing(endpoints)
        sequences = self._sequences = SeenSequences()
        self._channel = CommandChannel(clock, self, options, self._ring)
        self._heartbeat = Heartbeat(clock, owner.send_frames, options.heartbeat, options.timeout)
        self._credit = Credit(owner.send_frames)
        self._outbox = Outbox(owner.send_frames, options.max_held)
        self._subscriptions = Subscriptions(sequences)
        self._commits = Commits(owner.send_frames, clock, options.commit_timeout)
        self._inbox = Inbox(
            owner,
            sequences,
            self._post_done,
            self._credit.used,
            options.auto_done,
            options.dedupe_window,
        )
        inbox, channel = self._inbox, self._channel
        self._handlers: dict[type[mlm.Message], Callable[[Any], None]] = {
            mlm.StreamDeliver: inbox.stream_deliver,
            mlm.MailboxDeliver: inbox.letter,
            mlm.ServiceDeliver: inbox.letter,
            mlm.Confirm: inbox.confirmation,
            mlm.Ok: channel.ok,
            mlm.Error: channel.error,
            mlm.ConnectionPong: _heard_only,  # hearing it is all that counts
        }
        if options.version == 2:
            self._handlers.update(
                {
                    mlm.StreamRecord: inbox.stream_record,
                    mlm.MailboxRecord: inbox.record,
                    mlm.ServiceRecord: inbox.record,
                    mlm.StreamGap: inbox.gap,
                    mlm.Stored: self._on_stored,
                    mlm.StreamCommitted: self._commits.committed,
                }
            )

    # State

    @property
    def state(self) -> ClientState:
        return self._channel.state

    @property
    def address(self) -> str:
        return self.options.address

    @property
    def version(self) -> int:
        """The protocol version the client speaks (1 or 2)."""
        return self.options.version

    @property
    def reconnects(self) -> int:
        """How many times the broker forgot us and we opened again."""
        return self._channel.reconnects

    @property
    def endpoint(self) -> str:
        """The endpoint the client is on (or trying)."""
        return self._ring.current

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every endpoint the client may use, in order."""
        return self._ring.endpoints

    @property
    def switches(self) -> int:
        """How many times the client moved to another endpoint (fail-overs)."""
        return self._ring.switches

    @property
    def held_dropped(self) -> int:
        """Messages dropped: too many were held while the connection was not usable."""
        return self._outbox.dropped

    @property
    def duplicates(self) -> int:
        """(Version 2) redelivered records dropped instead of handed over again."""
        return self._inbox.duplicates

    @property
    def gaps(self) -> int:
        """(Version 2) STREAM_GAPs received."""
        return self._inbox.gaps

    @property
    def settings(self) -> tuple[Setting, ...]:
        """The recorded settings, in the order a reconnection replays them."""
        return self._subscriptions.settings

    @property
    def unstored(self) -> int:
        """Sends (version 2) waiting for their STORED, held ones included."""
        return self._outbox.pending_stored

    # Commands (each answered by OK or ERROR)

    def connect(self, done: Done) -> None:
        """Send CONNECTION_OPEN; C{done} runs when OK, ERROR or the timeout comes."""
        self._channel.connect(done)

    def set_producer(self, stream: str, done: Done) -> None:
        """Publish to C{stream} from now on (one stream at a time)."""
        self._command(mlm.StreamWrite(stream), done)

    def set_consumer(
        self, stream: str, pattern: str, done: Done, whence: int = mlm.LATEST, position: int = 0
    ) -> None:
        """
        Read C{stream} for subjects that C{pattern} matches, from C{whence}:
        LATEST (messages written from now on: STREAM_READ), or, with
        version 2 only, EARLIEST, SEQUENCE (from message number C{position}),
        TIME (from C{position}, milliseconds since the epoch) or
        LAST_VALUES (a last-value stream's latest record of each subject,
        then on), sent as STREAM_READ_FROM. After a reconnection a stream
        with a record handed over resumes right after it (for LAST_VALUES
        too: the snapshot is not sent again), one without gets what was
        asked again (L{Subscriptions.replay_plan}).

        @raise ValueError: for a whence other than LATEST with version 1,
            or an unknown whence.
        """
        if whence == mlm.LATEST:
            self._command(mlm.StreamRead(stream, pattern), done)
            return
        if whence not in (mlm.EARLIEST, mlm.SEQUENCE, mlm.TIME, mlm.LAST_VALUES):
            raise ValueError(f"unknown whence {whence!r}")
        if self.options.version < 2:
            raise ValueError("reading from a position needs protocol version 2")
        self._command(mlm.StreamReadFrom(stream, pattern, whence, position), done)

    def consume(
        self,
        stream: str,
        pattern: str,
        consumer: str,
        done: Done,
        group: str = "",
        whence: int = mlm.RESUME,
        position: int = 0,
    ) -> None:
        """
        Read C{stream} as the durable consumer C{consumer} (version 2,
        STREAM_CONSUME): from after its last commit (RESUME), or from
        another C{whence}, which resets it there. A reconnection resumes it.

        @raise ValueError: with version 1, or for an unknown whence.
        """
        if self.options.version < 2:
            raise ValueError("consumers need protocol version 2")
        if whence not in (mlm.LATEST, mlm.EARLIEST, mlm.SEQUENCE, mlm.TIME, mlm.RESUME):
            raise ValueError(f"unknown whence {whence!r}")
        self._command(mlm.StreamConsume(stream, pattern, consumer, group, whence, position), done)

    def commit(self, stream: str, sequence: int, settled: CommitCallback) -> None:
        """
        Acknowledge every record of C{stream} up to C{sequence} for the
        consumer this client reads it as; C{settled} gets the position the
        broker made durable (the broker's: lower than C{sequence} for a
        reader's commit past the last record it was sent, which it clamps
        to that record), or the error: L{MalamuteError} for a refusal,
        L{BrokerUnreachableError} if no answer came within
        C{commit_timeout} seconds (L{malamute_pack.client.commits}).

        @raise ValueError: with version 1.
        @raise ClientClosedError: if the client is not open.
        """
        if self.options.version < 2:
            raise ValueError("consumers need protocol version 2")
        self._check_open()
        self._commits.commit(stream, sequence, settled, self._channel.state in USABLE)

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
        self._channel.close(done)

    def _command(self, message: mlm.Message, done: Done) -> None:
        mlm.encode_header(message)  # a name too long for the wire raises here, now
        self._channel.command(message, done)

    # Messages without a reply (with version 2, sendto and sendfor get STORED)

    def send(self, subject: str, content: Sequence[bytes]) -> None:
        """Publish to the producer stream."""
        self._post([_stream_send_header(subject), *_frames(content)])

    def sendto(
        self,
        address: str,
        subject: str,
        content: Sequence[bytes],
        tracker: str = "",
        timeout_ms: int = 0,
        stored: StoredCallback | None = None,
    ) -> None:
        """
        Send a letter to the mailbox C{address}. With version 2, C{stored}
        runs with the message's id once the broker stored it, or with
        L{MalamuteError} if it refused it.
        """
        message = mlm.MailboxSend(address, subject, tracker, timeout_ms, _frames(content))
        self._post_stored(mlm.encode(message), stored)

    def sendfor(
        self,
        service: str,
        subject: str,
        content: Sequence[bytes],
        tracker: str = "",
        timeout_ms: int = 0,
        stored: StoredCallback | None = None,
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
        if self._inbox.tracks(tracker):
            self._check_listening()
            self._inbox.confirm(tracker, status_code, reason)
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
        record_id = self._inbox.check_done(delivery, status_code, reason)
        self._check_listening()
        self._inbox.answer(record_id, status_code, reason)

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
        if self._channel.state in LISTENING:
            self._inbox.handed_over(delivery, status_code, reason)
        # Otherwise the broker delivers it again to whoever comes next.

    def credit(self, amount: int) -> None:
        """
        Let the broker deliver at most C{amount} more messages. From the
        first call on, the broker throttles; the credit left is granted again
        after a reconnection.
        """
        check_credit(amount)
        self._check_open()
        self._credit.grant(amount, self._channel.state in USABLE)

    def _check_open(self) -> None:
        if self._channel.state not in _OPEN:
            raise ClientClosedError("the client is not open")

    def _check_listening(self) -> None:
        if self._channel.state not in LISTENING:
            raise ClientClosedError("the client is not open")

    def _post(self, message: Outgoing) -> None:
        state = self._channel.state
        if state not in _OPEN:
            raise ClientClosedError("the client is not open")
        self._outbox.post(message, state in USABLE, state.value)

    def _post_stored(self, frames: list[bytes], stored: StoredCallback | None) -> None:
        if self.options.version < 2:
            if stored is not None:
                raise ValueError("STORED needs protocol version 2")
            self._post(frames)
            return
        self._post(StoredSend(frames, stored or _ignore_stored))

    def _post_done(self, record_id: int, status_code: int, reason: str) -> None:
        frames = mlm.encode(mlm.Done(record_id, status_code, reason))
        state = self._channel.state
        if state in _OPEN:
            self._outbox.post(frames, state in USABLE, state.value)
        elif state is ClientState.CLOSING and not self._channel.said_close:
            # Still useful ahead of CONNECTION_CLOSE; after it, the broker
            # delivers the record again to whoever comes next.
            self._owner.send_frames(frames)

    # Input

    def receive(self, frames: Sequence[bytes]) -> None:
        """Handle one message from the broker."""
        channel = self._channel
        if channel.state not in LISTENING:
            return
        try:
            message = mlm.decode(frames)
        except mlm.MalformedMessage as e:
            _log.warn("malformed message from the broker dropped: {reason}", reason=e)
            return
        self._heartbeat.heard()
        channel.heard(message)
        handler = self._handlers.get(type(message))
        if handler is None:
            _log.warn(
                "unexpected {name} from the broker dropped", name=mlm.MESSAGE_NAMES[message.ID]
            )
            return
        handler(message)

    def connection_made(self) -> None:
        """
        (Several endpoints) the driver's connection to the current endpoint
        is up: a CONNECTION_OPEN waiting for one goes now.
        """
        if self._ring.several and self._channel.state in LISTENING:
            self._channel.connection_made()

    def connection_lost(self) -> None:
        """
        (Several endpoints) the driver's connection to the current endpoint
        broke (the broker went away): move on to the next at once.
        """
        if self._ring.several and self._channel.state in LISTENING:
            self._channel.connection_lost()

    def connection_refused(self, error: ClientError) -> None:
        """
        The broker refused the connection's security handshake (the
        driver's socket monitor said so): connect() fails with C{error} at
        once; later, it is logged.
        """
        if self._channel.state in LISTENING:
            self._channel.refused(error)

    def _on_stored(self, message: mlm.Stored) -> None:
        if self._outbox.stored(message) and not self._outbox.awaiting_stored:
            self._channel.sends_stored()

    # Time

    def wakeup_at(self) -> float | None:
        """When L{on_time} should run next (clock seconds), or None."""
        times = [
            t
            for t in (
                self._channel.wakeup_at(),
                self._heartbeat.wakeup_at(self._channel.state in WATCHED),
                self._commits.wakeup_at(),
            )
            if t is not None
        ]
        return min(times) if times else None

    def on_time(self) -> None:
        """Run whatever timers are due (harmless when called early)."""
        heartbeat = self._heartbeat
        now = self._clock.seconds()
        self._channel.on_time(now)
        if self._channel.state in WATCHED and heartbeat.silent(now):
            self._channel.silence()
        heartbeat.ping_if_due(now)
        self._commits.on_time(now)

    # ChannelOwner: what the channel's actions ask of the other parts

    def send_frames(self, frames: list[bytes]) -> None:
        self._owner.send_frames(frames)

    def start_heartbeat(self) -> None:
        self._heartbeat.start()

    def stop_heartbeat(self) -> None:
        self._heartbeat.stop()

    def flush(self) -> None:
        self._credit.flush()
        self._outbox.flush()
        self._commits.flush()

    def regrant_credit(self) -> None:
        self._credit.regrant()

    def forget_given_back(self) -> None:
        groups = {
            setting.stream
            for setting in self._subscriptions.settings
            if isinstance(setting, mlm.StreamConsume) and setting.group
        }
        if not groups:
            return
        dropped = self._owner.withdraw(
            lambda delivery: delivery.sequence is not None and delivery.address in groups
        )
        if dropped:
            # Their commits would be refused (300): another member has them now.
            # Not had: if the group gives one to this member again, it is taken.
            for delivery in dropped:
                assert delivery.sequence is not None
                self._sequences.discard(delivery.address, delivery.sequence)
            _log.info(
                "{count} group records not yet handed over were given back when the broker"
                " forgot this connection: dropped",
                count=len(dropped),
            )

    def record_setting(self, setting: Setting) -> None:
        self._subscriptions.record(setting)

    def replay_plan(self) -> list[ReplayStep]:
        return self._subscriptions.replay_plan()

    def resend_unstored(self) -> None:
        self._outbox.resend_unstored()
        self._commits.resend()

    def awaiting_stored(self) -> bool:
        return self._outbox.awaiting_stored

    def drop_sends(self) -> None:
        self._outbox.drop_all(
            ClientClosedError("the client was closed before the broker said STORED")
        )
        self._commits.drop_all(
            ClientClosedError("the client was closed before the broker said COMMITTED")
        )

    def connect_to(self, endpoint: str) -> None:
        self._heartbeat.heard()  # the new endpoint has the whole timeout to answer
        self._owner.connect_to(endpoint)

    def try_send(self, frames: list[bytes]) -> bool:
        return self._owner.try_send(frames)


def _heard_only(message: mlm.Message) -> None:
    pass


def _frames(content: Sequence[bytes]) -> list[bytes]:
    """The content frames, refusing a lone bytes or str passed by mistake."""
    if isinstance(content, bytes | bytearray | str):
        raise TypeError("content is a sequence of frames, e.g. [b'payload'], not one bytes/str")
    return list(content)
