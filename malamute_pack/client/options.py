"""
A client's settings, fixed for its life: one frozen L{ClientOptions} made
in one place (L{resolve_options}) from an options object and keyword
overrides, and read by the core and both drivers.

    client = await MalamuteClient.connect(reactor, endpoint, "me", timeout=2.0)
    client = BlockingClient(endpoint, options=ClientOptions(address="me", version=1))

Tests: ``tests/unit/test_client_options.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, NamedTuple, TypedDict

import zmq.auth

from malamute_pack.client.dedupe import ID_WINDOW
from malamute_pack.protocol import mlm

VERSIONS: Final = (1, 2)
# The environment variable programs read a PLAIN password from (never a
# command-line option: other users can read those).
PASSWORD_VARIABLE: Final = "MALAMUTE_PASSWORD"


class CurveKeys(NamedTuple):
    """
    A CURVE client's keys, each 40 characters of Z85: the broker's public
    key (its C{curve/server.key}) and the client's own key pair (made with
    C{zmq.curve_keypair()}; the broker knows its public key).
    """

    server: str
    public: str
    secret: str

    @classmethod
    def load(cls, server_certificate: str | Path, secret_certificate: str | Path) -> CurveKeys:
        """
        The keys from certificate files (as C{zcert} or C{zmq.auth} write
        them): the broker's public certificate and the client's secret one.

        @raise ValueError: if a file has not the key it should.
        @raise OSError: if a file cannot be read.
        """
        server, _ = zmq.auth.load_certificate(str(server_certificate))
        public, secret = zmq.auth.load_certificate(str(secret_certificate))
        if secret is None:
            raise ValueError(f"{secret_certificate} has no secret key")
        return cls(server.decode("ascii"), public.decode("ascii"), secret.decode("ascii"))


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
    @ivar curve: for CURVE security, the keys in Z85 text:
        L{CurveKeys}(server public key, client public key, client secret
        key), or None.
    @ivar commit_timeout: (version 2) seconds a consumer's commit waits for
        the broker's STREAM_COMMITTED, from the call (reconnections
        included), before it fails with C{BrokerUnreachableError}.
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
    curve: CurveKeys | None = None
    commit_timeout: float = 30.0

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat < self.timeout:
            raise ValueError(f"need 0 < heartbeat ({self.heartbeat}) < timeout ({self.timeout})")
        if self.version not in VERSIONS:
            raise ValueError(f"protocol version must be 1 or 2, not {self.version!r}")
        if self.close_timeout <= 0:
            raise ValueError(f"close_timeout must be positive, not {self.close_timeout}")
        if self.commit_timeout <= 0:
            raise ValueError(f"commit_timeout must be positive, not {self.commit_timeout}")
        if self.max_held < 0:
            raise ValueError(f"max_held must not be negative, not {self.max_held}")
        if self.dedupe_window < 1:
            raise ValueError(f"dedupe_window must be at least 1, not {self.dedupe_window}")
        mlm.encode_string(self.address)  # refuse an address the wire cannot carry, now
        if self.curve is not None:
            bad = [name for name, key in self.curve._asdict().items() if len(key) != 40]
            if bad:
                raise ValueError(f"CURVE keys must be 40 characters of Z85: {', '.join(bad)}")
        if self.curve is not None and self.plain is not None:
            raise ValueError("choose PLAIN or CURVE, not both")


def plain_credentials(
    user: str | None, environ: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """
    PLAIN credentials for C{user} (a C{--user} option), the password taken
    from the environment variable L{PASSWORD_VARIABLE}; None without a user.

    @raise ValueError: a user was given and the variable is not set.
    """
    if not user:
        return None
    password = (os.environ if environ is None else environ).get(PASSWORD_VARIABLE)
    if password is None:
        raise ValueError(
            f"--user {user} needs the password in the environment: {PASSWORD_VARIABLE}"
        )
    return (user, password)


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
    curve: CurveKeys | None
    commit_timeout: float


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
