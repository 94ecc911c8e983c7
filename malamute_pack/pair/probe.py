"""
Evidence that a pair's partner process is gone: a TCP connection to its
pair endpoint that the partner's host refuses (it answers, and nothing
listens there any more). An active goes on alone (acknowledges what the
partner does not have) on such evidence, never on silence alone: a
process that is gone comes back as a new one, out of sync, which cannot
take over before it has caught up. A connection accepted (even by a
paused process's kernel), a timeout or an unreachable host prove
nothing: a cut link looks the same, and a cut partner may be taking over.

Only C{tcp://HOST:PORT} endpoints can be probed (others give no evidence).

Tests: ``tests/unit/test_pair_probe.py``.
"""

from __future__ import annotations

import ipaddress
from typing import Final

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IReactorTCP, IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

_TCP: Final = "tcp://"


def probe_endpoint(
    reactor: IReactorTCP, endpoint: str, timeout: float
) -> IStreamClientEndpoint | None:
    """The client endpoint that reaches C{endpoint} (C{tcp://HOST:PORT}), or None."""
    if not endpoint.startswith(_TCP):
        return None
    host, _, port = endpoint[len(_TCP) :].rpartition(":")
    host = host.strip("[]")
    if not host or host == "*" or not port.isdigit():
        return None
    try:
        ipv4 = ipaddress.ip_address(host).version == 4
    except ValueError:
        ipv4 = False
    if ipv4:
        return TCP4ClientEndpoint(reactor, host, int(port), timeout=timeout)
    return HostnameEndpoint(reactor, host.encode(), int(port), timeout=timeout)


class PartnerProbe:
    """
    Asks, a connection at a time, whether the partner's pair endpoint
    refuses connections. C{available}: whether the endpoint can be probed.
    """

    def __init__(self, reactor: IReactorTCP, endpoint: str, timeout: float) -> None:
        self._reactor = reactor
        self._endpoint = probe_endpoint(reactor, endpoint, timeout)
        self._under_way: Deferred[bool] | None = None

    @property
    def available(self) -> bool:
        return self._endpoint is not None

    def gone(self) -> Deferred[bool] | None:
        """
        Fires True if the partner's endpoint refused the connection (its
        process is gone), False otherwise; None while a probe is under way
        or when the endpoint cannot be probed.
        """
        if self._endpoint is None or self._under_way is not None:
            return None
        connecting = self._endpoint.connect(Factory.forProtocol(Protocol))
        result: Deferred[bool] = Deferred()
        self._under_way = result

        def accepted(protocol: Protocol | None) -> bool:
            transport = protocol.transport if protocol is not None else None
            if transport is not None:
                transport.loseConnection()
            return False

        def failed(failure: Failure) -> bool:
            return isinstance(failure.value, ConnectionRefusedError)

        def settle(found: bool) -> None:
            self._under_way = None
            result.callback(found)

        connecting.addCallbacks(accepted, failed).addCallback(settle)
        return result


__all__ = ["PartnerProbe", "probe_endpoint"]
