"""
The broker model: clients and their per-client state machine, with streams
(L{malamute_pack.broker.streaming}) and mailboxes and services
(L{malamute_pack.broker.postal}) below it. Pure state: it never touches a
socket or a file.

Frames come in through L{Broker.receive} (one message from one routing id);
frames go out through a L{FrameSink}; journaling goes through a L{Store}
(or nowhere, with no journal); time comes from an injected clock. The state
machine of L{malamute_pack.broker.client} decides which actions run for
each message; actions are the C{action_*} methods.

Tests: ``tests/test_broker_model.py``, ``tests/test_broker_durable.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from malamute_pack.broker.client import Client, Event, State, transition
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.interfaces import FrameSink, Store
from malamute_pack.broker.letters import Kind
from malamute_pack.broker.limits import Limits
from malamute_pack.broker.postal import PostOffice
from malamute_pack.broker.streaming import Streams
from malamute_pack.journal import QueuedRecord
from malamute_pack.protocol import mlm

_log = Logger()

_OK = mlm.encode(mlm.Ok())
_PONG = mlm.encode(mlm.ConnectionPong())

# Commands the protocol gives no reply: a refusal is logged and counted.
_NO_REPLY = (mlm.StreamSend, mlm.MailboxSend, mlm.ServiceSend, mlm.Credit, mlm.Confirm, mlm.Done)

# Messages only a client that opened with version 2 may send.
_VERSION_2 = (mlm.StreamReadFrom, mlm.Done)

__all__ = ["Broker", "BrokerConfig", "BrokerCounters", "FrameSink", "Refused", "Store"]


@dataclass
class BrokerCounters:
    """What the broker has counted since it started (see also its parts)."""

    received: int = 0
    malformed: int = 0
    refused: int = 0
    expired_clients: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """
    @ivar timeout: seconds of silence after which a client is expired.
    @ivar match_cache: subjects whose match results each stream or service
        keeps (0 switches the cache off).
    @ivar replay_batch: stream records read from the journal at a time for
        a reader that is behind.
    """

    timeout: float = 10.0
    limits: Limits = field(default_factory=Limits)
    match_cache: int = 10_000
    replay_batch: int = 256


class Broker:
    """
    The Malamute broker's state and behaviour.

    @ivar clients: open clients by routing id.
    @ivar addresses: open clients by address (anonymous clients excluded).
    @ivar streams: the streams and their delivery.
    @ivar post: the mailboxes and services.
    """

    def __init__(
        self,
        sink: FrameSink,
        clock: IReactorTime,
        config: BrokerConfig,
        store: Store | None = None,
    ) -> None:
        self._sink = sink
        self._clock = clock
        self.config = config
        self.limits = config.limits
        self.store = store
        self.clients: dict[bytes, Client] = {}
        self.addresses: dict[str, Client] = {}
        self.counters = BrokerCounters()
        self.streams = Streams(
            sink, clock, store, config.match_cache, config.replay_batch, config.limits.max_subject
        )
        self.post = PostOffice(
            sink, clock, store, config.limits, config.match_cache, self.addresses, self.clients
        )
        self._sweeper = LoopingCall(self.expire_silent)
        self._sweeper.clock = clock

    # Lifetime

    def restore(self, records: Iterable[QueuedRecord]) -> int:
        """Take back the letters a journal recovered; how many."""
        return self.post.restore(records)

    def start(self) -> None:
        """Start expiring silent clients (checked four times a timeout)."""
        self._sweeper.start(self.config.timeout / 4, now=False)

    def stop(self) -> None:
        if self._sweeper.running:
            self._sweeper.stop()
        self.post.stop()

    # Input

    def receive(self, route: bytes, frames: list[bytes]) -> None:
        """Handle one message (its frames after the routing id) from C{route}."""
        self.counters.received += 1
        client = self.clients.get(route)
        try:
            message = mlm.decode(frames)
        except mlm.MalformedMessage as e:
            self._malformed(route, client, str(e))
            return
        if client is None:
            actions, _ = transition(State.START, type(message))
        else:
            client.last_seen = self._clock.seconds()
            actions, _ = transition(client.state, type(message))
        if len(frames) > self.limits.max_frames or (
            sum(map(len, frames)) > self.limits.max_message_bytes
        ):
            reason = (
                f"message too large: the limits are {self.limits.max_frames} frames"
                f" and {self.limits.max_message_bytes} bytes"
            )
            self._refuse(route, client, message, Refused(reason))
            return
        self._run(actions, route, client, message)

    def _run(
        self, actions: tuple[str, ...], route: bytes, client: Client | None, message: object
    ) -> None:
        for name in actions:
            try:
                result = getattr(self, "action_" + name)(route, client, message)
            except Refused as e:
                self._refuse(route, client, message, e)
                return
            if name == "register":
                client = result

    def _event(self, client: Client, event: Event) -> None:
        actions, _ = transition(client.state, event)
        self._run(actions, client.route, client, event)

    def _count(self, reason: str) -> None:
        self.counters.by_reason[reason] = self.counters.by_reason.get(reason, 0) + 1

    def _malformed(self, route: bytes, client: Client | None, reason: str) -> None:
        self.counters.malformed += 1
        self._count("malformed")
        if client is None:
            _log.debug("malformed message from unknown peer {route}: {reason}",
                       route=route.hex(), reason=reason)  # fmt: skip
        else:
            client.malformed += 1
            _log.warn("malformed message from {client}: {reason}", client=client, reason=reason)
        self._send(route, mlm.Error(mlm.COMMAND_INVALID, mlm.fit_string(f"malformed: {reason}")))
        if client is not None:
            self._deregister(client)

    def _refuse(self, route: bytes, client: Client | None, message: object, e: Refused) -> None:
        self.counters.refused += 1
        self._count(e.reason.split(":")[0])
        if not isinstance(message, _NO_REPLY):
            self._send(route, mlm.Error(e.code, mlm.fit_string(e.reason)))
            return
        _log.info("refused from {client}: {reason}", client=client, reason=e.reason)
        if not isinstance(message, mlm.MailboxSend | mlm.ServiceSend) or client is None:
            return
        if client.version >= 2:
            # Every send of a version 2 client gets its STORED, in order.
            if not e.acknowledged:
                ack = self.post.expect_ack(client, message.tracker)
                self.post.acknowledge(client, ack, 0, e.code, e.reason)
        elif message.tracker:
            self._send(route, mlm.Confirm(message.tracker, e.code, mlm.fit_string(e.reason)))

    def _send(self, route: bytes, message: mlm.Message) -> None:
        self._sink.send(route, mlm.encode(message))

    # Actions (names come from the state machine table)

    def action_command_invalid(self, route: bytes, client: Client | None, message: object) -> None:
        name = mlm.MESSAGE_NAMES.get(getattr(message, "ID", 0), str(message))
        self._send(route, mlm.Error(mlm.COMMAND_INVALID, f"command invalid: {name}"))

    def action_reply_ok(self, route: bytes, client: Client | None, message: object) -> None:
        self._sink.send(route, _OK)

    def action_reply_pong(self, route: bytes, client: Client | None, message: object) -> None:
        self._sink.send(route, _PONG)

    def action_register(
        self, route: bytes, client: Client | None, message: mlm.ConnectionOpen
    ) -> Client:
        address = message.address
        self._check_name("address", address, allow_empty=True)
        if len(self.clients) >= self.limits.max_clients:
            raise Refused(f"too many clients: the limit is {self.limits.max_clients}")
        version = 2 if message.version >= 2 else 1
        client = Client(route, address, self._clock.seconds(), version)
        if address:
            previous = self.addresses.get(address)
            if previous is not None:
                _log.info("{client} takes over the address of {previous}",
                          client=client, previous=previous)  # fmt: skip
                self._event(previous, Event.TAKEN_OVER)
            self.addresses[address] = client
        self.clients[route] = client
        return client

    def action_deregister(self, route: bytes, client: Client, message: object) -> None:
        self._deregister(client)
        if message is Event.EXPIRED:
            self.counters.expired_clients += 1

    def _deregister(self, client: Client) -> None:
        """Forget C{client}: routing, readers, offers; requeue what it held."""
        if client.state is State.GONE:
            return
        client.state = State.GONE
        if self.clients.get(client.route) is client:
            del self.clients[client.route]
        if client.address and self.addresses.get(client.address) is client:
            del self.addresses[client.address]
        self.streams.forget(client)
        self.post.withdraw(client)
        self.post.forget(client)

    def action_store_writer(self, route: bytes, client: Client, message: mlm.StreamWrite) -> None:
        self._check_name("stream name", message.stream)
        self.streams.set_writer(client, message.stream)

    def action_store_reader(self, route: bytes, client: Client, message: mlm.StreamRead) -> None:
        self._check_name("stream name", message.stream)
        self._check_subscriptions(client)
        self.streams.subscribe(client, message.stream, message.pattern)

    def action_store_reader_from(
        self, route: bytes, client: Client, message: mlm.StreamReadFrom
    ) -> None:
        self._check_version(client, message)
        self._check_name("stream name", message.stream)
        self._check_subscriptions(client)
        self.streams.read_from(
            client, message.stream, message.pattern, message.whence, message.position
        )

    def action_resume_streams(self, route: bytes, client: Client, message: object) -> None:
        self.streams.resume_all(client)

    def action_cancel_reader(self, route: bytes, client: Client, message: mlm.StreamCancel) -> None:
        self.streams.cancel(client, message.stream)

    def action_write_to_stream(self, route: bytes, client: Client, message: mlm.StreamSend) -> None:
        self.streams.write(client, message)

    def action_write_to_mailbox(
        self, route: bytes, client: Client, message: mlm.MailboxSend
    ) -> None:
        self._check_name("mailbox address", message.address)
        self.post.post(Kind.MAILBOX, client, message)

    def action_write_to_service(
        self, route: bytes, client: Client, message: mlm.ServiceSend
    ) -> None:
        self._check_name("service address", message.address)
        self.post.post(Kind.SERVICE, client, message)

    def action_store_offer(self, route: bytes, client: Client, message: mlm.ServiceOffer) -> None:
        self._check_name("service address", message.address)
        self._check_subscriptions(client)
        self.post.offer(client, message.address, message.pattern)

    def action_dispatch_offered(self, route: bytes, client: Client, message: object) -> None:
        self.post.dispatch_offered(client)

    def action_deliver_mail(self, route: bytes, client: Client, message: object) -> None:
        self.post.deliver_mail(client)

    def action_credit(self, route: bytes, client: Client, message: mlm.Credit) -> None:
        client.credit = (client.credit or 0) + message.amount

    def action_confirm(self, route: bytes, client: Client, message: mlm.Confirm) -> None:
        self.post.confirm(client, message)

    def action_done(self, route: bytes, client: Client, message: mlm.Done) -> None:
        self._check_version(client, message)
        self.post.done(client, message)

    # Checks

    def _check_name(self, what: str, name: str, allow_empty: bool = False) -> None:
        if not name and not allow_empty:
            raise Refused(f"invalid {what}: it is empty")
        limit = self.limits.max_address
        if len(name.encode("utf-8", "surrogateescape")) > limit:
            raise Refused(f"invalid {what}: longer than {limit} bytes")

    def _check_subscriptions(self, client: Client) -> None:
        if client.subscriptions() >= self.limits.max_subscriptions:
            raise Refused(f"too many subscriptions: the limit is {self.limits.max_subscriptions}")

    def _check_version(self, client: Client, message: mlm.Message) -> None:
        if client.version < 2 and isinstance(message, _VERSION_2):
            name = mlm.MESSAGE_NAMES[message.ID]
            raise Refused(f"command invalid: {name} needs protocol version 2", mlm.COMMAND_INVALID)

    # Time

    def expire_silent(self) -> None:
        """Expire every client silent for longer than the timeout."""
        limit = self._clock.seconds() - self.config.timeout
        for client in [c for c in self.clients.values() if c.last_seen < limit]:
            _log.info("{client} expired after {timeout}s of silence",
                      client=client, timeout=self.config.timeout)  # fmt: skip
            self._event(client, Event.EXPIRED)
