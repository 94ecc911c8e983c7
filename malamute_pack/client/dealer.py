"""
The ZeroMQ socket both drivers talk through: a DEALER connected to the
broker's endpoint, with deep queues and PLAIN credentials or CURVE keys if
given.

Tests: ``tests/test_client_dealer.py``.
"""

from __future__ import annotations

from typing import Final

import zmq

from malamute_pack.client.errors import BadEndpointError
from malamute_pack.client.options import CurveKeys

# Deep queues so that a burst from the application is not dropped at once.
SOCKET_HWM: Final = 100_000


def make_dealer(
    context: zmq.Context[zmq.Socket[bytes]],
    endpoint: str,
    plain: tuple[str, str] | None = None,
    curve: CurveKeys | None = None,
) -> zmq.Socket[bytes]:
    """
    A DEALER connected to C{endpoint}, with PLAIN credentials or CURVE keys
    if given.

    @raise BadEndpointError: if ZeroMQ refuses the endpoint.
    """
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, SOCKET_HWM)
    socket.setsockopt(zmq.RCVHWM, SOCKET_HWM)
    if plain is not None:
        socket.setsockopt_string(zmq.PLAIN_USERNAME, plain[0])
        socket.setsockopt_string(zmq.PLAIN_PASSWORD, plain[1])
    if curve is not None:
        socket.setsockopt_string(zmq.CURVE_SERVERKEY, curve.server)
        socket.setsockopt_string(zmq.CURVE_PUBLICKEY, curve.public)
        socket.setsockopt_string(zmq.CURVE_SECRETKEY, curve.secret)
    try:
        socket.connect(endpoint)
    except zmq.ZMQError as e:
        socket.close(linger=0)
        raise BadEndpointError(f"cannot connect to {endpoint!r}: {e}") from e
    return socket
