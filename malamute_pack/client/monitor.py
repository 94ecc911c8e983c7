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

A CURVE client given the wrong broker key is not told so by libzmq: the
broker cannot open the client's HELLO and closes the connection, and the
client hears C{EVENT_HANDSHAKE_FAILED_NO_DETAIL} (EPIPE or ECONNRESET),
C{EVENT_DISCONNECTED}, and connects again every 100 to 200 ms, for ever
(a dead broker gives no C{EVENT_CONNECTED}, a slow one no failure).
L{Handshakes} counts those broken-off handshakes across the client's
DEALERs: L{BROKEN_OFF_CONCLUSIVE} of them with none succeeded, or one
when connect() times out, make a L{Refusal} that L{refusal_error} turns
into L{WrongServerKeyError}. A refusal of the other mechanisms can come as
a broken-off handshake too, on a busy machine (the broker's reset drops
its answer before the client has read it, and libzmq connects again):
those make a L{Refusal} the same way, and the error says what the broker
probably wants.
A blocking client whose send found no room waits with L{wait_writable},
which wakes up for the monitor too (a connection that broke leaves no room
ever: waiting for room alone would last until the timeout).

Each DEALER gets its own inproc address, so that the PAIR of a new DEALER
never hears the events of one the client left.

Tests: ``tests/unit/test_client_monitor.py``.
"""

from __future__ import annotations

import enum
import errno
import itertools
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import zmq

from malamute_pack.client.errors import AuthenticationRefusedError, WrongServerKeyError
from malamute_pack.client.options import CurveKeys

# The events a watched DEALER reports: its connection up or lost, and a
# security handshake the broker refused or broke off.
LINK_EVENTS: Final = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
#: Handshakes broken off by the broker, none succeeding, after which a
#: client reports a refusal (a CURVE client: its broker key wrong; libzmq
#: retries every 100 to 200 ms: the second comes within about 0.2 s).
BROKEN_OFF_CONCLUSIVE: Final = 2
# What a handshake broken off by the peer fails with (the peer closed the
# connection), not a handshake timing out.
_PEER_CLOSED: Final = frozenset((errno.EPIPE, errno.ECONNRESET))
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
    BROKEN_OFF = "broken off"  # the broker closed it during the handshake (L{Handshakes})


@dataclass(frozen=True, slots=True)
class Refusal:
    """
    The broker refused the security handshake: C{status} is the ZAP status
    code (400: the credentials are wrong) for a refusal of the credentials,
    C{protocol_error} libzmq's protocol error code for a failed handshake
    (L{MECHANISM_MISMATCH}: the client offers another mechanism than the
    broker's endpoint takes). One of the two is None, or both, and
    C{broken_off} counts the handshakes of a CURVE client that the broker
    broke off, none succeeding (L{Handshakes}): its key for the broker is
    probably wrong.
    """

    status: int | None = None
    protocol_error: int | None = None
    broken_off: int = 0


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
    if event == _FAILED_NO_DETAIL:
        return LinkChange.BROKEN_OFF if value in _PEER_CLOSED else None
    return _CHANGES.get(event)


_FAILED_AUTH: Final = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_FAILED_PROTOCOL: Final = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_FAILED_NO_DETAIL: Final = int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class Handshakes:
    """
    A client's security handshakes so far, across its DEALERs: whether one
    succeeded, and how many the broker broke off. For a CURVE client,
    handshakes broken off with none succeeded say that the broker's public
    key it was given is probably not the broker's (or that something other
    than a Malamute broker listens there): libzmq cannot tell it otherwise.
    For a client of another mechanism they are what a refusal of its
    mechanism becomes when the broker's reset overtakes its answer: the
    broker, having refused, closes with the client's next bytes unread,
    which makes the kernel reset the connection and drop the broker's
    greeting if the client, busy, had not read it yet; libzmq then
    connects again and again.

    @ivar succeeded: whether a handshake ever succeeded.
    @ivar broken_off: the handshakes the broker broke off.
    """

    def __init__(self) -> None:
        self.succeeded = False
        self.broken_off = 0

    def heard(self, change: LinkChange | Refusal | None) -> LinkChange | Refusal | None:
        """
        What C{change} (from L{link_change}) tells the client, once counted:
        a broken-off handshake says nothing, but the one that makes them
        L{BROKEN_OFF_CONCLUSIVE} is a L{Refusal} (once).
        """
        if change is LinkChange.MADE:
            self.succeeded = True
        elif change is LinkChange.BROKEN_OFF:
            self.broken_off += 1
            return self.refusal() if self.broken_off == BROKEN_OFF_CONCLUSIVE else None
        return change

    def refusal(self) -> Refusal | None:
        """
        The L{Refusal} the handshakes so far make: handshakes the broker
        broke off (one is enough when connect() timed out), none
        succeeding; None otherwise.
        """
        if self.broken_off and not self.succeeded:
            return Refusal(broken_off=self.broken_off)
        return None


# What a client without credentials is told its broker wants.
_OFFERS_NONE: Final = (
    "requires PLAIN/CURVE authentication and this client offers none: give --user and "
    "the password (MALAMUTE_PASSWORD), or CURVE keys"
)


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
    if refusal.broken_off:
        times = {1: "once", 2: "twice"}.get(refusal.broken_off, f"{refusal.broken_off} times")
        broke_off = (
            f"the broker at {endpoint} broke off the {mechanism} handshake ({times}, never "
            "completing one)"
        )
        if curve is not None:
            return WrongServerKeyError(
                f"{broke_off}: the broker's public key given to this client (server key "
                f"{curve.server}) is probably not the broker's; check it against the broker's "
                "server.key",
                endpoint,
                curve.server,
                refusal.broken_off,
            )
        if plain is None:
            why = f"it probably {_OFFERS_NONE}"
        else:
            why = (
                f"it refused the credentials (PLAIN user {plain[0]!r}) or takes another "
                "mechanism: check --user, the password and the endpoint"
            )
        return AuthenticationRefusedError(f"{broke_off}: {why}", endpoint, mechanism, None)
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
            message = f"the broker at {endpoint} {_OFFERS_NONE}"
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
