"""
Tests for L{malamute_pack.gcservice}: while the service runs the
collector's first threshold is the broker's and what existed when it
started is frozen; stopping gives back the thresholds as they were and
unfreezes; the broker's composition starts it after everything but the
systemd notifier.
"""

from __future__ import annotations

import gc

import zmq
from twisted.internet import reactor
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.gcservice import THRESHOLDS, GarbageCollectorService
from malamute_pack.tap import Options, makeBrokerService


class GarbageCollectorServiceTests(SynchronousTestCase):
    def setUp(self) -> None:
        before = gc.get_threshold()
        # Whatever a test leaves, the process gets its collector back.
        self.addCleanup(gc.set_threshold, *before)
        self.addCleanup(gc.unfreeze)

    def test_runningSetsThresholdsAndFreezes(self) -> None:
        """
        Started, the service sets L{THRESHOLDS} and moves every object the
        collector tracks into the frozen generation, where collections no
        longer walk it.
        """
        kept = [object() for _ in range(10)]  # tracked: a list of objects
        service = GarbageCollectorService()
        service.startService()
        try:
            self.assertEqual(gc.get_threshold(), THRESHOLDS)
            self.assertGreater(gc.get_freeze_count(), len(kept))
            walked = (gc.get_objects(generation) for generation in range(3))
            self.assertFalse(any(found is kept for objects in walked for found in objects))
        finally:
            service.stopService()

    def test_stopGivesBackWhatItFound(self) -> None:
        """
        Stopped, the service restores the thresholds it found (not
        CPython's defaults) and unfreezes, so a reference cycle made while
        the broker started is collectable again.
        """
        gc.set_threshold(1234, 5, 6)
        service = GarbageCollectorService()
        service.startService()

        class Node:
            other: object

        cycle = Node()
        cycle.other = cycle
        gc.freeze()  # as if the cycle were made while starting
        del cycle
        service.stopService()
        self.assertEqual(gc.get_threshold(), (1234, 5, 6))
        self.assertEqual(gc.get_freeze_count(), 0)
        self.assertGreaterEqual(gc.collect(), 1)

    def test_stopWithoutStartChangesNothing(self) -> None:
        """A service stopped without having started leaves the collector alone."""
        gc.set_threshold(999, 9, 9)
        GarbageCollectorService().stopService()
        self.assertEqual(gc.get_threshold(), (999, 9, 9))

    def test_lastToStopGivesBack(self) -> None:
        """
        Two brokers in one process: the collector keeps the broker's
        settings until the second stops, and then has the ones it had
        before the first started.
        """
        gc.set_threshold(1234, 5, 6)
        first, second = GarbageCollectorService(), GarbageCollectorService()
        first.startService()
        second.startService()
        first.stopService()
        self.assertEqual(gc.get_threshold(), THRESHOLDS)
        second.stopService()
        self.assertEqual(gc.get_threshold(), (1234, 5, 6))
        self.assertEqual(gc.get_freeze_count(), 0)

    def test_composedBeforeTheNotifier(self) -> None:
        """
        The broker's composition holds the service as C{gc}, after
        everything but the systemd notifier: it starts once the endpoints
        are bound and the journal has recovered.
        """
        options = Options()
        options.parseOptions(["-d", self.mktemp(), "-e", "tcp://127.0.0.1:9999"])
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        top = makeBrokerService(options["settings"], reactor, context)
        names = [service.name for service in top]
        self.assertEqual(names[-2:], ["gc", "sd-notify"])
        self.assertIsInstance(top.getServiceNamed("gc"), GarbageCollectorService)
