"""
What the broker's own clients want and offer, as a pack peer needs to
know it: the (stream, pattern) pairs its readers read, the addresses its
clients hold, and the (service, pattern) pairs its workers offer with how
many workers each. Only local connections count (a peer broker's proxies
never do, so nothing announced to a peer comes back from it).

The model keeps one L{Interests} and tells it every change; a listener (the
pack) hears the changes that matter to peers: a pair's first reader and
last, an address opened and closed, a new worker count.

Tests: ``tests/unit/test_broker_interests.py``.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol


class InterestListener(Protocol):
    """Who hears the changes (the pack)."""

    def reading_started(self, stream: str, pattern: str) -> None:
        """The first local reader of C{stream} with C{pattern}."""

    def reading_stopped(self, stream: str, pattern: str) -> None:
        """The last local reader of C{stream} with C{pattern} is gone."""

    def history_wanted(self, stream: str, pattern: str, whence: int, position: int) -> None:
        """
        A local reader of C{stream} with C{pattern} asked to read from a
        position (MLM's STREAM_READ_FROM C{whence} and C{position}, not
        the latest): peers may hold history it wants.
        """

    def address_opened(self, address: str) -> None:
        """A local client opened C{address}."""

    def address_closed(self, address: str) -> None:
        """The local client holding C{address} is gone."""

    def offers_changed(self, service: str, pattern: str, workers: int) -> None:
        """C{workers} local workers now offer C{service} with C{pattern} (0: none)."""


class Interests:
    """
    Reference counts of the local readers, addresses and offers.

    @ivar listener: who hears the changes, or None.
    """

    def __init__(self) -> None:
        self.listener: InterestListener | None = None
        self._readings: Counter[tuple[str, str]] = Counter()
        self._offers: Counter[tuple[str, str]] = Counter()
        self._workers: Counter[str] = Counter()  # offers per service, all patterns
        self._addresses: set[str] = set()

    # What there is now (a peer's full resynchronisation)

    def readings(self) -> list[tuple[str, str]]:
        return sorted(self._readings)

    def addresses(self) -> list[str]:
        return sorted(self._addresses)

    def offers(self) -> list[tuple[str, str, int]]:
        return sorted((service, pattern, n) for (service, pattern), n in self._offers.items())

    def offering(self, service: str) -> bool:
        """Whether a local worker offers C{service} (with any pattern)."""
        return self._workers[service] > 0

    # Changes

    def read(self, stream: str, pattern: str) -> None:
        key = (stream, pattern)
        self._readings[key] += 1
        if self._readings[key] == 1 and self.listener is not None:
            self.listener.reading_started(stream, pattern)

    def unread(self, stream: str, pattern: str) -> None:
        key = (stream, pattern)
        count = self._readings[key] - 1
        if count > 0:
            self._readings[key] = count
            return
        del self._readings[key]
        if self.listener is not None:
            self.listener.reading_stopped(stream, pattern)

    def history(self, stream: str, pattern: str, whence: int, position: int) -> None:
        if self.listener is not None:
            self.listener.history_wanted(stream, pattern, whence, position)

    def opened(self, address: str) -> None:
        self._addresses.add(address)
        if self.listener is not None:
            self.listener.address_opened(address)

    def closed(self, address: str) -> None:
        self._addresses.discard(address)
        if self.listener is not None:
            self.listener.address_closed(address)

    def offered(self, service: str, pattern: str, change: int) -> None:
        key = (service, pattern)
        self._workers[service] += change
        if self._workers[service] <= 0:
            del self._workers[service]
        count = self._offers[key] + change
        if count > 0:
            self._offers[key] = count
        else:
            del self._offers[key]
        if self.listener is not None:
            self.listener.offers_changed(service, pattern, max(count, 0))
