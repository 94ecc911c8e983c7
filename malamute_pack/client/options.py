"""
A client's settings, fixed for its life: one frozen L{ClientOptions} made
in one place (L{resolve_options}) from an options object and keyword
overrides, and read by the core and both drivers.

    client = await MalamuteClient.connect(reactor, endpoint, "me", timeout=2.0)
    client = BlockingClient(endpoint, options=ClientOptions(address="me", version=1))

Tests: ``tests/test_client_options.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, TypedDict

from malamute_pack.client.dedupe import ID_WINDOW
from malamute_pack.protocol import mlm

VERSIONS: Final = (1, 2)


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """
    How a client connects and behaves.

    @ivar address: the client's address ("" = anonymous).
    @ivar timeout: seconds to wait for OK to CONNECTION_OPEN, and of silence
        after which the connection counts as lost.
    @ivar heartbeat: seconds between CONNECTION_PINGs (below C{timeout}).
    @ivar close_timeout: seconds close() waits for the STOREDs of earlier
        sends and for the OK to CONNECTION_CLOSE.
    @ivar max_held: messages held at most while the connection is not
        usable; more are dropped (and counted).
    @ivar version: the protocol version: 2 (journaled streams, durable
        mailboxes and queues, ``docs/protocol.md``) or 1 (libmlm's, for the
        C broker).
    @ivar auto_done: (version 2) answer each untracked mailbox and service
        delivery with DONE 200 when it is handed to the application; if
        False the application calls C{done(delivery)}.
    @ivar dedupe_window: (version 2) how many record ids are remembered to
        drop redeliveries.
    @ivar plain: (user, password) for PLAIN security, or None.
    """

    address: str = ""
    timeout: float = 5.0
    heartbeat: float = 1.0
    close_timeout: float = 1.0
    max_held: int = 10_000
    version: int = 2
    auto_done: bool = True
    dedupe_window: int = ID_WINDOW
    plain: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat < self.timeout:
            raise ValueError(f"need 0 < heartbeat ({self.heartbeat}) < timeout ({self.timeout})")
        if self.version not in VERSIONS:
            raise ValueError(f"protocol version must be 1 or 2, not {self.version!r}")
        if self.close_timeout <= 0:
            raise ValueError(f"close_timeout must be positive, not {self.close_timeout}")
        if self.max_held < 0:
            raise ValueError(f"max_held must not be negative, not {self.max_held}")
        if self.dedupe_window < 1:
            raise ValueError(f"dedupe_window must be at least 1, not {self.dedupe_window}")
        mlm.encode_string(self.address)  # refuse an address the wire cannot carry, now


class OptionOverrides(TypedDict, total=False):
    """
    The keyword arguments the drivers accept besides C{address} (which they
    take positionally): each overrides the L{ClientOptions} field of its name.
    """

    timeout: float
    heartbeat: float
    close_timeout: float
    max_held: int
    version: int
    auto_done: bool
    dedupe_window: int
    plain: tuple[str, str] | None


def resolve_options(
    options: ClientOptions | None, address: str | None, overrides: OptionOverrides
) -> ClientOptions:
    """
    The options a client runs with: C{options} (or the defaults) with
    C{address} and C{overrides} applied.

    @raise ValueError: if the result is not valid (see L{ClientOptions}).
    @raise TypeError: for an override that names no option.
    """
    base = ClientOptions() if options is None else options
    if address is None and not overrides:
        return base
    if address is not None:
        base = replace(base, address=address)
    return replace(base, **overrides)
