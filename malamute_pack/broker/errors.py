"""
The refusal the broker's actions raise when they cannot do what a session
asked. Tests: ``tests/unit/test_broker_model.py``.
"""

from __future__ import annotations

from malamute_pack.protocol import mlm


class Refused(Exception):
    """
    An action cannot be done. For a command the protocol answers, the
    session gets ERROR with this status; for one it does not, the refusal is
    logged and counted (and a refused letter's receipt says so).
    """

    def __init__(self, reason: str, code: int = mlm.FAILED) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason

    @property
    def kind(self) -> str:
        """The reason's first part, by which refusals are counted."""
        return self.reason.split(":")[0]
