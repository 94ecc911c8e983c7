"""
Credit (opt-in flow control): what the application granted, how much of it
deliveries have used up, and what is still to be sent because the
connection was not usable when it was granted. After a reconnection the
credit left is granted again, as the new broker session starts from none.

Tests: ``tests/unit/test_client_credit.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from malamute_pack.protocol import mlm

MAX_CREDIT: Final = 0xFFFF  # CREDIT carries a number2


def check_credit(amount: int) -> None:
    """
    @raise ValueError: for an amount CREDIT cannot carry (or not positive).
    """
    if not 0 < amount <= MAX_CREDIT:
        raise ValueError(f"credit must be between 1 and {MAX_CREDIT}, not {amount}")


class Credit:
    """
    The credit a client granted.

    @ivar left: credit granted and not used up yet; None until the
        application first grants credit (until then the broker does not
        throttle, and deliveries are not counted).
    @ivar unsent: credit granted while the connection was not usable.
    """

    def __init__(self, send_frames: Callable[[list[bytes]], None]) -> None:
        self._send_frames = send_frames
        self.left: int | None = None
        self.unsent = 0

    def grant(self, amount: int, usable: bool) -> None:
        """Grant C{amount} more: send it now if C{usable}, else once it is."""
        check_credit(amount)
        self.left = (self.left or 0) + amount
        if usable:
            self._send_frames(mlm.encode(mlm.Credit(amount)))
        else:
            self.unsent += amount

    def used(self) -> None:
        """A delivery arrived: it used one credit (if the application uses credit)."""
        if self.left:
            self.left -= 1

    def flush(self) -> None:
        """The connection is usable: send what was granted meanwhile."""
        if self.unsent:
            self._send_frames(mlm.encode(mlm.Credit(min(self.unsent, MAX_CREDIT))))
            self.unsent = 0

    def regrant(self) -> None:
        """A new broker session: grant again all the credit left."""
        if self.left is not None:
            self.unsent = 0
            self._send_frames(mlm.encode(mlm.Credit(min(self.left, MAX_CREDIT))))
