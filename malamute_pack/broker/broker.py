"""
The broker: it receives decoded messages from sessions, runs the actions
the state machine (L{malamute_pack.broker.machine}) names for them, and
answers through the sessions. Streams (L{malamute_pack.broker.streams}) and
mailboxes and services (L{malamute_pack.broker.post_office}) sit below it;
the registry (L{malamute_pack.broker.registry}) says who is connected; when
clients authenticate, the access control (L{malamute_pack.broker.access})
says what each session's user may do and who owns an address. Pure
state: it never touches a socket, a frame or a file; journaling goes
through a L{Store} (or nowhere, with no journal) and time comes from an
injected clock.

Tests: ``tests/unit/test_broker_model.py``, ``tests/unit/test_broker_durable.py``,
``tests/unit/test_broker_machine.py``, ``tests/unit/test_broker_sessions.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from malamute_pack.broker.access import AccessControl, Right
from malamute_pack.broker.connection import Connection
from malamute_pack.broker.consumers import Consumers
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.interests import Interests
from malamute_pack.broker.letters import Kind
from malamute_pack.broker.limits import Limits, check_name
from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.broker.machine import (
    EXPIRED,
    MACHINE,
    REPLACED,
    TAKEN_OVER,
    Action,
    AnyOther,
    EventType,
    InternalEvent,
    Malformed,
    Rejected,
    State,
    Unresponsive,
)
from malamute_pack.broker.post_office import LetterMessage, Posted, PostOffice
from malamute_pack.broker.ranges import Ranges
from malamute_pack.broker.registry import Registry
from malamute_pack.broker.session import Session
from malamute_pack.broker.stalled import Stalled
from malamute_pack.broker.streams import Streams
from malamute_pack.protocol import chunks, mlm
from malamute_pack.protocol.records import QueuedRecord, StreamRecord
from malamute_pack.store import Store

_log = Logger()

# Commands the protocol gives no reply: a refusal is logged and counted.
_NO_REPLY: Final = (
    mlm.StreamSend,
    mlm.MailboxSend,
    mlm.ServiceSend,
    mlm.Credit,
    mlm.Confirm,
    mlm.Done,
)

Event = mlm.Message | InternalEvent
_ActionMethod = Callable[[Session, Event], None]
_BoundRow = tuple[tuple[_ActionMethod, ...], State]

__all__ = ["Broker", "BrokerConfig", "BrokerCounters"]


@dataclass
class BrokerCounters:
    """What the broker has counted since it started (see also its parts)."""

    malformed: int = 0
    refused: int = 0
    expired_clients: int = 0
    unresponsive_clients: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """
    @ivar timeout: seconds of silence after which a connection is expired.
    @ivar match_cache: subjects whose match results each stream or service
        keeps (0 switches the cache off).
    @ivar replay_batch: stream records read from the journal at a time for
        a reader that is behind.
    @ivar stall_retry: seconds before what is owed to a stalled connection
        (one whose session could not take a delivery) is tried again.
    """

    timeout: float = 10.0
    limits: Limits = field(default_factory=Limits)
    match_cache: int = 10_000
    replay_batch: int = 256
    stall_retry: float = 0.05


class Broker:
    """
    The Malamute broker's state and behaviour: the L{Receiver} its
    transports feed.

    @ivar registry: the open connections, by session and by address.
    @ivar streams: the streams and their delivery.
    @ivar post: the mailboxes and services.
    """

    def __init__(
        self, clock: IReactorTime, config: BrokerConfig, store: Store | None = None
    ) -> None:
        self._clock = clock
        self.config = config
        self.limits = config.limits
        self.store = store
        # What local clients read, hold and offer: what a pack announces.
        self.interests = Interests()
        self.registry = Registry(self.interests)
        self.counters = BrokerCounters()
        self.stalled = Stalled(clock, config.stall_retry, self._unstall)
        self.streams = Streams(
            clock,
            store,
            self.stalled,
            config.match_cache,
            config.replay_batch,
            config.limits.max_subject,
            self.interests,
            config.limits.append_keys,
        )
        self.ranges = Ranges(store, self.stalled)
        self.consumers = Consumers(
            clock,
            store,
            self.streams,
            self.stalled,
            config.limits.consumers,
            config.limits.consumer_ttl,
            config.limits.max_address,
            config.limits.group_lease,
            config.limits.group_unacked_bytes,
            config.limits.consumers_per_user,
            config.limits.consumers_per_connection,
        )
        self.post = PostOffice(
            clock,
            store,
            config.limits,
            config.match_cache,
            self.registry,
            self.stalled,
            self.interests,
        )
        # The state table with every action bound to its method, once.
        self._rows: dict[tuple[State, EventType], _BoundRow] = {
            key: (tuple(getattr(self, f"action_{a.value}") for a in row.actions), row.next)
            for key, row in MACHINE.items()
        }
        self._deaf = False
        self._log_limit = LogLimit(clock, _log)
        # Who may do what, when clients authenticate (None: everyone may
        # do everything, as in the C broker).
        self.access: AccessControl | None = None
        self._sweeper = LoopingCall(self.expire_silent)
        self._last_sweep: float | None = None
        self._skipped_sweep = False
        self._sweeper.clock = clock

    # Lifetime

    def restore(self, records: Iterable[QueuedRecord]) -> int:
        """Take back the letters a journal recovered; how many."""
        return self.post.restore(records)

    def start(self) -> None:
        """Start expiring silent connections (checked four times a timeout)."""
        self._last_sweep = self._clock.seconds()
        self._sweeper.start(self.config.timeout / 4, now=False)

    def stop(self) -> None:
        if self._sweeper.running:
            self._sweeper.stop()
        self.stalled.stop()
        self.post.stop()

    def _unstall(self, connection: Connection) -> None:
        """Try again everything owed to a connection that stalled."""
        self.post.deliver_mail(connection)
        self.post.dispatch_offered(connection)
        self.streams.resume_all(connection)
        self.ranges.resume_all(connection)
        self.consumers.pump(connection)

    # Input (the Receiver interface)

    def receive(self, session: Session, event: Event) -> None:
        """
        Handle one message from C{session} (or an internal event): run the
        row of the state table for it and apply the row's next state.
        """
        connection = self.registry.get(session)
        if connection is None:
            state = State.START
        else:
            connection.last_seen = self._clock.seconds()
            state = connection.state
        rows = self._rows
        found = rows.get((state, type(event)))
        actions, next_state = found if found is not None else rows[(state, AnyOther)]
        try:
            for action in actions:
                action(session, event)
        except Refused as e:
            self._refuse(session, event, e)
            return
        # The session's connection now: a new one after OPEN, the old one
        # (out of the registry) after an end.
        connection = self.registry.get(session) or connection
        if connection is not None:
            connection.state = next_state

    def malformed(self, session: Session, reason: str) -> None:
        """C{session} sent something that does not decode."""
        self.receive(session, Malformed(reason))

    def rejected(self, session: Session, message: mlm.Message, reason: str) -> None:
        """C{session} sent C{message}, which its transport rejected at the door."""
        self.receive(session, Rejected(message, reason))

    def undelivered(self, session: Session, record: StreamRecord) -> None:
        """A live stream record C{session} took could not be sent after all."""
        connection = self.registry.get(session)
        if connection is None or connection.gone:
            return
        if not self.consumers.undelivered(connection, record):  # a group's record
            self.streams.undelivered(connection, record)

    def unresponsive(self, session: Session, reason: str) -> None:
        """C{session}'s transport gave it up: it does not read what it is sent."""
        self._log_limit.info(
            "unresponsive", "{session} dropped: {reason}", session=session, reason=reason
        )
        self.counters.unresponsive_clients += 1
        self.receive(session, Unresponsive(reason))

    # Peer brokers (the pack): their sessions are not clients

    def attach_remote(self, session: Session, address: str = "") -> Connection | None:
        """
        Register a connection for a session of the pack (a peer broker, or
        an address or service held there): no access control and no client
        limit apply (the peer checked its own clients). An address a local
        client holds stays with it: None, nothing registered.
        """
        if address and self.registry.holder(address) is not None:
            return None
        connection = Connection(session, address, self._clock.seconds(), remote=True)
        self.registry.add(connection)
        return connection

    def attach_internal(self, session: Session) -> Connection:
        """
        Register a connection for a part of this broker's process (a
        multicast bridge): it reads and writes streams as a local client
        does (the pack hears its patterns), with no access control or
        client limit, and never expires for silence.
        """
        connection = Connection(session, "", self._clock.seconds(), internal=True)
        self.registry.add(connection)
        return connection

    def detach_remote(self, session: Session) -> None:
        """End the connection of a session of the pack or a bridge, as if it had closed."""
        connection = self.registry.get(session)
        if connection is not None:
            self.action_deregister(session, mlm.ConnectionClose())
            connection.state = State.GONE

    def _fire(self, connection: Connection, event: InternalEvent) -> None:
        """Run an internal event on an open connection."""
        assert connection.state is State.CONNECTED, connection
        self.receive(connection.session, event)

    def _connection(self, session: Session) -> Connection:
        connection = self.registry.get(session)
        assert connection is not None, f"no connection for {session!r}: not in the table's rows"
        return connection

    # Refusals

    def _refuse(self, session: Session, event: Event, e: Refused) -> None:
        message = event.message if isinstance(event, Rejected) else event
        if not isinstance(message, _NO_REPLY):
            self._count_refusal(e)
            session.error(e.code, mlm.fit_string(e.reason))
            return
        self._refused_silently(session, e)
        if isinstance(message, mlm.MailboxSend | mlm.ServiceSend):
            connection = self.registry.get(session)
            if connection is not None:
                self.post.refuse(connection, message, e)

    def _count_refusal(self, e: Refused) -> None:
        self.counters.refused += 1
        by_reason = self.counters.by_reason
        by_reason[e.kind] = by_reason.get(e.kind, 0) + 1

    def _refused_silently(self, session: Session, e: Refused) -> None:
        """A refusal the protocol has no reply for: counted and logged."""
        self._count_refusal(e)
        self._log_limit.info(
            "refused", "refused from {session}: {reason}", session=session, reason=e.reason
        )

    # Actions (the state table names them; each takes the session and the event)

    def action_reply_ok(self, session: Session, event: Event) -> None:
        session.ok()

    def action_reply_pong(self, session: Session, event: Event) -> None:
        session.pong()

    def action_reply_invalid(self, session: Session, event: Event) -> None:
        name = mlm.MESSAGE_NAMES.get(getattr(event, "ID", 0), type(event).__name__)
        session.error(mlm.COMMAND_INVALID, f"command invalid: {name}")

    def action_reply_malformed(self, session: Session, event: Event) -> None:
        assert isinstance(event, Malformed)
        self.counters.malformed += 1
        self.counters.by_reason["malformed"] = self.counters.by_reason.get("malformed", 0) + 1
        self._log_limit.info(
            "malformed",
            "malformed message from {session}: {reason}",
            session=session,
            reason=event.reason,
        )
        session.error(mlm.COMMAND_INVALID, mlm.fit_string(f"malformed: {event.reason}"))

    def action_refuse_rejected(self, session: Session, event: Event) -> None:
        assert isinstance(event, Rejected)
        raise Refused(event.reason)

    def action_require_dialect(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.Message)
        if not session.speaks(type(event)):
            name = mlm.MESSAGE_NAMES[event.ID]
            raise Refused(f"command invalid: {name} needs protocol version 2", mlm.COMMAND_INVALID)

    def action_register(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.ConnectionOpen)
        address = event.address
        check_name("address", address, self.limits.max_address, allow_empty=True)
        registry = self.registry
        previous = registry.get(session)
        if previous is None and len(registry) >= self.limits.max_clients:
            raise Refused(f"too many clients: the limit is {self.limits.max_clients}")
        if self.access is not None:
            self.access.open(session.user, address)
        if previous is not None:
            self._fire(previous, REPLACED)
        holder = registry.holder(address) if address else None
        if holder is not None:
            self._log_limit.info(
                "takeover",
                "{session} takes over the address of {holder}",
                session=session,
                holder=holder,
            )
            self._fire(holder, TAKEN_OVER)
        registry.add(Connection(session, address, self._clock.seconds()))
        self._log_client("connect", session, address, f"version={event.version}")

    def action_deregister(self, session: Session, event: Event) -> None:
        """Forget the session's connection: readers, offers; requeue what it held."""
        connection = self._connection(session)
        if not (connection.remote or connection.internal):
            self._log_client("close", session, connection.address, f"({self._why_closed(event)})")
        self.registry.remove(connection)
        self.consumers.forget_connection(connection)
        self.streams.forget(connection)
        connection.ranges.clear()
        self.post.withdraw(connection)
        self.post.forget(connection)
        if event is EXPIRED:
            self.counters.expired_clients += 1

    def _log_client(self, kind: str, session: Session, address: str, rest: str) -> None:
        """
        A client's connect or close at info level (a line per connection,
        never per message; rate-limited against a storm of reconnections).
        """
        peer = getattr(session, "peer", None)  # a transport that knows it says it
        self._log_limit.info(
            kind,
            "client {what}: address={address} user={user} {rest}{peer}",
            what="connected" if kind == "connect" else "closed",
            address=address or "(anonymous)",
            user=session.user or "(none)",
            rest=rest,
            peer=f" peer={peer}" if peer else "",
        )

    def _why_closed(self, event: Event) -> str:
        """Why a client's connection ends, for its close line."""
        if isinstance(event, mlm.ConnectionClose):
            return "CONNECTION_CLOSE"
        if event is EXPIRED:
            return f"expired after {self.config.timeout:g}s of silence"
        if event is TAKEN_OVER:
            return "its address was taken over by a new connection"
        if event is REPLACED:
            return "it opened again"
        if isinstance(event, Unresponsive):
            return f"unresponsive: {event.reason}"
        if isinstance(event, Malformed):
            return f"malformed message: {event.reason}"
        name = mlm.MESSAGE_NAMES.get(getattr(event, "ID", 0), type(event).__name__)
        return f"protocol violation: {name}"

    def action_store_writer(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.StreamWrite)
        check_name("stream name", event.stream, self.limits.max_address)
        if self.access is not None:
            self.access.check(session.user, Right.WRITE, event.stream)
        self.streams.set_writer(self._connection(session), event.stream)

    def action_store_reader(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.StreamRead)
        connection = self._connection(session)
        self._check_reading(connection, event.stream)
        self.streams.subscribe(connection, event.stream, event.pattern)

    def action_store_reader_from(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.StreamReadFrom)
        connection = self._connection(session)
        self._check_reading(connection, event.stream)
        self.streams.read_from(
            connection, event.stream, event.pattern, event.whence, event.position
        )

    def action_resume_streams(self, session: Session, event: Event) -> None:
        connection = self._connection(session)
        self.streams.resume_all(connection)
        if connection.ranges:
            self.ranges.resume_all(connection)
        self.consumers.pump(connection)

    def action_cancel_reader(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.StreamCancel)
        connection = self._connection(session)
        self.consumers.cancelled(connection, event.stream)
        self.streams.cancel(connection, event.stream)
        self.ranges.cancel(connection, event.stream)

    def action_consume(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.StreamConsume)
        connection = self._connection(session)
        self._check_reading(connection, event.stream)
        self.consumers.consume(connection, event)

    def action_commit(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.StreamCommit)
        self.consumers.commit(self._connection(session), event)

    def action_query_stream(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.StreamQuery)
        connection = self._connection(session)
        check_name("stream name", event.stream, self.limits.max_address)
        if self.access is not None:
            self.access.check(session.user, Right.READ, event.stream)
        self.ranges.query(connection, event.stream, event.whence, event.position)

    def action_store_range_reader(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.StreamReadRange)
        connection = self._connection(session)
        check_name("stream name", event.stream, self.limits.max_address)
        if self.access is not None:
            self.access.check(session.user, Right.READ, event.stream)
        self.ranges.read(connection, event.stream, event.pattern, event.first, event.last)

    def action_append_to_stream(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.StreamAppend)
        connection = self._connection(session)
        name, key = event.address, event.key

        def answer(first: int, last: int, code: int, reason: str) -> None:
            if not connection.gone:
                session.appended(name, key, first, last, code, reason)

        # Every outcome is a STREAM_APPENDED, refusals included.
        try:
            check_name("stream name", name, self.limits.max_address)
            check_name("append key", key, self.limits.max_address)
            if self.access is not None:
                self.access.check(session.user, Right.WRITE, name)
            if len(event.content) != 1:
                raise Refused("invalid append: its records must be one content frame")
            try:
                records = chunks.decode_append(event.content[0])
            except mlm.MalformedMessage as e:
                raise Refused(f"invalid append: {e}") from e
            self._check_frames(records)
            self.streams.append(connection, name, key, records, answer)
        except Refused as e:
            self._count_refusal(e)
            answer(0, 0, e.code, mlm.fit_string(e.reason))

    def _check_frames(self, records: list[tuple[str, tuple[bytes, ...]]]) -> None:
        limit = self.limits.max_frames
        for _, frames in records:
            if len(frames) >= limit:
                raise Refused(f"invalid append: a record of more than {limit - 1} frames")

    def action_write_to_stream(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.StreamSend)
        writer = self.registry.get(session)  # the hottest path: no helper call
        assert writer is not None
        self.streams.write(writer, event)

    def action_write_to_mailbox(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.MailboxSend)
        if self.access is not None:
            self.access.check(session.user, Right.SEND, event.address, log=False)
        self._post(Kind.MAILBOX, session, event)

    def action_write_to_service(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.ServiceSend)
        if self.access is not None:
            self.access.check(session.user, Right.CALL, event.address, log=False)
        self._post(Kind.SERVICE, session, event)

    def _post(self, kind: Kind, session: Session, message: LetterMessage) -> None:
        outcome = self.post.post(kind, self._connection(session), message)
        if outcome.status is Posted.REFUSED:
            assert outcome.refusal is not None
            self._refused_silently(session, outcome.refusal)

    def action_store_offer(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.ServiceOffer)
        connection = self._connection(session)
        check_name("service address", event.address, self.limits.max_address)
        if self.access is not None:
            self.access.check(session.user, Right.OFFER, event.address)
        self._check_subscriptions(connection)
        self.post.offer(connection, event.address, event.pattern)

    def action_dispatch_offered(self, session: Session, event: Event) -> None:
        self.post.dispatch_offered(self._connection(session))

    def action_deliver_mail(self, session: Session, event: Event) -> None:
        self.post.deliver_mail(self._connection(session))

    def action_credit(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.Credit)
        connection = self._connection(session)
        connection.credit = (connection.credit or 0) + event.amount

    def action_confirm(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.Confirm)
        self.post.confirm(self._connection(session), event)

    def action_done(self, session: Session, event: Event) -> None:
        assert isinstance(event, mlm.Done)
        self.post.done(self._connection(session), event)

    # Checks

    def _check_reading(self, connection: Connection, stream: str) -> None:
        check_name("stream name", stream, self.limits.max_address)
        if self.access is not None:
            self.access.check(connection.session.user, Right.READ, stream)
        self._check_subscriptions(connection)

    def _check_subscriptions(self, connection: Connection) -> None:
        limit = self.limits.max_subscriptions
        if connection.subscriptions() >= limit:
            raise Refused(f"too many subscriptions: the limit is {limit}")

    # Time

    def listening(self, listening: bool) -> None:
        """
        Whether the broker is reading what sessions send. While it is not
        (backpressure), nobody is expired for silence; once it is again,
        every connection counts as heard just now.
        """
        self._deaf = not listening
        if listening:
            now = self._clock.seconds()
            for connection in self.registry:
                connection.last_seen = now

    def expire_silent(self) -> None:
        """
        Expire every connection silent for longer than the timeout, and the
        group members past their lease. A sweep that comes much later than
        its time (more than half a timeout since the last: this broker was
        paused, or starved) expires nothing: what the clients sent
        meanwhile waits unread, and they were not silent; the next sweep,
        a quarter of a timeout later, expires those that still are (never
        two sweeps skipped in a row, so a broker always late still expires).
        """
        if self._deaf:
            return
        now = self._clock.seconds()
        last, self._last_sweep = self._last_sweep, now
        if last is not None and now - last > self.config.timeout / 2 and not self._skipped_sweep:
            self._skipped_sweep = True
            _log.info(
                "this broker did not run for {seconds:.1f}s (paused, or starved): no client"
                " is expired for that silence before what they sent meanwhile is read",
                seconds=now - last,
            )
            return
        self._skipped_sweep = False
        limit = now - self.config.timeout
        # A pack session lives as long as its peer (ZRE's own timers say), a
        # bridge as long as the broker.
        expired = [c for c in self.registry if c.last_seen < limit and not (c.remote or c.internal)]
        for connection in expired:  # logged as its close, with the reason
            self._fire(connection, EXPIRED)
        self.consumers.sweep()


def check_actions(broker: type[Broker]) -> None:
    """
    Every action of the state table has its method in C{broker}; raises
    ImportError otherwise. Run at import, so a typo fails there.
    """
    missing = [a.value for a in Action if not callable(getattr(broker, f"action_{a.value}", None))]
    if missing:
        raise ImportError(f"{broker.__name__} has no method for actions {missing}")


check_actions(Broker)
