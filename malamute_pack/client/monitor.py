"""
How a client with several endpoints (a primary/backup pair) hears at once
that its connection is up or gone, instead of waiting for silence: a
ZeroMQ socket monitor on its DEALER. L{watch} attaches one (before the
DEALER connects, so that no event is missed) and returns the PAIR socket
its events come on; L{link_change} reads one event message as what the
client cares about: the connection is up (the handshake is done: messages
can be queued on it) or lost (the broker went away, e.g. killed: its TCP
connection was reset). L{unwatch} detaches it before the DEALER closes.
A blocking client whose send found no room waits with L{wait_writable},
which wakes up for the monitor too (a connection that broke leaves no room
ever: waiting for room alone would last until the timeout).

Each DEALER gets its own inproc address, so that the PAIR of a new DEALER
never hears the events of one the client left.

Tests: ``tests/test_client_monitor.py``.
"""

from __future__ import annotations

import enum
import itertools
import struct
import time
from collections.abc import Sequence
from typing import Final

import zmq

# The events a watched DEALER reports.
LINK_EVENTS: Final = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED

_EVENT: Final = struct.Struct("=HI")  # the event's number, and its value
_addresses = itertools.count(1)


class LinkChange(enum.Enum):
    MADE = "made"  # the connection is up: messages can be queued on it
    LOST = "lost"  # the connection broke


_CHANGES: Final = {
    int(zmq.EVENT_HANDSHAKE_SUCCEEDED): LinkChange.MADE,
    int(zmq.EVENT_DISCONNECTED): LinkChange.LOST,
}


def watch(dealer: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
    """
    Monitor C{dealer}'s connections (call it before C{dealer} connects);
    the PAIR socket the events come on, to be read without blocking.
    """
    address = f"inproc://malamute-client-monitor-{next(_addresses)}"
    dealer.monitor(address, LINK_EVENTS)
    pair: zmq.Socket[bytes] = dealer.context.socket(zmq.PAIR)
    pair.setsockopt(zmq.LINGER, 0)
    pair.connect(address)
    return pair


def unwatch(dealer: zmq.Socket[bytes]) -> None:
    """Stop monitoring C{dealer}, before it closes (then close its PAIR)."""
    if not dealer.closed:
        dealer.disable_monitor()


def wait_writable(dealer: zmq.Socket[bytes], pair: zmq.Socket[bytes], until: float) -> None:
    """
    Wait until C{dealer} can take a message, or its monitor C{pair} has
    something to say, or C{until} (C{time.monotonic()}), whichever comes first.
    """
    poller = zmq.Poller()
    poller.register(dealer, zmq.POLLOUT)
    poller.register(pair, zmq.POLLIN)
    poller.poll(max(0, int((until - time.monotonic()) * 1000)))


def link_change(frames: Sequence[bytes]) -> LinkChange | None:
    """What one monitor message says of the connection; None for any other event."""
    if len(frames) != 2 or len(frames[0]) != _EVENT.size:
        return None
    event, _ = _EVENT.unpack(frames[0])
    return _CHANGES.get(event)
