"""
The ZeroMQ socket both drivers talk through: a DEALER connected to the
broker's endpoint, with deep queues and PLAIN credentials or CURVE keys if
given. A client with several endpoints (a primary/backup pair) is connected
to one at a time: a new DEALER for each, so that nothing queued for a
broker it left is sent later to one that did not expect it;
L{check_endpoints} refuses a bad endpoint up front. Such a client's
DEALER (L{make_watched_dealer}) queues messages only on a connection that
is up (C{zmq.IMMEDIATE}: a send with none fails at once, so an endpoint
nobody listens on is found out quickly) and reports its connection
coming up and breaking (L{malamute_pack.client.monitor}). Every client
watches its DEALER, one endpoint or several, to hear at once that the
broker refused its credentials (C{immediate=False} for one endpoint: its
DEALER queues as before, whatever the connection).

Tests: ``tests/unit/test_client_dealer.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import zmq

from malamute_pack.client.errors import BadEndpointError
from malamute_pack.client.monitor import watch
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
    socket = _dealer(context, plain, curve)
    _connect(socket, endpoint)
    return socket


def make_watched_dealer(
    context: zmq.Context[zmq.Socket[bytes]],
    endpoint: str,
    plain: tuple[str, str] | None = None,
    curve: CurveKeys | None = None,
    immediate: bool = True,
) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    """
    A DEALER as L{make_dealer} makes and the PAIR socket its connection
    events come on (L{monitor.watch}, attached before it connects so that
    none is missed). With C{immediate} (several endpoints) it queues
    messages only on a connection that is up (C{zmq.IMMEDIATE}).

    @raise BadEndpointError: if ZeroMQ refuses the endpoint.
    """
    socket = _dealer(context, plain, curve)
    if immediate:
        socket.setsockopt(zmq.IMMEDIATE, 1)
    pair = watch(socket)
    try:
        _connect(socket, endpoint)
    except BadEndpointError:
        pair.close(linger=0)
        raise
    return socket, pair


def _dealer(
    context: zmq.Context[zmq.Socket[bytes]],
    plain: tuple[str, str] | None,
    curve: CurveKeys | None,
) -> zmq.Socket[bytes]:
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
    return socket


def _connect(socket: zmq.Socket[bytes], endpoint: str) -> None:
    """Connect C{socket}, or close it and raise BadEndpointError."""
    try:
        socket.connect(endpoint)
    except zmq.ZMQError as e:
        socket.close(linger=0)
        raise BadEndpointError(f"cannot connect to {endpoint!r}: {e}") from e


def check_endpoints(context: zmq.Context[zmq.Socket[bytes]], endpoints: Sequence[str]) -> None:
    """
    Whether ZeroMQ takes every endpoint of C{endpoints}, tried on a socket
    closed at once (so that a fail-over never meets a bad one later).

    @raise BadEndpointError: for the first it refuses.
    """
    for endpoint in endpoints:
        make_dealer(context, endpoint).close(linger=0)
