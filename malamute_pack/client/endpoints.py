"""
The brokers a client may talk to, in order: a primary/backup pair (Binary
Star, ``docs/pair.md``) is given as two endpoints, and the client moves to
the next one, round-robin, when the one it is on is silent or answers
ERROR 503 (it is the passive one), or its connection breaks, or none comes
up in a short grace (nobody listens there). L{parse_endpoints} reads what the
application gave; an L{EndpointRing} says which endpoint is current, moves
on, and tells when every endpoint failed in a row (a full round: time to
back off before going round again).

    parse_endpoints("tcp://a:9999,tcp://b:9999")  # ('tcp://a:9999', 'tcp://b:9999')

Tests: ``tests/unit/test_client_endpoints.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from malamute_pack.client.errors import BadEndpointError
from malamute_pack.protocol import mlm

# ERROR status of a broker that does not serve (the passive of a pair).
NOT_ACTIVE: Final = mlm.NOT_ACTIVE
# Seconds to wait after every endpoint refused (or was silent) in a row,
# before going round again.
BACK_OFF: Final = 0.5

# Seconds a new connection has to come up (the TCP and ZeroMQ handshakes)
# before an endpoint whose CONNECTION_OPEN cannot be queued counts as
# failed (at most a quarter of the client's timeout).
HANDSHAKE_GRACE: Final = 0.2

# What the drivers take as C{endpoint}.
EndpointSpec = str | Sequence[str]


def parse_endpoints(spec: EndpointSpec) -> tuple[str, ...]:
    """
    The endpoints in C{spec}: one endpoint, several separated by commas
    (blanks around them ignored), or a list or tuple of endpoints.

    @raise BadEndpointError: if there is none.
    """
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    endpoints = tuple(part.strip() for part in parts if part.strip())
    if not endpoints:
        raise BadEndpointError(f"no endpoint given in {spec!r}")
    return endpoints


class EndpointRing:
    """
    The endpoints in order, the current one, and the failures in a row.

    @ivar endpoints: every endpoint, in the order they are tried.
    @ivar switches: how many times the client moved to another endpoint.
    """

    def __init__(self, endpoints: Sequence[str]) -> None:
        self.endpoints = tuple(endpoints) or ("",)
        self.switches = 0
        self._index = 0
        self._failures = 0  # endpoints that failed in a row since one accepted us

    @property
    def current(self) -> str:
        """The endpoint the client is on (or trying)."""
        return self.endpoints[self._index]

    @property
    def several(self) -> bool:
        """Whether there is another endpoint to move to (fail-over is on)."""
        return len(self.endpoints) > 1

    def failed(self) -> bool:
        """
        The current endpoint is silent or refused us: the next one becomes
        current. True when that completes a round: every endpoint failed
        in a row.
        """
        self._index = (self._index + 1) % len(self.endpoints)
        self._failures += 1
        if self._failures >= len(self.endpoints):
            self._failures = 0
            return True
        return False

    def switched(self) -> None:
        """A new connection was made to the current endpoint."""
        self.switches += 1

    def accepted(self) -> None:
        """The current endpoint accepted us: failures count from zero again."""
        self._failures = 0
