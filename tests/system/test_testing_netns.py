"""
Tests for L{malamute_pack.testing.netns}: the names a L{Lan} makes, and, as
slow system tests run as root, real Lans: a UDP broadcast from one host
reaches the others, TCP connects across hosts, nothing appears in the root
namespace, and destroy() (and create() after a killed run) leaves nothing
behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import ClassVar

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from malamute_pack.testing.netns import IFNAME_MAX, Lan, namespaces, netns_available
from tests.support import skip_slow

# This helper's share of the project's names and addresses (see the brief):
# NamesTests' prefix is never created; each of LanTests' is its own.
PREFIX = "mpn0"
SUBNET = "10.77.13"

# Receives one UDP datagram on argv[1]'s port, from any address (a
# broadcast included), and prints it with its source address.
RECEIVE = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", int(sys.argv[1])))
    s.settimeout(10)
    print("ready", flush=True)
    data, (address, _) = s.recvfrom(100)
    print(data.decode(), address)
    """
)

# Sends argv[2] to the broadcast address argv[1], port argv[3], 20 times
# over a second (one datagram lost on the way does not fail the test).
BROADCAST = textwrap.dedent(
    """
    import socket, sys, time
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    for _ in range(20):
        s.sendto(sys.argv[2].encode(), (sys.argv[1], int(sys.argv[3])))
        time.sleep(0.05)
    """
)

# Listens on argv[1], any port; prints the port, then what one connection
# sends and where it came from.
LISTEN = textwrap.dedent(
    """
    import socket, sys
    s = socket.create_server((sys.argv[1], 0))
    s.settimeout(10)
    print(s.getsockname()[1], flush=True)
    connection, (address, _) = s.accept()
    print(connection.recv(100).decode(), address)
    """
)

CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)" + (
    ".sendall(b'hello')"
)


def _root_links() -> list[str]:
    """The interface names of the root namespace."""
    listed = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    return [line.split(":")[1].strip().split("@")[0] for line in listed.stdout.splitlines()]


def _root_addresses() -> str:
    return subprocess.run(["ip", "-o", "address"], capture_output=True, text=True).stdout


class NamesTests(SynchronousTestCase):
    """What a Lan is called, before anything is made."""

    def test_namesFitIFNAMSIZ(self) -> None:
        """
        With the longest prefix and the most hosts, every namespace and
        interface name a Lan makes fits in IFNAMSIZ; hosts are numbered
        from 1 with matching addresses.
        """
        lan = Lan("mp9999", "10.77.13", 254)
        self.assertEqual(max(len(name) for name in lan.names()), len("mp9999h254"))
        self.assertLessEqual(max(len(name) for name in lan.names()), IFNAME_MAX)
        self.assertEqual(
            [(h.name, h.address, h.interface) for h in (lan.hosts[0], lan.hosts[-1])],
            [("mp9999h1", "10.77.13.1", "eth0"), ("mp9999h254", "10.77.13.254", "eth0")],
        )
        self.assertEqual(lan.broadcast, "10.77.13.255")

    def test_badArguments(self) -> None:
        """
        A prefix that is too long, does not start with C{mp} or has other
        characters, a subnet that is not three octets, and a size outside
        1..254 are refused.
        """
        for prefix in ("mp12345", "xx1", "mp-1", ""):
            self.assertRaises(ValueError, Lan, prefix, SUBNET, 3)
        for subnet in ("10.77", "10.77.13.0", "10.77.300"):
            self.assertRaises(ValueError, Lan, PREFIX, subnet, 3)
        for size in (0, 255):
            self.assertRaises(ValueError, Lan, PREFIX, SUBNET, size)

    def test_hostCommand(self) -> None:
        """A host's command runs its argv in its namespace through C{ip netns exec}."""
        host = Lan(PREFIX, SUBNET, 2).hosts[1]
        self.assertEqual(
            host.command(["true", "x"]), ["ip", "netns", "exec", "mpn0h2", "true", "x"]
        )


class LanTests(SynchronousTestCase):
    """
    Real Lans of network namespaces.

    @cvar PREFIXES: each test method's namespace prefix, used by no other
        test: tests run side by side (C{trial -j}) and a Lan's create()
        deletes what its prefix names. None is a string prefix of another
        test's, so the checks that nothing starts with a test's prefix see
        its own names only.
    """

    skip = skip_slow
    PREFIXES: ClassVar[dict[str, str]] = {
        "test_broadcastReachesOtherHosts": "mpn1",
        "test_tcpBetweenHosts": "mpn2",
        "test_loopbackUp": "mpn3",
        "test_rootNamespaceUntouched": "mpn4",
        "test_destroyLeavesNothing": "mpn5",
        "test_createAfterKilledRun": "mpn6",
        "test_otherPrefixesKept": "mpn7",
    }

    def setUp(self) -> None:
        reason = netns_available()
        if reason is not None:
            raise SkipTest(reason)
        self.prefix = self.PREFIXES[self._testMethodName]

    def lan(self, size: int = 3, prefix: str | None = None) -> Lan:
        """A created Lan (this test's prefix unless told), destroyed when the test ends."""
        lan = Lan(prefix or self.prefix, SUBNET, size)
        self.addCleanup(lan.destroy)
        lan.create()
        return lan

    def python(self, lan: Lan, index: int, code: str, *args: str) -> subprocess.Popen[str]:
        """C{code} started with C{args} on host C{index} (from 0), killed if still running."""
        process = lan.hosts[index].popen(
            [sys.executable, "-c", code, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

        def end() -> None:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
            process.communicate()

        self.addCleanup(end)
        return process

    def test_broadcastReachesOtherHosts(self) -> None:
        """
        A UDP broadcast to the Lan's broadcast address from host 1 is
        received on hosts 2 and 3, from host 1's address.
        """
        lan = self.lan()
        port = "5670"
        receivers = [self.python(lan, i, RECEIVE, port) for i in (1, 2)]
        for receiver in receivers:
            assert receiver.stdout is not None
            self.assertEqual(receiver.stdout.readline(), "ready\n")
        sent = lan.hosts[0].run([sys.executable, "-c", BROADCAST, lan.broadcast, "beacon", port])
        self.assertEqual(sent.returncode, 0, sent.stderr)
        for receiver in receivers:
            out, err = receiver.communicate(timeout=15)
            self.assertEqual(out.splitlines()[-1:], [f"beacon {lan.hosts[0].address}"], err)

    def test_tcpBetweenHosts(self) -> None:
        """
        A TCP client on host 1 connects to a server on host 2's address,
        which sees it come from host 1's address.
        """
        lan = self.lan(2)
        server = self.python(lan, 1, LISTEN, lan.hosts[1].address)
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        connected = lan.hosts[0].run(
            [sys.executable, "-c", CONNECT, lan.hosts[1].address, port], timeout=15
        )
        self.assertEqual(connected.returncode, 0, connected.stderr)
        out, err = server.communicate(timeout=15)
        self.assertEqual(out.splitlines()[-1:], [f"hello {lan.hosts[0].address}"], err)

    def test_loopbackUp(self) -> None:
        """Each host's loopback is up: a TCP server on 127.0.0.1 takes a connection there."""
        lan = self.lan(1)
        server = self.python(lan, 0, LISTEN, "127.0.0.1")
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        connected = lan.hosts[0].run([sys.executable, "-c", CONNECT, "127.0.0.1", port])
        self.assertEqual(connected.returncode, 0, connected.stderr)
        out, err = server.communicate(timeout=15)
        self.assertEqual(out.splitlines()[-1:], ["hello 127.0.0.1"], err)

    def test_rootNamespaceUntouched(self) -> None:
        """
        A created Lan is its namespaces, the bridge's and one per host, and
        nothing in the root namespace: no interface named with its prefix,
        no address on its subnet.
        """
        lan = self.lan()
        self.assertEqual(
            sorted(lan.existing()), [f"{self.prefix}{n}" for n in ("br", "h1", "h2", "h3")]
        )
        self.assertEqual([name for name in _root_links() if name.startswith(self.prefix)], [])
        self.assertNotIn(SUBNET + ".", _root_addresses())

    def test_destroyLeavesNothing(self) -> None:
        """
        After destroy() no namespace and no root link carries the prefix;
        a second destroy() is harmless.
        """
        lan = self.lan()
        lan.destroy()
        self.assertEqual([name for name in namespaces() if name.startswith(self.prefix)], [])
        self.assertEqual([name for name in _root_links() if name.startswith(self.prefix)], [])
        lan.destroy()

    def test_createAfterKilledRun(self) -> None:
        """
        Leftovers of a run killed before its destroy() (a whole Lan, with
        a process still running in one host, and a stray namespace the
        prefix names) are removed by the next create(), and the new Lan
        works.
        """
        leftover = self.lan(3)
        sleeper = self.python(
            leftover, 1, "import time; print('ready', flush=True); time.sleep(60)"
        )
        # Running in its namespace (ip netns exec done) before that is deleted.
        assert sleeper.stdout is not None
        self.assertEqual(sleeper.stdout.readline(), "ready\n")
        subprocess.run(["ip", "netns", "add", f"{self.prefix}h7"], check=True)
        lan = self.lan(2)
        self.assertEqual(sorted(lan.existing()), [f"{self.prefix}{n}" for n in ("br", "h1", "h2")])
        self.assertIsNone(sleeper.poll())
        server = self.python(lan, 1, LISTEN, lan.hosts[1].address)
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        connected = lan.hosts[0].run([sys.executable, "-c", CONNECT, lan.hosts[1].address, port])
        self.assertEqual(connected.returncode, 0, connected.stderr)

    def test_otherPrefixesKept(self) -> None:
        """Creating and destroying a Lan leaves another Lan whose prefix extends it alone."""
        other = self.lan(1, prefix=self.prefix + "0")
        lan = self.lan(1)
        lan.destroy()
        self.assertEqual(sorted(other.existing()), [f"{self.prefix}0br", f"{self.prefix}0h1"])
