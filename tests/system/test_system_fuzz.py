"""
Fuzzing a real broker process: tens of thousands of random and mutated
frames (L{tests.fuzz_frames}) from many identities, interleaved with a
well-behaved client's stream, mailbox and service traffic, which must keep
flowing with nothing refused and nothing lost; the broker must log no
unhandled error and shut down cleanly afterwards.

C{MALAMUTE_FUZZ_SEED} picks another seed (the default is fixed, so a
failure can be replayed); C{MALAMUTE_FUZZ_FRAMES} another volume.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.blocking import BlockingClient
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import BrokerProcess
from tests.fuzz_frames import FrameFuzzer
from tests.support import skip_slow

SEED = int(os.environ.get("MALAMUTE_FUZZ_SEED", "20261123"))
FRAMES = int(os.environ.get("MALAMUTE_FUZZ_FRAMES", "30000"))
IDENTITIES = 40
ROUNDS = 150


class FuzzTests(SynchronousTestCase):
    skip = skip_slow

    def setUp(self) -> None:
        self.broker = BrokerProcess(Path(self.mktemp()))
        self.broker.start()
        self.addCleanup(self.broker.stop)  # a clean SIGTERM shutdown is part of the test
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)

    def client(self, address: str) -> BlockingClient:
        client = BlockingClient(self.broker.endpoint, address, context=self.context)
        self.addCleanup(client.close)
        return client

    def fuzzers(self) -> list[zmq.Socket[bytes]]:
        sockets = []
        for _ in range(IDENTITIES):
            socket = self.context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(self.broker.endpoint)
            self.addCleanup(socket.close)
            sockets.append(socket)
        return sockets

    def test_goodTrafficFlowsThroughFuzz(self) -> None:
        """
        While many identities send garbage, near-misses and explosive
        patterns, a well-behaved client's stream messages, letters (each
        STORED 200) and service round trips all arrive, in order, and every
        one of its commands succeeds; the broker logs no unhandled error.
        """
        fuzz = FrameFuzzer(SEED)
        choose = random.Random(SEED + 1)
        fuzzers = self.fuzzers()
        writer, reader = self.client("good-writer"), self.client("good-reader")
        sender, inbox = self.client("good-sender"), self.client("good-inbox")
        worker, requester = self.client("good-worker"), self.client("good-requester")
        reader.set_consumer("good-stream", "^good")
        writer.set_producer("good-stream")
        worker.set_worker("good-echo", "")
        sent = slowest = 0.0
        per_round = FRAMES // ROUNDS
        frames_sent = 0
        for n in range(ROUNDS):
            for _ in range(per_round):
                socket = choose.choice(fuzzers)
                if choose.random() < 0.1:  # most fuzz should land inside a connection
                    address = f"fuzz-{choose.randrange(64)}"
                    message = mlm.ConnectionOpen(version=choose.choice((1, 2)), address=address)
                    frames = mlm.encode(message)
                else:
                    frames = fuzz.next()
                try:
                    socket.send_multipart(frames, zmq.NOBLOCK)
                    frames_sent += 1
                except zmq.Again:
                    pass
            started = time.monotonic()
            writer.send(f"good.{n}", [b"%d" % n])
            delivery = reader.recv(timeout=10)
            assert delivery is not None, f"round {n}: stream message lost"
            self.assertEqual((delivery.subject, delivery.content), (f"good.{n}", (b"%d" % n,)))
            stored = sender.sendto("good-inbox", f"letter.{n}", [b"%d" % n])
            self.assertIsInstance(stored, int)
            letter = inbox.recv(timeout=10)
            assert letter is not None, f"round {n}: letter lost"
            self.assertEqual(letter.subject, f"letter.{n}")
            requester.sendfor("good-echo", f"job.{n}", [b"%d" % n])
            request = worker.recv(timeout=10)
            assert request is not None, f"round {n}: request lost"
            worker.sendto(request.sender, f"done.{n}", request.content)
            reply = requester.recv(timeout=10)
            assert reply is not None, f"round {n}: reply lost"
            self.assertEqual((reply.subject, reply.content), (f"done.{n}", (b"%d" % n,)))
            elapsed = time.monotonic() - started
            sent += elapsed
            slowest = max(slowest, elapsed)
            for socket in fuzzers:  # what the broker answers the fuzzers is not read
                while socket.poll(0):
                    socket.recv_multipart()
        log = self.broker.run_log()
        self.assertNotIn("Traceback", log)
        self.assertNotIn("Unhandled", log)
        print(
            f"\nfuzz: seed={SEED} frames={frames_sent} identities={IDENTITIES} rounds={ROUNDS}"
            f" good_round_avg_ms={sent / ROUNDS * 1000:.1f} good_round_max_ms={slowest * 1000:.1f}"
        )
