"""
Tests for L{malamute_pack.ops.sdnotify}: the states reach a real unix
datagram socket the test binds (a path, and an abstract name written
with C{@}), nothing is sent without C{$NOTIFY_SOCKET}, a missing or full
socket never raises, and the notifier service says READY=1 when it
starts, updates its status line and says STOPPING=1 when it stops; and
a real broker process (the tap adds the notifier last) says both.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.ops.sdnotify import (
    SystemdNotifier,
    notify,
    socket_address,
    status_line,
    watchdog_period,
)
from malamute_pack.testing.brokerprocess import BrokerProcess
from tests.support import skip_slow


class Listener:
    """A unix datagram socket bound where systemd's would be, read without blocking."""

    def __init__(self, case: SynchronousTestCase, abstract: bool) -> None:
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        case.addCleanup(self.socket.close)
        if abstract:
            name = f"malamute-sdnotify-test-{os.getpid()}-{id(self)}"
            self.socket.bind("\0" + name)
            self.value = "@" + name
        else:
            # A short directory: a socket's path has at most 107 bytes.
            directory = tempfile.mkdtemp(prefix="malamute-sd-")
            case.addCleanup(shutil.rmtree, directory)
            path = os.path.join(directory, "notify")
            self.socket.bind(path)
            self.value = path
        self.socket.setblocking(False)
        self.environ = {"NOTIFY_SOCKET": self.value}

    def received(self) -> list[str]:
        """Every datagram waiting, decoded, oldest first."""
        found = []
        while True:
            try:
                found.append(self.socket.recv(4096).decode())
            except BlockingIOError:
                return found


class NotifyTests(SynchronousTestCase):
    def test_address(self) -> None:
        """A path is itself, C{@name} the abstract C{\\0name}; anything else is not usable."""
        self.assertEqual(socket_address("/run/systemd/notify"), "/run/systemd/notify")
        self.assertEqual(socket_address("@abc"), "\0abc")
        self.assertIsNone(socket_address("@"))
        self.assertIsNone(socket_address("vsock:2:1234"))
        self.assertIsNone(socket_address("relative"))

    def test_statusLine(self) -> None:
        """The status line names the endpoints served, or why the broker does not serve."""
        self.assertEqual(
            status_line(None, ["ipc://@/m", "tcp://1.2.3.4:5"]),
            "serving ipc://@/m, tcp://1.2.3.4:5",
        )
        self.assertEqual(status_line(None, []), "serving")
        self.assertEqual(
            status_line("the journal is not open", ["x"]), "not serving: the journal is not open"
        )

    def test_path(self) -> None:
        """A state reaches the socket at a path."""
        listener = Listener(self, abstract=False)
        self.assertTrue(notify("READY=1", listener.environ))
        self.assertEqual(listener.received(), ["READY=1"])

    def test_abstract(self) -> None:
        """A state reaches an abstract socket named with a leading C{@}."""
        listener = Listener(self, abstract=True)
        self.assertTrue(notify("STATUS=serving", listener.environ))
        self.assertEqual(listener.received(), ["STATUS=serving"])

    def test_withoutVariable(self) -> None:
        """Without C{$NOTIFY_SOCKET} (or with it empty) nothing is sent and nothing fails."""
        self.assertFalse(notify("READY=1", {}))
        self.assertFalse(notify("READY=1", {"NOTIFY_SOCKET": ""}))

    def test_noSocketThere(self) -> None:
        """A variable naming no socket is logged, not raised."""
        self.assertFalse(notify("READY=1", {"NOTIFY_SOCKET": os.path.abspath(self.mktemp())}))
        self.assertFalse(notify("READY=1", {"NOTIFY_SOCKET": "vsock:2:1"}))

    def test_fullSocketNeverBlocks(self) -> None:
        """A receiver that does not read makes sends fail at once, never block."""
        listener = Listener(self, abstract=True)
        sent = 0
        for _ in range(100_000):
            if not notify("STATUS=" + "x" * 1000, listener.environ):
                break
            sent += 1
        self.assertLess(sent, 100_000)
        self.assertTrue(listener.received())


class NotifierServiceTests(SynchronousTestCase):
    def test_readyAndStopping(self) -> None:
        """READY=1 with the status when the service starts; STOPPING=1 when it stops."""
        listener = Listener(self, abstract=True)
        notifier = SystemdNotifier(lambda: "serving ipc://@/x", environ=listener.environ)
        notifier.startService()
        self.assertEqual(listener.received(), ["READY=1\nSTATUS=serving ipc://@/x"])
        notifier.stopService()
        self.assertEqual(listener.received(), ["STOPPING=1\nSTATUS=stopping"])
        self.assertEqual(len(notifier.sent), 2)

    def test_statusUpdates(self) -> None:
        """The status line is read every interval and sent only when it changed, on one line."""
        listener = Listener(self, abstract=False)
        clock = Clock()
        status = ["starting"]
        notifier = SystemdNotifier(lambda: status[0], clock, 5.0, listener.environ)
        notifier.startService()
        self.assertEqual(listener.received(), ["READY=1\nSTATUS=starting"])
        clock.advance(5)
        self.assertEqual(listener.received(), [])
        status[0] = "serving\n3 clients"
        clock.advance(5)
        self.assertEqual(listener.received(), ["STATUS=serving 3 clients"])
        notifier.stopService()
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_watchdog(self) -> None:
        """With C{$WATCHDOG_USEC}, WATCHDOG=1 every half of it from the clock, until stopped."""
        listener = Listener(self, abstract=True)
        clock = Clock()
        environ = {**listener.environ, "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}
        notifier = SystemdNotifier(None, clock, environ=environ)
        notifier.startService()
        self.assertEqual(listener.received(), ["READY=1", "WATCHDOG=1"])
        clock.advance(2)
        clock.advance(2)
        self.assertEqual(listener.received(), ["WATCHDOG=1", "WATCHDOG=1"])
        notifier.stopService()
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_watchdogPeriod(self) -> None:
        """The watchdog is for this process only, and only with a positive period."""
        self.assertEqual(watchdog_period({"WATCHDOG_USEC": "3000000"}), 1.5)
        self.assertIsNone(watchdog_period({}))
        self.assertIsNone(watchdog_period({"WATCHDOG_USEC": "0"}))
        self.assertIsNone(watchdog_period({"WATCHDOG_USEC": "soon"}))
        self.assertIsNone(watchdog_period({"WATCHDOG_USEC": "100", "WATCHDOG_PID": "1"}))

    def test_noVariableNoOp(self) -> None:
        """Outside systemd the service starts and stops sending nothing."""
        notifier = SystemdNotifier(lambda: "serving", Clock(), environ={})
        notifier.startService()
        notifier.stopService()
        self.assertEqual(notifier.sent, [])

    def test_failingStatus(self) -> None:
        """A status function that raises is logged; READY=1 is still sent."""
        listener = Listener(self, abstract=True)

        def broken() -> str:
            raise RuntimeError("no status")

        notifier = SystemdNotifier(broken, environ=listener.environ)
        notifier.startService()
        self.assertEqual(listener.received(), ["READY=1"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        notifier.stopService()


class SystemTests(SynchronousTestCase):
    skip = skip_slow

    def test_brokerProcess(self) -> None:
        """
        A broker run with C{$NOTIFY_SOCKET} says READY=1 with the endpoint it
        serves once it has started, and STOPPING=1 when it stops.
        """
        listener = Listener(self, abstract=True)
        self.patch(os, "environ", {**os.environ, **listener.environ})
        broker = BrokerProcess(Path(self.mktemp()), journal=False)
        with broker:
            started = listener.received()
        stopped = listener.received()
        self.assertEqual(started, [f"READY=1\nSTATUS=serving {broker.endpoint}"])
        self.assertEqual(stopped, ["STOPPING=1\nSTATUS=stopping"])
