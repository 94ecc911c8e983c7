"""
Tests for L{malamute_pack.client.bulk}: the bulk client against a real
broker process over TCP: queries, range reads (every record once, in
order, across chunks, resumed across a broker restart), idempotent appends,
calls right after a broker restart (killed or stopped cleanly: the client
opens again instead of failing with the new broker's ERROR 500), and a
clear error when no broker answers; and, against a fake broker on
loopback, that an open the broker refuses is followed by a new one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client import bulk
from malamute_pack.client.bulk import Appended, BulkClient, RangeChunk
from malamute_pack.client.errors import BrokerUnreachableError, MalamuteError
from malamute_pack.protocol import chunks, mlm
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, BrokerProcess
from tests.support import skip_slow


class NoBrokerTests(SynchronousTestCase):
    def test_unreachable(self) -> None:
        """With nobody at the endpoint, opening fails with an error that names it."""
        started = time.monotonic()
        with self.assertRaises(BrokerUnreachableError) as ctx:
            BulkClient("tcp://127.0.0.1:9", timeout=0.3)
        self.assertIn("tcp://127.0.0.1:9", str(ctx.exception))
        self.assertLess(time.monotonic() - started, 5)


class _RefusingBroker:
    """
    A fake broker on loopback, in a thread: it refuses its second
    CONNECTION_OPEN with ERROR 503 and accepts the others; it never answers
    its first STREAM_APPEND, appends the others, and answers one sent on a
    connection it never opened ERROR 500 "command invalid", as the broker
    does.
    """

    def __init__(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind("tcp://127.0.0.1:*")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.opens = 0
        self.appends = 0
        self.opened: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.socket.poll(50):
                continue
            route, *frames = self.socket.recv_multipart()
            message = mlm.decode(frames)
            reply: mlm.Message | None = None
            if isinstance(message, mlm.ConnectionOpen):
                self.opens += 1
                if self.opens == 2:
                    reply = mlm.Error(mlm.NOT_ACTIVE, "not active: a passive")
                else:
                    self.opened.add(route)
                    reply = mlm.Ok(mlm.SUCCESS, "")
            elif isinstance(message, mlm.StreamAppend):
                if route not in self.opened:
                    reply = mlm.Error(mlm.COMMAND_INVALID, "command invalid: STREAM_APPEND")
                else:
                    self.appends += 1
                    if self.appends > 1:
                        reply = mlm.StreamAppended(
                            message.address, message.key, 1, 1, mlm.SUCCESS, ""
                        )
            if reply is not None:
                self.socket.send_multipart([route, *mlm.encode(reply)])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.socket.close()
        self.context.term()


class RefusedOpenTests(SynchronousTestCase):
    def test_refusedOpenOpensAgain(self) -> None:
        """
        An append cut short by silence is tried on a new connection, whose
        open the broker refuses (ERROR 503: a pair's passive, before it
        takes over): that append fails with the 503, and the next call opens
        a new connection rather than send on the one never opened (which
        the broker would answer "command invalid", call after call).
        """
        broker = _RefusingBroker()
        self.addCleanup(broker.stop)
        client = BulkClient(broker.endpoint, timeout=0.5, retries=1)
        self.addCleanup(client.close)
        records = [("one", [b"1"])]
        error = self.assertRaises(MalamuteError, client.append, "s", "k1", records)
        self.assertEqual(error.code, mlm.NOT_ACTIVE)
        done = client.append("s", "k2", records)
        self.assertEqual((done.first, done.last, done.duplicate), (1, 1, False))
        self.assertEqual(broker.opens, 3)


class _ForgettingBroker:
    """
    A fake broker on loopback, in a thread, that forgets connections as a
    restarted broker does. Every CONNECTION_OPEN is accepted. Appends are
    answered C{append_answers} in turn (the last one again and again): an
    ERROR, or None for STREAM_APPENDED. A range read is answered OK; on
    each connection, its first CREDIT gets a chunk of the next two records
    (of 1 to 4), and then, on the first connection, ERROR 500 "command
    invalid: CREDIT" (as if the broker had restarted between), on the
    second, STREAM_END after record 4.
    """

    def __init__(self, append_answers: list[mlm.Error | None] | None = None) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind("tcp://127.0.0.1:*")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.append_answers = append_answers or [None]
        self.opens = 0
        self.appends = 0
        self.reads: list[tuple[int, int]] = []
        self._credited: set[bytes] = set()
        self._next = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.socket.poll(50):
                continue
            route, *frames = self.socket.recv_multipart()
            for reply in self._answer(route, mlm.decode(frames)):
                self.socket.send_multipart([route, *mlm.encode(reply)])

    def _answer(self, route: bytes, message: mlm.Message) -> list[mlm.Message]:
        if isinstance(message, mlm.ConnectionOpen):
            self.opens += 1
            return [mlm.Ok(mlm.SUCCESS, "")]
        if isinstance(message, mlm.StreamAppend):
            self.appends += 1
            answer = self.append_answers[min(self.appends, len(self.append_answers)) - 1]
            if answer is not None:
                return [answer]
            return [mlm.StreamAppended(message.address, message.key, 1, 1, mlm.SUCCESS, "")]
        if isinstance(message, mlm.StreamReadRange):
            self.reads.append((message.first, message.last))
            return [mlm.Ok(mlm.SUCCESS, "")]
        if isinstance(message, mlm.Credit) and route not in self._credited:
            self._credited.add(route)
            rows = [
                chunks.ChunkRow(seq, 0.0, "", f"r{seq}", b"")
                for seq in range(self._next, self._next + 2)
            ]
            self._next += 2
            chunk = mlm.StreamChunk("s", len(rows), [chunks.encode_chunk(rows)])
            if self.opens == 1:
                return [chunk, mlm.Error(mlm.COMMAND_INVALID, "command invalid: CREDIT")]
            return [chunk, mlm.StreamEnd("s", 4)]
        return []

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.socket.close()
        self.context.term()


class ForgottenConnectionTests(SynchronousTestCase):
    """
    The broker's answer to a connection it does not know (ERROR 500
    "command invalid: NAME"), told apart from a refusal, against a fake
    broker on loopback.
    """

    def client(self, broker: _ForgettingBroker) -> BulkClient:
        self.addCleanup(broker.stop)
        client = BulkClient(broker.endpoint, timeout=5, retries=0)
        self.addCleanup(client.close)
        return client

    def test_forgottenAppendOpensAgain(self) -> None:
        """
        An append answered "command invalid: STREAM_APPEND" is sent again,
        once, on a new connection, where it is written.
        """
        broker = _ForgettingBroker(
            [mlm.Error(mlm.COMMAND_INVALID, "command invalid: STREAM_APPEND"), None]
        )
        client = self.client(broker)
        done = client.append("s", "k", [("a", [b"1"])])
        self.assertEqual((done.first, done.last, done.duplicate), (1, 1, False))
        self.assertEqual((broker.opens, broker.appends), (2, 2))

    def test_forgottenTwiceFails(self) -> None:
        """
        A broker that forgets the new connection too: the append fails
        with its ERROR 500 after one new connection, not in a loop.
        """
        broker = _ForgettingBroker(
            [mlm.Error(mlm.COMMAND_INVALID, "command invalid: STREAM_APPEND")]
        )
        client = self.client(broker)
        error = self.assertRaises(MalamuteError, client.append, "s", "k", [("a", [b"1"])])
        self.assertEqual(
            (error.code, error.reason), (mlm.COMMAND_INVALID, "command invalid: STREAM_APPEND")
        )
        self.assertEqual((broker.opens, broker.appends), (2, 2))

    def test_refusalNotRetried(self) -> None:
        """
        An ERROR 500 that refuses the message itself (more than "command
        invalid: NAME") fails the call at once, on the same connection.
        """
        reason = "command invalid: STREAM_APPEND needs protocol version 2"
        broker = _ForgettingBroker([mlm.Error(mlm.COMMAND_INVALID, reason), None])
        client = self.client(broker)
        error = self.assertRaises(MalamuteError, client.append, "s", "k", [("a", [b"1"])])
        self.assertEqual((error.code, error.reason), (mlm.COMMAND_INVALID, reason))
        self.assertEqual((broker.opens, broker.appends), (1, 1))

    def test_readForgottenMidRange(self) -> None:
        """
        A read whose CREDIT the broker answers "command invalid: CREDIT"
        (it restarted mid-read) goes on, on a new connection, from the
        record after the last one yielded: each record once, in order.
        """
        broker = _ForgettingBroker()
        client = self.client(broker)
        seqs: list[int] = []
        for item in client.read_range("s", 1, 4):
            assert isinstance(item, RangeChunk), item
            seqs += item.seq
        self.assertEqual(seqs, [1, 2, 3, 4])
        self.assertEqual(broker.reads, [(1, 4), (3, 4)])
        self.assertEqual(broker.opens, 2)


class BulkClientTests(SynchronousTestCase):
    skip = skip_slow

    def setUp(self) -> None:
        self.broker = BrokerProcess(Path(self.mktemp()), bind=ANY_TCP_PORT)
        self.broker.start()
        self.addCleanup(self.broker.stop)
        self.client = BulkClient(self.broker.endpoint, timeout=5)
        self.addCleanup(self.client.close)

    def fill(self, count: int, per_append: int = 1000) -> None:
        for start in range(0, count, per_append):
            records = [
                (f"r{i}", [str(i).encode(), b"\x00"]) for i in range(start, start + per_append)
            ]
            self.client.append("s", f"k{start}", records)

    def read_all(self, first: int, last: int, pattern: str = "") -> list[int]:
        seqs: list[int] = []
        for item in self.client.read_range("s", first, last, pattern):
            assert isinstance(item, RangeChunk), item
            seqs += item.seq
        return seqs

    def test_appendAndRead(self) -> None:
        """Appended records read back in order, each once, with subjects and frames intact."""
        self.fill(50_000)
        status = self.client.status("s", mlm.EARLIEST)
        self.assertEqual((status.first, status.last, status.position), (1, 50_000, 1))
        got = list(self.client.read_range("s", 1, 50_000))
        chunks_read = [c for c in got if isinstance(c, RangeChunk)]
        self.assertGreater(len(chunks_read), 1)
        seqs = [s for c in chunks_read for s in c.seq]
        self.assertEqual(seqs, list(range(1, 50_001)))
        last = chunks_read[-1]
        self.assertEqual(last.subject[-1], "r49999")
        self.assertEqual(chunks.decode_frames(last.content[-1]), (b"49999", b"\x00"))

    def test_duplicateAppend(self) -> None:
        """The same key again is reported as a duplicate and writes nothing."""
        first = self.client.append("s", "k", [("a", [b"1"])])
        again = self.client.append("s", "k", [("a", [b"1"])])
        self.assertEqual(
            (again.first, again.last, again.duplicate), (first.first, first.last, True)
        )
        self.assertEqual(self.client.status("s").last, 1)

    def test_pattern(self) -> None:
        """A range read applies the pattern on the broker."""
        self.fill(1000)
        self.assertEqual(self.read_all(1, 1000, "^r99"), [100, *range(991, 1001)])

    def test_idleClientStillWorks(self) -> None:
        """A client idle for longer than the broker's expiry opens again on its next call."""
        self.client.append("s", "k", [("a", [b"1"])])
        self.client._last_sent -= 60  # as if idle for a minute
        self.assertEqual(self.client.status("s").last, 1)

    def test_refusal(self) -> None:
        """A refused read is a MalamuteError with the broker's reason."""
        with self.assertRaises(MalamuteError) as ctx:
            list(self.client.read_range("s", 1, 10, "topic:a..b"))
        self.assertIn("invalid pattern", str(ctx.exception))

    def test_abandonedRead(self) -> None:
        """A read left half way does not disturb the client's next calls."""
        self.fill(20_000)
        reading = self.client.read_range("s", 1, 20_000)
        next(reading)
        reading.close()
        self.assertEqual(len(self.read_all(1, 20_000)), 20_000)

    def test_restartMidRead(self) -> None:
        """
        A broker restart in the middle of a read: the read goes on from the
        record after the last one yielded, each record once.
        """
        self.fill(30_000)
        reading = self.client.read_range("s", 1, 30_000)
        first = next(reading)
        assert isinstance(first, RangeChunk)
        seqs = list(first.seq)
        self.broker.stop()
        self.broker.start()
        for item in reading:
            assert isinstance(item, RangeChunk)
            seqs += item.seq
        self.assertEqual(seqs, list(range(1, 30_001)))

    def test_brokerGone(self) -> None:
        """A broker that is gone and stays gone is a clear error, not a short read."""
        self.fill(20_000)
        client = BulkClient(self.broker.endpoint, timeout=0.5, retries=1)
        self.addCleanup(client.close)
        reading = client.read_range("s", 1, 20_000)
        next(reading)
        self.broker.kill()
        with self.assertRaises(BrokerUnreachableError) as ctx:
            for _ in reading:
                pass
        self.assertIn("while reading stream 's'", str(ctx.exception))


class RestartTests(SynchronousTestCase):
    """
    A broker process (journal on) restarted on the same data directory and
    endpoint while a client keeps its connection: ZeroMQ reconnects the
    client's socket silently, and the new broker, which never saw this
    connection's CONNECTION_OPEN, answers its next command ERROR 500
    "command invalid". The restart falls within the client's idle window
    (C{REOPEN_AFTER}, made long here), as a quick restart or a call in
    flight does, so that the client does not open again on its own first.
    """

    skip = skip_slow

    def setUp(self) -> None:
        self.patch(bulk, "REOPEN_AFTER", 3600.0)
        self.broker = BrokerProcess(Path(self.mktemp()), bind=ANY_TCP_PORT)
        self.broker.start()
        self.addCleanup(self.broker.stop)
        self.client = BulkClient(self.broker.endpoint, timeout=10)
        self.addCleanup(self.client.close)
        self.acknowledged: list[tuple[Appended, list[str]]] = []

    def append(self, key: str, count: int = 3) -> Appended:
        subjects = [f"{key}.{i}" for i in range(count)]
        done = self.client.append("s", key, [(subject, [subject.encode()]) for subject in subjects])
        self.assertFalse(done.duplicate)
        self.acknowledged.append((done, subjects))
        return done

    def assertAllReadable(self) -> None:
        """Every acknowledged append's records read back, under their sequence numbers."""
        expected = {
            seq: subject
            for done, subjects in self.acknowledged
            for seq, subject in zip(range(done.first, done.last + 1), subjects, strict=True)
        }
        got: dict[int, str] = {}
        for item in self.client.read_range("s", 1, max(expected)):
            assert isinstance(item, RangeChunk), item
            got.update(zip(item.seq, item.subject, strict=True))
        self.assertEqual(got, expected)

    def test_appendAfterKill(self) -> None:
        """
        After the broker was SIGKILLed and started again, the next append
        succeeds (the client opens again and sends it once more) and every
        append acknowledged before and after reads back.
        """
        for n in range(3):
            self.append(f"before{n}")
        self.broker.kill()
        self.broker.start()
        after = self.append("after")
        # After a kill the journal may skip sequence numbers; never back.
        self.assertGreater(after.first, self.acknowledged[-2][0].last)
        self.append("later")
        self.assertAllReadable()

    def test_appendAfterCleanStop(self) -> None:
        """
        After the broker was stopped cleanly (SIGTERM) and started again,
        the next append succeeds and every acknowledged append reads back.
        """
        for n in range(3):
            self.append(f"before{n}")
        self.broker.stop()
        self.broker.start()
        self.append("after")
        self.assertAllReadable()

    def test_readAndStatusAfterRestart(self) -> None:
        """
        A range read and a query, each the first call after a restart, are
        answered by the new broker (the client opens again), not failed
        with its ERROR 500.
        """
        self.append("before")
        self.broker.kill()
        self.broker.start()
        self.assertAllReadable()
        self.broker.stop()
        self.broker.start()
        self.assertEqual(self.client.status("s").last, 3)
