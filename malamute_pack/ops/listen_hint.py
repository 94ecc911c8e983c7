"""
What a broker whose management API cannot listen (C{--http}) says: the
endpoint, the reason, and an endpoint to give instead that works now: on
the same interface, the first port from the next one up (from 8180 for a
port below 1024, which needs root) that this host lets a server bind,
checked by binding it (else C{tcp:0}, any free port, which the log's
C{management API at} line names). The start fails with that line
(L{malamute_pack.ops.service}).

Tests: ``tests/unit/test_ops_listen_hint.py``.
"""

from __future__ import annotations

import socket
from typing import Final

from twisted.internet.error import CannotListenError
from twisted.python.failure import Failure

# Where the search for a free port starts when the one given is privileged.
FIRST_PORT: Final = 8180
# How many ports up from the first the search tries.
PORTS_TRIED: Final = 100
# The interface suggested when the one given is not this host's.
LOOPBACK: Final = "127.0.0.1"


def cannot_listen(description: str, failure: Failure) -> str:
    """The line for the management API refused C{description}, as C{failure} says."""
    error = failure.value
    if isinstance(error, CannotListenError):
        reason = error.socketError.strerror or str(error.socketError)
        interface = error.interface if _bindable(error.interface, 0) else LOOPBACK
        first = error.port + 1 if error.port >= 1024 else FIRST_PORT
        what = f"port {error.port} of {error.interface or 'every interface'}: {reason}"
    else:
        interface, first = LOOPBACK, FIRST_PORT
        what = failure.getErrorMessage()
    return (
        f"management API: cannot listen on {description}: {what}"
        f" (give --http another endpoint, such as {suggestion(interface, first)})"
    )


def suggestion(interface: str, first: int) -> str:
    """A TCP endpoint on C{interface} with the first free port from C{first} (else any port)."""
    for port in range(first, min(first + PORTS_TRIED, 65536)):
        if _bindable(interface, port):
            return _endpoint(interface, port)
    return f"{_endpoint(interface, 0)}: any free port, which the log names"


def _endpoint(interface: str, port: int) -> str:
    if not interface:
        return f"tcp:{port}"
    # strports escapes the colons of an IPv6 address.
    escaped = interface.replace(":", "\\:")
    return f"tcp:{port}:interface={escaped}"


def _bindable(interface: str, port: int) -> bool:
    """Whether a TCP server could bind C{port} of C{interface} now, as Twisted binds one."""
    family = socket.AF_INET6 if ":" in interface else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As twisted.internet.tcp.Port: a port left in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((interface, port))
        except OSError:
            return False
    return True
