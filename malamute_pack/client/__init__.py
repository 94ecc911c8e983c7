"""
Malamute clients: L{MalamuteClient} for Twisted programs and
L{BlockingClient} for scripts, both driving one sans-I/O L{ClientCore}.

What each module holds:

- C{options}: L{ClientOptions}, the frozen settings both drivers take
  (C{options=} and/or keyword overrides, resolved in one place).
- C{facade}: the API both drivers share (commands, sends with their
  STORED, credit, confirm, done, the state they report), written once.
- C{reactor_client}: L{MalamuteClient}, the driver for Twisted (Deferreds,
  L{ZmqSocket} in the reactor).
- C{blocking}: L{BlockingClient}, the driver for scripts (a C{zmq.Poller} loop).
- C{bulk}: L{malamute_pack.client.bulk.BulkClient}, blocking bulk reads and
  idempotent appends (the Spark source's and C{malamute export}'s).
- C{dealer}: the DEALER socket both connect through.
- C{monitor}: with several endpoints, the DEALER's socket monitor: its
  connection up (CONNECTION_OPEN can go) or broken (move on at once).
- C{endpoints}: several endpoints (a primary/backup pair: given as a list
  or separated by commas) and the ring the client fails over along.
- C{core}: L{ClientCore}, the composition of the parts below; it routes
  each decoded message to its part.
- C{machine}: the state table (state, event -> actions, next state) and
  which states send, hold or refuse messages.
- C{channel}: the command channel that applies the table: one OK/ERROR
  command outstanding, a queue, reopen and replay, close.
- C{subscriptions}: accepted settings and the replay plan (resume positions).
- C{outbox}: messages sent or held, STORED matched in send order.
- C{inbox}: deliveries, DONE and trackers.
- C{commits}: a consumer's commits waiting for STREAM_COMMITTED.
- C{dedupe}: what a version 2 client already handed over, dropped if sent again.
- C{heartbeat}: pings and the silence timer.
- C{credit}: flow control: credit granted, used and still to send.
- C{events}: what the application receives (L{Delivery}, L{Confirmation},
  L{Gap}).
- C{errors}: what it catches (L{AuthenticationRefusedError}: the broker
  refused the credentials; L{WrongServerKeyError}: a CURVE client's key
  for the broker is wrong).

How a message flows. Out: an API call on a driver -> the facade -> the
core (a command to the channel, a send to the outbox) -> frames encoded by
L{malamute_pack.protocol.mlm} -> the driver's socket. In: frames from the
socket -> the core decodes them -> OK/ERROR to the channel (command results,
state changes), STORED to the outbox (send results), deliveries to the
inbox -> the driver hands them to the application (C{recv()} or a callback)
-> the inbox answers with DONE.

Tests: ``tests/unit/test_client_core.py``, ``tests/unit/test_client_reactor.py``,
``tests/system/test_client_blocking.py``.
"""

from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.core import ClientCore
from malamute_pack.client.errors import (
    AuthenticationRefusedError,
    BadEndpointError,
    BrokerUnreachableError,
    ClientClosedError,
    ClientError,
    MalamuteError,
    MessageDroppedError,
    WrongServerKeyError,
)
from malamute_pack.client.events import Confirmation, Delivery, Gap
from malamute_pack.client.machine import ClientState
from malamute_pack.client.options import ClientOptions, CurveKeys, plain_credentials
from malamute_pack.client.reactor_client import MalamuteClient

__all__ = [
    "AuthenticationRefusedError",
    "BadEndpointError",
    "BlockingClient",
    "BrokerUnreachableError",
    "ClientClosedError",
    "ClientCore",
    "ClientError",
    "ClientOptions",
    "ClientState",
    "Confirmation",
    "CurveKeys",
    "Delivery",
    "Gap",
    "MalamuteClient",
    "MalamuteError",
    "MessageDroppedError",
    "WrongServerKeyError",
    "plain_credentials",
]
