"""
The refusal the broker's actions raise when they cannot do what a client
asked. Tests: ``tests/test_broker_model.py``.
"""

from __future__ import annotations

from malamute_pack.protocol import mlm


class Refused(Exception):
    """
    An action cannot be done. For a command the protocol answers, the client
    gets ERROR with this status; for one it does not, the refusal is logged
    and counted (and a tracked letter's sender gets a failed CONFIRM).

    @ivar acknowledged: a version 2 sender already got STORED for it.
    """

    def __init__(self, reason: str, code: int = mlm.FAILED) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.acknowledged = False
