"""
How a client with several endpoints (a primary/backup pair) hears at once
that its connection is up or gone, instead of waiting for silence: a
ZeroMQ socket monitor on its DEALER. L{watch} attaches one (before the
DEALER connects, so that no event is missed) and returns the PAIR socket
its events come on; L{link_change} reads one event message as what the
client cares about: the connection is up (the handshake is done: messages
can be queued on it) or lost (the broker went away, e.g. killed: its TCP
connection was reset), or a L{Refusal}: the broker refused the security
handshake. L{unwatch} detaches it before the DEALER closes.

Every client watches its DEALER for refusals, with one endpoint too: a
wrong PLAIN password (ZAP answers 400: C{EVENT_HANDSHAKE_FAILED_AUTH} with
the status), a CURVE key the broker does not know (the same), or no
credentials where the broker requires them, or PLAIN where it wants CURVE
(C{EVENT_HANDSHAKE_FAILED_PROTOCOL} with
C{PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH}). libzmq 4.3 does not reconnect
after either, so without the monitor the client would wait out its
timeout and report the broker unreachable; L{refusal_error} says what to
fix instead.
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
from dataclasses import dataclass
from typing import Final

import zmq

from malamute_pack.client.errors import AuthenticationRefusedError
from malamute_pack.client.options import CurveKeys

# The events a watched DEALER reports: its connection up or lost, and a
# security handshake the broker refused.
LINK_EVENTS: Final = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
)
MECHANISM_MISMATCH: Final = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
# libzmq's protocol error codes by name, for messages.
PROTOCOL_ERRORS: Final = {
    int(getattr(zmq, name)): name.removeprefix("PROTOCOL_ERROR_")
    for name in dir(zmq)
    if name.startswith("PROTOCOL_ERROR_")
}

_EVENT: Final = struct.Struct("=HI")  # the event's number, and its value
_addresses = itertools.count(1)


class LinkChange(enum.Enum):
    MADE = "made"  # the connection is up: messages can be queued on it
    LOST = "lost"  # the connection broke


@dataclass(frozen=True, slots=True)
class Refusal:
    """
    The broker refused the security handshake: C{status} is the ZAP status
    code (400: the credentials are wrong) for a refusal of the credentials,
    C{protocol_error} libzmq's protocol error code for a failed handshake
    (L{MECHANISM_MISMATCH}: the client offers another mechanism than the
    broker's endpoint takes). One of the two is None.
    """

    status: int | None = None
    protocol_error: int | None = None


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


def link_change(frames: Sequence[bytes]) -> LinkChange | Refusal | None:
    """
    What one monitor message says of the connection (a L{Refusal} if the
    broker refused the handshake); None for any other event.
    """
    if len(frames) != 2 or len(frames[0]) != _EVENT.size:
        return None
    event, value = _EVENT.unpack(frames[0])
    if event == _FAILED_AUTH:
        return Refusal(status=value)
    if event == _FAILED_PROTOCOL:
        return Refusal(protocol_error=value)
    return _CHANGES.get(event)


_FAILED_AUTH: Final = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_FAILED_PROTOCOL: Final = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)


def offered_mechanism(plain: tuple[str, str] | None, curve: CurveKeys | None) -> str:
    """The security mechanism a client with these credentials offers."""
    if plain is not None:
        return "PLAIN"
    return "NULL" if curve is None else "CURVE"


def refusal_error(
    refusal: Refusal,
    endpoint: str,
    plain: tuple[str, str] | None,
    curve: CurveKeys | None,
) -> AuthenticationRefusedError:
    """The error that tells the user what the broker at C{endpoint} refused, and what to fix."""
    mechanism = offered_mechanism(plain, curve)
    if refusal.status is not None:
        if refusal.status != 400:
            why = f"could not check the credentials (ZAP status {refusal.status})"
        elif plain is not None:
            why = (
                f"refused the credentials (PLAIN user {plain[0]!r}): check --user and the password"
            )
        elif curve is not None:
            why = (
                f"refused the credentials (CURVE public key {curve.public}): check that the "
                "broker lists this client's key"
            )
        else:
            why = "refused the connection (ZAP status 400)"
        message = f"the broker at {endpoint} {why}"
    elif refusal.protocol_error == MECHANISM_MISMATCH:
        if mechanism == "NULL":
            message = (
                f"the broker at {endpoint} requires PLAIN/CURVE authentication and this client "
                "offers none: give --user and the password (MALAMUTE_PASSWORD), or CURVE keys"
            )
        else:
            message = (
                f"the broker at {endpoint} does not take {mechanism} authentication (it "
                "requires another mechanism, or none): check the endpoint and the credentials"
            )
    else:
        code = refusal.protocol_error or 0
        name = PROTOCOL_ERRORS.get(code, hex(code))
        message = (
            f"the {mechanism} handshake with the broker at {endpoint} failed ({name}): "
            "check the credentials (and, for CURVE, the broker's public key)"
        )
    return AuthenticationRefusedError(message, endpoint, mechanism, refusal.status)
