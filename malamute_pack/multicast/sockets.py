"""
The bridges' ZeroMQ sockets, made for their URL: a PUB for an outbound
bridge, a SUB for an inbound one, with the multicast options (rate,
recovery interval, hops) set before they connect. On a multicast URL both
sides connect (ZeroMQ joins the group); on any other endpoint the PUB
binds and the SUBs connect.

The PUB does not drop: at its high-water mark a send fails (C{XPUB_NODROP}),
the bridge's session refuses the delivery and the broker serves it from
the journal later, so a burst over the rate is published late, not lost.
Without it a PUB over the rate drops silently.

Two facts of libzmq 4.3 (measured in network namespaces) shape the rest:

- PGM takes the interface as an address: C{epgm://eth0;...} is refused
  (EINVAL). L{zmq_url} puts the interface's IPv4 address in its place
  (and L{malamute_pack.multicast.config.check} refuses an unknown name).
- A PGM SUB whose queue reaches its high-water mark aborts the process
  (an assertion in C{pgm_receiver.cpp}). So the SUB has none (C{RCVHWM} 0)
  and is never left unread: the bridge's rate must suit its slowest
  receiver, and a receiver that must pause drops and repairs instead
  (L{malamute_pack.multicast.inbound}).

Tests: ``tests/unit/test_multicast_outbound.py``, ``tests/unit/test_multicast_inbound.py``.
"""

from __future__ import annotations

from typing import Final

import zmq

from malamute_pack.multicast.config import MULTICAST, BridgeSettings, zmq_url
from malamute_pack.multicast.publisher import NORM_PACK_BYTES, PACK_BYTES
from malamute_pack.protocol.multicast import PREFIX

# Messages queued in ZeroMQ on either side, and the kernel's socket buffers:
# a receiver that pauses for a moment (a journal commit) must not lose data.
HWM: Final = 10_000
BUFFER_BYTES: Final = 8 * 1024 * 1024


def _multicast(url: str) -> bool:
    return url.split("://", 1)[0] in MULTICAST


def _options(socket: zmq.Socket[bytes], settings: BridgeSettings) -> None:
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RATE, settings.rate_kbps)
    socket.setsockopt(zmq.RECOVERY_IVL, settings.recovery_ms)
    socket.setsockopt(zmq.MULTICAST_HOPS, settings.hops)
    socket.setsockopt(zmq.SNDBUF, BUFFER_BYTES)
    socket.setsockopt(zmq.RCVBUF, BUFFER_BYTES)


def pack_bytes(url: str) -> int:
    """The most bytes of records a publisher on C{url} packs in one message."""
    return NORM_PACK_BYTES if url.split("://", 1)[0] == "norm" else PACK_BYTES


def open_publisher(
    context: zmq.Context[zmq.Socket[bytes]], url: str, settings: BridgeSettings
) -> zmq.Socket[bytes]:
    """
    A PUB on C{url}.

    @raise zmq.ZMQError: ZeroMQ refused the URL (the message says why).
    @raise ValueError: no such interface.
    """
    socket = context.socket(zmq.PUB)
    try:
        _options(socket, settings)
        socket.setsockopt(zmq.SNDHWM, HWM)
        socket.setsockopt(zmq.XPUB_NODROP, 1)
        if _multicast(url):
            socket.connect(zmq_url(url))
        else:
            socket.bind(url)
    except (zmq.ZMQError, ValueError):
        socket.close(linger=0)
        raise
    return socket


def bound_url(socket: zmq.Socket[bytes], url: str) -> str:
    """
    Where a PUB opened on C{url} is: C{url} itself on a multicast group,
    else the endpoint it bound (a C{*} port resolved), for logs and status.
    """
    if _multicast(url):
        return url
    endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
    return endpoint.decode() if isinstance(endpoint, bytes) and endpoint else url


def open_subscriber(
    context: zmq.Context[zmq.Socket[bytes]], url: str, settings: BridgeSettings
) -> zmq.Socket[bytes]:
    """
    A SUB on C{url}, subscribed to the bridge's messages.

    @raise zmq.ZMQError: ZeroMQ refused the URL (the message says why).
    @raise ValueError: no such interface.
    """
    socket = context.socket(zmq.SUB)
    try:
        _options(socket, settings)
        socket.setsockopt(zmq.RCVHWM, 0 if _multicast(url) else HWM)
        socket.setsockopt(zmq.SUBSCRIBE, PREFIX)
        socket.connect(zmq_url(url))
    except (zmq.ZMQError, ValueError):
        socket.close(linger=0)
        raise
    return socket
