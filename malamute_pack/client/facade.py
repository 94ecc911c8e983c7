"""
What the Twisted and the blocking client share: the state they report and
the commands that need no waiting, all passed straight to their L{ClientCore}.

Tests: ``tests/test_client_reactor.py``, ``tests/test_client_blocking.py``.
"""

from __future__ import annotations

from malamute_pack.client.core import ClientCore, ClientState
from malamute_pack.client.events import Delivery
from malamute_pack.protocol import mlm


class CoreFacade:
    """A client's view of its core; subclasses set C{_core} and add the I/O."""

    _core: ClientCore

    @property
    def state(self) -> ClientState:
        return self._core.state

    @property
    def address(self) -> str:
        return self._core.address

    @property
    def reconnects(self) -> int:
        """How many times the broker forgot us and we opened again and replayed."""
        return self._core.reconnects

    @property
    def version(self) -> int:
        """The protocol version the client speaks (1 or 2)."""
        return self._core.version

    @property
    def duplicates(self) -> int:
        """Redelivered records (version 2) dropped instead of handed over again."""
        return self._core.duplicates

    @property
    def gaps(self) -> int:
        """STREAM_GAPs received (version 2)."""
        return self._core.gaps

    def credit(self, amount: int) -> None:
        """Let the broker deliver at most C{amount} more messages (opt-in flow control)."""
        self._core.credit(amount)

    def confirm(self, tracker: str, status_code: int = mlm.SUCCESS, reason: str = "") -> None:
        """Confirm a tracked letter; its sender hears through L{recv_confirm}."""
        self._core.confirm(tracker, status_code, reason)

    def done(self, delivery: Delivery, status_code: int = mlm.SUCCESS, reason: str = "") -> None:
        """
        Answer a mailbox or service delivery (version 2, with
        C{auto_done=False}) once processed: the broker removes it and passes
        the status to a tracked message's sender.

        @raise ValueError: for a delivery without an id.
        """
        self._core.done(delivery, status_code, reason)
