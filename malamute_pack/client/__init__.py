"""
Malamute clients: L{MalamuteClient} for Twisted programs and
L{BlockingClient} for scripts, both driving the sans-I/O L{ClientCore}.

Tests: ``tests/test_client_core.py``, ``tests/test_client_reactor.py``,
``tests/test_client_blocking.py``.
"""

from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.core import ClientCore, ClientState
from malamute_pack.client.errors import (
    BadEndpointError,
    BrokerUnreachableError,
    ClientClosedError,
    ClientError,
    MalamuteError,
    MessageDroppedError,
)
from malamute_pack.client.events import Confirmation, Delivery, Gap
from malamute_pack.client.reactor_client import MalamuteClient

__all__ = [
    "BadEndpointError",
    "BlockingClient",
    "BrokerUnreachableError",
    "ClientClosedError",
    "ClientCore",
    "ClientError",
    "ClientState",
    "Confirmation",
    "Delivery",
    "Gap",
    "MalamuteClient",
    "MalamuteError",
    "MessageDroppedError",
]
