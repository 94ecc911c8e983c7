"""
A broker of a primary/backup pair, as a Twisted service: the Binary Star
machine (L{malamute_pack.pair.machine}) fed by the partner's heartbeats,
by the clients' requests (through L{ClientGate}) and by the clock; the
pair link (L{PairLink}); and replication (L{malamute_pack.pair.replication}),
the active's source or the passive's replica.

Becoming active: the replica stops; unless this broker led the history its
journal holds, the journal is closed and opened again as a takeover
(numbering jumps past what the old active may have handed out) and the new
history (epoch) is recorded with its takeover point; the letters and keys
the journal holds go to the broker model; the services that only the
active runs (the pack) start; the gate opens. Becoming passive at start:
the replica asks the active to catch it up. An active that must yield to
its partner (two actives after a partition: the backup yields) stops the
broker: it restarts as passive and catches up, never serving beside the
partner.

Tests: ``tests/test_pair_service.py``, ``tests/test_pair_system.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorCore, IReactorFDSet, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.broker.session import Receiver
from malamute_pack.journal.journal import Journal, Recovered
from malamute_pack.pair.check import write_state
from malamute_pack.pair.gate import ClientGate
from malamute_pack.pair.link import PairLink
from malamute_pack.pair.machine import Action, Event, PairMachine, Role, State, Transition
from malamute_pack.pair.replication import (
    COMPLETE,
    LEADER,
    History,
    Replica,
    ReplicationSource,
    set_state,
)
from malamute_pack.protocol import pair as wire
from malamute_pack.settings import PairSettings

_log = Logger()

_PEER_EVENTS = {
    "starting": Event.PEER_STARTING,
    "active": Event.PEER_ACTIVE,
    "passive": Event.PEER_PASSIVE,
}


@dataclass(slots=True)
class PairStatus:
    """What the pair looks like from this broker (logs, stats, tests)."""

    role: str
    state: str
    partner_alive: bool
    in_sync: bool
    replication: str
    lag: int
    epoch: str
    takeovers: int
    refused_clients: int


class PairService(Service):
    """
    One broker of the pair: C{broker} receives its clients' messages
    through L{gate}; C{restore} gets what the journal holds when this
    broker becomes active; C{active_services} run only while it is.
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]],
        settings: PairSettings,
        journal: Journal,
        broker: Receiver,
        restore: Callable[[Recovered], None],
        active_services: Sequence[Service] = (),
        data_dir: Path | None = None,
    ) -> None:
        assert settings.role is not None and settings.bind and settings.connect
        self._reactor = reactor
        self._clock: IReactorTime = reactor  # type: ignore[assignment]
        self._settings = settings
        self._journal = journal
        self._restore = restore
        self._active_services = list(active_services)
        self._data_dir = data_dir
        self._recorded = ""
        self.role = Role(settings.role)
        self._heartbeat = settings.heartbeat_ms / 1000.0
        self.machine = PairMachine(
            self.role, self._clock.seconds(), self._heartbeat, settings.misses
        )
        self.gate = ClientGate(broker, self._client_request)
        self.link = PairLink(reactor, context, settings.bind, settings.connect, self._received)
        self.incarnation = uuid.uuid4().hex
        self.source: ReplicationSource | None = None
        self.replica: Replica | None = None
        self._recovered: Recovered | None = None
        self._loop: LoopingCall | None = None
        self._leads = False  # this journal leads the history (this broker was the last active)
        self.takeovers = 0
        self._same_role = ""  # the incarnation of the same-role broker reported last
        self.activated: Deferred[None] = Deferred()

    def add_active_service(self, service: Service) -> None:
        """Run C{service} only while this broker is active."""
        self._active_services.append(service)

    @property
    def active_services(self) -> tuple[Service, ...]:
        """The services that run only while this broker is active."""
        return tuple(self._active_services)

    def recovered(self, found: Recovered) -> None:
        """What the journal held when it opened (the JournalService's callback)."""
        self._recovered = found
        self._leads = found.pair.get(LEADER) == self.role.value

    @property
    def epoch(self) -> str:
        """The history this broker leads (active) or follows (passive, once caught up to it)."""
        if self.source is not None:
            return self.source.history.epoch
        if self.replica is not None and self.replica.epoch:
            return self.replica.epoch
        return "" if self._recovered is None else self._recovered.pair.get("epoch", "")

    def status(self) -> PairStatus:
        now = self._clock.seconds()
        return PairStatus(
            self.role.value,
            self.machine.state.value,
            self.machine.partner_alive(now),
            self._in_sync(),
            self._settings.replication,
            self.source.lag if self.source is not None else 0,
            self.epoch,
            self.takeovers,
            self.gate.refused,
        )

    # The service.

    def _record(self) -> None:
        """Write this broker's state for L{malamute_pack.pair.check}, when it changed."""
        if self.gate.is_open:
            state = "active"
        elif self.machine.state is State.PASSIVE:
            state = "passive"
        else:
            state = "starting"
        if state != self._recorded and self._data_dir is not None:
            self._recorded = state
            try:
                write_state(self._data_dir, state, self.role.value)
            except OSError as e:
                _log.warn("pair: could not record its state: {error}", error=e)

    def startService(self) -> None:
        self._record()
        self.link.start()
        self._loop = LoopingCall(self._tick)
        self._loop.clock = self._clock
        self._loop.start(self._heartbeat, now=True)
        _log.info(
            "pair: {role}, replication {mode}; waiting for the partner at {partner}",
            role=self.role.value,
            mode=self._settings.replication,
            partner=self._settings.connect,
        )
        super().startService()

    def stopService(self) -> Deferred[Any]:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        stopping = [
            d
            for d in (s.stopService() for s in reversed(self._active_services) if s.running)
            if isinstance(d, Deferred)
        ]
        self.link.stop()
        return DeferredList(stopping)

    def pauseReading(self) -> None:
        """The journal is behind: take nothing more from the partner meanwhile."""
        self.link.pauseReading()

    def resumeReading(self) -> None:
        self.link.resumeReading()

    # Events.

    def _in_sync(self) -> bool:
        if self.source is not None:
            return self.source.in_sync
        return self.replica is not None and self.replica.in_sync

    def _tick(self) -> None:
        now = self._clock.seconds()
        link = self.source.link if self.source is not None else 0
        self.link.send(
            wire.Heartbeat(
                self.role.value,
                self.machine.state.value,
                self._in_sync(),
                self.incarnation,
                self.epoch,
                link,
                self._leads,
            )
        )
        if not self.machine.partner_alive(now):
            self._handle(Event.PEER_SILENT, now)

    def _received(self, message: wire.PairMessage) -> None:
        now = self._clock.seconds()
        if isinstance(message, wire.Heartbeat):
            event = _PEER_EVENTS.get(message.state)
            if event is None or message.role not in ("primary", "backup"):
                return
            if message.role == self.role.value and self.machine.state is not State.STARTING:
                # Two brokers of one role: the table reports it only between
                # starting brokers; neither may pair with the other.
                if message.incarnation != self._same_role:
                    self._same_role = message.incarnation
                    _log.error(
                        "pair: a broker configured as {role} too is at {partner}: ignored;"
                        " one must be primary, the other backup",
                        role=self.role.value,
                        partner=self._settings.connect,
                    )
                return
            source = self.source
            if (
                source is not None
                and source.link
                and (
                    message.incarnation != source.partner_incarnation or message.state != "passive"
                )
            ):
                # The replica's process is gone (the partner restarted) or no
                # longer passive: what the active holds for it must not wait.
                source.partner_gone()
            self.machine.heard(now)
            self._handle(event, now, Role(message.role), message.leads)
            if (
                self.replica is not None
                and self.machine.state is State.PASSIVE
                and message.state == "active"
            ):
                self.replica.heartbeat_link(message.link, now)
            return
        if self.source is not None:
            self.source.receive(message)
        elif self.replica is not None:
            self.replica.receive(message)

    def _client_request(self) -> bool:
        transition = self._handle(Event.CLIENT_REQUEST, self._clock.seconds())
        return Action.ACCEPT_CLIENT in transition.actions

    def _handle(
        self, event: Event, now: float, peer_role: Role | None = None, peer_leads: bool = False
    ) -> Transition:
        before = self.machine.state
        transition = self.machine.handle(
            event,
            now,
            peer_role=peer_role,
            in_sync=self._in_sync(),
            leads=self._leads,
            peer_leads=peer_leads,
        )
        for action in transition.actions:
            self._act(action, before, transition)
        self._record()
        return transition

    def _act(self, action: Action, before: State, transition: Transition) -> None:
        if action is Action.BECOME_ACTIVE:
            takeover = Action.TAKE_OVER in transition.actions
            Deferred.fromCoroutine(self._activate(takeover)).addErrback(self._activation_failed)
        elif action is Action.BECOME_PASSIVE:
            if before is State.ACTIVE:
                self._yield()
            else:
                self._become_passive()
        elif action is Action.REPORT_PARTNER_GONE:
            _log.warn("pair: the partner is silent (gone after {s} s)", s=self.machine.timeout)
            if self.source is not None:
                self.source.partner_gone()
        elif action is Action.REPORT_PARTNER_BACK:
            _log.info("pair: the partner is back")
        elif action is Action.REPORT_DUAL_ACTIVE:
            _log.error(
                "pair: both brokers are active (the pair link was cut while clients used both)"
            )
        elif action is Action.REPORT_SAME_ROLE:
            _log.error(
                "pair: the partner is configured as {role} too: one must be primary, one backup",
                role=self.role.value,
            )

    # Transitions.

    def _become_passive(self) -> None:
        _log.info("pair: passive; catching up from the active")
        self._leads = False  # its catch-up makes this journal follow the active's
        self.replica = Replica(
            self._journal,
            self.link.send,
            self.incarnation,
            self._clock.seconds,
            retry_after=self.machine.timeout * 2,
        )
        self.replica.hello()

    async def _activate(self, takeover: bool) -> None:
        if self.replica is not None:
            self.replica.stop()
            self.replica = None
        journal = self._journal
        found = self._recovered
        assert found is not None, "the journal opens before the pair starts"
        if takeover or found.pair.get(LEADER, self.role.value) != self.role.value:
            # Close the journal's writes and open it again as the successor.
            await journal.close()
            found = journal.open(takeover=True)
            self.takeovers += 1
            history = History(
                uuid.uuid4().hex, found.pair.get("epoch", ""), found.lasts, found.last_id
            )
            _log.warn(
                "pair: taking over from the partner (history {prev} -> {epoch})",
                prev=history.previous or "-",
                epoch=history.epoch,
            )
        else:
            history = History.from_state(found.pair)
            if not history.epoch:
                history.epoch = uuid.uuid4().hex
        await journal.execute(set_state({**history.state(self.role.value), COMPLETE: "1"}))
        self._leads = True
        self._recovered = found
        self._restore(found)
        self.source = ReplicationSource(
            journal,
            self.link.send,
            history,
            sync=self._settings.replication == "sync",
            seconds=self._clock.seconds,
        )
        for service in self._active_services:
            service.startService()
        self.gate.open()
        self._record()
        _log.info("pair: active; serving clients")
        self.activated.callback(None)

    def _activation_failed(self, failure: Failure) -> None:
        _log.failure("pair: becoming active failed; stopping the broker", failure)
        self._stop_reactor()

    def _yield(self) -> None:
        _log.critical(
            "pair: the partner is active too and this broker is the backup: it stops "
            "serving now; restart it and it comes back as passive and catches up"
        )
        self._stop_reactor()

    def _stop_reactor(self) -> None:
        reactor: IReactorCore = self._reactor  # type: ignore[assignment]
        if reactor.running:
            reactor.stop()
