"""
Tests for L{malamute_pack.client.core}: the client's state machine driven
with a L{Clock} and frames built with the MLM codec, no sockets. The
version 1 behaviour (libmlm's vocabulary) first, then what protocol
version 2 adds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.core import ClientCore, ClientState, Done
from malamute_pack.client.endpoints import BACK_OFF, NOT_ACTIVE
from malamute_pack.client.errors import (
    BrokerUnreachableError,
    ClientClosedError,
    ClientError,
    MalamuteError,
    MessageDroppedError,
)
from malamute_pack.client.events import Confirmation, Delivery, Gap, partition
from malamute_pack.client.options import ClientOptions
from malamute_pack.protocol import mlm

_UNSET = object()


class Recorder:
    """The core's owner: keeps what the core sent and handed over."""

    def __init__(self) -> None:
        self.sent: list[mlm.Message] = []
        self.deliveries: list[Delivery] = []
        self.confirmations: list[Confirmation] = []
        self.gaps: list[Gap] = []
        self.connected_to: list[str] = []
        self.linked = True  # whether the connection is up, for try_send

    def connect_to(self, endpoint: str) -> None:
        self.connected_to.append(endpoint)

    def send_frames(self, frames: list[bytes]) -> None:
        self.sent.append(mlm.decode(frames))

    def try_send(self, frames: list[bytes]) -> bool:
        """Sent if the connection is up (C{linked})."""
        if self.linked:
            self.send_frames(frames)
        return self.linked

    def delivered(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def withdraw(self, stale: Callable[[Delivery], bool]) -> list[Delivery]:
        self.deliveries, dropped = partition(self.deliveries, stale)
        return dropped

    def confirmed(self, confirmation: Confirmation) -> None:
        self.confirmations.append(confirmation)

    def gap(self, gap: Gap) -> None:
        self.gaps.append(gap)

    def take(self) -> list[mlm.Message]:
        """What was sent since the last call."""
        sent, self.sent = self.sent, []
        return sent


class Result:
    """A command's completion callback that remembers its outcome."""

    def __init__(self) -> None:
        self.outcome: object = _UNSET

    def __call__(self, error: ClientError | None) -> None:
        assert self.outcome is _UNSET, "completed twice"
        self.outcome = error

    @property
    def done(self) -> bool:
        return self.outcome is not _UNSET


class CoreTestCase(SynchronousTestCase):
    """
    A core with address "me", timeout 5 s and heartbeat 1 s on a Clock,
    speaking protocol C{version} (1 here: libmlm's vocabulary).
    """

    version = 1

    def setUp(self) -> None:
        self.clock = Clock()
        self.owner = Recorder()
        self.core = ClientCore(
            self.clock,
            self.owner,
            ClientOptions(address="me", timeout=5.0, heartbeat=1.0, version=self.version),
        )

    def remake(self, **changes: Any) -> None:
        """A new core whose options differ by C{changes}, connected."""
        self.core = ClientCore(self.clock, self.owner, replace(self.core.options, **changes))
        self.connected()

    def reply(self, message: mlm.Message) -> None:
        self.core.receive(mlm.encode(message))

    def advance(self, seconds: float, step: float = 0.25) -> None:
        """Move time on in steps, running the core's timers as a driver would."""
        end = self.clock.seconds() + seconds
        while self.clock.seconds() < end - 1e-9:
            self.clock.advance(min(step, end - self.clock.seconds()))
            wakeup = self.core.wakeup_at()
            if wakeup is not None and self.clock.seconds() >= wakeup:
                self.core.on_time()

    def connected(self) -> None:
        result = Result()
        self.core.connect(result)
        self.reply(mlm.Ok())
        self.assertIsNone(result.outcome)
        self.owner.take()

    def setting(self, start: Callable[[Done], None], message: mlm.Message) -> Result:
        """Run one command to its OK; return its result."""
        result = Result()
        start(result)
        self.assertEqual(self.owner.take(), [message])
        self.reply(mlm.Ok())
        self.assertIsNone(result.outcome)
        return result


class ConnectTests(CoreTestCase):
    def test_openSentAndOkConnects(self) -> None:
        """connect() sends CONNECTION_OPEN with the address; OK makes it CONNECTED."""
        result = Result()
        self.core.connect(result)
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])
        self.assertIs(self.core.state, ClientState.CONNECTING)
        self.assertFalse(result.done)
        self.reply(mlm.Ok())
        self.assertIsNone(result.outcome)
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_errorFailsConnect(self) -> None:
        """ERROR to CONNECTION_OPEN fails connect() with its code and reason."""
        result = Result()
        self.core.connect(result)
        self.reply(mlm.Error(mlm.FAILED, "too many clients"))
        assert isinstance(result.outcome, MalamuteError)
        self.assertEqual((result.outcome.code, result.outcome.reason), (300, "too many clients"))
        self.assertIs(self.core.state, ClientState.CLOSED)

    def test_connectTimesOut(self) -> None:
        """No answer within the timeout fails connect() with BrokerUnreachableError."""
        result = Result()
        self.core.connect(result)
        self.advance(4.9)
        self.assertFalse(result.done)
        self.advance(0.2)
        self.assertIsInstance(result.outcome, BrokerUnreachableError)
        self.assertIs(self.core.state, ClientState.CLOSED)
        self.assertIsNone(self.core.wakeup_at())

    def test_noPingsWhileConnecting(self) -> None:
        """Nothing but the OPEN is sent before the broker answers it."""
        self.core.connect(Result())
        self.advance(3)
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])

    def test_commandsBeforeConnectRefused(self) -> None:
        """A command before connect() fails with ClientClosedError."""
        result = Result()
        self.core.set_producer("s", result)
        self.assertIsInstance(result.outcome, ClientClosedError)
        self.assertRaises(ClientClosedError, self.core.send, "subject", [b"x"])

    def test_heartbeatMustBeBelowTimeout(self) -> None:
        """A heartbeat not below the timeout is refused."""
        self.assertRaises(ValueError, ClientOptions, timeout=1.0, heartbeat=1.0)

    def test_version1Open(self) -> None:
        """With version 1 CONNECTION_OPEN says version 1, as libmlm does."""
        self.core.connect(Result())
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(version=1, address="me")])

    def test_unknownVersionRefused(self) -> None:
        """Only versions 1 and 2 exist."""
        self.assertRaises(ValueError, ClientOptions, version=3)

    def test_version1HasNoPositions(self) -> None:
        """
        With version 1, set_consumer from a position raises ValueError at
        the call and sends nothing; sendto refuses a STORED callback.
        """
        self.connected()
        self.assertRaises(ValueError, self.core.set_consumer, "s", "", Result(), mlm.EARLIEST)
        self.assertRaises(ValueError, self.core.sendto, "bob", "", [], "", 0, lambda r: None)
        self.assertEqual(self.owner.take(), [])


class HeartbeatTests(CoreTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.connected()

    def test_pingsEveryHeartbeat(self) -> None:
        """CONNECTION_PING goes out once a heartbeat while the broker answers."""
        for _ in range(3):
            self.advance(1.0)
            self.assertEqual(self.owner.take(), [mlm.ConnectionPing()])
            self.reply(mlm.ConnectionPong())
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_silenceLosesConnection(self) -> None:
        """
        Nothing heard for the timeout: DISCONNECTED, the outstanding and the
        queued commands fail with BrokerUnreachableError, and pings go on.
        """
        first, second = Result(), Result()
        self.core.set_consumer("weather", "", first)
        self.core.set_consumer("news", "", second)
        self.advance(4.9)
        self.assertFalse(first.done)
        self.advance(0.2)
        self.assertIs(self.core.state, ClientState.DISCONNECTED)
        self.assertIsInstance(first.outcome, BrokerUnreachableError)
        self.assertIsInstance(second.outcome, BrokerUnreachableError)
        self.owner.take()
        self.advance(3)
        self.assertEqual(self.owner.take(), [mlm.ConnectionPing()] * 3)

    def test_commandWhileDisconnectedFails(self) -> None:
        """A command while DISCONNECTED fails at once."""
        self.advance(5.1)
        result = Result()
        self.core.set_producer("s", result)
        self.assertIsInstance(result.outcome, BrokerUnreachableError)

    def test_pongResumes(self) -> None:
        """
        A PONG while DISCONNECTED (the broker still knows us) makes the core
        CONNECTED again without replay, and messages held meanwhile go out.
        """
        self.advance(5.1)
        self.core.send("subject", [b"held"])
        self.owner.take()
        self.reply(mlm.ConnectionPong())
        self.assertIs(self.core.state, ClientState.CONNECTED)
        self.assertEqual(self.owner.take(), [mlm.StreamSend("subject", [b"held"])])
        self.assertEqual(self.core.reconnects, 0)

    def test_creditWhileDisconnectedSentOnResume(self) -> None:
        """Credit granted while DISCONNECTED goes out when the broker answers again."""
        self.advance(5.1)
        self.core.credit(4)
        self.owner.take()
        self.reply(mlm.ConnectionPong())
        self.assertEqual(self.owner.take(), [mlm.Credit(4)])

    def test_lateOkIgnoredAfterResume(self) -> None:
        """
        The OK of a command that failed on the timeout, arriving late, puts
        the core back to CONNECTED and does not answer a later command.
        """
        self.core.set_producer("s", Result())
        self.advance(5.1)
        self.reply(mlm.Ok())
        self.assertIs(self.core.state, ClientState.CONNECTED)
        later = Result()
        self.core.set_producer("t", later)
        self.assertFalse(later.done)


class CommandTests(CoreTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.connected()

    def test_oneCommandAtATime(self) -> None:
        """Commands queue behind the outstanding one and go out one by one."""
        results = [Result() for _ in range(3)]
        self.core.set_producer("weather", results[0])
        self.core.set_consumer("news", "^sport", results[1])
        self.core.set_worker("echo", ".*", results[2])
        self.assertEqual(self.owner.take(), [mlm.StreamWrite("weather")])
        self.assertIs(self.core.state, ClientState.CONFIRMING)
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.StreamRead("news", "^sport")])
        self.reply(mlm.Error(mlm.FAILED, "invalid pattern"))
        self.assertEqual(self.owner.take(), [mlm.ServiceOffer("echo", ".*")])
        self.reply(mlm.Ok())
        self.assertIs(self.core.state, ClientState.CONNECTED)
        self.assertIsNone(results[0].outcome)
        assert isinstance(results[1].outcome, MalamuteError)
        self.assertEqual(results[1].outcome.code, mlm.FAILED)
        self.assertIsNone(results[2].outcome)
        # The refused pattern is not replayed.
        self.assertEqual(
            self.core.settings, (mlm.StreamWrite("weather"), mlm.ServiceOffer("echo", ".*"))
        )

    def test_strayReplyIgnored(self) -> None:
        """OK or a non-500 ERROR with no command outstanding changes nothing."""
        self.reply(mlm.Ok())
        self.reply(mlm.Error(mlm.FAILED, "queue full"))
        self.assertIs(self.core.state, ClientState.CONNECTED)
        self.assertEqual(self.owner.take(), [])

    def test_deliveriesPassedOn(self) -> None:
        """Each kind of delivery and a CONFIRM reach the owner, also mid-command."""
        self.core.set_producer("s", Result())
        self.reply(mlm.StreamDeliver("weather", "station", "temp.x", [b"20"]))
        self.reply(mlm.MailboxDeliver("bob", "me", "hi", "t1", [b"a", b"b"]))
        self.reply(mlm.ServiceDeliver("bob", "echo", "ping", "", []))
        self.reply(mlm.Confirm("t9", 200, "thanks"))
        self.assertEqual(
            self.owner.deliveries,
            [
                Delivery("STREAM_DELIVER", "station", "weather", "temp.x", "", (b"20",)),
                Delivery("MAILBOX_DELIVER", "bob", "me", "hi", "t1", (b"a", b"b")),
                Delivery("SERVICE_DELIVER", "bob", "echo", "ping", "", ()),
            ],
        )
        self.assertEqual(self.owner.confirmations, [Confirmation("t9", 200, "thanks")])
        self.assertIs(self.core.state, ClientState.CONFIRMING)

    def test_sends(self) -> None:
        """send, sendto, sendfor, credit and confirm go out as their messages."""
        self.core.send("temp.x", [b"1", b"2"])
        self.core.sendto("bob", "hi", [b"x"], "t1", 500)
        self.core.sendfor("echo", "ping", [], "t2", 0)
        self.core.credit(7)
        self.core.confirm("t3", 300, "no")
        self.assertEqual(
            self.owner.take(),
            [
                mlm.StreamSend("temp.x", [b"1", b"2"]),
                mlm.MailboxSend("bob", "hi", "t1", 500, [b"x"]),
                mlm.ServiceSend("echo", "ping", "t2", 0, []),
                mlm.Credit(7),
                mlm.Confirm("t3", 300, "no"),
            ],
        )

    def test_contentMustBeFrames(self) -> None:
        """A lone bytes passed as content is refused, not sent byte by byte."""
        self.assertRaises(TypeError, self.core.send, "s", b"payload")

    def test_tooLongForTheWire(self) -> None:
        """A name longer than a protocol string can carry raises at the call."""
        self.assertRaises(mlm.MalformedMessage, self.core.set_producer, "s" * 256, Result())
        self.assertRaises(mlm.MalformedMessage, self.core.sendto, "a" * 256, "", [])
        self.assertEqual(self.owner.take(), [])
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_malformedIgnored(self) -> None:
        """A malformed message from the broker is dropped."""
        self.core.receive([b"\x00\x01"])
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_closeWaitsForQueuedCommands(self) -> None:
        """close() goes out after the queued commands; OK closes."""
        first, closed = Result(), Result()
        self.core.set_producer("s", first)
        self.core.close(closed)
        self.assertRaises(ClientClosedError, self.core.send, "x", [])
        self.assertEqual(self.owner.take(), [mlm.StreamWrite("s")])
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.ConnectionClose()])
        self.assertIs(self.core.state, ClientState.CLOSING)
        self.reply(mlm.Ok())
        self.assertIs(self.core.state, ClientState.CLOSED)
        self.assertIsNone(closed.outcome)
        self.assertIsNone(self.core.wakeup_at())

    def test_closeTwice(self) -> None:
        """A close() on a closed client completes at once."""
        self.core.close(Result())
        self.reply(mlm.Ok())
        again = Result()
        self.core.close(again)
        self.assertIsNone(again.outcome)

    def test_closeWithoutAnswer(self) -> None:
        """close() completes after the close timeout if the broker is silent."""
        closed = Result()
        self.core.close(closed)
        self.advance(0.9)
        self.assertFalse(closed.done)
        self.advance(0.2)
        self.assertIsNone(closed.outcome)
        self.assertIs(self.core.state, ClientState.CLOSED)


class ReconnectTests(CoreTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.connected()
        self.setting(lambda d: self.core.set_producer("weather", d), mlm.StreamWrite("weather"))
        self.setting(
            lambda d: self.core.set_consumer("news", "^sport", d), mlm.StreamRead("news", "^sport")
        )
        self.setting(
            lambda d: self.core.set_consumer("news", "^art", d), mlm.StreamRead("news", "^art")
        )
        self.setting(lambda d: self.core.remove_consumer("old", d), mlm.StreamCancel("old"))
        self.setting(
            lambda d: self.core.set_worker("echo", ".*", d), mlm.ServiceOffer("echo", ".*")
        )
        self.replayed = [
            mlm.StreamWrite("weather"),
            mlm.StreamRead("news", "^sport"),
            mlm.StreamRead("news", "^art"),
            mlm.StreamCancel("old"),
            mlm.ServiceOffer("echo", ".*"),
        ]

    def replay(self) -> list[mlm.Message]:
        """Answer each replayed command with OK; return what was sent."""
        sent = []
        while self.core.state is ClientState.RECONNECTING:
            step = self.owner.take()
            self.assertEqual(len(step), 1, step)
            sent.extend(step)
            self.reply(mlm.Ok())
        return sent

    def test_error500ReopensAndReplaysInOrder(self) -> None:
        """
        ERROR 500 (the broker does not know us) sends CONNECTION_OPEN; after
        its OK every recorded setting is sent again, in order, one at a time.
        """
        self.reply(mlm.Error(mlm.COMMAND_INVALID, "command invalid: CONNECTION_PING"))
        self.assertIs(self.core.state, ClientState.RECONNECTING)
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])
        self.reply(mlm.Ok())
        self.assertEqual(self.core.reconnects, 1)
        self.assertEqual(self.replay(), self.replayed)
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_staleErrorsIgnoredWhileReopening(self) -> None:
        """Further ERROR 500s before the new OPEN's OK answer older messages: ignored."""
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.owner.take()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.assertEqual(self.owner.take(), [])
        self.reply(mlm.Ok())
        self.assertEqual(self.replay(), self.replayed)
        self.assertEqual(self.core.reconnects, 1)

    def test_commandsWaitForReplay(self) -> None:
        """
        A command cut short by ERROR 500 and one issued while reconnecting
        go out after the replay; stream messages sent meanwhile are held.
        """
        cut, later = Result(), Result()
        self.core.set_consumer("extra", "x", cut)
        self.owner.take()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.core.set_worker("calc", "", later)
        self.core.send("temp.x", [b"1"])
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])
        self.reply(mlm.Ok())
        self.assertEqual(self.replay(), self.replayed)
        self.assertEqual(
            self.owner.take(), [mlm.StreamSend("temp.x", [b"1"]), mlm.StreamRead("extra", "x")]
        )
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.ServiceOffer("calc", "")])
        self.reply(mlm.Ok())
        self.assertIsNone(cut.outcome)
        self.assertIsNone(later.outcome)
        self.assertEqual(
            self.core.settings[-2:], (mlm.StreamRead("extra", "x"), mlm.ServiceOffer("calc", ""))
        )

    def test_disconnectedThenBrokerBack(self) -> None:
        """
        After a lost connection the pings go on; the restarted broker's
        ERROR 500 to one of them starts the reopen and replay.
        """
        self.advance(5.1)
        self.assertIs(self.core.state, ClientState.DISCONNECTED)
        self.advance(10)
        self.assertIn(mlm.ConnectionPing(), self.owner.take())
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])
        self.reply(mlm.Ok())
        self.assertEqual(self.replay(), self.replayed)
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_creditGrantedAgain(self) -> None:
        """The credit not used up is granted again right after the new OPEN's OK."""
        self.core.credit(5)
        for _ in range(2):
            self.reply(mlm.MailboxDeliver("bob", "me", "hi", "", []))
        self.owner.take()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.owner.take()
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.Credit(3), self.replayed[0]])

    def test_supersededSettingsNotReplayed(self) -> None:
        """
        A new producer stream replaces the old; removing a consumer drops its
        earlier patterns (the removal itself is kept); repeats are kept once.
        """
        self.setting(lambda d: self.core.set_producer("alerts", d), mlm.StreamWrite("alerts"))
        self.setting(lambda d: self.core.remove_consumer("news", d), mlm.StreamCancel("news"))
        self.setting(
            lambda d: self.core.set_worker("echo", ".*", d), mlm.ServiceOffer("echo", ".*")
        )
        self.assertEqual(
            self.core.settings,
            (
                mlm.StreamCancel("old"),
                mlm.ServiceOffer("echo", ".*"),
                mlm.StreamWrite("alerts"),
                mlm.StreamCancel("news"),
            ),
        )

    def test_silenceWhileReopening(self) -> None:
        """No OK to the new OPEN within the timeout: DISCONNECTED, waiting commands fail."""
        waiting = Result()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.core.set_producer("s", waiting)
        self.advance(5.1)
        self.assertIs(self.core.state, ClientState.DISCONNECTED)
        self.assertIsInstance(waiting.outcome, BrokerUnreachableError)

    def test_error500DuringReplayStartsOver(self) -> None:
        """The broker forgetting us again mid-replay restarts the reopen."""
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.reply(mlm.Ok())
        self.owner.take()
        self.reply(mlm.Ok())
        self.owner.take()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])
        self.reply(mlm.Ok())
        self.assertEqual(self.replay(), self.replayed)
        self.assertEqual(self.core.reconnects, 2)


class V2TestCase(CoreTestCase):
    """A version 2 core, connected."""

    version = 2

    def setUp(self) -> None:
        super().setUp()
        self.connected()

    def stored_results(self) -> tuple[list[int | ClientError], Callable[[int | ClientError], None]]:
        got: list[int | ClientError] = []
        return got, got.append

    def record(self, record_id: int, subject: str = "hi", tracker: str = "") -> None:
        self.reply(mlm.MailboxRecord(record_id, "bob", "me", subject, tracker, [b"x"]))

    def stream_record(self, stream: str, sequence: int, subject: str = "s") -> None:
        self.reply(
            mlm.StreamRecord(stream, "producer", subject, sequence, 1_700_000_000_500, [b"v"])
        )

    def replay(self) -> list[mlm.Message]:
        """Answer each replayed command with OK; return what was sent."""
        sent = []
        while self.core.state is ClientState.RECONNECTING:
            step = self.owner.take()
            self.assertEqual(len(step), 1, step)
            sent.extend(step)
            self.reply(mlm.Ok())
        return sent

    def forget_us(self) -> None:
        """The broker answers ERROR 500 and then OK to the new OPEN."""
        self.reply(mlm.Error(mlm.COMMAND_INVALID, "command invalid"))
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(version=2, address="me")])
        self.reply(mlm.Ok())


_OPEN = mlm.ConnectionOpen(version=2, address="me")


class FailoverTests(V2TestCase):
    """A version 2 core with two endpoints (timeout 5 s: 2.5 s each to answer OPEN)."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.owner = Recorder()
        options = ClientOptions(address="me", timeout=5.0, heartbeat=1.0)
        self.core = ClientCore(self.clock, self.owner, options, ("tcp://a:1", "tcp://b:1"))

    def test_refusedMovesOn(self) -> None:
        """ERROR 503 to CONNECTION_OPEN: the core connects to the next and opens there."""
        result = Result()
        self.core.connect(result)
        self.assertEqual(self.owner.take(), [_OPEN])
        self.reply(mlm.Error(NOT_ACTIVE, "not active"))
        self.assertEqual(self.owner.connected_to, ["tcp://b:1"])
        self.assertEqual(self.owner.take(), [_OPEN])
        self.assertFalse(result.done)
        self.reply(mlm.Ok())
        self.assertIsNone(result.outcome)
        self.assertEqual((self.core.endpoint, self.core.switches), ("tcp://b:1", 1))

    def test_silentMovesOnAfterItsShare(self) -> None:
        """No answer to CONNECTION_OPEN within half the timeout: on to the next."""
        self.core.connect(Result())
        self.owner.take()
        self.advance(2.25)
        self.assertEqual(self.owner.connected_to, [])
        self.advance(0.5)
        self.assertEqual(self.owner.connected_to, ["tcp://b:1"])
        self.assertEqual(self.owner.take(), [_OPEN])

    def test_roundOfRefusalsBacksOff(self) -> None:
        """
        After both refused, the core connects to the first again but opens
        there only after the back-off; at the connect timeout it gives up.
        """
        result = Result()
        self.core.connect(result)
        self.owner.take()
        self.reply(mlm.Error(NOT_ACTIVE, "not active"))
        self.owner.take()
        self.reply(mlm.Error(NOT_ACTIVE, "not active"))
        self.assertEqual(self.owner.connected_to, ["tcp://b:1", "tcp://a:1"])
        self.assertEqual(self.owner.take(), [])
        self.advance(BACK_OFF)
        self.assertEqual(self.owner.take(), [_OPEN])
        self.advance(5.0)
        self.assertIsInstance(result.outcome, BrokerUnreachableError)
        self.assertIs(self.core.state, ClientState.CLOSED)

    def test_silenceReopensAndResumesOnNext(self) -> None:
        """
        Silence mid-session: the core moves to the next endpoint, opens,
        replays the reader from after the last record seen, and sends again
        the letter that was never stored.
        """
        self.connected()
        self.setting(lambda d: self.core.set_consumer("s", "", d), mlm.StreamRead("s", ""))
        self.stream_record("s", 7)
        self.core.sendto("bob", "hi", [b"x"])
        letter = self.owner.take()
        self.advance(5.0)  # nothing heard (pings go unanswered)
        self.assertIs(self.core.state, ClientState.RECONNECTING)
        self.assertEqual(self.owner.connected_to, ["tcp://b:1"])
        self.assertIn(_OPEN, self.owner.take())
        self.reply(mlm.Ok())
        self.assertEqual(self.replay(), [mlm.StreamReadFrom("s", "", mlm.RESUME, 8)])
        self.assertEqual(self.owner.take(), [m for m in letter if type(m) is mlm.MailboxSend])
        self.assertEqual((self.core.reconnects, self.core.switches), (1, 1))

    def test_notActiveMidCommand(self) -> None:
        """ERROR 503 to a command: moved on, and the command goes after the replay."""
        self.connected()
        result = Result()
        self.core.set_producer("s", result)
        self.owner.take()
        self.reply(mlm.Error(NOT_ACTIVE, "not active"))
        self.assertEqual(self.owner.take(), [_OPEN])
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.StreamWrite("s")])
        self.reply(mlm.Ok())
        self.assertIsNone(result.outcome)
        self.assertEqual(self.core.endpoint, "tcp://b:1")


class ConnectionWatchTests(V2TestCase):
    """
    A core with two endpoints (as L{FailoverTests}) told by its driver when
    the connection is up or broken, its owner's socket queueing only on a
    connection that is up.
    """

    setUp = FailoverTests.setUp

    def test_lostMovesOnAtOnce(self) -> None:
        """
        The connection breaks mid-command: the core leaves at once (no
        silence waited for), opens on the next and retries the command there.
        """
        self.connected()
        result = Result()
        self.core.set_producer("s", result)
        self.owner.take()
        self.core.connection_lost()
        self.assertIs(self.core.state, ClientState.RECONNECTING)
        self.assertEqual(self.owner.connected_to, ["tcp://b:1"])
        self.assertEqual(self.owner.take(), [_OPEN])
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.StreamWrite("s")])
        self.reply(mlm.Ok())
        self.assertIsNone(result.outcome)

    def test_openWaitsForTheConnection(self) -> None:
        """
        CONNECTION_OPEN that no connection can take yet is sent once the
        driver says the connection is up, within the grace.
        """
        self.owner.linked = False
        self.core.connect(Result())
        self.assertEqual(self.owner.take(), [])
        self.advance(0.1)
        self.owner.linked = True
        self.core.connection_made()
        self.assertEqual(self.owner.take(), [_OPEN])
        self.advance(0.5)
        self.assertEqual(self.owner.connected_to, [])  # its answer is awaited, not the grace

    def test_noConnectionWithinTheGrace(self) -> None:
        """
        No connection up within the grace (0.2 s) after the connection was
        made: the endpoint is left for the next, long before the silence
        of the timeout (here that ends the round: the back-off follows).
        """
        self.connected()
        self.owner.linked = False
        self.core.connection_lost()
        self.assertEqual(self.owner.take(), [])  # nothing to send CONNECTION_OPEN on
        self.advance(0.15)
        self.assertEqual(self.owner.connected_to, ["tcp://b:1"])
        self.advance(0.1)
        self.assertEqual(self.owner.connected_to, ["tcp://b:1", "tcp://a:1"])
        self.assertIs(self.core.state, ClientState.DISCONNECTED)

    def test_afterBackOffNoGraceAgain(self) -> None:
        """
        After a round of refusals the back-off runs on the first endpoint's
        new connection; if that is not up when it ends (its grace long
        over), the core goes on to the next at once: the refusing one is
        asked again every back-off.
        """
        self.connected()
        self.core.connection_lost()  # on to b, which refuses: round failed
        self.reply(mlm.Error(NOT_ACTIVE, "not active"))
        self.assertIs(self.core.state, ClientState.DISCONNECTED)
        self.assertEqual(self.owner.connected_to, ["tcp://b:1", "tcp://a:1"])
        self.owner.take()
        self.owner.linked = False  # a is gone
        self.advance(BACK_OFF)
        self.assertEqual(self.owner.connected_to, ["tcp://b:1", "tcp://a:1", "tcp://b:1"])
        self.owner.linked = True
        self.core.connection_made()
        self.assertEqual(self.owner.take(), [_OPEN])

    def test_oneEndpointIgnoresTheSocket(self) -> None:
        """With one endpoint, a connection said lost changes nothing: silence decides."""
        core = ClientCore(self.clock, self.owner, ClientOptions(address="me"), ("tcp://a:1",))
        core.connect(Result())
        core.receive(mlm.encode(mlm.Ok()))
        core.connection_lost()
        core.connection_made()
        self.assertIs(core.state, ClientState.CONNECTED)
        self.assertEqual(self.owner.connected_to, [])


class V2ConnectTests(CoreTestCase):
    version = 2

    def test_versionTwoIsTheDefault(self) -> None:
        """A core made without a version opens with CONNECTION_OPEN version 2."""
        core = ClientCore(self.clock, self.owner, ClientOptions(address="me"))
        self.assertEqual(core.version, 2)
        core.connect(Result())
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(version=2, address="me")])

    def test_reopenSaysVersionTwo(self) -> None:
        """The CONNECTION_OPEN of a reconnection also says version 2."""
        self.connected()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(version=2, address="me")])


class V2ConsumerTests(V2TestCase):
    def test_latestSendsStreamRead(self) -> None:
        """set_consumer with whence LATEST (the default) sends STREAM_READ, as version 1."""
        self.setting(lambda d: self.core.set_consumer("s", "p", d), mlm.StreamRead("s", "p"))

    def test_positionsSendStreamReadFrom(self) -> None:
        """EARLIEST, SEQUENCE and TIME send STREAM_READ_FROM; OK completes the command."""
        for whence, position in ((mlm.EARLIEST, 0), (mlm.SEQUENCE, 42), (mlm.TIME, 1234)):
            result = Result()
            self.core.set_consumer("s", str(whence), result, whence, position)
            self.assertEqual(
                self.owner.take(), [mlm.StreamReadFrom("s", str(whence), whence, position)]
            )
            self.reply(mlm.Ok())
            self.assertIsNone(result.outcome)

    def test_streamReadFromRefused(self) -> None:
        """ERROR to STREAM_READ_FROM fails the command; the setting is not recorded."""
        result = Result()
        self.core.set_consumer("s", "", result, mlm.EARLIEST)
        self.owner.take()
        self.reply(mlm.Error(mlm.NOT_IMPLEMENTED, "no journal"))
        assert isinstance(result.outcome, MalamuteError)
        self.assertEqual(result.outcome.code, mlm.NOT_IMPLEMENTED)
        self.assertEqual(self.core.settings, ())

    def test_unknownWhence(self) -> None:
        """A whence the protocol does not define raises ValueError at the call."""
        self.assertRaises(ValueError, self.core.set_consumer, "s", "", Result(), 7)

    def test_partition(self) -> None:
        """partition() splits deliveries in order into those kept and those picked."""
        deliveries = [
            Delivery("STREAM_DELIVER", "p", "s", str(n), "", (), sequence=n) for n in range(5)
        ]
        kept, dropped = partition(deliveries, lambda d: d.sequence in (1, 3))
        self.assertEqual([d.sequence for d in kept], [0, 2, 4])
        self.assertEqual([d.sequence for d in dropped], [1, 3])

    def test_groupRecordsOfAForgottenConnectionDropped(self) -> None:
        """
        When the broker forgot this connection (ERROR 500, OPEN again), the
        records of a group membership waiting for the application are
        dropped: the broker gave them back to the group, another member
        has them now (found by the soak: a member woken from a pause
        handed its application records another member had acknowledged).
        The records of a plain reader and the letters stay; a group record
        after the new OPEN is delivered.
        """
        self.setting(
            lambda d: self.core.consume("orders", "", "m1", d, group="g"),
            mlm.StreamConsume("orders", "", "m1", "g", mlm.RESUME, 0),
        )
        self.setting(lambda d: self.core.set_consumer("news", "", d), mlm.StreamRead("news", ""))
        self.stream_record("orders", 5)
        self.stream_record("news", 7)
        self.record(11)
        self.stream_record("orders", 6)
        self.forget_us()
        self.replay()
        self.assertEqual(
            [(d.address, d.sequence, d.id) for d in self.owner.deliveries],
            [("news", 7, None), ("me", None, 11)],
        )
        self.stream_record("orders", 5)
        self.assertEqual(self.owner.deliveries[-1].sequence, 5)


class CommitTests(V2TestCase):
    """A version 2 core reading two streams as durable consumers, and its commits."""

    def setUp(self) -> None:
        super().setUp()
        self.setting(
            lambda d: self.core.consume("orders", "", "billing", d),
            mlm.StreamConsume("orders", "", "billing", "", mlm.RESUME, 0),
        )
        self.setting(
            lambda d: self.core.consume("refunds", "", "billing", d),
            mlm.StreamConsume("refunds", "", "billing", "", mlm.RESUME, 0),
        )

    def test_pastTheEndSettlesWithClampedPosition(self) -> None:
        """
        A commit past the stream's last record is settled by the broker's
        answer, with the clamped (lower) position it made durable.
        """
        got, settled = self.stored_results()
        self.core.commit("orders", 99, settled)
        self.assertEqual(self.owner.take(), [mlm.StreamCommit("orders", 99)])
        self.reply(mlm.StreamCommitted("orders", 5))
        self.assertEqual(got, [5])

    def test_orderWithSeveralStreams(self) -> None:
        """
        Each answer settles the oldest commit of its stream, whatever was
        committed on the other stream between (and a refusal fails its own).
        """
        results: dict[str, list[int | ClientError]] = {}
        for name, stream, sequence in (
            ("a", "orders", 3),
            ("b", "refunds", 1),
            ("c", "orders", 50),
            ("d", "refunds", 2),
        ):
            got: list[int | ClientError] = []
            results[name] = got
            self.core.commit(stream, sequence, got.append)
        self.owner.take()
        self.reply(mlm.StreamCommitted("refunds", 1))
        self.reply(mlm.StreamCommitted("orders", 3))
        self.reply(mlm.StreamCommitted("orders", 7))  # 50 clamped to the last record
        self.reply(mlm.StreamCommitted("refunds", 2, mlm.FAILED, "not delivered to this member"))
        self.assertEqual(
            {name: got[:1] for name, got in results.items() if name != "d"},
            {"a": [3], "b": [1], "c": [7]},
        )
        [error] = results["d"]
        assert isinstance(error, MalamuteError)
        self.assertEqual((error.code, error.reason), (mlm.FAILED, "not delivered to this member"))

    def test_deadline(self) -> None:
        """
        A commit the broker does not answer fails with
        BrokerUnreachableError once C{commit_timeout} has passed, not before.
        """
        self.remake(commit_timeout=3.0)
        got, settled = self.stored_results()
        self.core.commit("orders", 3, settled)
        self.owner.take()
        self.advance(2.75)
        self.assertEqual(got, [])
        self.advance(0.25)
        [error] = got
        self.assertIsInstance(error, BrokerUnreachableError)
        self.reply(mlm.StreamCommitted("orders", 3))  # late: its own, nothing else's
        self.assertEqual(len(got), 1)

    def test_deadlineWhileDisconnected(self) -> None:
        """
        With the broker silent (the client disconnected), a commit still
        fails at its deadline (the core asks to be woken for it).
        """
        got, settled = self.stored_results()
        self.core.commit("orders", 3, settled)
        self.advance(5.1)
        self.assertIs(self.core.state, ClientState.DISCONNECTED)
        self.assertEqual(got, [])
        wakeup = self.core.wakeup_at()
        self.assertIsNotNone(wakeup)
        self.advance(30.0 - 5.1)
        self.assertIsInstance(got[0], BrokerUnreachableError)

    def test_resentAfterReplayOnly(self) -> None:
        """
        When the broker forgot us, a commit not answered goes again after
        CONNECTION_OPEN and the replay (never ahead of them, where a new
        broker would refuse it), and keeps the deadline of its call.
        """
        got, settled = self.stored_results()
        self.core.commit("orders", 3, settled)
        self.advance(1.0)
        self.assertEqual(self.owner.take(), [mlm.StreamCommit("orders", 3), mlm.ConnectionPing()])
        self.reply(mlm.Error(mlm.COMMAND_INVALID, "command invalid: CONNECTION_PING"))
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(version=2, address="me")])
        self.reply(mlm.Ok())
        self.assertEqual(
            self.replay(),
            [
                mlm.StreamConsume("orders", "", "billing", "", mlm.RESUME, 0),
                mlm.StreamConsume("refunds", "", "billing", "", mlm.RESUME, 0),
            ],
        )
        self.assertEqual(self.owner.take(), [mlm.StreamCommit("orders", 3)])
        self.reply(mlm.StreamCommitted("orders", 3))
        self.assertEqual(got, [3])

    def test_commitWhenClosed(self) -> None:
        """A commit on a closed client is refused at once."""
        self.core.close(Result())
        self.reply(mlm.Ok())
        self.assertIs(self.core.state, ClientState.CLOSED)
        self.assertRaises(ClientClosedError, self.core.commit, "orders", 3, lambda r: None)

    def test_closeFailsCommits(self) -> None:
        """Closing fails the commits still waiting with ClientClosedError."""
        got, settled = self.stored_results()
        self.core.commit("orders", 3, settled)
        self.core.close(Result())
        self.reply(mlm.Ok())
        [error] = got
        self.assertIsInstance(error, ClientClosedError)
        self.assertIsNone(self.core.wakeup_at())


class StoredTests(V2TestCase):
    def test_storedMatchedInOrder(self) -> None:
        """
        STOREDs answer sendto and sendfor in the order they were sent, a
        refusal included (MalamuteError with its code and reason); stream
        sends and commands in between do not take a STORED.
        """
        got, stored = self.stored_results()
        self.core.sendto("bob", "a", [b"1"], stored=stored)
        self.core.send("x", [])
        self.core.sendfor("echo", "b", [b"2"], stored=stored)
        self.core.set_producer("s", Result())
        self.core.sendto("full", "c", [b"3"], stored=stored)
        self.assertEqual(self.core.unstored, 3)
        self.reply(mlm.Stored(11, "", mlm.SUCCESS, ""))
        self.reply(mlm.Ok())  # the command's answer, between STOREDs
        self.reply(mlm.Stored(12, "", mlm.SUCCESS, ""))
        self.reply(mlm.Stored(0, "", mlm.FAILED, "mailbox full"))
        self.assertEqual(got[:2], [11, 12])
        assert isinstance(got[2], MalamuteError)
        self.assertEqual((got[2].code, got[2].reason), (mlm.FAILED, "mailbox full"))
        self.assertEqual(self.core.unstored, 0)

    def test_strayStoredIgnored(self) -> None:
        """A STORED with no send waiting for it changes nothing."""
        self.reply(mlm.Stored(5, "", mlm.SUCCESS, ""))
        got, stored = self.stored_results()
        self.core.sendto("bob", "a", [], stored=stored)
        self.reply(mlm.Stored(6, "", mlm.SUCCESS, ""))
        self.assertEqual(got, [6])

    def test_heldSendsGetStoredAfterReplay(self) -> None:
        """A send made while reconnecting goes out after the replay and gets its STORED."""
        self.setting(lambda d: self.core.set_producer("s", d), mlm.StreamWrite("s"))
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        got, stored = self.stored_results()
        self.core.sendto("bob", "held", [b"1"], stored=stored)
        self.owner.take()
        self.reply(mlm.Ok())
        self.assertEqual(self.replay(), [mlm.StreamWrite("s")])
        self.assertEqual(self.owner.take(), [mlm.MailboxSend("bob", "held", "", 0, [b"1"])])
        self.reply(mlm.Stored(3, "", mlm.SUCCESS, ""))
        self.assertEqual(got, [3])

    def test_unacknowledgedSentAgainAfterReplay(self) -> None:
        """
        Sends not yet acknowledged when the broker forgets us are sent again
        after the replay, in order and before the ones held meanwhile; a
        STORED arriving before that (answering the old send) is ignored.
        """
        self.setting(lambda d: self.core.set_worker("echo", "", d), mlm.ServiceOffer("echo", ""))
        got, stored = self.stored_results()
        self.core.sendto("bob", "one", [], stored=stored)
        self.core.sendfor("echo", "two", [], stored=stored)
        self.reply(mlm.Stored(1, "", mlm.SUCCESS, ""))  # "one" is acknowledged
        self.core.sendto("bob", "three", [], stored=stored)
        self.owner.take()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.core.sendto("bob", "four", [], stored=stored)  # held
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(version=2, address="me")])
        self.reply(mlm.Stored(99, "", mlm.SUCCESS, ""))  # late, for the old "two": ignored
        self.reply(mlm.Ok())
        self.assertEqual(self.replay(), [mlm.ServiceOffer("echo", "")])
        self.assertEqual(
            self.owner.take(),
            [
                mlm.ServiceSend("echo", "two", "", 0, []),
                mlm.MailboxSend("bob", "three", "", 0, []),
                mlm.MailboxSend("bob", "four", "", 0, []),
            ],
        )
        for record_id in (2, 3, 4):
            self.reply(mlm.Stored(record_id, "", mlm.SUCCESS, ""))
        self.assertEqual(got, [1, 2, 3, 4])

    def test_unacknowledgedSentAgainAfterTimeout(self) -> None:
        """
        A send unacknowledged when the connection is lost (timeout) stays
        pending; the restarted broker's ERROR 500 leads to it being sent
        again after the replay.
        """
        got, stored = self.stored_results()
        self.core.sendto("bob", "lost", [], stored=stored)
        self.advance(5.1)
        self.assertIs(self.core.state, ClientState.DISCONNECTED)
        self.assertEqual(got, [])
        self.owner.take()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.owner.take()
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.MailboxSend("bob", "lost", "", 0, [])])
        self.reply(mlm.Stored(8, "", mlm.SUCCESS, ""))
        self.assertEqual(got, [8])

    def test_resumeDoesNotSendAgain(self) -> None:
        """After a timeout, a broker that still knows us answers the sends it has: no resend."""
        got, stored = self.stored_results()
        self.core.sendto("bob", "slow", [], stored=stored)
        self.advance(5.1)
        self.owner.take()
        self.reply(mlm.Stored(4, "", mlm.SUCCESS, ""))
        self.assertIs(self.core.state, ClientState.CONNECTED)
        self.assertEqual(self.owner.take(), [])
        self.assertEqual(got, [4])

    def test_closeWaitsForStored(self) -> None:
        """CONNECTION_CLOSE goes out once the sends made before close() are STORED."""
        got, stored = self.stored_results()
        self.core.sendto("bob", "a", [], stored=stored)
        closed = Result()
        self.core.close(closed)
        self.owner.take()
        self.assertIs(self.core.state, ClientState.CLOSING)
        self.reply(mlm.Stored(7, "", mlm.SUCCESS, ""))
        self.assertEqual(got, [7])
        self.assertEqual(self.owner.take(), [mlm.ConnectionClose()])
        self.reply(mlm.Ok())
        self.assertIsNone(closed.outcome)

    def test_closeGivesUpOnStored(self) -> None:
        """
        No STORED within the close timeout: CONNECTION_CLOSE goes out anyway
        and the send fails with ClientClosedError.
        """
        got, stored = self.stored_results()
        self.core.sendto("bob", "a", [], stored=stored)
        closed = Result()
        self.core.close(closed)
        self.owner.take()
        self.advance(1.1)
        self.assertEqual(self.owner.take(), [mlm.ConnectionClose()])
        self.assertIsNone(closed.outcome)
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], ClientClosedError)

    def test_tooManyHeld(self) -> None:
        """A send dropped because too many are held fails with MessageDroppedError."""
        self.remake(max_held=1)
        self.advance(5.1)
        got, stored = self.stored_results()
        self.core.sendto("bob", "kept", [], stored=stored)
        self.core.sendto("bob", "dropped", [], stored=stored)
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], MessageDroppedError)
        self.assertEqual(self.core.held_dropped, 1)


class RecordTests(V2TestCase):
    def test_recordDelivered(self) -> None:
        """
        MAILBOX_RECORD and SERVICE_RECORD arrive as MAILBOX_DELIVER and
        SERVICE_DELIVER deliveries carrying the id; no DONE before hand-over.
        """
        self.reply(mlm.MailboxRecord(5, "bob", "me", "hi", "t1", [b"a"]))
        self.reply(mlm.ServiceRecord(6, "bob", "echo", "ping", "", []))
        self.assertEqual(
            self.owner.deliveries,
            [
                Delivery("MAILBOX_DELIVER", "bob", "me", "hi", "t1", (b"a",), id=5),
                Delivery("SERVICE_DELIVER", "bob", "echo", "ping", "", (), id=6),
            ],
        )
        self.assertEqual(self.owner.take(), [])

    def test_autoDoneOnHandOver(self) -> None:
        """With auto_done, handing a record over sends DONE(id, 200) once."""
        self.record(5)
        delivery = self.owner.deliveries[0]
        self.core.handed_over(delivery)
        self.core.handed_over(delivery)
        self.core.done(delivery, 300, "ignored: already answered")
        self.assertEqual(self.owner.take(), [mlm.Done(5, mlm.SUCCESS, "")])

    def test_manualDone(self) -> None:
        """With auto_done off, hand-over sends nothing; done() sends the status given."""
        self.remake(auto_done=False)
        self.record(5)
        delivery = self.owner.deliveries[0]
        self.core.handed_over(delivery)
        self.assertEqual(self.owner.take(), [])
        self.core.done(delivery, mlm.FAILED, "cannot")
        self.assertEqual(self.owner.take(), [mlm.Done(5, mlm.FAILED, "cannot")])

    def test_trackedRecordAnsweredByConfirm(self) -> None:
        """
        A tracked record is not answered at hand-over: confirm(tracker)
        answers the oldest unanswered record with that tracker as DONE with
        the application's status; a tracker with none left is sent as
        CONFIRM, as with version 1.
        """
        self.record(5, tracker="order")
        self.record(6, tracker="order")
        for delivery in self.owner.deliveries:
            self.core.handed_over(delivery)
        self.assertEqual(self.owner.take(), [])
        self.core.confirm("order", 200, "shipped")
        self.core.done(self.owner.deliveries[1], 300, "lost")
        self.core.confirm("order", 200, "again")
        self.assertEqual(
            self.owner.take(),
            [
                mlm.Done(5, 200, "shipped"),
                mlm.Done(6, 300, "lost"),
                mlm.Confirm("order", 200, "again"),
            ],
        )

    def test_trackedRecordFailedAtHandOver(self) -> None:
        """A failure status at hand-over (the application's callback raised) answers it."""
        self.record(5, tracker="order")
        self.core.handed_over(self.owner.deliveries[0], mlm.FAILED, "crashed")
        self.assertEqual(self.owner.take(), [mlm.Done(5, mlm.FAILED, "crashed")])

    def test_doneNeedsAnId(self) -> None:
        """done() of a delivery without an id (a stream message) raises ValueError."""
        self.stream_record("s", 1)
        self.assertRaises(ValueError, self.core.done, self.owner.deliveries[0])

    def test_doneHeldWhileReconnecting(self) -> None:
        """A DONE while the broker is being reopened goes out after the replay."""
        self.record(5)
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.core.handed_over(self.owner.deliveries[0])
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(version=2, address="me")])
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.Done(5, mlm.SUCCESS, "")])

    def test_redeliveryDroppedAndDoneAgain(self) -> None:
        """
        A record whose id was handed over before is dropped, counted, and
        answered with the same DONE again (ours may never have reached the
        disk).
        """
        self.remake(auto_done=False)
        self.record(5)
        self.core.done(self.owner.deliveries[0], mlm.FAILED, "bad")
        self.owner.take()
        self.record(5)
        self.assertEqual(len(self.owner.deliveries), 1)
        self.assertEqual(self.core.duplicates, 1)
        self.assertEqual(self.owner.take(), [mlm.Done(5, mlm.FAILED, "bad")])

    def test_redeliveryBeforeDone(self) -> None:
        """
        A redelivery of a record the application has not answered yet is
        dropped without a DONE: the application's own DONE answers it.
        """
        self.remake(auto_done=False)
        self.record(5)
        self.record(5)
        self.assertEqual(self.owner.take(), [])
        self.assertEqual((len(self.owner.deliveries), self.core.duplicates), (1, 1))
        self.core.done(self.owner.deliveries[0])
        self.assertEqual(self.owner.take(), [mlm.Done(5, mlm.SUCCESS, "")])

    def test_dedupeWindowBounded(self) -> None:
        """Only the last dedupe_window ids are remembered."""
        self.core = ClientCore(self.clock, self.owner, ClientOptions(address="me", dedupe_window=2))
        self.connected()
        for record_id in (1, 2, 3):
            self.record(record_id)
        self.record(1)  # forgotten: handed over again
        self.record(3)  # remembered: dropped
        self.assertEqual([d.id for d in self.owner.deliveries], [1, 2, 3, 1])
        self.assertEqual(self.core.duplicates, 1)


class StreamRecordTests(V2TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.setting(lambda d: self.core.set_producer("out", d), mlm.StreamWrite("out"))
        self.setting(
            lambda d: self.core.set_consumer("weather", "^temp", d),
            mlm.StreamRead("weather", "^temp"),
        )
        self.setting(
            lambda d: self.core.set_consumer("weather", "^wind", d),
            mlm.StreamRead("weather", "^wind"),
        )
        self.setting(
            lambda d: self.core.set_consumer("news", "", d, mlm.EARLIEST),
            mlm.StreamReadFrom("news", "", mlm.EARLIEST, 0),
        )

    def test_recordDelivered(self) -> None:
        """STREAM_RECORD arrives as STREAM_DELIVER with its sequence and timestamp (s)."""
        self.stream_record("weather", 7, "temp.x")
        self.assertEqual(
            self.owner.deliveries,
            [
                Delivery(
                    "STREAM_DELIVER",
                    "producer",
                    "weather",
                    "temp.x",
                    "",
                    (b"v",),
                    sequence=7,
                    timestamp=1_700_000_000.5,
                )
            ],
        )

    def test_oldSequenceDropped(self) -> None:
        """A record at or below the last sequence seen on its stream is a duplicate."""
        for sequence in (1, 2, 2, 1, 3):
            self.stream_record("weather", sequence)
        self.stream_record("news", 1)  # other streams count apart
        self.assertEqual(
            [(d.address, d.sequence) for d in self.owner.deliveries],
            [("weather", 1), ("weather", 2), ("weather", 3), ("news", 1)],
        )
        self.assertEqual(self.core.duplicates, 2)

    def test_replayResumesAfterLastSeen(self) -> None:
        """
        After ERROR 500, a stream with a record seen is read again with
        STREAM_READ_FROM(SEQUENCE, last + 1), every pattern from the same
        position even if records arrive during the replay; a stream with
        none seen replays its original command.
        """
        self.stream_record("weather", 41)
        self.stream_record("weather", 42)
        self.forget_us()
        sent = [self.owner.take()]
        self.reply(mlm.Ok())
        sent.append(self.owner.take())
        self.reply(mlm.Ok())
        self.stream_record("weather", 43)  # the first pattern's catch-up begins
        sent.extend([m] for m in self.replay())
        self.assertEqual(
            sent,
            [
                [mlm.StreamWrite("out")],
                [mlm.StreamReadFrom("weather", "^temp", mlm.RESUME, 43)],
                [mlm.StreamReadFrom("weather", "^wind", mlm.RESUME, 43)],
                [mlm.StreamReadFrom("news", "", mlm.EARLIEST, 0)],
            ],
        )
        self.stream_record("weather", 43)  # the second pattern's catch-up: a duplicate
        self.stream_record("weather", 44)
        self.assertEqual([d.sequence for d in self.owner.deliveries], [41, 42, 43, 44])
        self.assertEqual(self.core.duplicates, 1)

    def test_resumeRefusedFallsBack(self) -> None:
        """A replayed STREAM_READ_FROM refused (no journal: 501) is replaced by the original."""
        self.stream_record("weather", 3)
        self.forget_us()
        self.owner.take()
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.StreamReadFrom("weather", "^temp", mlm.RESUME, 4)])
        self.reply(mlm.Error(mlm.NOT_IMPLEMENTED, "no journal"))
        self.assertEqual(self.owner.take(), [mlm.StreamRead("weather", "^temp")])
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.StreamReadFrom("weather", "^wind", mlm.RESUME, 4)])

    def test_removeConsumerForgetsPosition(self) -> None:
        """After remove_consumer a stream starts afresh: no dedupe, no resume."""
        self.stream_record("weather", 9)
        self.setting(lambda d: self.core.remove_consumer("weather", d), mlm.StreamCancel("weather"))
        self.setting(
            lambda d: self.core.set_consumer("weather", "", d, mlm.EARLIEST),
            mlm.StreamReadFrom("weather", "", mlm.EARLIEST, 0),
        )
        self.stream_record("weather", 1)
        self.assertEqual([d.sequence for d in self.owner.deliveries], [9, 1])
        self.forget_us()
        replayed = self.replay()
        self.assertIn(mlm.StreamReadFrom("weather", "", mlm.RESUME, 2), replayed)
        self.assertNotIn(mlm.StreamRead("weather", "^temp"), replayed)

    def test_anotherPatternFromEarliest(self) -> None:
        """
        A second pattern read from EARLIEST moves the stream's position
        back: the broker sends the history again, and only the records not
        handed over yet (the new pattern's) get through.
        """
        for sequence in (2, 4):  # the first pattern's matches
            self.stream_record("weather", sequence, "temp")
        self.setting(
            lambda d: self.core.set_consumer("weather", "^rain", d, mlm.EARLIEST),
            mlm.StreamReadFrom("weather", "^rain", mlm.EARLIEST, 0),
        )
        for sequence in (1, 2, 3, 4, 5):
            self.stream_record("weather", sequence)
        self.assertEqual([d.sequence for d in self.owner.deliveries], [2, 4, 1, 3, 5])
        self.assertEqual(self.core.duplicates, 2)

    def test_rereadReplacesSetting(self) -> None:
        """A pattern read again from another position replaces its old setting."""
        self.setting(
            lambda d: self.core.set_consumer("weather", "^temp", d, mlm.SEQUENCE, 5),
            mlm.StreamReadFrom("weather", "^temp", mlm.SEQUENCE, 5),
        )
        readers = [s for s in self.core.settings if getattr(s, "pattern", None) == "^temp"]
        self.assertEqual(readers, [mlm.StreamReadFrom("weather", "^temp", mlm.SEQUENCE, 5)])

    def test_gap(self) -> None:
        """STREAM_GAP is passed on as a Gap and counted."""
        self.reply(mlm.StreamGap("weather", 10, 25))
        self.assertEqual(self.owner.gaps, [Gap("weather", 10, 25)])
        self.assertEqual(self.core.gaps, 1)

    @settings(max_examples=50, deadline=None)
    @given(st.lists(st.integers(min_value=1, max_value=30), max_size=8))
    def test_resumedReplaysDeliverEachOnce(self, restarts: list[int]) -> None:
        """
        However often the broker sends the stream again from an earlier
        position (a replay after a crash), each record reaches the owner
        once, in order.
        """
        self.core = ClientCore(self.clock, self.owner, ClientOptions(address="me"))
        self.connected()
        self.owner.deliveries.clear()
        sent = 0
        for start in [1, *restarts]:
            for sequence in range(min(start, sent + 1), sent + 6):
                self.stream_record("s", sequence)
            sent += 5
        self.assertEqual([d.sequence for d in self.owner.deliveries], list(range(1, sent + 1)))
