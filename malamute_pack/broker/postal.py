"""
Mailboxes and service queues: letters stored (journaled when there is a
journal), acknowledged to version 2 senders once durable, delivered when
their recipient can take them, held until the recipient is done with them
where that matters, requeued when a recipient is lost holding one, and
expired at their deadline.

Who holds what after a hand-over:
  - a version 2 recipient holds every letter until it answers DONE (or
    CONFIRM by tracker); losing it requeues the letter;
  - a version 1 worker holds a tracked service request until CONFIRM;
    losing it requeues the request;
  - a version 1 recipient of a tracked mailbox letter holds it only so its
    CONFIRM reaches the sender: the letter left the journal at hand-over;
  - anything else is done at hand-over and leaves the journal then.

Tests: ``tests/test_broker_model.py``, ``tests/test_broker_durable.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.client import Client, PendingAck, State
from malamute_pack.broker.deadlines import Deadlines
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.interfaces import FrameSink, Store
from malamute_pack.broker.letters import Kind, Letter, LetterQueue, LetterState, QueueFull
from malamute_pack.broker.limits import Limits
from malamute_pack.broker.services import Service
from malamute_pack.broker.streaming import check_pattern
from malamute_pack.journal import JournalError, QueuedRecord
from malamute_pack.protocol import mlm

_log = Logger()


class PostOffice:
    """
    The broker's mailboxes and services.

    @ivar addresses: open clients by address (shared with the broker), to
        deliver mail and to reach a sender with CONFIRM.
    @ivar clients: open clients by routing id (shared with the broker).
    """

    def __init__(
        self,
        sink: FrameSink,
        clock: IReactorTime,
        store: Store | None,
        limits: Limits,
        match_cache: int,
        addresses: dict[str, Client],
        clients: dict[bytes, Client],
    ) -> None:
        self._sink = sink
        self._clock = clock
        self._store = store
        self._limits = limits
        self._match_cache = match_cache
        self.addresses = addresses
        self.clients = clients
        self.mailboxes: dict[str, LetterQueue] = {}
        self.services: dict[str, Service] = {}
        self._deadlines = Deadlines()
        self._deadline_call: IDelayedCall | None = None
        self._dispatches = 0
        self._ids = itertools.count(1)  # letter ids when there is no journal
        self.stored = 0
        self.delivered = 0
        self.requeued = 0
        self.expired = 0
        self.confirms = 0
        self.journal_errors = 0

    def stop(self) -> None:
        if self._deadline_call is not None and self._deadline_call.active():
            self._deadline_call.cancel()
        self._deadline_call = None

    # Queues

    def mailbox(self, address: str) -> LetterQueue:
        mailbox = self.mailboxes.get(address)
        if mailbox is None:
            mailbox = self.mailboxes[address] = LetterQueue(
                f"mailbox {address!r}",
                self._limits.mailbox_max_messages,
                self._limits.mailbox_max_bytes,
            )
        return mailbox

    def service(self, name: str) -> Service:
        service = self.services.get(name)
        if service is None:
            service = self.services[name] = Service(
                name,
                self._limits.service_max_messages,
                self._limits.service_max_bytes,
                self._match_cache,
            )
        return service

    def _queue_of(self, letter: Letter) -> LetterQueue:
        if letter.kind is Kind.MAILBOX:
            return self.mailbox(letter.address)
        return self.service(letter.address).queue

    # Posting

    def post(self, kind: Kind, client: Client, message: mlm.MailboxSend | mlm.ServiceSend) -> None:
        """
        Store a letter from C{client}, acknowledge it to a version 2 sender
        once durable, and deliver it if its recipient can take it now.
        """
        ack = self.expect_ack(client, message.tracker) if client.version >= 2 else None
        try:
            letter = self._accept(kind, client, message, ack)
        except Refused as e:
            if ack is not None:
                self.acknowledge(client, ack, 0, mlm.FAILED, e.reason)
                e.acknowledged = True
            raise
        self.stored += 1
        if ack is not None and self._store is None:
            self.acknowledge(client, ack, letter.id, mlm.SUCCESS, "stored")
        if kind is Kind.MAILBOX:
            owner = self.addresses.get(letter.address)
            if owner is not None:
                self.deliver_mail(owner)
        else:
            self.dispatch(self.service(letter.address))

    def _accept(
        self,
        kind: Kind,
        client: Client,
        message: mlm.MailboxSend | mlm.ServiceSend,
        ack: PendingAck | None,
    ) -> Letter:
        limit = self._limits.max_subject
        if len(message.subject.encode("utf-8", "surrogateescape")) > limit:
            raise Refused(f"invalid subject: longer than {limit} bytes")
        deadline = self._clock.seconds() + message.timeout / 1000.0 if message.timeout else None
        letter = Letter(
            0,
            kind,
            client.address,
            client.route,
            message.address,
            message.subject,
            message.tracker,
            message.content,
            deadline,
        )
        queue = (
            self.mailbox(message.address) if kind is Kind.MAILBOX
            else self.service(message.address).queue
        )  # fmt: skip
        try:
            queue.append(letter)
        except QueueFull as e:
            raise Refused(f"queue full: {e}; retry later") from e
        if self._store is None:
            letter.id = next(self._ids)
        else:
            letter.id = self._store.store_queued(
                kind.value,
                letter.address,
                letter.sender,
                letter.subject,
                letter.tracker,
                deadline,
                letter.content,
                lambda error: self._durable(client, letter, ack, error),
            ).id
        if deadline is not None:
            self._deadlines.add(letter)
            self._schedule_deadline()
        return letter

    def _durable(
        self, client: Client, letter: Letter, ack: PendingAck | None, error: JournalError | None
    ) -> None:
        if error is None:
            if ack is not None:
                self.acknowledge(client, ack, letter.id, mlm.SUCCESS, "stored")
            return
        self.journal_errors += 1
        _log.error("letter {id} to {address!r} not journaled: {error}",
                   id=letter.id, address=letter.address, error=error)  # fmt: skip
        reason = f"journal error: {error.reason}; retry later"
        if letter.state is LetterState.QUEUED:
            # Not stored, not delivered: the sender's retry is its only copy.
            if letter.queue is not None:
                letter.queue.remove(letter)
            letter.state = LetterState.DONE
        elif letter.state is LetterState.DONE and not letter.requeue_on_loss:
            # Already handed to a version 1 recipient and finished: nothing is
            # left to lose, so it counts as delivered.
            if ack is not None:
                self.acknowledge(client, ack, letter.id, mlm.SUCCESS, "delivered, not journaled")
            return
        # Else a recipient holds it: the sender still hears of the failure
        # and may retry, duplicating it (at least once, never lost).
        if ack is not None:
            self.acknowledge(client, ack, 0, mlm.FAILED, reason)
        else:
            self._notify_sender(letter, mlm.FAILED, reason)

    def expect_ack(self, client: Client, tracker: str) -> PendingAck:
        """Reserve C{client}'s next STORED, so STOREDs go out in send order."""
        ack = PendingAck(tracker)
        client.acks.append(ack)
        return ack

    def acknowledge(
        self, client: Client, ack: PendingAck, letter_id: int, code: int, reason: str
    ) -> None:
        """Settle C{ack}, then send every settled STORED at the head, in order."""
        ack.id, ack.code, ack.reason = letter_id, code, reason
        acks = client.acks
        while acks and acks[0].code is not None:
            done = acks.popleft()
            if client.state is not State.GONE:
                assert done.code is not None
                stored = mlm.Stored(done.id, done.tracker, done.code, mlm.fit_string(done.reason))
                self._sink.send(client.route, mlm.encode(stored))

    # Delivery

    def deliver_mail(self, client: Client) -> None:
        """Deliver C{client}'s waiting mail while it can take it."""
        mailbox = self.mailboxes.get(client.address) if client.address else None
        if mailbox is None:
            return
        while client.can_take():
            letter = mailbox.first()
            if letter is None:
                return
            mailbox.remove(letter)
            self._hand_over(client, letter)

    def dispatch(self, service: Service) -> None:
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
            self._hand_over(worker, letter)

    def dispatch_offered(self, client: Client) -> None:
        for name in client.offers:
            self.dispatch(self.services[name])

    def _hand_over(self, client: Client, letter: Letter) -> None:
        self.delivered += 1
        message: mlm.Message
        if client.version >= 2:
            cls = mlm.MailboxRecord if letter.kind is Kind.MAILBOX else mlm.ServiceRecord
            message = cls(
                letter.id, letter.sender, letter.address, letter.subject, letter.tracker,
                letter.content,
            )  # fmt: skip
            self._hold(client, letter, requeue_on_loss=True)
        else:
            cls1 = mlm.MailboxDeliver if letter.kind is Kind.MAILBOX else mlm.ServiceDeliver
            message = cls1(
                letter.sender, letter.address, letter.subject, letter.tracker, letter.content
            )
            if letter.tracker and letter.kind is Kind.SERVICE:
                self._hold(client, letter, requeue_on_loss=True)
            else:
                self._forget(letter)
                if letter.tracker:
                    # Held only so the recipient's CONFIRM reaches the sender.
                    self._hold(client, letter, requeue_on_loss=False)
        if client.credit is not None:
            client.credit -= 1
        self._sink.send(client.route, mlm.encode(message))

    def _hold(self, client: Client, letter: Letter, requeue_on_loss: bool) -> None:
        letter.state = LetterState.HELD
        letter.requeue_on_loss = requeue_on_loss
        client.held[letter.id] = letter

    def _forget(self, letter: Letter) -> None:
        letter.state = LetterState.DONE
        if self._store is not None:
            self._store.remove_queued(letter.id)

    # Completion

    def confirm(self, client: Client, message: mlm.Confirm) -> None:
        """A recipient's CONFIRM of a tracked letter: done, and the sender hears."""
        letter = client.release(message.tracker)
        if letter is None:
            raise Refused(f"unknown tracker: {message.tracker!r} was not delivered to {client}")
        self._complete(letter, message.status_code, message.status_reason)

    def done(self, client: Client, message: mlm.Done) -> None:
        """A version 2 recipient's DONE: the letter leaves the journal."""
        letter = client.held.pop(message.id, None)
        if letter is None:
            raise Refused(f"unknown letter: {message.id} is not held by {client}")
        self._complete(letter, message.status_code, message.status_reason)

    def _complete(self, letter: Letter, code: int, reason: str) -> None:
        if letter.requeue_on_loss:
            self._forget(letter)
        letter.state = LetterState.DONE
        self.confirms += 1
        self._notify_sender(letter, code, reason or "confirmed by recipient")

    def _notify_sender(self, letter: Letter, code: int, reason: str) -> None:
        if not letter.tracker:
            return
        sender = self.addresses.get(letter.sender) if letter.sender else None
        if sender is None:
            sender = self.clients.get(letter.sender_route)
        if sender is None:
            return
        confirm = mlm.Confirm(letter.tracker, code, mlm.fit_string(reason))
        self._sink.send(sender.route, mlm.encode(confirm))

    def forget(self, client: Client) -> None:
        """A client is gone: what it held and must not lose goes back to its queue."""
        touched: set[Service] = set()
        for letter in client.held.values():
            if not letter.requeue_on_loss:
                continue
            queue = self._queue_of(letter)
            queue.requeue(letter)
            self.requeued += 1
            if letter.deadline is not None:
                self._deadlines.add(letter)
                self._schedule_deadline()
            if letter.kind is Kind.SERVICE:
                touched.add(self.service(letter.address))
        client.held.clear()
        client.acks.clear()
        for service in touched:
            self.dispatch(service)

    def restore(self, records: Iterable[QueuedRecord]) -> int:
        """Put letters recovered from the journal back in their queues (startup)."""
        count = 0
        for record in records:
            letter = Letter(
                record.id,
                Kind(record.kind),
                record.sender,
                b"",
                record.address,
                record.subject,
                record.tracker,
                list(record.content),
                record.deadline,
            )
            self._queue_of(letter).append(letter, bounded=False)
            if letter.deadline is not None:
                self._deadlines.add(letter)
            count += 1
        self._schedule_deadline()
        return count

    # Offers

    def offer(self, client: Client, name: str, pattern: str) -> None:
        check_pattern(pattern)
        service = self.service(name)
        if service.offers.subscribe(client, pattern):
            client.offers.setdefault(name, set()).add(pattern)

    def withdraw(self, client: Client) -> None:
        for name in client.offers:
            self.services[name].offers.unsubscribe_owner(client)
        client.offers.clear()

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
            self._forget(letter)
            self.expired += 1
            _log.info(
                "{kind} message to {address!r} expired undelivered",
                kind=letter.kind.value,
                address=letter.address,
            )
            self._notify_sender(letter, mlm.FAILED, "expired: not delivered before its timeout")
        self._schedule_deadline()
