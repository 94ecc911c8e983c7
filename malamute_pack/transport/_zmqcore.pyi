"""
The compiled core of the broker's ZeroMQ I/O (``_zmqcore.c``): its types.

Tests: ``tests/unit/test_transport_zmqcore.py``.
"""

from collections.abc import Sequence

import zmq

def recv_batch(sock: zmq.Socket[bytes], limit: int, /) -> list[list[bytes]]: ...
def recv_identified_batch(sock: zmq.Socket[bytes], limit: int, /) -> list[list[bytes]]: ...
def send_message(sock: zmq.Socket[bytes], first: bytes, rest: Sequence[bytes], /) -> None: ...
