"""
The errors the Malamute clients raise (or fail their Deferreds with).

Tests: ``tests/unit/test_client_core.py``.
"""

from __future__ import annotations


class ClientError(Exception):
    """Base of every error a Malamute client reports."""


class MalamuteError(ClientError):
    """
    The broker answered a command with ERROR.

    @ivar code: the protocol status code (300 failed, 500 command invalid...).
    @ivar reason: the broker's explanation.
    """

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code} {reason}")
        self.code = code
        self.reason = reason


class BrokerUnreachableError(ClientError):
    """
    The broker did not answer in time: no OK to CONNECTION_OPEN within the
    connect timeout, or nothing at all heard from it for the timeout, or
    (a consumer's commit) no STREAM_COMMITTED within C{commit_timeout}.
    """


class AuthenticationRefusedError(BrokerUnreachableError):
    """
    The broker refused the connection's security handshake: wrong PLAIN
    credentials, a CURVE key it does not know, or a mechanism it does not
    take (e.g. no credentials where it requires PLAIN). ZeroMQ reports it
    through the client's socket monitor at once; it does not retry, so
    waiting longer would not help.

    A L{BrokerUnreachableError}: code that catches that (the broker cannot
    be used) stays right; catch this first to tell the user to fix the
    credentials rather than start the broker.

    @ivar endpoint: the broker's endpoint.
    @ivar mechanism: what the client offered: C{"PLAIN"}, C{"CURVE"} or
        C{"NULL"} (no credentials).
    @ivar status: the ZAP status code (400) for a refusal of the
        credentials, or None for a failed handshake (a mechanism mismatch).
    """

    def __init__(
        self, message: str, endpoint: str, mechanism: str, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.mechanism = mechanism
        self.status = status


class WrongServerKeyError(AuthenticationRefusedError):
    """
    The broker broke off every CURVE handshake of a client that never
    completed one: the broker's public key the client was given is
    probably not the broker's (it cannot read the client's HELLO, and
    libzmq says no more than that the connection closed). Raised as soon
    as two handshakes broke off, or when connect() times out after one.

    @ivar server_key: the broker key the client was given (Z85).
    @ivar broken_off: how many handshakes the broker broke off.
    """

    def __init__(self, message: str, endpoint: str, server_key: str, broken_off: int) -> None:
        super().__init__(message, endpoint, "CURVE")
        self.server_key = server_key
        self.broken_off = broken_off


class ClientClosedError(ClientError):
    """The client is not open (never connected, closing or closed)."""


class BadEndpointError(ClientError):
    """ZeroMQ refused the endpoint (a syntax error or an unknown transport)."""


class MessageDroppedError(ClientError):
    """
    A message waiting for its STORED was dropped unsent: too many messages
    were held while the connection was not usable.
    """
