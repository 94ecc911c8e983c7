"""
Tests for L{malamute_pack.ops.listen_hint}: the line for a C{--http}
endpoint that cannot listen suggests one that can, never the busy port
itself, on loopback sockets of this host.
"""

from __future__ import annotations

import errno
import os
import re
import socket

from twisted.internet.error import CannotListenError
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.ops.listen_hint import FIRST_PORT, cannot_listen

# The port of the endpoint a line suggests.
_SUGGESTED = re.compile(r"such as tcp:(\d+)(:interface=([^ )]+))?")


def refused(interface: str, port: int, number: int) -> Failure:
    """A failure as Twisted's listenTCP reports C{port} of C{interface} refused with C{number}."""
    error = OSError(number, os.strerror(number))
    return Failure(CannotListenError(interface, port, error))


class ListenHintTests(SynchronousTestCase):
    def busy_port(self) -> int:
        """A port of 127.0.0.1 that a socket of this test listens on."""
        busy = socket.socket()
        self.addCleanup(busy.close)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port: int = busy.getsockname()[1]
        return port

    def assertListens(self, line: str) -> tuple[int, str | None]:
        """The endpoint C{line} suggests can be listened on now; its port and interface."""
        found = _SUGGESTED.search(line)
        assert found is not None, line
        port, interface = int(found.group(1)), found.group(3)
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((interface or "", port))
            probe.listen()
        return port, interface

    def test_portInUse(self) -> None:
        """A busy port: the line names it and the reason, and suggests a free port next to it."""
        busy = self.busy_port()
        description = f"tcp:{busy}:interface=127.0.0.1"
        line = cannot_listen(description, refused("127.0.0.1", busy, errno.EADDRINUSE))
        self.assertTrue(line.startswith(f"management API: cannot listen on {description}: "))
        self.assertIn(f"port {busy} of 127.0.0.1: Address already in use", line)
        self.assertIn("give --http another endpoint", line)
        port, interface = self.assertListens(line)
        self.assertNotEqual(port, busy)
        self.assertGreater(port, busy)
        self.assertEqual(interface, "127.0.0.1")

    def test_privilegedPort(self) -> None:
        """A port below 1024 refused: the suggestion is one from 8180 up."""
        line = cannot_listen("tcp:80", refused("", 80, errno.EACCES))
        self.assertIn("port 80 of every interface: Permission denied", line)
        port, interface = self.assertListens(line)
        self.assertGreaterEqual(port, FIRST_PORT)
        self.assertIsNone(interface)

    def test_notThisHost(self) -> None:
        """An interface that is not this host's: the suggestion is on loopback."""
        line = cannot_listen(
            "tcp:8180:interface=192.0.2.1", refused("192.0.2.1", 8180, errno.EADDRNOTAVAIL)
        )
        _, interface = self.assertListens(line)
        self.assertEqual(interface, "127.0.0.1")

    def test_otherFailure(self) -> None:
        """Any other failure keeps its message and gets a loopback suggestion."""
        line = cannot_listen("unix:/no/such/dir/api", Failure(OSError("no such directory")))
        self.assertIn("cannot listen on unix:/no/such/dir/api: no such directory", line)
        self.assertListens(line)
