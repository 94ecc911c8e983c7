"""
Tests for L{malamute_pack.pair.probe}: a partner's pair endpoint that
refuses connections is evidence its process is gone; one that accepts is
not; endpoints that are not TCP cannot be probed. Real loopback sockets.
"""

from __future__ import annotations

from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import TestCase

from malamute_pack.pair.probe import PartnerProbe, probe_endpoint


class ProbeTests(TestCase):
    async def listening(self) -> IListeningPort:
        """A port on loopback that accepts connections (closed at cleanup)."""
        port: IListeningPort = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
            Factory.forProtocol(Protocol)
        )
        self.addCleanup(port.stopListening)
        return port

    def number(self, port: IListeningPort) -> int:
        address = port.getHost()
        assert isinstance(address, IPv4Address)
        return address.port

    async def test_refusedIsGone(self) -> None:
        """A port nothing listens on any more refuses the probe: the partner is gone."""
        port = await self.listening()
        number = self.number(port)
        stopped = port.stopListening()
        if stopped is not None:
            await stopped
        probe = PartnerProbe(reactor, f"tcp://127.0.0.1:{number}", 2.0)
        answer = probe.gone()
        assert answer is not None
        self.assertTrue(await answer)

    async def test_acceptedIsNotGone(self) -> None:
        """A port that accepts is no evidence (its process may be paused): not gone."""
        port = await self.listening()
        probe = PartnerProbe(reactor, f"tcp://127.0.0.1:{self.number(port)}", 2.0)
        answer = probe.gone()
        assert answer is not None
        self.assertFalse(await answer)

    async def test_oneAtATime(self) -> None:
        """While a probe is under way, another is not started (None)."""
        port = await self.listening()
        probe = PartnerProbe(reactor, f"tcp://127.0.0.1:{self.number(port)}", 2.0)
        first = probe.gone()
        self.assertIsNone(probe.gone())
        assert first is not None
        await first
        again = probe.gone()
        self.assertIsInstance(again, Deferred)
        assert again is not None
        await again

    def test_onlyTcp(self) -> None:
        """ipc, a wildcard host or a bad port cannot be probed."""
        for endpoint in ("ipc://@/pair", "tcp://*:9998", "tcp://10.0.0.1:x", "inproc://a"):
            self.assertIsNone(probe_endpoint(reactor, endpoint, 1.0), endpoint)
            self.assertFalse(PartnerProbe(reactor, endpoint, 1.0).available)
        for endpoint in ("tcp://10.0.0.1:9998", "tcp://[::1]:9998", "tcp://partner:9998"):
            self.assertIsNotNone(probe_endpoint(reactor, endpoint, 1.0), endpoint)
