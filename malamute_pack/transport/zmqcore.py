"""
The broker's ZeroMQ I/O core, compiled or pure Python: whole messages
received in batches (L{recv_batch}) and sent (L{send_message}) on a pyzmq
socket, never blocking.

pyzmq costs a Python call per frame, and on receipt a frame object per
frame; the compiled core (C{_zmqcore}, built from C{_zmqcore.c} when the
package is installed on a machine with a C compiler and libzmq's headers)
takes one call per batch or per message. The pure twin here does the same
through pyzmq and is used when the compiled one is absent or
C{MALAMUTE_PURE} is set in the environment (to any value but empty or
C{0}), and when the compiled core's libzmq is not pyzmq's (a pyzmq
wheel bundles its own: L{shares_pyzmq_sockets}); L{BUILD} says which, and
why, for the broker's start-up log.

Both behave the same: L{recv_batch} returns up to C{limit} messages (none
when none waits), raising any error but EAGAIN unless messages came
before it; L{recv_identified_batch}, for a ROUTER whose clients
authenticate, puts before each message the user ZeroMQ's authentication
(ZAP) gave its connection (empty if none); L{send_message} raises
C{zmq.ZMQError} as pyzmq does (EAGAIN for a full queue, EHOSTUNREACH for
an unknown peer on a ROUTER with mandatory routing, ENOTSOCK for a closed
socket).

Tests: ``tests/unit/test_transport_zmqcore.py``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Final

import zmq

# pyzmq's send_multipart combines its flags through enum arithmetic, which
# costs more than the send itself; the backend's send with int flags does not.
# Only the first frame can fail with EAGAIN: ZeroMQ queues whole messages.
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
_NOBLOCK: Final = int(zmq.NOBLOCK)
_MORE: Final = int(zmq.NOBLOCK | zmq.SNDMORE)

# Whether more frames follow is read from each frame (zmq_msg_more), never
# with getsockopt(RCVMORE): pyzmq turns every option into its enum first,
# which costs three times a frame's receipt.

Socket = zmq.Socket[bytes]
Messages = list[list[bytes]]
PURE_VARIABLE: Final = "MALAMUTE_PURE"


def _recv_multipart(sock: Socket) -> list[bytes]:
    """One whole message without blocking (zmq.Again if none waits)."""
    frames: list[bytes] = []
    while True:
        frame: zmq.Frame = _recv(sock, _NOBLOCK, False)
        frames.append(frame.bytes)  # the rest of a message is always there
        if not frame.more:
            return frames


def _recv_routed(sock: Socket) -> list[bytes]:
    """
    As L{_recv_multipart}, on a ROUTER: its first frame, the routing id,
    is always followed by the peer's message, so it is read as bytes, the
    cheapest way, with no frame object to ask.
    """
    frames: list[bytes] = [_recv(sock, _NOBLOCK)]
    while True:
        frame: zmq.Frame = _recv(sock, _NOBLOCK, False)
        frames.append(frame.bytes)
        if not frame.more:
            return frames


def _batch(sock: Socket, limit: int, receive: Callable[[Socket], list[bytes]]) -> Messages:
    """Up to C{limit} messages C{receive} reads, until none waits."""
    batch: Messages = []
    try:
        for _ in range(limit):
            batch.append(receive(sock))
    except zmq.Again:
        pass
    except zmq.ZMQError:
        if not batch:
            raise
    return batch


def pure_recv_batch(sock: Socket, limit: int) -> Messages:
    """Up to C{limit} whole messages waiting on C{sock}, through pyzmq."""
    return _batch(sock, limit, _recv_routed if sock.type == zmq.ROUTER else _recv_multipart)


def _recv_identified(sock: Socket) -> list[bytes]:
    """
    One whole message without blocking from a ROUTER, preceded by the user
    ZeroMQ's authentication (ZAP) gave its connection (UTF-8; empty if
    none). The routing id frame is the socket's own, without the peer's
    metadata: the user is read from the frame after it.
    """
    frames: list[bytes] = [b"", _recv(sock, _NOBLOCK)]
    frame: zmq.Frame = _recv(sock, _NOBLOCK, False)
    with contextlib.suppress(zmq.ZMQError):  # no user on this connection
        frames[0] = str(frame.get("User-Id")).encode("utf-8", "surrogateescape")
    frames.append(frame.bytes)
    while frame.more:
        frame = _recv(sock, _NOBLOCK, False)
        frames.append(frame.bytes)
    return frames


def pure_recv_identified_batch(sock: Socket, limit: int) -> Messages:
    """As L{pure_recv_batch} on a ROUTER, each message preceded by its connection's user."""
    return _batch(sock, limit, _recv_identified)


def pure_send_message(sock: Socket, first: bytes, rest: Sequence[bytes]) -> None:
    """Send C{first} then C{rest} as one message without blocking, through pyzmq."""
    if not rest:
        _send(sock, first, _NOBLOCK)
        return
    _send(sock, first, _MORE)
    last = len(rest) - 1
    for i, frame in enumerate(rest):
        _send(sock, frame, _NOBLOCK if i == last else _MORE)


def _wanted_pure(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether C{environ} asks for the pure-Python core."""
    return environ.get(PURE_VARIABLE, "") not in ("", "0")


RecvBatch = Callable[[Socket, int], Messages]
SendMessage = Callable[[Socket, bytes, Sequence[bytes]], None]


def shares_pyzmq_sockets(core_recv_batch: RecvBatch) -> bool:
    """
    Whether a compiled core can work on pyzmq's sockets: it must call the
    libzmq pyzmq calls. pyzmq from PyPI's binary wheel bundles a libzmq of
    its own, and the core, linked against the system's, would find every
    socket foreign (ENOTSOCK). Asked once, of a socket of a context with
    no I/O thread.
    """
    context: zmq.Context[Socket] = zmq.Context(io_threads=0)
    sock = context.socket(zmq.PAIR)
    try:
        core_recv_batch(sock, 1)
    except zmq.ZMQError:
        return False
    finally:
        sock.close(0)
        context.term()
    return True


def _choose() -> tuple[RecvBatch, RecvBatch, SendMessage, str]:
    """The core to use, and the start-up log's words for it."""
    pure = pure_recv_batch, pure_recv_identified_batch, pure_send_message
    if _wanted_pure(os.environ):
        return *pure, f"pure Python ({PURE_VARIABLE} is set)"
    try:
        from malamute_pack.transport import _zmqcore
    except ImportError as e:
        return *pure, f"pure Python (no compiled core: {e})"
    if not shares_pyzmq_sockets(_zmqcore.recv_batch):
        return *pure, (
            "pure Python (the compiled core's libzmq is not pyzmq's: pyzmq from a "
            "binary wheel bundles its own; install it with --no-binary pyzmq)"
        )
    core = _zmqcore.recv_batch, _zmqcore.recv_identified_batch, _zmqcore.send_message
    return *core, "compiled"


recv_batch, recv_identified_batch, send_message, BUILD = _choose()
COMPILED: Final = BUILD == "compiled"
