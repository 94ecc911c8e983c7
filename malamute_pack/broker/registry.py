"""
The registry: which sessions have an open connection, and which connection
holds each address. It is the one owner of both; streams and the post office
ask it rather than keeping their own.

Tests: ``tests/unit/test_broker_registry.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from malamute_pack.broker.connection import Connection
from malamute_pack.broker.interests import Interests
from malamute_pack.broker.session import Session


class Registry:
    """
    Open connections by session, and by address (anonymous ones excluded).

    @ivar get: the open connection of a session, or None.
    @ivar holder: the open connection that holds an address, or None.
    """

    def __init__(self, interests: Interests | None = None) -> None:
        # Told of every address a local client opens and closes.
        self._interests = interests
        self._by_session: dict[Session, Connection] = {}
        self._by_address: dict[str, Connection] = {}
        # Looked up for every message: the dict's own method, no wrapper.
        self.get: Callable[[Session], Connection | None] = self._by_session.get
        self.holder: Callable[[str], Connection | None] = self._by_address.get

    def __len__(self) -> int:
        return len(self._by_session)

    def __iter__(self) -> Iterator[Connection]:
        return iter(list(self._by_session.values()))

    def addresses(self) -> set[str]:
        return set(self._by_address)

    def add(self, connection: Connection) -> None:
        """
        Register C{connection}; its session and address must be free (the
        broker ends a previous holder first).
        """
        session = connection.session
        assert session not in self._by_session, f"{session!r} already has a connection"
        self._by_session[session] = connection
        if connection.address:
            assert connection.address not in self._by_address, connection.address
            self._by_address[connection.address] = connection
            if self._interests is not None and not connection.remote:
                self._interests.opened(connection.address)
        session.attached()

    def remove(self, connection: Connection) -> bool:
        """Forget C{connection}; False if it was not registered."""
        session = connection.session
        if self._by_session.get(session) is not connection:
            return False
        del self._by_session[session]
        if connection.address and self._by_address.get(connection.address) is connection:
            del self._by_address[connection.address]
            if self._interests is not None and not connection.remote:
                self._interests.closed(connection.address)
        session.detached()
        return True
