"""
Tests for L{malamute_pack.client.subscriptions}: which accepted settings are
kept for replay, and the replay plan with resume positions.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.dedupe import SeenSequences
from malamute_pack.client.subscriptions import ReplayStep, Setting, Subscriptions
from malamute_pack.protocol import mlm


class RecordTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.sequences = SeenSequences()
        self.subscriptions = Subscriptions(self.sequences)

    def test_inOrder(self) -> None:
        """Settings are kept in the order accepted; a repeat is kept once."""
        settings: list[Setting] = [
            mlm.StreamWrite("out"),
            mlm.StreamRead("s", "a"),
            mlm.ServiceOffer("echo", ""),
            mlm.StreamRead("s", "a"),
            mlm.ServiceOffer("echo", ""),
        ]
        for setting in settings:
            self.subscriptions.record(setting)
        self.assertEqual(self.subscriptions.settings, tuple(settings[:3]))

    def test_newProducerReplacesOld(self) -> None:
        """Only the last producer stream is kept."""
        self.subscriptions.record(mlm.StreamWrite("a"))
        self.subscriptions.record(mlm.StreamWrite("b"))
        self.assertEqual(self.subscriptions.settings, (mlm.StreamWrite("b"),))

    def test_cancelDropsStream(self) -> None:
        """
        A removal drops the stream's readings and earlier removal, is kept
        itself, and forgets what was handed over of the stream.
        """
        self.subscriptions.record(mlm.StreamRead("s", "a"))
        self.subscriptions.record(mlm.StreamReadFrom("s", "b", mlm.EARLIEST, 0))
        self.subscriptions.record(mlm.StreamRead("t", "a"))
        self.sequences.add("s", 4)
        self.subscriptions.record(mlm.StreamCancel("s"))
        self.assertEqual(
            self.subscriptions.settings, (mlm.StreamRead("t", "a"), mlm.StreamCancel("s"))
        )
        self.assertIsNone(self.sequences.last("s"))

    def test_rereadReplaces(self) -> None:
        """A pattern read again from another position replaces its earlier reading."""
        self.subscriptions.record(mlm.StreamRead("s", "a"))
        self.subscriptions.record(mlm.StreamReadFrom("s", "a", mlm.SEQUENCE, 5))
        self.assertEqual(
            self.subscriptions.settings, (mlm.StreamReadFrom("s", "a", mlm.SEQUENCE, 5),)
        )


class ReplayPlanTests(SynchronousTestCase):
    def test_plan(self) -> None:
        """
        Each setting again; a stream with a record handed over resumes right
        after it, every pattern, with the original as fallback.
        """
        sequences = SeenSequences()
        subscriptions = Subscriptions(sequences)
        for setting in (
            mlm.StreamWrite("out"),
            mlm.StreamRead("s", "a"),
            mlm.StreamReadFrom("s", "b", mlm.EARLIEST, 0),
            mlm.StreamRead("t", ""),
            mlm.ServiceOffer("echo", ""),
        ):
            subscriptions.record(setting)
        sequences.add("s", 7)
        self.assertEqual(
            subscriptions.replay_plan(),
            [
                ReplayStep(mlm.StreamWrite("out")),
                ReplayStep(mlm.StreamReadFrom("s", "a", mlm.RESUME, 8), mlm.StreamRead("s", "a")),
                ReplayStep(
                    mlm.StreamReadFrom("s", "b", mlm.RESUME, 8),
                    mlm.StreamReadFrom("s", "b", mlm.EARLIEST, 0),
                ),
                ReplayStep(mlm.StreamRead("t", "")),
                ReplayStep(mlm.ServiceOffer("echo", "")),
            ],
        )

    def test_lastValuesResumeAfterWhatWasHandedOver(self) -> None:
        """
        A reading from last values whose stream had nothing handed over asks
        for last values again; once records were handed over (the snapshot
        is in sequence order, live after it), it resumes right after the
        last one: the snapshot is not sent again, nothing is missed.
        """
        sequences = SeenSequences()
        subscriptions = Subscriptions(sequences)
        reading = mlm.StreamReadFrom("ticks", "", mlm.LAST_VALUES, 0)
        subscriptions.record(reading)
        self.assertEqual(subscriptions.replay_plan(), [ReplayStep(reading)])
        sequences.add("ticks", 40)
        sequences.add("ticks", 3)
        self.assertEqual(
            subscriptions.replay_plan(),
            [ReplayStep(mlm.StreamReadFrom("ticks", "", mlm.RESUME, 41), reading)],
        )

    def test_consumerResumes(self) -> None:
        """
        A durable consumer is replayed resuming from the position the broker
        keeps, whatever whence it first used (a reset is not made twice),
        saying the number after the last record handed over.
        """
        sequences = SeenSequences()
        subscriptions = Subscriptions(sequences)
        subscriptions.record(mlm.StreamConsume("s", "", "c1", "g", mlm.EARLIEST, 0))
        self.assertEqual(
            subscriptions.replay_plan(),
            [ReplayStep(mlm.StreamConsume("s", "", "c1", "g", mlm.RESUME, 0))],
        )
        # Once records were handed over, it says the number after the last.
        sequences.add("s", 9)
        self.assertEqual(
            subscriptions.replay_plan(),
            [ReplayStep(mlm.StreamConsume("s", "", "c1", "g", mlm.RESUME, 10))],
        )

    def test_emptyPlan(self) -> None:
        """Nothing recorded, nothing to replay."""
        self.assertEqual(Subscriptions(SeenSequences()).replay_plan(), [])
