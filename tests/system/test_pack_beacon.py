"""
Tests for L{malamute_pack.pack.beacon}: the listener's decoding and
filtering without sockets; L{resolve_interface} on this machine's
interfaces; and, as slow system tests run as root, two L{BeaconService}s
in two network namespaces (a L{Lan}) that hear each other's beacons,
never their own, and the port-0 beacon of the one that stops.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from typing import ClassVar

import psutil
import zmq
from twisted.trial.unittest import SkipTest, SynchronousTestCase
from zmq.utils import z85

from malamute_pack.pack.beacon import BeaconListener, resolve_interface
from malamute_pack.protocol.zre import Beacon, encode_beacon
from malamute_pack.testing.brokerprocess import PROJECT_ROOT
from malamute_pack.testing.netns import Lan, netns_available
from tests.support import skip_slow

# This helper's share of the project's addresses (see the brief; each test's
# namespace prefix is in its class's PREFIXES).
SUBNET = "10.77.12"

OURS = bytes(range(16))
THEIRS = bytes(range(16, 32))


class ListenerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.listener = BeaconListener(
            OURS,
            lambda uuid, endpoint, key: self.calls.append(("discovered", uuid, endpoint, key)),
            lambda uuid: self.calls.append(("departed", uuid)),
        )

    def test_discovered(self) -> None:
        """A beacon becomes the sender's tcp endpoint: its source address and port, no key."""
        self.listener.datagram(encode_beacon(Beacon(THEIRS, 4242)), "10.77.12.2")
        self.assertEqual(self.calls, [("discovered", THEIRS, "tcp://10.77.12.2:4242", None)])
        self.assertEqual(self.listener.counters.heard, 1)

    def test_departed(self) -> None:
        """A port-0 beacon means the sender is leaving."""
        self.listener.datagram(encode_beacon(Beacon(THEIRS, 0)), "10.77.12.2")
        self.assertEqual(self.calls, [("departed", THEIRS)])

    def test_own(self) -> None:
        """Our own beacon, echoed back by the broadcast, is ignored and counted."""
        self.listener.datagram(encode_beacon(Beacon(OURS, 4242)), "10.77.12.1")
        self.assertEqual((self.calls, self.listener.counters.own), ([], 1))

    def test_malformed(self) -> None:
        """Datagrams that are not beacons are ignored and counted."""
        for data in (b"", b"ZRE", b"ZRE\x01" + THEIRS, b"x" * 22, b"ZRE\x02" + THEIRS + b"\0\1"):
            self.listener.datagram(data, "10.77.12.2")
        self.assertEqual((self.calls, self.listener.counters.malformed), ([], 5))

    def test_curve(self) -> None:
        """
        A CURVE beacon's public key goes to the node in Z85 with its
        endpoint (the node decides whether to follow it); it is counted.
        """
        public, _ = zmq.curve_keypair()
        beacon = encode_beacon(Beacon(THEIRS, 1, z85.decode(public)))
        self.assertEqual(len(beacon), 54)
        self.listener.datagram(beacon, "10.77.12.2")
        self.assertEqual(self.calls, [("discovered", THEIRS, "tcp://10.77.12.2:1", public)])
        self.assertEqual(self.listener.counters.curve, 1)


class ResolveTests(SynchronousTestCase):
    def test_byNameAndAddress(self) -> None:
        """An interface with a broadcast address resolves by its name and by its address."""
        for name, entries in psutil.net_if_addrs().items():
            for entry in entries:
                if entry.family == socket.AF_INET and entry.broadcast:
                    expected = (entry.address, entry.broadcast)
                    self.assertEqual(resolve_interface(name), expected)
                    self.assertEqual(resolve_interface(entry.address), expected)
                    return
        raise SkipTest("no interface with an IPv4 broadcast address here")

    def test_loopbackRefused(self) -> None:
        """Loopback has no broadcast address: a clear ValueError."""
        with self.assertRaises(ValueError) as caught:
            resolve_interface("127.0.0.1")
        self.assertIn("no IPv4 broadcast", str(caught.exception))

    def test_unknown(self) -> None:
        """An unknown interface is a clear ValueError."""
        with self.assertRaises(ValueError) as caught:
            resolve_interface("mpb-no-such-interface")
        self.assertIn("no network interface", str(caught.exception))


# Runs one BeaconService on eth0 (uuid argv[1] in hex, inbox port argv[2])
# until argv[3] seconds after its first discovery (or 20 s without one: the
# other may start late on a loaded machine) and prints, as JSON lines, the
# interface, each discovery and departure, and the counters at the end.
BEACONER = textwrap.dedent(
    """
    import json, sys
    from twisted.internet import reactor
    from malamute_pack.pack.beacon import BeaconService, resolve_interface

    def say(**fields):
        print(json.dumps(fields), flush=True)

    def discovered(uuid, endpoint, key):
        say(event="discovered", uuid=uuid.hex(), endpoint=endpoint)
        if giving_up.active():
            giving_up.cancel()
            reactor.callLater(float(sys.argv[3]), stop)

    address, broadcast = resolve_interface("eth0")
    say(event="interface", address=address, broadcast=broadcast)
    service = BeaconService(
        reactor, bytes.fromhex(sys.argv[1]), int(sys.argv[2]), discovered,
        lambda uuid: say(event="departed", uuid=uuid.hex()),
        broadcast, interval=0.1,
    )

    def stop():
        service.stop()
        say(event="counters", **vars(service.counters))
        reactor.stop()

    giving_up = reactor.callLater(20.0, stop)
    service.start()
    reactor.run()
    """
)


class BeaconNamespaceTests(SynchronousTestCase):
    skip = skip_slow
    # Each test method's namespace prefix, used by no other test: tests run
    # side by side, and a Lan's create() deletes what its prefix names.
    PREFIXES: ClassVar[dict[str, str]] = {"test_hearEachOther": "mpb1"}

    def setUp(self) -> None:
        why = netns_available()
        if why is not None:
            raise SkipTest(why)
        self.lan = Lan(self.PREFIXES[self._testMethodName], SUBNET, 2)
        self.addCleanup(self.lan.destroy)
        self.lan.create()

    def test_hearEachOther(self) -> None:
        """
        Two hosts' beacons reach each other with the sender's address as
        the endpoint's host, never their own; the one that stops first
        (1.5 s after it heard the other, which stops 3 s after) is seen to
        depart.
        """
        one, two = self.lan.hosts
        first = one.popen(
            [sys.executable, "-c", BEACONER, OURS.hex(), "1111", "1.5"],
            stdout=subprocess.PIPE,
            cwd=PROJECT_ROOT,
        )
        second = two.popen(
            [sys.executable, "-c", BEACONER, THEIRS.hex(), "2222", "3"],
            stdout=subprocess.PIPE,
            cwd=PROJECT_ROOT,
        )
        out_first, _ = first.communicate(timeout=40)
        out_second, _ = second.communicate(timeout=40)
        self.assertEqual((first.returncode, second.returncode), (0, 0))
        heard_first = [json.loads(line) for line in out_first.splitlines()]
        heard_second = [json.loads(line) for line in out_second.splitlines()]

        self.assertEqual(
            heard_first[0],
            {"event": "interface", "address": "10.77.12.1", "broadcast": "10.77.12.255"},
        )
        discovered = {(e["uuid"], e["endpoint"]) for e in heard_first if e["event"] == "discovered"}
        self.assertEqual(discovered, {(THEIRS.hex(), "tcp://10.77.12.2:2222")})
        discovered = {
            (e["uuid"], e["endpoint"]) for e in heard_second if e["event"] == "discovered"
        }
        self.assertEqual(discovered, {(OURS.hex(), "tcp://10.77.12.1:1111")})
        self.assertIn({"event": "departed", "uuid": OURS.hex()}, heard_second)
        counters = heard_second[-1]
        self.assertEqual(counters["event"], "counters")
        self.assertGreater(counters["own"], 5)
        self.assertEqual(counters["malformed"], 0)
        self.assertEqual(counters["send_errors"], 0)
