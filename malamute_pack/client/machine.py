"""
The client connection's state machine, as a table in the manner of libmlm's
``mlm_client.xml``: for each (state, event), the actions to run, in order,
and the next state. L{malamute_pack.client.channel.CommandChannel} applies
it; this module is data only.

::

    START --CONNECT--> CONNECTING --OPEN_OK--> CONNECTED <--OK/REFUSED-- CONFIRMING
                                                  |  --COMMAND/NEXT-->  |
              (ERROR 500: INVALID, in CONNECTED, CONFIRMING, RECONNECTING, DISCONNECTED)
        RECONNECTING: OPEN again, then replay every setting --REPLAYED--> CONNECTED
              (nothing heard for the timeout: SILENCE)
        DISCONNECTED: keep pinging --HEARD--> CONNECTED (the broker still knows us)
        CLOSING: finish the queued commands, wait for the last STOREDs,
                 CONNECTION_CLOSE --CLOSE_OK/CLOSE_ERROR/DEADLINE/SILENCE--> CLOSED

Events are what the channel was asked (CONNECT, COMMAND, CLOSE), what the
broker answered, told apart by what it answers (OK to CONNECTION_OPEN is
OPEN_OK, OK to a command OK, OK to CONNECTION_CLOSE CLOSE_OK, OK with
nothing outstanding STRAY_OK; ERROR likewise, ERROR 500 being INVALID: the
broker does not know us), time (DEADLINE of CONNECTING or CLOSING, SILENCE
for the timeout) and follow-ups the actions raise (NEXT: a queued command
can go; REPLAYED: the replay is over). The NOTIFICATIONS (HEARD: something
arrived; SENDS_STORED: no send waits for its STORED any more) matter in a
few states only: elsewhere they have no row and mean nothing. Any other
(state, event) without a row cannot happen (``tests/unit/test_client_machine.py``
lists why for each); the channel raises L{UnreachableEvent} if one does.

With several endpoints (a primary/backup pair, L{EndpointRing}) the
channel applies L{FAILOVER_MACHINE} instead: the same table with rows for
moving to the next endpoint. There, ERROR 503 (the broker is the passive
one: NOT_ACTIVE), no answer to CONNECTION_OPEN within the endpoint's share
of the connect timeout (NO_ANSWER), SILENCE, the connection breaking (LOST:
the DEALER's monitor says so at once, e.g. when the broker was killed) and
no connection coming up for CONNECTION_OPEN to be queued on within a short
grace (UNCONNECTED: nobody listens there) make the client leave the
endpoint (FAIL_OVER), then open on the next (MOVE_ON): connect() tries
every endpoint in turn until its timeout, and a connection that was open
reopens and replays on the next one (RECONNECTING) instead of waiting for
the broker it lost. When every endpoint failed in a row (ROUND_FAILED), the
client waits a short back-off (BACKED_OFF) before going round again;
commands waiting then fail as after SILENCE (DISCONNECTED).

::

    CONNECTING --NOT_ACTIVE/NO_ANSWER/LOST/UNCONNECTED--> FAIL_OVER
               --MOVE_ON--> CONNECTION_OPEN on the next
    CONNECTED/CONFIRMING --NOT_ACTIVE/SILENCE/LOST--> RECONNECTING on the next
    RECONNECTING --NOT_ACTIVE/SILENCE/LOST/UNCONNECTED--> RECONNECTING on the next
    RECONNECTING --ROUND_FAILED--> DISCONNECTED --BACKED_OFF--> RECONNECTING

Besides the tables, four sets of states say how the rest of the client
behaves in each: whether input is read at all (LISTENING), whether silence
counts (WATCHED), whether messages go out at once (USABLE) or wait
(HOLDING).

Tests: ``tests/unit/test_client_machine.py``.
"""

from __future__ import annotations

import enum
from typing import Final, NamedTuple


class ClientState(enum.Enum):
    START = "start"  # not connected yet
    CONNECTING = "connecting"  # CONNECTION_OPEN sent, waiting for OK
    CONNECTED = "connected"  # open, no command outstanding
    CONFIRMING = "confirming"  # open, one command waiting for OK or ERROR
    RECONNECTING = "reconnecting"  # the broker forgot us: opening again and replaying
    DISCONNECTED = "disconnected"  # nothing heard for the timeout: waiting for the broker
    CLOSING = "closing"  # close() called: last commands, last STOREDs, CONNECTION_CLOSE
    CLOSED = "closed"


class Event(enum.Enum):
    CONNECT = "connect"  # connect() called
    COMMAND = "command"  # a command that expects OK/ERROR was asked for
    CLOSE = "close"  # close() called
    OPEN_OK = "open_ok"  # OK to CONNECTION_OPEN
    OPEN_REFUSED = "open_refused"  # ERROR other than 500 to CONNECTION_OPEN
    OPEN_INVALID = "open_invalid"  # ERROR 500 to CONNECTION_OPEN
    OK = "ok"  # OK to a command or a replayed setting
    REFUSED = "refused"  # ERROR to it (a 500 only if the command was already retried)
    INVALID = "invalid"  # ERROR 500 otherwise: the broker does not know us
    CLOSE_OK = "close_ok"  # OK to CONNECTION_CLOSE
    CLOSE_ERROR = "close_error"  # ERROR to CONNECTION_CLOSE
    STRAY_OK = "stray_ok"  # OK with no command outstanding
    STRAY_ERROR = "stray_error"  # ERROR other than 500 with no command outstanding
    SILENCE = "silence"  # nothing heard from the broker for the timeout
    DEADLINE = "deadline"  # the connect or close timeout passed
    NEXT = "next"  # a queued command can go now
    REPLAYED = "replayed"  # every setting was sent again
    HEARD = "heard"  # something other than ERROR 500 arrived
    SENDS_STORED = "sends_stored"  # the last send waiting for its STORED got it
    # With several endpoints only (FAILOVER_MACHINE):
    NOT_ACTIVE = "not_active"  # ERROR 503: this broker does not serve (a passive)
    NO_ANSWER = "no_answer"  # no answer to CONNECTION_OPEN within the endpoint's share
    LOST = "lost"  # the connection to the endpoint broke (its monitor said so)
    UNCONNECTED = "unconnected"  # no connection came up to queue CONNECTION_OPEN on in time
    MOVE_ON = "move_on"  # follow-up: open on the next endpoint now
    ROUND_FAILED = "round_failed"  # follow-up: every endpoint failed in a row
    BACKED_OFF = "backed_off"  # the back-off after a failed round is over


class Action(enum.Enum):
    """The channel's actions; each value names a method C{_action_<value>}."""

    SEND_OPEN = "send_open"  # CONNECTION_OPEN, with the connect timeout
    REFUSE_CONNECT = "refuse_connect"
    ENQUEUE = "enqueue"
    SEND_NEXT = "send_next"  # the queue's first command
    REFUSE_CLOSED = "refuse_closed"  # fail the command: not open
    REFUSE_UNREACHABLE = "refuse_unreachable"  # fail the command: broker silent
    RECORD = "record"  # the outstanding setting was accepted: keep it for replay
    COMPLETE = "complete"  # the outstanding command succeeded
    FAIL = "fail"  # the outstanding command failed with the broker's ERROR
    TIME_OUT_OPEN = "time_out_open"  # connect() failed: no answer in time
    PUMP = "pump"  # raise NEXT if a command waits
    CANCEL_DEADLINE = "cancel_deadline"
    START_HEARTBEAT = "start_heartbeat"
    FLUSH = "flush"  # send the credit and the messages held meanwhile
    IGNORE_STRAY = "ignore_stray"
    RETRY_AFTER_REOPEN = "retry_after_reopen"  # the cut-short command goes first again
    REOPEN = "reopen"  # CONNECTION_OPEN again; unacknowledged sends go again later
    COUNT_RECONNECT = "count_reconnect"
    REGRANT_CREDIT = "regrant_credit"
    # Group records not yet handed over came on the connection the broker
    # forgot (or left): it gave them back to the group; dropped.
    FORGET_GIVEN_BACK = "forget_given_back"
    START_REPLAY = "start_replay"  # take the replay plan
    REPLAY_NEXT = "replay_next"  # its next step, or raise REPLAYED
    FALL_BACK = "fall_back"  # a refused step is replaced by its fallback, if any
    RESUME = "resume"
    WARN_SILENCE = "warn_silence"
    WARN_LOST = "warn_lost"  # (several endpoints only) the connection broke
    WARN_OPEN_REFUSED = "warn_open_refused"
    LOSE = "lose"  # fail what waits: the broker is unreachable
    WAIT_FOR_CLOSE = "wait_for_close"  # the close() caller waits for CLOSED
    PROCEED_TO_CLOSE = "proceed_to_close"  # next command, or wait for STOREDs, or CLOSE
    SAY_CLOSE = "say_close"  # CONNECTION_CLOSE, without waiting for its OK
    GIVE_UP_CLOSING = "give_up_closing"  # close timeout: CONNECTION_CLOSE if not sent yet
    FINISH_CLOSE = "finish_close"  # fail what waits, stop the timers
    RELEASE_WAITERS = "release_waiters"  # the close() callers hear it is closed
    # With several endpoints only (FAILOVER_MACHINE):
    AWAIT_ANSWER = "await_answer"  # the endpoint's share of the connect timeout starts
    FAIL_OVER = "fail_over"  # leave the endpoint: raise MOVE_ON, or ROUND_FAILED
    SWITCH = "switch"  # a new connection, to the next endpoint
    RESEND_OPEN = "resend_open"  # connect()'s CONNECTION_OPEN again, on the new connection
    BACK_OFF = "back_off"  # wait before going round again
    ARRIVED = "arrived"  # the endpoint accepted us: failures count from zero again


class Row(NamedTuple):
    actions: tuple[Action, ...]
    next: ClientState


_S = ClientState
_E = Event
_A = Action

# Ending: every waiting command and send fails, then close() returns.
_CLOSE_NOW: Final = (_A.FINISH_CLOSE, _A.RELEASE_WAITERS)
_USABLE_AGAIN: Final = (_A.FLUSH, _A.PUMP)

MACHINE: Final[dict[tuple[ClientState, Event], Row]] = {
    (_S.START, _E.CONNECT): Row((_A.SEND_OPEN,), _S.CONNECTING),
    (_S.START, _E.COMMAND): Row((_A.REFUSE_CLOSED,), _S.START),
    (_S.START, _E.CLOSE): Row((_A.WAIT_FOR_CLOSE, *_CLOSE_NOW), _S.CLOSED),
    #
    (_S.CONNECTING, _E.CONNECT): Row((_A.REFUSE_CONNECT,), _S.CONNECTING),
    (_S.CONNECTING, _E.COMMAND): Row((_A.ENQUEUE,), _S.CONNECTING),
    (_S.CONNECTING, _E.CLOSE): Row((_A.WAIT_FOR_CLOSE, *_CLOSE_NOW), _S.CLOSED),
    (_S.CONNECTING, _E.OPEN_OK): Row(
        (_A.CANCEL_DEADLINE, _A.START_HEARTBEAT, _A.COMPLETE, *_USABLE_AGAIN), _S.CONNECTED
    ),
    (_S.CONNECTING, _E.OPEN_REFUSED): Row((_A.FAIL, *_CLOSE_NOW), _S.CLOSED),
    (_S.CONNECTING, _E.OPEN_INVALID): Row((_A.FAIL, *_CLOSE_NOW), _S.CLOSED),
    (_S.CONNECTING, _E.DEADLINE): Row((_A.TIME_OUT_OPEN, *_CLOSE_NOW), _S.CLOSED),
    #
    (_S.CONNECTED, _E.CONNECT): Row((_A.REFUSE_CONNECT,), _S.CONNECTED),
    (_S.CONNECTED, _E.COMMAND): Row((_A.ENQUEUE, _A.SEND_NEXT), _S.CONFIRMING),
    (_S.CONNECTED, _E.NEXT): Row((_A.SEND_NEXT,), _S.CONFIRMING),
    (_S.CONNECTED, _E.CLOSE): Row((_A.WAIT_FOR_CLOSE, _A.PROCEED_TO_CLOSE), _S.CLOSING),
    (_S.CONNECTED, _E.STRAY_OK): Row((_A.IGNORE_STRAY,), _S.CONNECTED),
    (_S.CONNECTED, _E.STRAY_ERROR): Row((_A.IGNORE_STRAY,), _S.CONNECTED),
    (_S.CONNECTED, _E.INVALID): Row((_A.REOPEN,), _S.RECONNECTING),
    (_S.CONNECTED, _E.SILENCE): Row((_A.WARN_SILENCE, _A.LOSE), _S.DISCONNECTED),
    #
    (_S.CONFIRMING, _E.CONNECT): Row((_A.REFUSE_CONNECT,), _S.CONFIRMING),
    (_S.CONFIRMING, _E.COMMAND): Row((_A.ENQUEUE,), _S.CONFIRMING),
    # The outstanding command and those queued before close() still go.
    (_S.CONFIRMING, _E.CLOSE): Row((_A.WAIT_FOR_CLOSE,), _S.CLOSING),
    (_S.CONFIRMING, _E.OK): Row((_A.RECORD, _A.COMPLETE, _A.PUMP), _S.CONNECTED),
    (_S.CONFIRMING, _E.REFUSED): Row((_A.FAIL, _A.PUMP), _S.CONNECTED),
    (_S.CONFIRMING, _E.INVALID): Row((_A.RETRY_AFTER_REOPEN, _A.REOPEN), _S.RECONNECTING),
    (_S.CONFIRMING, _E.SILENCE): Row((_A.WARN_SILENCE, _A.LOSE), _S.DISCONNECTED),
    #
    (_S.RECONNECTING, _E.CONNECT): Row((_A.REFUSE_CONNECT,), _S.RECONNECTING),
    (_S.RECONNECTING, _E.COMMAND): Row((_A.ENQUEUE,), _S.RECONNECTING),
    # The broker may know us by now; tell it, without waiting.
    (_S.RECONNECTING, _E.CLOSE): Row((_A.WAIT_FOR_CLOSE, _A.SAY_CLOSE, *_CLOSE_NOW), _S.CLOSED),
    (_S.RECONNECTING, _E.OPEN_OK): Row(
        (
            _A.COUNT_RECONNECT,
            _A.FORGET_GIVEN_BACK,
            _A.REGRANT_CREDIT,
            _A.START_REPLAY,
            _A.REPLAY_NEXT,
        ),
        _S.RECONNECTING,
    ),
    # Refused for real (e.g. the client limit): wait for the broker and try again.
    (_S.RECONNECTING, _E.OPEN_REFUSED): Row((_A.WARN_OPEN_REFUSED, _A.LOSE), _S.DISCONNECTED),
    # A 500 before the new OPEN's OK answers something sent before it: stale.
    (_S.RECONNECTING, _E.OPEN_INVALID): Row((), _S.RECONNECTING),
    (_S.RECONNECTING, _E.OK): Row((_A.REPLAY_NEXT,), _S.RECONNECTING),
    (_S.RECONNECTING, _E.REFUSED): Row((_A.FALL_BACK, _A.REPLAY_NEXT), _S.RECONNECTING),
    (_S.RECONNECTING, _E.INVALID): Row((_A.REOPEN,), _S.RECONNECTING),
    (_S.RECONNECTING, _E.REPLAYED): Row(_USABLE_AGAIN, _S.CONNECTED),
    (_S.RECONNECTING, _E.SILENCE): Row((_A.WARN_SILENCE, _A.LOSE), _S.DISCONNECTED),
    #
    (_S.DISCONNECTED, _E.CONNECT): Row((_A.REFUSE_CONNECT,), _S.DISCONNECTED),
    (_S.DISCONNECTED, _E.COMMAND): Row((_A.REFUSE_UNREACHABLE,), _S.DISCONNECTED),
    (_S.DISCONNECTED, _E.CLOSE): Row((_A.WAIT_FOR_CLOSE, *_CLOSE_NOW), _S.CLOSED),
    # It answers and still knows us: carry on, no replay.
    (_S.DISCONNECTED, _E.HEARD): Row((_A.RESUME, *_USABLE_AGAIN), _S.CONNECTED),
    (_S.DISCONNECTED, _E.INVALID): Row((_A.REOPEN,), _S.RECONNECTING),
    #
    (_S.CLOSING, _E.CONNECT): Row((_A.REFUSE_CONNECT,), _S.CLOSING),
    (_S.CLOSING, _E.COMMAND): Row((_A.REFUSE_CLOSED,), _S.CLOSING),
    (_S.CLOSING, _E.CLOSE): Row((_A.WAIT_FOR_CLOSE,), _S.CLOSING),
    (_S.CLOSING, _E.OK): Row((_A.RECORD, _A.COMPLETE, _A.PROCEED_TO_CLOSE), _S.CLOSING),
    (_S.CLOSING, _E.REFUSED): Row((_A.FAIL, _A.PROCEED_TO_CLOSE), _S.CLOSING),
    (_S.CLOSING, _E.SENDS_STORED): Row((_A.PROCEED_TO_CLOSE,), _S.CLOSING),
    (_S.CLOSING, _E.STRAY_OK): Row((_A.IGNORE_STRAY,), _S.CLOSING),
    # Any ERROR, or nothing more to wait for: closed, whatever the broker said.
    (_S.CLOSING, _E.STRAY_ERROR): Row(_CLOSE_NOW, _S.CLOSED),
    (_S.CLOSING, _E.INVALID): Row(_CLOSE_NOW, _S.CLOSED),
    (_S.CLOSING, _E.CLOSE_OK): Row(_CLOSE_NOW, _S.CLOSED),
    (_S.CLOSING, _E.CLOSE_ERROR): Row(_CLOSE_NOW, _S.CLOSED),
    (_S.CLOSING, _E.DEADLINE): Row((_A.GIVE_UP_CLOSING, *_CLOSE_NOW), _S.CLOSED),
    (_S.CLOSING, _E.SILENCE): Row(_CLOSE_NOW, _S.CLOSED),
    #
    (_S.CLOSED, _E.CONNECT): Row((_A.REFUSE_CONNECT,), _S.CLOSED),
    (_S.CLOSED, _E.COMMAND): Row((_A.REFUSE_CLOSED,), _S.CLOSED),
    (_S.CLOSED, _E.CLOSE): Row((_A.WAIT_FOR_CLOSE, _A.RELEASE_WAITERS), _S.CLOSED),
}

# With several endpoints: the rows that differ, or that only fail-over has.
FAILOVER_MACHINE: Final[dict[tuple[ClientState, Event], Row]] = {
    **MACHINE,
    (_S.START, _E.CONNECT): Row((_A.SEND_OPEN, _A.AWAIT_ANSWER), _S.CONNECTING),
    (_S.CONNECTING, _E.OPEN_OK): Row(
        (_A.CANCEL_DEADLINE, _A.ARRIVED, _A.START_HEARTBEAT, _A.COMPLETE, *_USABLE_AGAIN),
        _S.CONNECTED,
    ),
    (_S.CONNECTING, _E.NOT_ACTIVE): Row((_A.FAIL_OVER,), _S.CONNECTING),
    (_S.CONNECTING, _E.NO_ANSWER): Row((_A.FAIL_OVER,), _S.CONNECTING),
    # Lost while backing off too: on to the next endpoint at once.
    (_S.CONNECTING, _E.LOST): Row((_A.FAIL_OVER,), _S.CONNECTING),
    (_S.CONNECTING, _E.UNCONNECTED): Row((_A.FAIL_OVER,), _S.CONNECTING),
    (_S.CONNECTING, _E.MOVE_ON): Row((_A.SWITCH, _A.RESEND_OPEN, _A.AWAIT_ANSWER), _S.CONNECTING),
    # Connect to the first again now; open there after the back-off.
    (_S.CONNECTING, _E.ROUND_FAILED): Row((_A.SWITCH, _A.BACK_OFF), _S.CONNECTING),
    (_S.CONNECTING, _E.BACKED_OFF): Row((_A.RESEND_OPEN, _A.AWAIT_ANSWER), _S.CONNECTING),
    #
    (_S.CONNECTED, _E.SILENCE): Row((_A.WARN_SILENCE, _A.FAIL_OVER), _S.RECONNECTING),
    (_S.CONNECTED, _E.NOT_ACTIVE): Row((_A.FAIL_OVER,), _S.RECONNECTING),
    (_S.CONNECTED, _E.LOST): Row((_A.WARN_LOST, _A.FAIL_OVER), _S.RECONNECTING),
    #
    (_S.CONFIRMING, _E.SILENCE): Row(
        (_A.WARN_SILENCE, _A.RETRY_AFTER_REOPEN, _A.FAIL_OVER), _S.RECONNECTING
    ),
    (_S.CONFIRMING, _E.NOT_ACTIVE): Row((_A.RETRY_AFTER_REOPEN, _A.FAIL_OVER), _S.RECONNECTING),
    (_S.CONFIRMING, _E.LOST): Row(
        (_A.WARN_LOST, _A.RETRY_AFTER_REOPEN, _A.FAIL_OVER), _S.RECONNECTING
    ),
    #
    (_S.RECONNECTING, _E.OPEN_OK): Row(
        (
            _A.ARRIVED,
            _A.COUNT_RECONNECT,
            _A.FORGET_GIVEN_BACK,
            _A.REGRANT_CREDIT,
            _A.START_REPLAY,
            _A.REPLAY_NEXT,
        ),
        _S.RECONNECTING,
    ),
    (_S.RECONNECTING, _E.SILENCE): Row((_A.WARN_SILENCE, _A.FAIL_OVER), _S.RECONNECTING),
    (_S.RECONNECTING, _E.NOT_ACTIVE): Row((_A.FAIL_OVER,), _S.RECONNECTING),
    (_S.RECONNECTING, _E.LOST): Row((_A.WARN_LOST, _A.FAIL_OVER), _S.RECONNECTING),
    (_S.RECONNECTING, _E.UNCONNECTED): Row((_A.FAIL_OVER,), _S.RECONNECTING),
    (_S.RECONNECTING, _E.MOVE_ON): Row((_A.SWITCH, _A.REOPEN), _S.RECONNECTING),
    # Nobody serves: what waits fails, as after SILENCE with one endpoint.
    (_S.RECONNECTING, _E.ROUND_FAILED): Row((_A.LOSE, _A.SWITCH, _A.BACK_OFF), _S.DISCONNECTED),
    #
    (_S.DISCONNECTED, _E.BACKED_OFF): Row((_A.REOPEN,), _S.RECONNECTING),
    # A ping answered by a passive: the back-off moves on.
    (_S.DISCONNECTED, _E.NOT_ACTIVE): Row((), _S.DISCONNECTED),
    # The connection the back-off will open on broke: that OPEN finds out.
    (_S.DISCONNECTED, _E.LOST): Row((), _S.DISCONNECTED),
    #
    (_S.CLOSING, _E.NOT_ACTIVE): Row(_CLOSE_NOW, _S.CLOSED),
    (_S.CLOSING, _E.LOST): Row(_CLOSE_NOW, _S.CLOSED),
}

# Events that have no row in most states: there they mean nothing.
NOTIFICATIONS: Final = frozenset({Event.HEARD, Event.SENDS_STORED})

# States in which input from the broker is read (before connect and after
# close it is dropped unread).
LISTENING: Final = frozenset(set(ClientState) - {ClientState.START, ClientState.CLOSED})
# States in which silence for the timeout is an event (SILENCE).
WATCHED: Final = frozenset({_S.CONNECTED, _S.CONFIRMING, _S.RECONNECTING, _S.CLOSING})
# States in which messages go to the broker at once.
USABLE: Final = frozenset({_S.CONNECTED, _S.CONFIRMING})
# States in which messages wait until the connection is usable again.
HOLDING: Final = frozenset({_S.CONNECTING, _S.RECONNECTING, _S.DISCONNECTED})
