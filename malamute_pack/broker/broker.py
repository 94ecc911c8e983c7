"""
The broker model: clients, streams, mailboxes, services, credit and
confirmations. Pure state: it never touches a socket or a file.

Frames come in through L{Broker.receive} (one message from one routing id);
frames go out through a L{FrameSink}; time comes from an injected clock. The
per-client state machine of L{malamute_pack.broker.client} decides which
actions run for each message.

Tests: ``tests/test_broker_model.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from malamute_pack.broker.client import Client, Event, State, transition
from malamute_pack.broker.deadlines import Deadlines
from malamute_pack.broker.letters import Kind, Letter, LetterQueue, LetterState, QueueFull
from malamute_pack.broker.limits import Limits
from malamute_pack.broker.services import Service
from malamute_pack.broker.streams import Stream
from malamute_pack.matching import PatternError, validate_pattern
from malamute_pack.protocol import mlm

_log = Logger()

_OK = mlm.encode(mlm.Ok())
_PONG = mlm.encode(mlm.ConnectionPong())


class FrameSink(Protocol):
    """Where the broker's outgoing messages go (a ROUTER socket, in service)."""

    def send(self, route: bytes, frames: Sequence[bytes]) -> bool:
        """Send C{frames} to the peer with routing id C{route}."""


class Refused(Exception):
    """
    An action cannot be done. For a command the protocol answers, the client
    gets ERROR with this status; for one it does not, the refusal is logged
    and counted (and a tracked letter's sender gets a failed CONFIRM).
    """

    def __init__(self, reason: str, code: int = mlm.FAILED) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class BrokerCounters:
    """What the broker has counted since it started."""

    received: int = 0
    malformed: int = 0
    refused: int = 0
    stream_delivered: int = 0
    stream_dropped: int = 0
    mailbox_stored: int = 0
    mailbox_delivered: int = 0
    service_queued: int = 0
    service_delivered: int = 0
    service_requeued: int = 0
    expired_letters: int = 0
    expired_clients: int = 0
    confirms: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """
    @ivar timeout: seconds of silence after which a client is expired.
    @ivar match_cache: subjects whose match results each stream or service
        keeps (0 switches the cache off).
    """

    timeout: float = 10.0
    limits: Limits = field(default_factory=Limits)
    match_cache: int = 10_000


class Broker:
    """
    The Malamute broker's state and behaviour.

    @ivar clients: open clients by routing id.
    @ivar addresses: open clients by address (anonymous clients excluded).
    """

    def __init__(self, sink: FrameSink, clock: IReactorTime, config: BrokerConfig) -> None:
        self._sink = sink
        self._clock = clock
        self.config = config
        self.limits = config.limits
        self.clients: dict[bytes, Client] = {}
        self.addresses: dict[str, Client] = {}
        self.streams: dict[str, Stream] = {}
        self.mailboxes: dict[str, LetterQueue] = {}
        self.services: dict[str, Service] = {}
        self.counters = BrokerCounters()
        self._deadlines = Deadlines()
        self._deadline_call: IDelayedCall | None = None
        self._dispatches = 0
        self._sweeper = LoopingCall(self.expire_silent)
        self._sweeper.clock = clock

    # Lifetime

    def start(self) -> None:
        """Start expiring silent clients (checked four times a timeout)."""
        self._sweeper.start(self.config.timeout / 4, now=False)

    def stop(self) -> None:
        if self._sweeper.running:
            self._sweeper.stop()
        if self._deadline_call is not None and self._deadline_call.active():
            self._deadline_call.cancel()
        self._deadline_call = None

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
            self._refuse(
                route,
                client,
                message,
                Refused(
                    f"message too large: the limits are {self.limits.max_frames} frames"
                    f" and {self.limits.max_message_bytes} bytes"
                ),
            )
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
            _log.debug(
                "malformed message from unknown peer {route}: {reason}",
                route=route.hex(),
                reason=reason,
            )
        else:
            client.malformed += 1
            _log.warn("malformed message from {client}: {reason}", client=client, reason=reason)
        self._send(route, mlm.Error(mlm.COMMAND_INVALID, _short(f"malformed: {reason}")))
        if client is not None:
            self._event_deregister(client)

    def _refuse(self, route: bytes, client: Client | None, message: object, e: Refused) -> None:
        self.counters.refused += 1
        self._count(e.reason.split(":")[0])
        if isinstance(
            message, mlm.StreamSend | mlm.MailboxSend | mlm.ServiceSend | mlm.Credit | mlm.Confirm
        ):
            # No reply exists for these; a tracked letter's sender hears by CONFIRM.
            _log.info("refused from {client}: {reason}", client=client, reason=e.reason)
            tracker = getattr(message, "tracker", "")
            if tracker and isinstance(message, mlm.MailboxSend | mlm.ServiceSend):
                self._send(route, mlm.Confirm(tracker, e.code, _short(e.reason)))
            return
        self._send(route, mlm.Error(e.code, _short(e.reason)))

    # Output

    def _send(self, route: bytes, message: mlm.Message) -> None:
        self._sink.send(route, mlm.encode(message))

    def _deliver(self, client: Client, frames: Sequence[bytes]) -> None:
        if client.credit is not None:
            client.credit -= 1
        self._sink.send(client.route, frames)

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
        client = Client(route, address, self._clock.seconds())
        if address:
            previous = self.addresses.get(address)
            if previous is not None:
                _log.info(
                    "{client} takes over the address of {previous}",
                    client=client,
                    previous=previous,
                )
                self._event(previous, Event.TAKEN_OVER)
            self.addresses[address] = client
        self.clients[route] = client
        return client

    def action_deregister(self, route: bytes, client: Client | None, message: object) -> None:
        assert client is not None
        self._event_deregister(client)
        if message is Event.EXPIRED:
            self.counters.expired_clients += 1

    def _event_deregister(self, client: Client) -> None:
        """Forget C{client}: its routing, readers and offers; requeue what it held."""
        if client.state is State.GONE:
            return
        client.state = State.GONE
        if self.clients.get(client.route) is client:
            del self.clients[client.route]
        if client.address and self.addresses.get(client.address) is client:
            del self.addresses[client.address]
        for name in client.reading:
            self.streams[name].readers.unsubscribe_owner(client)
        for name in client.offers:
            self.services[name].offers.unsubscribe_owner(client)
        client.reading.clear()
        client.offers.clear()
        client.writer = None
        touched: set[Service] = set()
        for letters in client.held.values():
            for letter in letters:
                if letter.kind is Kind.SERVICE:
                    service = self.services[letter.address]
                    self._requeue(service.queue, letter)
                    touched.add(service)
        client.held.clear()
        for service in touched:
            self._dispatch(service)

    def _requeue(self, queue: LetterQueue, letter: Letter) -> None:
        queue.requeue(letter)
        self.counters.service_requeued += 1
        if letter.deadline is not None:
            self._deadlines.add(letter)
            self._schedule_deadline()

    def action_store_writer(self, route: bytes, client: Client, message: mlm.StreamWrite) -> None:
        stream = self._stream(message.stream)
        client.writer = stream
        client.deliver_prefix = (
            mlm.SIGNATURE
            + bytes((mlm.StreamDeliver.ID,))
            + mlm.encode_string(stream.name)
            + mlm.encode_string(client.address)
        )

    def action_store_reader(self, route: bytes, client: Client, message: mlm.StreamRead) -> None:
        self._check_subscription(client, message.pattern)
        stream = self._stream(message.stream)
        if stream.readers.subscribe(client, message.pattern):
            client.reading.setdefault(stream.name, set()).add(message.pattern)

    def action_cancel_reader(self, route: bytes, client: Client, message: mlm.StreamCancel) -> None:
        stream = self.streams.get(message.stream)
        if client.reading.pop(message.stream, None) is not None and stream is not None:
            stream.readers.unsubscribe_owner(client)

    def action_write_to_stream(self, route: bytes, client: Client, message: mlm.StreamSend) -> None:
        stream = client.writer
        if stream is None:
            raise Refused("no stream: send STREAM_WRITE before STREAM_SEND")
        stream.messages += 1
        readers = stream.readers.match(message.subject)
        if not readers:
            return
        frames = [
            client.deliver_prefix + mlm.encode_string(message.subject),
            *message.content,
        ]
        send = self._sink.send
        delivered = 0
        for reader in readers:
            if reader is client:
                continue
            if reader.credit is not None:
                if reader.credit <= 0:
                    # Counted until the journal can replay what was missed.
                    stream.dropped += 1
                    reader.dropped += 1
                    self.counters.stream_dropped += 1
                    continue
                reader.credit -= 1
            send(reader.route, frames)
            delivered += 1
        stream.delivered += delivered
        self.counters.stream_delivered += delivered

    def action_write_to_mailbox(
        self, route: bytes, client: Client, message: mlm.MailboxSend
    ) -> None:
        self._check_name("mailbox address", message.address)
        letter = self._letter(Kind.MAILBOX, client, message)
        mailbox = self.mailboxes.get(message.address)
        if mailbox is None:
            mailbox = LetterQueue(
                f"mailbox {message.address!r}",
                self.limits.mailbox_max_messages,
                self.limits.mailbox_max_bytes,
            )
            self.mailboxes[message.address] = mailbox
        self._enqueue(mailbox, letter)
        self.counters.mailbox_stored += 1
        owner = self.addresses.get(message.address)
        if owner is not None:
            self._deliver_mail(owner, mailbox)

    def action_write_to_service(
        self, route: bytes, client: Client, message: mlm.ServiceSend
    ) -> None:
        self._check_name("service address", message.address)
        letter = self._letter(Kind.SERVICE, client, message)
        service = self._service(message.address)
        self._enqueue(service.queue, letter)
        self.counters.service_queued += 1
        self._dispatch(service)

    def action_store_offer(self, route: bytes, client: Client, message: mlm.ServiceOffer) -> None:
        self._check_name("service address", message.address)
        self._check_subscription(client, message.pattern)
        service = self._service(message.address)
        if service.offers.subscribe(client, message.pattern):
            client.offers.setdefault(service.name, set()).add(message.pattern)

    def action_dispatch_offered(self, route: bytes, client: Client, message: object) -> None:
        for name in client.offers:
            self._dispatch(self.services[name])

    def action_deliver_mail(self, route: bytes, client: Client, message: object) -> None:
        mailbox = self.mailboxes.get(client.address) if client.address else None
        if mailbox is not None:
            self._deliver_mail(client, mailbox)

    def action_credit(self, route: bytes, client: Client, message: mlm.Credit) -> None:
        client.credit = (client.credit or 0) + message.amount

    def action_confirm(self, route: bytes, client: Client, message: mlm.Confirm) -> None:
        letter = client.release(message.tracker)
        if letter is None:
            raise Refused(f"unknown tracker: {message.tracker!r} was not delivered to {client}")
        letter.state = LetterState.DONE
        self.counters.confirms += 1
        self._notify_sender(
            letter, message.status_code, message.status_reason or "confirmed by recipient"
        )

    # Helpers of the actions

    def _check_name(self, what: str, name: str, allow_empty: bool = False) -> None:
        if not name and not allow_empty:
            raise Refused(f"invalid {what}: it is empty")
        limit = self.limits.max_address
        if len(name.encode("utf-8", "surrogateescape")) > limit:
            raise Refused(f"invalid {what}: longer than {limit} bytes")

    def _check_subscription(self, client: Client, pattern: str) -> None:
        if client.subscriptions() >= self.limits.max_subscriptions:
            raise Refused(f"too many subscriptions: the limit is {self.limits.max_subscriptions}")
        try:
            validate_pattern(pattern)
        except PatternError as e:
            raise Refused(f"invalid pattern: {e}") from e

    def _stream(self, name: str) -> Stream:
        self._check_name("stream name", name)
        stream = self.streams.get(name)
        if stream is None:
            stream = self.streams[name] = Stream(name, self.config.match_cache)
        return stream

    def _service(self, name: str) -> Service:
        service = self.services.get(name)
        if service is None:
            service = self.services[name] = Service(
                name,
                self.limits.service_max_messages,
                self.limits.service_max_bytes,
                self.config.match_cache,
            )
        return service

    def _letter(
        self, kind: Kind, client: Client, message: mlm.MailboxSend | mlm.ServiceSend
    ) -> Letter:
        subject_bytes = len(message.subject.encode("utf-8", "surrogateescape"))
        if subject_bytes > self.limits.max_subject:
            raise Refused(f"invalid subject: longer than {self.limits.max_subject} bytes")
        deadline = self._clock.seconds() + message.timeout / 1000.0 if message.timeout else None
        return Letter(
            kind,
            client.address,
            client.route,
            message.address,
            message.subject,
            message.tracker,
            message.content,
            deadline,
        )

    def _enqueue(self, queue: LetterQueue, letter: Letter) -> None:
        try:
            queue.append(letter)
        except QueueFull as e:
            raise Refused(f"queue full: {e}; retry later") from e
        if letter.deadline is not None:
            self._deadlines.add(letter)
            self._schedule_deadline()

    def _deliver_mail(self, client: Client, mailbox: LetterQueue) -> None:
        while client.can_take():
            letter = mailbox.first()
            if letter is None:
                return
            mailbox.remove(letter)
            self._hand_over(
                client,
                letter,
                mlm.MailboxDeliver(
                    letter.sender, letter.address, letter.subject, letter.tracker, letter.content
                ),
            )
            self.counters.mailbox_delivered += 1

    def _dispatch(self, service: Service) -> None:
        """Hand queued requests to workers that match and can take them."""
        if not len(service.queue):
            return
        for letter in list(service.queue):
            worker = service.pick_worker(letter.subject)
            if worker is None:
                continue
            service.queue.remove(letter)
            self._dispatches += 1
            worker.last_dispatch = self._dispatches
            self._hand_over(
                worker,
                letter,
                mlm.ServiceDeliver(
                    letter.sender, letter.address, letter.subject, letter.tracker, letter.content
                ),
            )
            self.counters.service_delivered += 1

    def _hand_over(self, client: Client, letter: Letter, message: mlm.Message) -> None:
        # A tracked letter stays held until the recipient confirms it, so its
        # CONFIRM can reach the sender and a dead worker's request is requeued.
        if letter.tracker:
            letter.state = LetterState.HELD
            client.hold(letter)
        else:
            letter.state = LetterState.DONE
        self._deliver(client, mlm.encode(message))

    def _notify_sender(self, letter: Letter, code: int, reason: str) -> None:
        if not letter.tracker:
            return
        sender = self.addresses.get(letter.sender) if letter.sender else None
        if sender is None:
            sender = self.clients.get(letter.sender_route)
        if sender is None:
            return
        self._send(sender.route, mlm.Confirm(letter.tracker, code, _short(reason)))

    # Time

    def _schedule_deadline(self) -> None:
        when = self._deadlines.next_deadline()
        if when is None:
            return
        call = self._deadline_call
        if call is not None and call.active():
            if call.getTime() <= when:
                return
            call.cancel()
        self._deadline_call = self._clock.callLater(
            max(0.0, when - self._clock.seconds()), self._expire_letters
        )

    def _expire_letters(self) -> None:
        self._deadline_call = None
        for letter in self._deadlines.pop_due(self._clock.seconds()):
            assert letter.queue is not None
            letter.queue.remove(letter)
            letter.state = LetterState.DONE
            self.counters.expired_letters += 1
            _log.info(
                "{kind} message to {address!r} expired undelivered",
                kind=letter.kind.value,
                address=letter.address,
            )
            self._notify_sender(letter, mlm.FAILED, "expired: not delivered before its timeout")
        self._schedule_deadline()

    def expire_silent(self) -> None:
        """Expire every client silent for longer than the timeout."""
        limit = self._clock.seconds() - self.config.timeout
        for client in [c for c in self.clients.values() if c.last_seen < limit]:
            _log.info(
                "{client} expired after {timeout}s of silence",
                client=client,
                timeout=self.config.timeout,
            )
            self._event(client, Event.EXPIRED)


def _short(reason: str) -> str:
    """C{reason} cut to fit a protocol string."""
    data = reason.encode("utf-8", "surrogateescape")
    return reason if len(data) <= 255 else data[:252].decode("utf-8", "ignore") + "..."
