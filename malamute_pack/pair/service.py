"""
A broker of a primary/backup pair, as a Twisted service: the Binary Star
machine (L{malamute_pack.pair.machine}) fed by the partner's heartbeats,
by the clients' requests (through L{ClientGate}) and by the clock; the
pair link (L{PairLink}); and replication (L{malamute_pack.pair.replication}),
the active's source or the passive's replica.

Becoming active: the replica stops; unless this broker led the history its
journal holds, the journal is closed and opened again as a takeover
(numbering jumps past what the old active may have handed out) and the new
history (epoch) is recorded with its takeover point; the letters, keys and
owners of addresses the journal holds go to the broker model (the passive
serves no client, so its owners are read only now, from the table the
active replicated); the services that only the active runs (the pack)
start; the gate opens. Becoming passive at start: the replica asks the
active to catch it up. An active that must yield to
its partner (two actives after a partition: the backup yields) stops the
broker: it restarts as passive and catches up, never serving beside the
partner.

Stopping itself (L{PairService.stop_broker}; the backup yielding, exit
status L{EXIT_YIELDED}, or a takeover that failed, L{EXIT_FAILED}): the
reactor stops and twistd stops the services as on SIGTERM. Whatever was
under way finishes or is abandoned first: a takeover stops at its next
step (a journal being closed for it is closed, and not opened again), and
the service stops only once it has; the journal writes what it holds and
closes. The process then exits with that status (an C{atexit} hook), and
if anything still holds it L{EXIT_GRACE_S} seconds after the stop began,
a watchdog thread says so on stderr and ends it: a broker that stopped
itself must not linger, since systemd's C{Restart=always} waits for it.

The clients' security (L{use_security}): the active sends it to the
passive after each reload of its security files and at each catch-up; the
passive puts it in force in memory (its own files are not changed), so
that it is in force on this broker if it takes over.

Tests: ``tests/system/test_pair_service.py``, ``tests/system/test_pair_system.py``,
``tests/unit/test_pair_identity.py``, ``tests/system/test_system_pair_identity.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.error import ReactorNotRunning
from twisted.internet.interfaces import IReactorCore, IReactorFDSet, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.broker.session import Receiver
from malamute_pack.datadir import learn_identity, learned_identity, pack_identity
from malamute_pack.journal.journal import Journal, Recovered
from malamute_pack.journal.sequencing import Ceiling
from malamute_pack.pair.check import write_state
from malamute_pack.pair.config import PairSettings
from malamute_pack.pair.gate import ClientGate
from malamute_pack.pair.link import PairLink
from malamute_pack.pair.machine import Action, Event, PairMachine, Role, State, Transition
from malamute_pack.pair.probe import PartnerProbe
from malamute_pack.pair.replication import (
    BEFORE_TAKEOVER,
    COMPLETE,
    EPOCH,
    LEADER,
    PREVIOUS_EPOCH,
    SERVED,
    History,
    Replica,
    ReplicationSource,
    before_takeover,
    claimed,
    security_change,
    security_state,
    set_state,
)
from malamute_pack.protocol import pair as wire
from malamute_pack.transport.curve import LinkCurve
from malamute_pack.transport.security import ClientSecurity, SecurityService

_log = Logger()

# The exit status of a broker that stopped itself: the backup yielding to an
# active partner (EX_TEMPFAIL: restart it, it comes back passive), or a
# takeover that failed.
EXIT_YIELDED = 75
EXIT_FAILED = 1
# Seconds a broker that stopped itself has to exit before its watchdog ends it.
EXIT_GRACE_S = 5.0

# Why an active refuses its clients, and what waited for its partner, while
# the partner is silent and may be alive.
_SUSPENDED = (
    "not active: this broker cannot reach its pair's partner, which may serve; connect to it"
)
_UNREACHABLE = "the pair's partner is unreachable"

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


def _as_claimed(found: Recovered) -> Recovered:
    """What the journal held when it opened, with the history it claims (L{claimed})."""
    return dataclasses.replace(found, pair=claimed(found.pair))


class PairService(Service):
    """
    One broker of the pair: C{broker} receives its clients' messages
    through L{gate}; C{restore} gets what the journal holds when this
    broker becomes active; C{active_services} run only while it is.
    """

    # The clients' security files (L{use_security}), if clients authenticate.
    _security: SecurityService | None = None

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
        curve: LinkCurve | None = None,
    ) -> None:
        """
        @param curve: the pair link's CURVE keys (C{--pair-key}: this
            broker's key pair, the partner's public key); None: an open link.
        """
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
        # The identity the pair shows other brokers (a pack), the same on
        # both, so that records forwarded by either are one origin's and the
        # two never take each other for a peer: the one a broker learned
        # from its partner while the partner was active, else the primary's
        # own (None: a backup that has heard no active yet). Read at start.
        self.shared_identity: bytes | None = None
        self._heartbeat = settings.heartbeat_ms / 1000.0
        self.machine = PairMachine(
            self.role,
            self._clock.seconds(),
            self._heartbeat,
            settings.misses,
            None if settings.alone_after_ms is None else settings.alone_after_ms / 1000.0,
        )
        self.gate = ClientGate(broker, self._client_request)
        # Whether the silent partner's process is gone (its port refuses).
        self._probe = PartnerProbe(reactor, settings.connect, self._heartbeat)  # type: ignore[arg-type]
        self.link = PairLink(
            reactor, context, settings.bind, settings.connect, self._received, curve
        )
        self.incarnation = uuid.uuid4().hex
        self.source: ReplicationSource | None = None
        self.replica: Replica | None = None
        self._recovered: Recovered | None = None
        self._loop: LoopingCall | None = None
        self._leads = False  # this journal leads the history (this broker was the last active)
        self._fresh = False  # this journal holds no history yet
        self.takeovers = 0
        self._same_role = ""  # the incarnation of the same-role broker reported last
        # What the partner's last heartbeat said its damaged journal may have
        # given (0: nothing to number past).
        self._partner_ceiling = Ceiling(0, 0)
        self._no_takeover_reported = False  # since the partner was last back
        # Its port refused connections while this broker refused its clients (logged once).
        self._gone_while_suspended = False
        self.suspensions = 0  # times it refused its clients, its partner silent
        self.activated: Deferred[None] = Deferred()
        # Fires once the takeover under way (if any) has finished or given up.
        self._activating: Deferred[None] | None = None
        # This broker asked to stop itself: its services stop on the
        # reactor's next turn (a takeover under way goes no further).
        self._stopping_itself = False
        # Stops the broker with an exit status (L{EXIT_YIELDED}...): the
        # reactor and then the process (L{_stop_process}); tests replace it.
        self.stop_broker: Callable[[int], None] = self._stop_process

    def add_active_service(self, service: Service) -> None:
        """Run C{service} only while this broker is active."""
        self._active_services.append(service)

    @property
    def active_services(self) -> tuple[Service, ...]:
        """The services that run only while this broker is active."""
        return tuple(self._active_services)

    def use_security(self, security: SecurityService) -> None:
        """
        The clients' security in force here: sent to the partner after each
        reload while this broker is active, and at each catch-up; replaced
        by the partner's while it is passive.
        """
        self._security = security
        security.reloaded.append(self._security_reloaded)

    def _security_reloaded(self, state: ClientSecurity) -> None:
        if self.source is not None and self._journal.is_open:
            self._journal.pass_to_partner(security_change(state))

    def _client_security(self) -> wire.ClientSecurity | None:
        security = self._security
        if security is None or security.clients is None:
            return None
        return security_change(security.clients)

    def _install_security(self, change: wire.ClientSecurity) -> None:
        """The active's clients' security, in force here from now on (in memory)."""
        state = security_state(change)
        if self._security is None or not self._security.install(state):
            return
        _log.info(
            "pair: the active's client security is in force here: {users} passwords,"
            " {keys} CURVE keys, access rules for {rights} rights",
            users=len(state.passwords or ()),
            keys=len(state.curve_keys or ()),
            rights=len(state.policy.rules),
        )

    def recovered(self, found: Recovered) -> None:
        """What the journal held when it opened (the JournalService's callback)."""
        found = _as_claimed(found)
        self._recovered = found
        # A journal that lost records (a damaged file, salvaged) still leads
        # the history it led: serving, it copies what it lost back from its
        # partner once that is in sync (found by the soak: the older copy
        # served instead, and what only this one held was cut back).
        self._leads = found.pair.get(LEADER) == self.role.value
        # No history yet (never paired): nothing a partner acknowledged to lack.
        self._fresh = not found.pair.get(EPOCH) and not found.losses

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
        if self._data_dir is not None:
            learned = learned_identity(self._data_dir)
            if learned is None and self.role is Role.PRIMARY:
                learned = pack_identity(self._data_dir, self._journal.identity)
            self.shared_identity = learned
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
        """
        Stop, once a takeover under way has finished or given up (it does
        at its next step, seeing this service stopped): the journal's own
        service closes the journal meanwhile, after the takeover's close
        if one is under way, and nothing opens it again.
        """
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        stopping = [
            d
            for d in (s.stopService() for s in reversed(self._active_services) if s.running)
            if isinstance(d, Deferred)
        ]
        self.link.stop()
        if self._activating is not None:
            stopping.append(self._activating)
        return DeferredList(stopping)

    def pauseReading(self) -> None:
        """The journal is behind: take nothing more from the partner meanwhile."""
        self.link.pauseReading()

    def resumeReading(self) -> None:
        self.link.resumeReading()

    # Events.

    def _in_sync(self) -> bool:
        """
        Active: whether its partner is in sync (it heard CAUGHT_UP on its
        link); passive: whether it may take over (L{Replica.may_take_over}).
        """
        if self.source is not None:
            return self.source.in_sync
        return self.replica is not None and self.replica.may_take_over

    @property
    def previous_epoch(self) -> str:
        """
        The history this broker's active took over from ("" for none): as
        active, or starting with a journal that took over (so that, of two
        starting brokers, the one that took over from the other's history
        serves, even if it stopped leading when its partner fell silent:
        found by the soak, the older one served and the newer's records
        acknowledged alone were cut back). So does a journal that lost
        records to damage: serving, it copies them back from its partner.
        """
        if self.source is not None:
            return self.source.history.previous
        found = self._recovered
        if self.replica is None and found is not None and found.pair.get(SERVED, "1") == "1":
            return found.pair.get(PREVIOUS_EPOCH, "")
        return ""

    def _tick(self) -> None:
        now = self._clock.seconds()
        machine = self.machine
        # Seen first: a stall of this process just ended is not the partner's silence.
        machine.observe(now)
        self._send_heartbeat()
        source = self.source
        if not machine.partner_alive(now):
            self._handle(Event.PEER_SILENT, now)
        if source is not None and source.holding:
            self._watch_partner(now)

    def _send_heartbeat(self) -> None:
        """Tell the partner this broker's state (each tick, and when its partner caught up)."""
        source = self.source
        self.link.send(
            wire.Heartbeat(
                self.role.value,
                self.machine.state.value,
                self._in_sync(),
                self.incarnation,
                self.epoch,
                source.link if source is not None else 0,
                self._leads,
                self.previous_epoch,
                self.shared_identity.hex().upper() if self.shared_identity else "",
                *self._ceiling(),
            )
        )

    def _ceiling(self) -> Ceiling:
        """
        The numbers this broker's journal may have given, while it starts
        with a journal that lost records to damage (0 otherwise): the salvage
        cannot tell what it had past them, so if the partner serves instead
        it numbers past them, and none is given twice.
        """
        found = self._recovered
        if self.source is None and self.replica is None and found is not None and found.losses:
            return self._journal.numbering_ceiling()
        return Ceiling(0, 0)

    def _learn_identity(self, text: str) -> None:
        """The active partner's identity, C{text} (32 hex digits), is the pair's: kept."""
        try:
            identity = bytes.fromhex(text)
        except ValueError:
            return
        if len(identity) != 16 or identity == self.shared_identity or self._data_dir is None:
            return
        learn_identity(self._data_dir, identity)
        self.shared_identity = identity
        _log.info(
            "pair: this broker shows other brokers the pair's identity {id} (its active's)",
            id=text.upper(),
        )

    def _watch_partner(self, now: float) -> None:
        """
        An active whose acknowledgements wait for its partner (in sync): is
        the partner silent? Then find out whether its process is gone (go on
        alone); until then acknowledge nothing without it, and refuse the
        clients (503) so that they turn to it: it may be cut off from this
        broker, not from them, and take over.
        """
        machine = self.machine
        if machine.partner_alive(now):
            self._serve_again()
        elif machine.alone(now):
            # Silent for alone-after (the operator's choice): a passive no
            # longer takes over (machine.safe_takeover).
            self._go_alone("silent for alone-after")
        else:
            self._probe_partner()
            if self.gate.suspended:
                self._journal.refuse_held(_UNREACHABLE)

    def _go_alone(self, why: str) -> None:
        """The partner is gone ({why}): acknowledge without it, and serve."""
        source = self.source
        if source is not None:
            source.partner_gone(why)
        self._serve_again()

    def _suspend(self) -> None:
        """Acknowledge nothing without the silent partner; refuse the clients (503)."""
        if self.gate.suspended:
            return
        _log.warn(
            "pair: the partner is silent, and its process may be alive (cut off, paused):"
            " this broker acknowledges nothing without it and refuses its clients (503),"
            " who may make the partner take over"
        )
        self.suspensions += 1
        self.gate.suspend(_SUSPENDED)
        self._journal.refuse_held(_UNREACHABLE)
        # The partner may take over meanwhile: until this broker serves again,
        # its journal does not lead (restarted alone, it would not serve).
        self._lead(False)

    def _may_serve_alone(self, now: float) -> bool:
        """
        Whether this broker, starting and hearing nobody, lacks nothing its
        partner may have acknowledged, so that it may serve alone: only if
        its journal holds no history yet (a new pair), or if the operator
        chose to go alone after a silence (alone-after) and it has lasted.
        Any other journal, even one that led when it stopped, may lack what
        the partner acknowledged after taking over since (found by the soak:
        the active killed, the backup took over and was killed in turn, the
        primary came back alone and served without what the backup had).
        """
        return self._fresh or self.machine.alone(now)

    def _lead(self, leads: bool) -> None:
        """Record in the journal whether it leads the history (L{recovered} reads it)."""
        if leads == self._leads:
            return
        self._leads = leads
        recording = self._journal.execute(set_state({LEADER: self.role.value if leads else ""}))
        recording.addErrback(
            lambda failure: _log.failure("pair: recording whether this journal leads", failure)
        )

    def _serve_again(self) -> None:
        self._gone_while_suspended = False
        if self.gate.suspended:
            self.gate.resume()
            self._lead(True)
            _log.info("pair: serving clients again")

    def _probe_partner(self) -> None:
        """
        The partner is silent: is its process gone (its pair port refuses
        connections)? Then go on alone: it comes back out of sync, and
        cannot take over what this broker acknowledges without it.
        """
        answer = self._probe.gone()
        if answer is not None:
            answer.addCallback(self._probed)

    def _probed(self, gone: bool) -> None:
        source = self.source
        if source is None or not source.holding or self._stopping():
            return
        if self.machine.partner_alive(self._clock.seconds()):
            return  # heard again meanwhile
        if not gone:
            self._suspend()
            return
        if self.gate.suspended:
            # It refused its clients, so they may have turned to the partner,
            # which may have taken over and acknowledged writes before its
            # process went (found by the soak: this broker then served its
            # older history, and those writes were lost): only the partner,
            # heard again, can say; until then acknowledge nothing.
            if not self._gone_while_suspended:
                self._gone_while_suspended = True
                _log.warn(
                    "pair: the partner's process is gone ({partner}), but it may have taken"
                    " over while this broker refused its clients: this broker waits to hear it",
                    partner=self._settings.connect,
                )
            return
        _log.warn(
            "pair: the partner's pair port refuses connections: its process is gone ({partner})",
            partner=self._settings.connect,
        )
        self._go_alone("its port refuses connections")

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
            epoch = self.epoch
            partner_newer = bool(epoch) and message.previous == epoch
            if source is not None and source.link and source.partner_incarnation:
                if message.incarnation != source.partner_incarnation and not partner_newer:
                    # The replica's process is gone (the partner restarted, and
                    # cannot take over before it has caught up): go on alone.
                    # (Unless it took over from this broker's history before
                    # it restarted: then it is the newer, and this one yields.)
                    self._go_alone("it restarted")
                elif message.state != "passive":
                    # No longer following (it took over: two actives): the
                    # link ends, and what waits for it keeps waiting (the
                    # table decides who yields; the one that does withholds it).
                    source.drop_link()
            self.machine.observe(now)
            self.machine.heard(now)
            self._partner_ceiling = Ceiling(message.ceiling, message.letter_ceiling)
            if message.state == "active" and self.machine.state is not State.ACTIVE:
                self._learn_identity(message.pack_id)
            if self.source is not None:
                self._serve_again()
            self._handle(
                event,
                now,
                Role(message.role),
                message.leads,
                partner_newer=partner_newer,
                partner_older=bool(message.epoch) and self.previous_epoch == message.epoch,
            )
            if (
                self.replica is not None
                and self.machine.state is State.PASSIVE
                and message.state == "active"
            ):
                self.replica.heartbeat_link(message.link, now, message.in_sync)
            return
        if self.source is not None:
            was_in_sync = self.source.in_sync
            self.source.receive(message)
            if self.source.in_sync and not was_in_sync:
                self._send_heartbeat()  # the partner may take over from now on: tell it at once
        elif self.replica is not None:
            self.replica.receive(message)

    def _client_request(self) -> bool:
        now = self._clock.seconds()
        self.machine.observe(now)  # a stall just ended is not the partner's silence
        transition = self._handle(Event.CLIENT_REQUEST, now)
        return Action.ACCEPT_CLIENT in transition.actions

    def _handle(
        self,
        event: Event,
        now: float,
        peer_role: Role | None = None,
        peer_leads: bool = False,
        *,
        partner_newer: bool = False,
        partner_older: bool = False,
    ) -> Transition:
        before = self.machine.state
        transition = self.machine.handle(
            event,
            now,
            peer_role=peer_role,
            in_sync=self._in_sync(),
            leads=self._may_serve_alone(now) if event is Event.CLIENT_REQUEST else self._leads,
            peer_leads=peer_leads,
            partner_newer=partner_newer,
            partner_older=partner_older,
        )
        for action in transition.actions:
            self._act(action, before, transition)
        self._record()
        return transition

    def _act(self, action: Action, before: State, transition: Transition) -> None:
        if action is Action.BECOME_ACTIVE:
            if not self._stopping():  # nothing may open the journal again
                self._begin_activation(Action.TAKE_OVER in transition.actions)
        elif action is Action.BECOME_PASSIVE:
            if before is State.ACTIVE:
                self._yield()
            else:
                self._become_passive()
        elif action is Action.REPORT_PARTNER_GONE:
            _log.warn("pair: the partner is silent (gone after {s} s)", s=self.machine.timeout)
        elif action is Action.REPORT_NO_TAKEOVER:
            if not self._no_takeover_reported:
                self._no_takeover_reported = True
                _log.error(
                    "pair: the active is silent, but this broker does not take over: it may"
                    " lack what the active acknowledged alone (it is not in sync, or it last"
                    " heard the active longer ago than alone-after); the clients wait for the"
                    " other broker, whose journal is the complete one: start it",
                )
        elif action is Action.REPORT_PARTNER_BACK:
            _log.info("pair: the partner is back")
            self._no_takeover_reported = False
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
        if self._security is not None and self._security.clients is not None:
            self.replica.on_security = self._install_security
        self.replica.hello()

    def _begin_activation(self, takeover: bool) -> None:
        """Run L{_activate}; L{_activating} fires when it is over, whatever its outcome."""
        settled: Deferred[None] = Deferred()
        self._activating = settled

        def over(_: object) -> None:
            if self._activating is settled:
                self._activating = None
            settled.callback(None)

        activation = Deferred.fromCoroutine(self._activate(takeover))
        activation.addErrback(self._activation_failed).addBoth(over)

    def _stopping(self) -> bool:
        """Whether the broker is stopping (its services, or it asked to stop itself)."""
        return self._stopping_itself or not self.running

    def _abandoned(self) -> bool:
        """Whether the broker is stopping: the takeover under way goes no further (logged)."""
        if not self._stopping():
            return False
        _log.warn("pair: the broker is stopping: the takeover under way is abandoned")
        return True

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
            if self._abandoned():
                return  # closed, and it stays so: the journal service's close waited for this one
            found = _as_claimed(journal.open(takeover=True))
            before = before_takeover(found.pair)
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
            before = ""  # the same history: nothing to claim again
            history = History.from_state(found.pair)
            if not history.epoch:
                history.epoch = uuid.uuid4().hex
        # Not yet served: if the takeover is abandoned from here on (the
        # broker stops), the journal claims no history it never served (found
        # by the soak: restarted, it made its partner, which had gone on
        # serving, yield and cut back what it acknowledged meanwhile), and
        # claims again the history it held before (L{claimed}).
        state = {**history.state(self.role.value), COMPLETE: "1", SERVED: "0"}
        await journal.execute(set_state({**state, BEFORE_TAKEOVER: before}))
        if self._abandoned():
            return  # the journal service is closing the journal
        ceiling, own = self._partner_ceiling, journal.numbering_ceiling()
        if ceiling.streams > own.streams or ceiling.letters > own.letters:
            # Found by the soak: the partner served alone, then its journal
            # was damaged and lost what only it had; this one serves its
            # older history, and must not give those numbers again.
            _log.warn(
                "pair: the partner's journal lost records to damage and may have given"
                " stream numbers up to {streams} and letter ids up to {letters}: this"
                " broker numbers past them",
                streams=ceiling.streams,
                letters=ceiling.letters,
            )
            await journal.number_past(ceiling)  # it never moves numbering back
            if self._abandoned():
                return
        # It serves from here on.
        await journal.execute(set_state({SERVED: "1", BEFORE_TAKEOVER: ""}))
        if self._abandoned():
            return
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
        self.source.security = self._client_security
        for service in self._active_services:
            service.startService()
        self.gate.open()
        self._record()
        _log.info("pair: active; serving clients")
        self.activated.callback(None)

    def _activation_failed(self, failure: Failure) -> None:
        if self._stopping():  # the journal closed under it, say: the broker stops anyway
            _log.warn(
                "pair: the broker is stopping: the takeover under way is abandoned ({error})",
                error=failure.value,
            )
            return
        _log.failure(
            "pair: becoming active failed; stopping the broker (exit status {status})",
            failure,
            status=EXIT_FAILED,
        )
        self._stopping_itself = True
        self.stop_broker(EXIT_FAILED)

    def _yield(self) -> None:
        _log.critical(
            "pair: the partner is active too and serves in this broker's place (it took over"
            " from this broker's history, or this broker is the backup): this broker stops"
            " serving now and exits (status {status}); what waited for the partner is not"
            " acknowledged; restart it and it comes back as passive and catches up",
            status=EXIT_YIELDED,
        )
        self.gate.close("not active: this broker yielded to its partner; connect to the partner")
        self._lead(False)  # the partner's history is the newer
        self._journal.withhold("this broker yielded to its pair's partner, which serves now")
        self._stopping_itself = True
        self.stop_broker(EXIT_YIELDED)

    def _stop_process(self, status: int) -> None:
        """
        Stop the reactor (twistd then stops the services: L{stopService},
        the journal writing what it holds and closing) and have the process
        exit with C{status} (L{exit_when_stopped}).
        """
        exit_when_stopped(status, EXIT_GRACE_S)
        reactor: IReactorCore = self._reactor  # type: ignore[assignment]
        if not reactor.running:
            reactor.callWhenRunning(reactor.stop)
            return
        with contextlib.suppress(ReactorNotRunning):  # stopping already
            reactor.stop()


# The status this process exits with, once exit_when_stopped was called.
_exit_status: int | None = None


def exit_when_stopped(status: int, grace: float) -> None:
    """
    End this process with C{status} once it stops: when the interpreter
    exits (twistd returned, every thread ended), an C{atexit} hook flushes
    stdout and stderr and exits with C{status}, not 0; and if it still runs
    C{grace} seconds from now (a stop that never finished: a service, a
    thread), a daemon thread says so on stderr and ends it. The first call
    of a process sets the status; later ones change nothing.
    """
    global _exit_status
    if _exit_status is not None:
        return
    _exit_status = status
    atexit.register(_exit_now, status)
    threading.Thread(
        target=_exit_later, args=(status, grace), name="pair-exit-watchdog", daemon=True
    ).start()


def _exit_now(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _exit_later(status: int, grace: float) -> None:
    time.sleep(grace)
    line = (
        f"pair: the broker stopped itself {grace:g} s ago and has not exited"
        f" (a stop that never finished): exiting now with status {status}\n"
    )
    with contextlib.suppress(OSError):
        os.write(2, line.encode())
    os._exit(status)
