"""
The command channel: the connection's state, applied from the table in
L{malamute_pack.client.machine}, and the commands that expect OK or ERROR.
One is outstanding at a time; later ones wait in a queue. When the broker
answers ERROR 500 (it does not know us: it restarted, or it expired us) the
channel opens again and replays the settings its owner recorded, one at a
time, before the queued commands go on; a command cut short by that ERROR
is sent again once after the replay.

With several endpoints (an L{EndpointRing}: a primary/backup pair) the
channel applies the fail-over table, L{FAILOVER_MACHINE}: a broker that
answers ERROR 503 (not active), is silent, or does not answer
CONNECTION_OPEN within its share of the connect timeout is left for the
next endpoint (the owner makes the new connection), where the channel opens
and replays as after ERROR 500. So is one whose connection breaks (the
owner's socket monitor tells: L{CommandChannel.connection_lost}), or where
no connection comes up for CONNECTION_OPEN to be queued on (the owner's
socket queues only on a connection that is up: L{ChannelOwner.try_send})
within a short grace for the handshake, L{HANDSHAKE_GRACE} after the
connection was made; one that comes up in time
(L{CommandChannel.connection_made}) takes the CONNECTION_OPEN at once.

Each input becomes one event (an answer is told apart by what it answers);
the table's row for (state, event) gives the actions, run in order, and the
next state, which is then applied. The application's callbacks (command
results, the close() callers) run after that, so they always see the state
the row led to; an event raised meanwhile (by an action, or by a callback
calling the channel again) is handled once the current one is done.

What the actions need from the other parts of the client (the heartbeat,
the credit, the outbox, the recorded settings) they ask of the
L{ChannelOwner}.

Tests: ``tests/unit/test_client_channel.py``, ``tests/unit/test_client_machine.py``.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from twisted.logger import Logger

from malamute_pack.client.endpoints import BACK_OFF, HANDSHAKE_GRACE, NOT_ACTIVE, EndpointRing
from malamute_pack.client.errors import (
    BrokerUnreachableError,
    ClientClosedError,
    ClientError,
    MalamuteError,
)
from malamute_pack.client.heartbeat import Clock
from malamute_pack.client.machine import (
    FAILOVER_MACHINE,
    MACHINE,
    NOTIFICATIONS,
    Action,
    ClientState,
    Event,
)
from malamute_pack.client.options import ClientOptions
from malamute_pack.client.subscriptions import SETTINGS, ReplayStep, Setting
from malamute_pack.protocol import mlm

_log = Logger()

_CLOSE_FRAMES: Final = mlm.encode(mlm.ConnectionClose())

# Called once with None (success) or the error that ended a command.
Done = Callable[[ClientError | None], None]


@dataclass(eq=False, slots=True)
class Command:
    """
    A message that expects OK or ERROR; C{done} is None for the channel's
    own (a reopen, a replayed setting). C{fallback} is what a replay sends
    instead if the broker refuses it.
    """

    message: mlm.Message
    done: Done | None
    retried: bool = False
    fallback: Setting | None = None


# What an event carries: the command asked for, the broker's ERROR, or (for
# the fail-over events of the owner and the timers) why the endpoint failed,
# or (DEADLINE of CONNECTING ahead of time) the error connect() fails with.
Payload = Command | mlm.Error | str | ClientError | None


class ChannelOwner(Protocol):
    """What the channel's actions ask of the rest of the client."""

    def send_frames(self, frames: list[bytes]) -> None:
        """Send one message to the broker."""

    def start_heartbeat(self) -> None:
        """The broker accepted us: ping from now on."""

    def stop_heartbeat(self) -> None:
        """No more pings: the client is closing."""

    def flush(self) -> None:
        """The connection is usable: send the credit and messages held meanwhile."""

    def regrant_credit(self) -> None:
        """A new broker session: grant again the credit left."""

    def forget_given_back(self) -> None:
        """
        A new broker session: the group records that came on the last one
        and wait for the application were given back to their groups (the
        broker forgot that session, or this client left it): drop them.
        """

    def record_setting(self, setting: Setting) -> None:
        """The broker accepted C{setting}: keep it for replay."""

    def replay_plan(self) -> list[ReplayStep]:
        """What to send again, in order, once the broker accepted us again."""

    def resend_unstored(self) -> None:
        """The broker forgot us: unacknowledged sends go again after the replay."""

    def awaiting_stored(self) -> bool:
        """Whether a send still waits for its STORED."""

    def drop_sends(self) -> None:
        """The client closed: sends still waiting fail (after CLOSED is applied)."""

    def connect_to(self, endpoint: str) -> None:
        """
        Leave the current endpoint (what is queued for it is dropped) and
        connect to C{endpoint}; silence counts from now.
        """

    def try_send(self, frames: list[bytes]) -> bool:
        """
        (Several endpoints) send one message if the connection can take it
        now; False, and nothing sent, if it is not up (yet).
        """


class UnreachableEvent(RuntimeError):
    """An event happened in a state whose table has no row for it: a bug."""


class CommandChannel:
    """
    One connection's state and commands.

    @ivar state: the current L{ClientState}.
    @ivar reconnects: how many times the broker forgot us (or we moved to
        another endpoint) and a broker accepted us again.
    @ivar observer: if set, called with (state, event, next state) after each
        transition (for tests and debugging).
    """

    def __init__(
        self,
        clock: Clock,
        owner: ChannelOwner,
        options: ClientOptions,
        endpoints: EndpointRing | None = None,
    ) -> None:
        """
        @param endpoints: the brokers to fail over between; with one (or
            None), the channel never changes endpoint.
        """
        self._clock = clock
        self._owner = owner
        self._options = options
        self._ring = EndpointRing(()) if endpoints is None else endpoints
        self.state = ClientState.START
        self.reconnects = 0
        self.observer: Callable[[ClientState, Event, ClientState], None] | None = None
        self._outstanding: Command | None = None
        self._queue: deque[Command] = deque()
        self._replaying: deque[Command] = deque()
        self._close_waiters: list[Done] = []
        self._deadline: float | None = None  # of CONNECTING or CLOSING
        # With several endpoints: when the endpoint counts as silent, or the
        # back-off ends, and the event it then raises.
        self._attempt: tuple[float, Event] | None = None
        self._last_failure = ""  # why the last endpoint was left, for connect()'s error
        self._refusal_logged = ""  # the last refusal logged (each is logged once)
        # With several endpoints: when the connection to the current endpoint
        # was made, and, while CONNECTION_OPEN (outstanding) waits for it to
        # come up, when the endpoint counts as unreachable.
        self._grace = min(HANDSHAKE_GRACE, options.timeout / 4)
        self._dialled = clock.seconds()
        self._unsent: float | None = None
        self._events: deque[tuple[Event, Payload]] = deque()
        self._callbacks: list[Callable[[], None]] = []
        self._dispatching = False
        # The table with each action bound to its method, once.
        table = FAILOVER_MACHINE if self._ring.several else MACHINE
        self._rows = {
            key: (tuple(getattr(self, f"_action_{a.value}") for a in row.actions), row.next)
            for key, row in table.items()
        }

    @property
    def said_close(self) -> bool:
        """Whether CONNECTION_CLOSE went out and its answer is awaited."""
        command = self._outstanding
        return command is not None and type(command.message) is mlm.ConnectionClose

    @property
    def queued(self) -> int:
        """Commands waiting behind the outstanding one."""
        return len(self._queue)

    # Inputs

    def connect(self, done: Done) -> None:
        """Send CONNECTION_OPEN; C{done} runs when OK, ERROR or the timeout comes."""
        self._dispatch(Event.CONNECT, Command(self._open_message(), done))

    def command(self, message: mlm.Message, done: Done) -> None:
        """Send C{message} after the queued commands; C{done} runs with its result."""
        self._dispatch(Event.COMMAND, Command(message, done))

    def close(self, done: Done) -> None:
        """Close after the queued commands; C{done} runs with None once CLOSED."""
        self._dispatch(Event.CLOSE, Command(mlm.ConnectionClose(), done))

    def ok(self, message: mlm.Ok | None = None) -> None:
        """The broker said OK."""
        command = self._outstanding
        if command is None:
            event = Event.STRAY_OK
        elif type(command.message) is mlm.ConnectionOpen:
            event = Event.OPEN_OK
        elif type(command.message) is mlm.ConnectionClose:
            event = Event.CLOSE_OK
        else:
            event = Event.OK
        self._dispatch(event, None)

    def error(self, message: mlm.Error) -> None:
        """The broker said ERROR."""
        command = self._outstanding
        invalid = message.status_code == mlm.COMMAND_INVALID
        if self._ring.several and message.status_code == NOT_ACTIVE:
            event = Event.NOT_ACTIVE
        elif command is None:
            event = Event.INVALID if invalid else Event.STRAY_ERROR
        elif type(command.message) is mlm.ConnectionOpen:
            event = Event.OPEN_INVALID if invalid else Event.OPEN_REFUSED
        elif type(command.message) is mlm.ConnectionClose:
            event = Event.CLOSE_ERROR
        elif invalid and not command.retried:
            event = Event.INVALID
        else:
            event = Event.REFUSED
        self._dispatch(event, message)

    def heard(self, message: mlm.Message) -> None:
        """
        C{message} arrived (before it is handled): an ERROR 500 says the
        broker does not know us, anything else that it does.
        """
        if self.state in _HEARING and not (
            type(message) is mlm.Error
            and (
                message.status_code == mlm.COMMAND_INVALID
                or (self._ring.several and message.status_code == NOT_ACTIVE)
            )
        ):
            self._dispatch(Event.HEARD, None)

    def sends_stored(self) -> None:
        """The last send waiting for its STORED got it."""
        self._dispatch(Event.SENDS_STORED, None)

    def connection_made(self) -> None:
        """
        (Several endpoints) the connection to the current endpoint is up: a
        CONNECTION_OPEN waiting for it goes now.
        """
        if self._unsent is not None and self._try_open():
            self._unsent = None

    def connection_lost(self) -> None:
        """(Several endpoints) the connection to the current endpoint broke."""
        self._dispatch(Event.LOST, "the connection broke")

    def refused(self, error: ClientError) -> None:
        """
        The broker refused the connection's security handshake (the owner's
        socket monitor says so; ZeroMQ does not try again): connect() fails
        with C{error} now instead of at its timeout. Later (a reconnection
        meeting new credentials on the broker) it is logged: the client
        stays as silence leaves it.
        """
        if self.state is ClientState.CONNECTING:
            self._deadline = None
            self._dispatch(Event.DEADLINE, error)
        elif str(error) != self._refusal_logged:
            self._refusal_logged = str(error)
            _log.error("{error}", error=error)

    def silence(self) -> None:
        """Nothing was heard from the broker for the timeout."""
        self._dispatch(Event.SILENCE, None)

    def wakeup_at(self) -> float | None:
        """
        When L{on_time} should run next for the connect or close timeout
        (or, with several endpoints, an endpoint's time to answer or to
        take CONNECTION_OPEN, or the back-off).
        """
        attempt = None if self._attempt is None else self._attempt[0]
        times = [t for t in (self._deadline, self._unsent, attempt) if t is not None]
        return min(times) if times else None

    def on_time(self, now: float) -> None:
        """Run the connect or close timeout (or a fail-over timer) if it is due."""
        if self._deadline is not None and now >= self._deadline:
            self._deadline = None
            self._dispatch(Event.DEADLINE, None)
        elif self._unsent is not None and now >= self._unsent:
            self._unsent = None
            if not self._try_open():  # a last try: the connection may be up unannounced
                self._dispatch(Event.UNCONNECTED, f"no connection within {self._grace:g}s")
        elif self._attempt is not None and now >= self._attempt[0]:
            event = self._attempt[1]
            self._attempt = None
            self._dispatch(event, None)

    # The engine

    def _dispatch(self, event: Event, payload: Payload) -> None:
        self._events.append((event, payload))
        if self._dispatching:
            return  # handled once the current event is done
        self._dispatching = True
        try:
            while self._events or self._callbacks:
                while self._events:
                    self._apply(*self._events.popleft())
                callbacks, self._callbacks = self._callbacks, []
                for callback in callbacks:
                    callback()
        finally:
            self._dispatching = False

    def _apply(self, event: Event, payload: Payload) -> None:
        before = self.state
        row = self._rows.get((before, event))
        if row is None:
            if event in NOTIFICATIONS:
                return
            raise UnreachableEvent(f"no row for {event.name} in state {before.name}")
        actions, after = row
        for action in actions:
            action(payload)
        self.state = after
        if self.observer is not None:
            self.observer(before, event, after)

    def _raise(self, event: Event, payload: Payload = None) -> None:
        """Handle C{event} once the current one is done."""
        self._events.append((event, payload))

    def _later(self, done: Done | None, result: ClientError | None) -> None:
        """Call C{done} with C{result} once the next state is applied."""
        if done is not None:
            self._callbacks.append(functools.partial(done, result))

    def _open_message(self) -> mlm.ConnectionOpen:
        return mlm.ConnectionOpen(version=self._options.version, address=self._options.address)

    def _send_outstanding(self, command: Command) -> None:
        self._outstanding = command
        self._owner.send_frames(mlm.encode(command.message))

    def _send_open(self, command: Command) -> None:
        """
        Send CONNECTION_OPEN; with several endpoints, if no connection is up
        to take it, it waits for one until the grace after the connection
        was made (or, that being over, the endpoint failed now).
        """
        self._outstanding = command
        self._unsent = None
        if not self._ring.several:
            self._owner.send_frames(mlm.encode(command.message))
            return
        if self._try_open():
            return
        due = self._dialled + self._grace
        if self._clock.seconds() < due:
            self._unsent = due
        else:
            self._raise(Event.UNCONNECTED, f"no connection within {self._grace:g}s")

    def _try_open(self) -> bool:
        """
        (Several endpoints) send the outstanding CONNECTION_OPEN if a
        connection takes it (True too if it is no longer outstanding).
        """
        command = self._outstanding
        if command is None or type(command.message) is not mlm.ConnectionOpen:
            return True  # answered meanwhile (without the socket saying it was up)
        return self._owner.try_send(mlm.encode(command.message))

    def _take_outstanding(self) -> Command:
        command = self._outstanding
        assert command is not None, "the table runs this only with a command outstanding"
        self._outstanding = None
        return command

    def _fail_waiting(self, error: ClientError) -> None:
        waiting = [c for c in (self._outstanding, *self._queue) if c is not None]
        self._outstanding = None
        self._queue.clear()
        for command in waiting:
            self._later(command.done, error)

    def _unreachable(self) -> BrokerUnreachableError:
        return BrokerUnreachableError(f"nothing heard from the broker for {self._options.timeout}s")

    # Actions (the table names them; each takes the event's payload)

    def _action_send_open(self, payload: Payload) -> None:
        assert isinstance(payload, Command)
        self._deadline = self._clock.seconds() + self._options.timeout
        self._send_open(payload)

    def _action_refuse_connect(self, payload: Payload) -> None:
        assert isinstance(payload, Command)
        self._later(payload.done, ClientClosedError(f"connect() in state {self.state.value}"))

    def _action_enqueue(self, payload: Payload) -> None:
        assert isinstance(payload, Command)
        self._queue.append(payload)

    def _action_send_next(self, payload: Payload) -> None:
        self._send_outstanding(self._queue.popleft())

    def _action_refuse_closed(self, payload: Payload) -> None:
        assert isinstance(payload, Command)
        self._later(payload.done, ClientClosedError("the client is not open"))

    def _action_refuse_unreachable(self, payload: Payload) -> None:
        assert isinstance(payload, Command)
        self._later(payload.done, self._unreachable())

    def _action_record(self, payload: Payload) -> None:
        assert self._outstanding is not None
        setting = self._outstanding.message
        assert isinstance(setting, SETTINGS)
        self._owner.record_setting(setting)

    def _action_complete(self, payload: Payload) -> None:
        self._later(self._take_outstanding().done, None)

    def _action_fail(self, payload: Payload) -> None:
        assert isinstance(payload, mlm.Error)
        error = MalamuteError(payload.status_code, payload.status_reason)
        self._later(self._take_outstanding().done, error)

    def _action_time_out_open(self, payload: Payload) -> None:
        if isinstance(payload, ClientError):  # ended early: the broker refused us
            self._later(self._take_outstanding().done, payload)
            return
        if self._ring.several:
            last = f" (the last: {self._last_failure})" if self._last_failure else ""
            error = BrokerUnreachableError(
                f"no broker at {', '.join(self._ring.endpoints)} accepted CONNECTION_OPEN "
                f"within {self._options.timeout}s{last}"
            )
        else:
            error = BrokerUnreachableError(
                f"no answer to CONNECTION_OPEN within {self._options.timeout}s"
            )
        self._later(self._take_outstanding().done, error)

    def _action_pump(self, payload: Payload) -> None:
        if self._queue:
            self._raise(Event.NEXT)

    def _action_cancel_deadline(self, payload: Payload) -> None:
        self._deadline = None
        self._attempt = None
        self._unsent = None

    def _action_start_heartbeat(self, payload: Payload) -> None:
        self._owner.start_heartbeat()

    def _action_flush(self, payload: Payload) -> None:
        self._owner.flush()

    def _action_ignore_stray(self, payload: Payload) -> None:
        if isinstance(payload, mlm.Error):
            _log.warn(
                "ERROR with no command outstanding ignored: {code} {reason}",
                code=payload.status_code,
                reason=payload.status_reason,
            )
        else:
            _log.info(
                "OK with no command outstanding ignored (state {state})", state=self.state.value
            )

    def _action_retry_after_reopen(self, payload: Payload) -> None:
        command = self._take_outstanding()
        command.retried = True
        self._queue.appendleft(command)

    def _action_reopen(self, payload: Payload) -> None:
        if isinstance(payload, mlm.Error):
            _log.info("the broker does not know us (ERROR 500): opening again")
        self._attempt = None  # a back-off: the broker answered first
        self._replaying.clear()
        self._owner.resend_unstored()
        self._send_open(Command(self._open_message(), None))

    def _action_count_reconnect(self, payload: Payload) -> None:
        self.reconnects += 1

    def _action_forget_given_back(self, payload: Payload) -> None:
        self._owner.forget_given_back()

    def _action_regrant_credit(self, payload: Payload) -> None:
        self._owner.regrant_credit()

    def _action_start_replay(self, payload: Payload) -> None:
        plan = self._owner.replay_plan()
        _log.info("the broker accepted us again; replaying {n} settings", n=len(plan))
        self._replaying = deque(Command(s.setting, None, fallback=s.fallback) for s in plan)

    def _action_replay_next(self, payload: Payload) -> None:
        self._outstanding = None
        if self._replaying:
            self._send_outstanding(self._replaying.popleft())
            return
        _log.info("reconnected and replayed; {n} commands waiting", n=len(self._queue))
        self._raise(Event.REPLAYED)

    def _action_fall_back(self, payload: Payload) -> None:
        assert isinstance(payload, mlm.Error)
        command = self._take_outstanding()
        _log.warn(
            "the broker refused the replayed {name}: {code} {reason}",
            name=mlm.MESSAGE_NAMES[command.message.ID],
            code=payload.status_code,
            reason=payload.status_reason,
        )
        if command.fallback is not None:
            # Resuming from a position was refused (e.g. no journal): subscribe
            # as the application first did.
            self._replaying.appendleft(Command(command.fallback, None))

    def _action_resume(self, payload: Payload) -> None:
        _log.info("the broker answers again")
        self._attempt = None

    def _action_warn_silence(self, payload: Payload) -> None:
        _log.warn(
            "nothing heard from the broker for {timeout}s: connection lost",
            timeout=self._options.timeout,
        )

    def _action_warn_lost(self, payload: Payload) -> None:
        _log.warn("the connection to the broker at {at} broke", at=self._ring.current)

    def _action_warn_open_refused(self, payload: Payload) -> None:
        assert isinstance(payload, mlm.Error)
        _log.warn(
            "the broker refused our new CONNECTION_OPEN: {code} {reason}",
            code=payload.status_code,
            reason=payload.status_reason,
        )

    def _action_lose(self, payload: Payload) -> None:
        self._replaying.clear()
        self._fail_waiting(self._unreachable())

    def _action_wait_for_close(self, payload: Payload) -> None:
        assert isinstance(payload, Command) and payload.done is not None
        self._close_waiters.append(payload.done)

    def _action_proceed_to_close(self, payload: Payload) -> None:
        if self._outstanding is not None:
            return  # its answer proceeds
        if self._queue:
            self._send_outstanding(self._queue.popleft())
            return
        if self._deadline is None:
            self._deadline = self._clock.seconds() + self._options.close_timeout
            self._owner.stop_heartbeat()
        if self._owner.awaiting_stored():
            return  # CONNECTION_CLOSE goes when the last STORED comes
        self._send_outstanding(Command(mlm.ConnectionClose(), None))

    def _action_say_close(self, payload: Payload) -> None:
        self._owner.send_frames(list(_CLOSE_FRAMES))

    def _action_give_up_closing(self, payload: Payload) -> None:
        _log.info(
            "no OK to CONNECTION_CLOSE (or no STORED for every send) within {t}s; closing anyway",
            t=self._options.close_timeout,
        )
        if self._outstanding is None:
            self._owner.send_frames(list(_CLOSE_FRAMES))

    def _action_finish_close(self, payload: Payload) -> None:
        self._deadline = None
        self._attempt = None
        self._unsent = None
        self._replaying.clear()
        self._owner.stop_heartbeat()
        self._fail_waiting(ClientClosedError("the client was closed"))
        self._callbacks.append(self._owner.drop_sends)

    def _action_release_waiters(self, payload: Payload) -> None:
        waiters, self._close_waiters = self._close_waiters, []
        for done in waiters:
            self._later(done, None)

    # Fail-over actions (several endpoints only)

    def _action_await_answer(self, payload: Payload) -> None:
        # Each endpoint gets its share, so that connect() reaches the last in time.
        share = self._options.timeout / len(self._ring.endpoints)
        self._attempt = (self._clock.seconds() + share, Event.NO_ANSWER)

    def _action_fail_over(self, payload: Payload) -> None:
        self._attempt = None
        self._unsent = None
        if isinstance(payload, mlm.Error):
            why = f"ERROR {payload.status_code} {payload.status_reason}"
        elif isinstance(payload, str):
            why = payload
        elif self.state is ClientState.CONNECTING:
            why = "no answer to CONNECTION_OPEN"
        else:
            why = f"nothing heard for {self._options.timeout}s"
        self._last_failure = f"{self._ring.current}: {why}"
        left = self._ring.current
        round_failed = self._ring.failed()
        _log.info(
            "leaving the broker at {left} ({why}); next: {next}",
            left=left,
            why=why,
            next=self._ring.current,
        )
        self._raise(Event.ROUND_FAILED if round_failed else Event.MOVE_ON)

    def _action_switch(self, payload: Payload) -> None:
        self._ring.switched()
        self._dialled = self._clock.seconds()
        self._owner.connect_to(self._ring.current)

    def _action_resend_open(self, payload: Payload) -> None:
        command = self._outstanding
        assert command is not None and type(command.message) is mlm.ConnectionOpen
        self._send_open(command)

    def _action_back_off(self, payload: Payload) -> None:
        _log.warn(
            "no broker at {endpoints} serves us; trying again in {delay}s",
            endpoints=", ".join(self._ring.endpoints),
            delay=BACK_OFF,
        )
        self._attempt = (self._clock.seconds() + BACK_OFF, Event.BACKED_OFF)

    def _action_arrived(self, payload: Payload) -> None:
        self._ring.accepted()
        self._last_failure = ""


# States in which hearing from the broker is an event (the same in both tables).
_HEARING: Final = frozenset(state for state, event in MACHINE if event is Event.HEARD)


def _check_actions(channel: type[CommandChannel]) -> None:
    """Every action of the table has its method: a typo fails here, at import."""
    missing = [
        a.value for a in Action if not callable(getattr(channel, f"_action_{a.value}", None))
    ]
    if missing:
        raise ImportError(f"{channel.__name__} has no method for the actions {missing}")


_check_actions(CommandChannel)
