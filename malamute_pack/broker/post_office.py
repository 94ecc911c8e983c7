"""
The post office: mailboxes and service queues. Letters are stored
(journaled when there is a journal), their senders get a receipt once the
letter is durable or refused, and they are delivered when their recipient
can take them, held until the recipient answers them where its session's
policy says so, requeued when a recipient is lost holding one, and expired
at their deadline.

What a hand-over leaves the broker holding is the recipient session's
policy (L{Hold}): with MLM version 2 every letter until DONE (or CONFIRM by
tracker); with version 1 a tracked service request until CONFIRM, a tracked
mailbox letter only so that its CONFIRM reaches the sender, anything else
nothing. A held letter whose recipient is lost goes back to its queue,
unless it was held only for the CONFIRM.

Tests: ``tests/unit/test_broker_model.py``, ``tests/unit/test_broker_durable.py``,
``tests/unit/test_broker_sessions.py``.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.connection import Connection
from malamute_pack.broker.deadlines import Deadlines, Leases
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.interests import Interests
from malamute_pack.broker.letters import Kind, Letter, LetterQueue, LetterState, QueueFull
from malamute_pack.broker.limits import Limits, check_name, longer_than
from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.broker.receipts import Receipt
from malamute_pack.broker.registry import Registry
from malamute_pack.broker.service import Service
from malamute_pack.broker.session import Hold
from malamute_pack.broker.stalled import Stalled
from malamute_pack.broker.streams import check_pattern
from malamute_pack.protocol import mlm
from malamute_pack.protocol.records import QueuedRecord
from malamute_pack.store import Store, StoreError

_log = Logger()

# Bytes a letter costs beyond its content (the object, its strings, its
# place in a queue and in the journal's bookkeeping), so that many tiny
# letters are bounded too.
LETTER_OVERHEAD: Final = 512

LetterMessage = mlm.MailboxSend | mlm.ServiceSend

# What an address is called in a refusal, by kind (made once, not per letter).
_ADDRESS: Final = {kind: f"{kind.value} address" for kind in Kind}


class Posted(enum.Enum):
    """What became of a letter at once."""

    STORED = "stored"  # queued for its recipient (durable once journaled)
    DELIVERED = "delivered"  # handed to its recipient at once
    REFUSED = "refused"  # not taken; its sender's receipt says why


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of L{PostOffice.post}: what became of the letter, and why if refused."""

    status: Posted
    refusal: Refused | None = None


_STORED: Final = Outcome(Posted.STORED)
_DELIVERED: Final = Outcome(Posted.DELIVERED)


class PostOffice:
    """The broker's mailboxes and services."""

    def __init__(
        self,
        clock: IReactorTime,
        store: Store | None,
        limits: Limits,
        match_cache: int,
        registry: Registry,
        stalled: Stalled,
        interests: Interests | None = None,
    ) -> None:
        self._clock = clock
        # Told of local workers' offers (the pack announces them to peers).
        self._interests = interests
        # Clients decide how many letters expire or outlive a lease: a
        # line per letter would let them fill the log.
        self._log_limit = LogLimit(clock, _log)
        self._stalled = stalled
        self._store = store
        self._limits = limits
        self._match_cache = match_cache
        self._registry = registry
        self.mailboxes: dict[str, LetterQueue] = {}
        self.services: dict[str, Service] = {}
        self._deadlines = Deadlines()
        self._leases = Leases()
        self._timer: IDelayedCall | None = None
        self._dispatches = 0
        self._ids = itertools.count(1)  # letter ids when there is no journal
        self.stored = 0
        self.stored_requests = 0  # of those stored, service requests
        self.purged = 0
        self.delivered = 0
        self.requeued = 0
        self.expired = 0
        self.confirms = 0
        self.journal_errors = 0
        self.leases_ended = 0
        # Bytes of every letter not done with yet, queued or held (with
        # LETTER_OVERHEAD each), against limits.letters_max_bytes.
        self.letter_bytes = 0

    def stop(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

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

    def _queue_of(self, kind: Kind, address: str) -> LetterQueue:
        if kind is Kind.MAILBOX:
            return self.mailbox(address)
        return self.service(address).queue

    # Posting

    def post(
        self,
        kind: Kind,
        sender: Connection,
        message: LetterMessage,
        on_behalf_of: str | None = None,
        relay: Callable[[Letter], None] | None = None,
        relay_key: tuple[str, int] | None = None,
    ) -> Outcome:
        """
        Take a letter from C{sender}: deliver it if its recipient can take
        it now, journal it if it is still kept then (queued, or held until
        answered), and settle its receipt once it is durable (at once if it
        was refused, or delivered and done with).

        @param on_behalf_of: the letter's sender address when C{sender} is
            a peer broker handing over a letter of one of its clients.
        @param relay: for a service request a peer broker handed over:
            called once it is done with here (see L{Letter.relay}).
        @param relay_key: for a letter a peer broker handed over: its
            broker id and its id there (journaled with the letter).
        """
        # Its receipt is made once its fate is known, later in this call:
        # still in send order, and most are settled there and then.
        try:
            letter = self._accept(kind, sender, message, on_behalf_of, relay, relay_key)
        except Refused as e:
            self._settle_now(sender, message.tracker, 0, e.code, e.reason)
            # The outcome outlives this frame: kept with its traceback (and
            # its cause's), the refusal would hold the frames that hold the
            # message, up to MiBs, in a reference cycle only the collector
            # frees.
            e.__traceback__ = e.__cause__ = e.__context__ = None
            return Outcome(Posted.REFUSED, refusal=e)
        self.stored += 1
        store = self._store
        if store is None:
            self._settle_now(sender, message.tracker, letter.id, mlm.SUCCESS, "stored")
        if kind is Kind.MAILBOX:
            owner = self._registry.holder(letter.address)
            if owner is not None:
                self.deliver_mail(owner)
        else:
            self.stored_requests += 1
            self.dispatch(self.service(letter.address))
        if store is not None:
            if letter.charged:
                self._journal(store, sender, letter, relay_key)
            else:
                # Delivered and done with already (no answer awaited): the
                # journal would only write it and delete it; nothing of it
                # is left to lose.
                self._settle_now(sender, message.tracker, letter.id, mlm.SUCCESS, "stored")
        return _STORED if letter.state is LetterState.QUEUED else _DELIVERED

    def refuse(self, sender: Connection, message: LetterMessage, refusal: Refused) -> None:
        """A letter was refused before it reached the post office: its receipt says so."""
        self._settle_now(sender, message.tracker, 0, refusal.code, refusal.reason)

    def _accept(
        self,
        kind: Kind,
        sender: Connection,
        message: LetterMessage,
        on_behalf_of: str | None = None,
        relay: Callable[[Letter], None] | None = None,
        relay_key: tuple[str, int] | None = None,
    ) -> Letter:
        limits = self._limits
        check_name(_ADDRESS[kind], message.address, limits.max_address)
        if longer_than(message.subject, limits.max_subject):
            raise Refused(f"invalid subject: longer than {limits.max_subject} bytes")
        now = self._clock.seconds()
        deadline = now + message.timeout / 1000.0 if message.timeout else None
        letter = Letter(
            0,
            kind,
            sender.address if on_behalf_of is None else on_behalf_of,
            message.address,
            message.subject,
            message.tracker,
            message.content,
            deadline,
            sender.session,
            relay=relay,
            relay_key=relay_key,
            created=now,
        )
        cost = letter.size + LETTER_OVERHEAD
        if self.letter_bytes + cost > limits.letters_max_bytes:
            raise Refused(
                f"memory full: the broker holds {self.letter_bytes} bytes of letters,"
                f" its limit is {limits.letters_max_bytes}; retry later"
            )
        try:
            self._queue_of(kind, message.address).append(letter)
        except QueueFull as e:
            raise Refused(f"queue full: {e}; retry later") from e
        self._charge(letter, cost)
        # Numbered now, journaled once post knows it is still kept.
        letter.id = next(self._ids) if self._store is None else self._store.queued_id()
        if deadline is not None:
            self._deadlines.add(letter)
            self._schedule()
        return letter

    def _journal(
        self,
        store: Store,
        sender: Connection,
        letter: Letter,
        relay_key: tuple[str, int] | None,
    ) -> None:
        """
        Journal C{letter}, still kept (queued, or held until answered): its
        sender's receipt waits for the commit.
        """
        receipt = sender.receipts.expect(letter.tracker)
        letter.journaled = True
        store.store_queued(
            letter.kind.value,
            letter.address,
            letter.sender,
            letter.subject,
            letter.tracker,
            letter.deadline,
            letter.content,
            lambda error: self._durable(sender, letter, receipt, error),
            *(relay_key or ("", 0)),
            letter.id,
        )

    def _charge(self, letter: Letter, cost: int) -> None:
        letter.charged = cost
        self.letter_bytes += cost

    def _durable(
        self, sender: Connection, letter: Letter, receipt: Receipt, error: StoreError | None
    ) -> None:
        if error is None:
            self._settle(sender, receipt, letter.id, mlm.SUCCESS, "stored")
            return
        self.journal_errors += 1
        _log.error(
            "letter {id} to {address!r} not journaled: {error}",
            id=letter.id,
            address=letter.address,
            error=error,
        )
        if letter.state is LetterState.DONE and not letter.requeue_on_loss:
            # Already handed over and finished with: nothing is left to lose.
            self._settle(sender, receipt, letter.id, mlm.SUCCESS, "delivered, not journaled")
            return
        if letter.state is LetterState.QUEUED:
            # Not stored, not delivered: the sender's retry is its only copy.
            if letter.queue is not None:
                letter.queue.remove(letter)
            self._done(letter)
        # Else a recipient holds it: the sender still hears of the failure
        # and may retry, duplicating it (at least once, never lost).
        self._settle(sender, receipt, 0, mlm.FAILED, f"journal error: {error.reason}; retry later")

    def _settle(
        self, sender: Connection, receipt: Receipt, letter_id: int, code: int, reason: str
    ) -> None:
        """Settle C{receipt}; the sender gets every receipt now due, in send order."""
        self._tell(sender, sender.receipts.settle(receipt, letter_id, code, reason))

    def _settle_now(
        self, sender: Connection, tracker: str, letter_id: int, code: int, reason: str
    ) -> None:
        """A letter's receipt, settled as it is made; as L{_settle}."""
        self._tell(sender, sender.receipts.settled(tracker, letter_id, code, reason))

    def _tell(self, sender: Connection, ready: list[Receipt]) -> None:
        if sender.gone:
            return
        for settled in ready:
            sender.session.stored(settled)

    # Delivery

    def deliver_mail(self, connection: Connection) -> None:
        """Deliver C{connection}'s waiting mail while it can take it."""
        mailbox = self.mailboxes.get(connection.address) if connection.address else None
        if mailbox is None:
            return
        while connection.can_take():
            letter = mailbox.first()
            if letter is None or not self._hand_over(connection, letter):
                return

    def dispatch(self, service: Service) -> None:
        """Hand queued requests to workers that match and can take them."""
        if not len(service.queue):
            return
        for letter in list(service.queue):
            # A worker that cannot take it is stalled, so the next pick is another.
            local_only = letter.relay is not None
            while (worker := service.pick_worker(letter.subject, local_only)) is not None:
                if self._hand_over(worker, letter):
                    self._dispatches += 1
                    worker.last_dispatch = self._dispatches
                    break

    def dispatch_offered(self, connection: Connection) -> None:
        for name in connection.offers:
            self.dispatch(self.services[name])

    def _hand_over(self, recipient: Connection, letter: Letter) -> bool:
        """
        Send C{letter}, still in its queue, to C{recipient}; on success it
        leaves the queue and is held or done with as the recipient's
        session says. False if the session could not take it: the letter
        stays where it was and the recipient is stalled.
        """
        session = recipient.session
        if not session.deliver_letter(letter):
            self._stalled.add(recipient)
            return False
        assert letter.queue is not None
        letter.queue.remove(letter)
        self.delivered += 1
        hold = session.hold(letter)
        if hold is Hold.UNTIL_ANSWERED:
            self._hold(recipient, letter, requeue_on_loss=True)
        else:
            self._forget(letter)
            if hold is Hold.FOR_CONFIRM:
                self._hold(recipient, letter, requeue_on_loss=False)
        recipient.took()
        return True

    def _hold(self, recipient: Connection, letter: Letter, requeue_on_loss: bool) -> None:
        letter.state = LetterState.HELD
        letter.requeue_on_loss = requeue_on_loss
        letter.holder = recipient
        recipient.held[letter.id] = letter
        lease = self._limits.service_lease
        if lease and requeue_on_loss and letter.kind is Kind.SERVICE:
            letter.lease_until = self._clock.seconds() + lease
            self._leases.add(letter)
            self._schedule()

    def _forget(self, letter: Letter) -> None:
        """C{letter} is done with: out of the journal and the memory budget."""
        self._done(letter)
        if letter.journaled:
            assert self._store is not None
            self._store.remove_queued(letter.id)
        if letter.relay is not None:
            relay, letter.relay = letter.relay, None
            relay(letter)

    # Letters handed to a peer broker (a remote connection holds them)

    def passed_on(self, holder: Connection, letter_id: int) -> bool:
        """
        The peer broker behind C{holder} has the letter C{letter_id} now
        (stored durably there, or finished by a worker there): it is done
        with here, and its sender hears nothing of it from here. False if
        C{holder} does not hold it.
        """
        letter = holder.held.pop(letter_id, None)
        if letter is None:
            return False
        self._forget(letter)
        letter.holder = None
        letter.lease_until = None
        return True

    def taken_back(self, holder: Connection, letter_id: int) -> bool:
        """
        The peer broker behind C{holder} refused the letter C{letter_id}
        (its queue was full...): back at the front of its queue here, for
        whoever can take it next. False if C{holder} does not hold it.
        """
        letter = holder.held.pop(letter_id, None)
        if letter is None:
            return False
        service = self._requeue(letter)
        if service is not None:
            self.dispatch(service)
        return True

    def _done(self, letter: Letter) -> None:
        """C{letter} is done with: its bytes go back to the budget, its content is dropped."""
        letter.state = LetterState.DONE
        self.letter_bytes -= letter.charged
        letter.charged = 0
        letter.content = ()  # a letter kept for its CONFIRM needs no content

    def purge(self, queue: LetterQueue) -> tuple[int, int]:
        """
        Drop every letter waiting in C{queue} (an operator's purge): gone
        for good, out of the journal and the memory budget; a tracked
        letter's sender hears that it failed. Letters a recipient holds
        stay with it. The letters and content bytes dropped.
        """
        letters = list(queue)
        size = queue.bytes
        for letter in letters:
            queue.remove(letter)
            self._forget(letter)
            self._notify_sender(letter, mlm.FAILED, "purged by an operator")
        self.purged += len(letters)
        return len(letters), size

    # Completion

    def confirm(self, recipient: Connection, message: mlm.Confirm) -> None:
        """A recipient's CONFIRM of a tracked letter: done, and the sender hears."""
        letter = recipient.release(message.tracker)
        if letter is None:
            raise Refused(f"unknown tracker: {message.tracker!r} was not delivered to {recipient}")
        self._complete(letter, message.status_code, message.status_reason)

    def done(self, recipient: Connection, message: mlm.Done) -> None:
        """A recipient's DONE: the letter leaves the journal."""
        letter = recipient.held.pop(message.id, None)
        if letter is None:
            raise Refused(f"unknown letter: {message.id} is not held by {recipient}")
        self._complete(letter, message.status_code, message.status_reason)

    def _complete(self, letter: Letter, code: int, reason: str) -> None:
        if letter.requeue_on_loss:
            self._forget(letter)
        self._done(letter)
        letter.holder = None
        letter.lease_until = None
        self.confirms += 1
        self._notify_sender(letter, code, reason or "confirmed by recipient")

    def _notify_sender(self, letter: Letter, code: int, reason: str) -> None:
        """Tell a tracked letter's sender, wherever it is now connected, of its end."""
        if not letter.tracker:
            return
        sender = self._registry.holder(letter.sender) if letter.sender else None
        if sender is None and letter.origin is not None:
            sender = self._registry.get(letter.origin)
        if sender is not None:
            sender.session.confirm(letter.tracker, code, reason)

    def forget(self, connection: Connection) -> None:
        """A connection is gone: what it held and must not lose goes back to its queue."""
        touched: set[Service] = set()
        for letter in connection.held.values():
            if letter.requeue_on_loss:
                service = self._requeue(letter)
                if service is not None:
                    touched.add(service)
        connection.held.clear()
        connection.receipts.clear()
        for service in touched:
            self.dispatch(service)
        # An empty mailbox whose holder left is nothing to keep: without
        # this every short-lived address (a `malamute status`) stays forever.
        mailbox = self.mailboxes.get(connection.address) if connection.address else None
        if mailbox is not None and not mailbox:
            del self.mailboxes[connection.address]

    def _requeue(self, letter: Letter) -> Service | None:
        """Put a letter its recipient lost back at the front of its queue; its service."""
        self._queue_of(letter.kind, letter.address).requeue(letter)
        letter.holder = None
        letter.lease_until = None
        self.requeued += 1
        if letter.deadline is not None:
            self._deadlines.add(letter)  # still its one entry if it never left
            self._schedule()
        return self.service(letter.address) if letter.kind is Kind.SERVICE else None

    def restore(self, records: Iterable[QueuedRecord]) -> int:
        """Put letters recovered from the journal back in their queues (startup)."""
        count = 0
        for record in records:
            kind = Kind(record.kind)
            letter = Letter(
                record.id,
                kind,
                record.sender,
                record.address,
                record.subject,
                record.tracker,
                record.content,
                record.deadline,
                relay_key=(record.relay_origin, record.relay_id) if record.relay_origin else None,
                created=record.created,
                journaled=True,
            )
            self._queue_of(kind, letter.address).append(letter, bounded=False)
            self._charge(letter, letter.size + LETTER_OVERHEAD)
            if letter.deadline is not None:
                self._deadlines.add(letter)
            count += 1
        self._schedule()
        return count

    # Offers

    def offer(self, worker: Connection, name: str, pattern: str) -> None:
        check_pattern(pattern)
        service = self.service(name)
        if service.offers.subscribe(worker, pattern):
            worker.offers.setdefault(name, set()).add(pattern)
            if self._interests is not None and not worker.remote:
                self._interests.offered(name, pattern, 1)

    def unoffer(self, worker: Connection, name: str, pattern: str) -> None:
        """Withdraw one offer of C{worker} (all of them: L{withdraw})."""
        patterns = worker.offers.get(name)
        if not patterns or pattern not in patterns:
            return
        patterns.discard(pattern)
        if not patterns:
            del worker.offers[name]
        self.services[name].offers.unsubscribe(worker, pattern)
        if self._interests is not None and not worker.remote:
            self._interests.offered(name, pattern, -1)

    def withdraw(self, worker: Connection) -> None:
        for name, patterns in worker.offers.items():
            self.services[name].offers.unsubscribe_owner(worker)
            if self._interests is not None and not worker.remote:
                for pattern in patterns:
                    self._interests.offered(name, pattern, -1)
        worker.offers.clear()

    # Time: deadlines of queued letters, leases of held service requests

    def _schedule(self) -> None:
        """Have the clock wake us for the next deadline or lease, whichever is first."""
        times = [
            t for t in (self._deadlines.next_time(), self._leases.next_time()) if t is not None
        ]
        if not times:
            return
        when = min(times)
        call = self._timer
        if call is not None and call.active():
            if call.getTime() <= when:
                return
            call.cancel()
        self._timer = self._clock.callLater(max(0.0, when - self._clock.seconds()), self._on_time)

    def _on_time(self) -> None:
        self._timer = None
        now = self._clock.seconds()
        try:
            for letter in self._deadlines.pop_due(now):
                self._expire(letter)
            touched = {self._end_lease(letter) for letter in self._leases.pop_due(now)}
            for service in touched:
                self.dispatch(service)
        finally:
            self._schedule()

    def _expire(self, letter: Letter) -> None:
        if letter.queue is not None:
            letter.queue.remove(letter)
        self._forget(letter)
        self.expired += 1
        self._log_limit.info(
            "expired",
            "{kind} message to {address!r} expired undelivered",
            kind=letter.kind.value,
            address=letter.address,
        )
        self._notify_sender(letter, mlm.FAILED, "expired: not delivered before its timeout")

    def _end_lease(self, letter: Letter) -> Service:
        """A worker held a request past its lease: it goes back to the queue."""
        holder = letter.holder
        if holder is not None and holder.held.get(letter.id) is letter:
            del holder.held[letter.id]
        self.leases_ended += 1
        self._log_limit.info(
            "lease",
            "service request {id} to {address!r} held by {holder} past its lease of {lease}s:"
            " back in the queue",
            id=letter.id,
            address=letter.address,
            holder=holder,
            lease=self._limits.service_lease,
        )
        service = self._requeue(letter)
        assert service is not None
        return service
