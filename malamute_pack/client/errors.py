"""
The errors the Malamute clients raise (or fail their Deferreds with).

Tests: ``tests/test_client_core.py``.
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
    connect timeout, or nothing at all heard from it for the timeout.
    """


class ClientClosedError(ClientError):
    """The client is not open (never connected, closing or closed)."""


class BadEndpointError(ClientError):
    """ZeroMQ refused the endpoint (a syntax error or an unknown transport)."""


class MessageDroppedError(ClientError):
    """
    A message waiting for its STORED was dropped unsent: too many messages
    were held while the connection was not usable.
    """
