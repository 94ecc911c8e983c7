"""
How the C{malamute} command reaches a broker: the endpoints, credentials
and connect timeout from its options and the environment
(L{ConnectionSettings}), a unique mailbox address for this run, clients of
the project's library opened with them (L{open_client}, L{open_bulk}), and
the one line that explains a client error (L{explain}).

A password is never taken from the command line (other users see it in
the process list): only from C{MALAMUTE_PASSWORD} or a file.

Tests: ``tests/system/test_cli.py`` (against a broker), ``tests/unit/test_cli_records.py``
(settings from options and environment).
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import zmq

from malamute_pack.cli.errors import CommandError
from malamute_pack.client import errors
from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.bulk import BulkClient, StreamStatus
from malamute_pack.client.endpoints import parse_endpoints
from malamute_pack.client.options import ClientOptions, CurveKeys
from malamute_pack.protocol import mlm

DEFAULT_ENDPOINT: Final = "ipc://@/malamute"
DEFAULT_TIMEOUT: Final = 5.0
WHERE: Final = "(-e/--endpoint, MALAMUTE_ENDPOINT)"

_Z85_KEY = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """
    Where and as whom the command connects: the endpoints (tried in order,
    failing over), the connect timeout in seconds, PLAIN or CURVE
    credentials, and the address (None: a unique one for this run).
    """

    endpoints: tuple[str, ...]
    timeout: float = DEFAULT_TIMEOUT
    plain: tuple[str, str] | None = None
    curve: CurveKeys | None = None
    address: str | None = None

    @property
    def where(self) -> str:
        return ", ".join(self.endpoints)

    def options(self, address: str, *, auto_done: bool = True) -> ClientOptions:
        """The client options for C{address}."""
        return ClientOptions(
            address=address,
            timeout=self.timeout,
            heartbeat=min(1.0, self.timeout / 3),
            plain=self.plain,
            curve=self.curve,
            auto_done=auto_done,
        )


def unique_address() -> str:
    """An address no other client has: C{malamute-cli.<host>.<pid>.<random>}."""
    return f"malamute-cli.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CommandError(f"cannot read the {what} file {path}: {_reason(e)}") from None


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return str(error)


def _server_key(value: str) -> str:
    """A Z85 key as given, or the public key of the certificate file C{value}."""
    if _Z85_KEY.fullmatch(value):
        return value
    try:
        public, _ = zmq.auth.load_certificate(value)
    except (OSError, ValueError) as e:
        raise CommandError(
            f"--curve-server-key: {value!r} is neither a 40-character Z85 key nor a readable "
            f"certificate ({_reason(e)}); the broker's is <data-dir>/curve/server.key"
        ) from None
    return public.decode("ascii")


def settings_from(
    *,
    endpoint: str | None,
    timeout: float | None,
    user: str | None,
    password_file: str | None,
    curve_server_key: str | None,
    curve_keys: str | None,
    address: str | None,
    environ: Mapping[str, str],
) -> ConnectionSettings:
    """
    The settings the options give, the environment filling what they do
    not: C{MALAMUTE_ENDPOINT}, C{MALAMUTE_USER}, C{MALAMUTE_PASSWORD},
    C{MALAMUTE_CURVE_SERVER_KEY}, C{MALAMUTE_CURVE_KEYS}, C{MALAMUTE_ADDRESS}.

    @raise CommandError: for settings that cannot work, saying which.
    """
    spec = endpoint or environ.get("MALAMUTE_ENDPOINT") or DEFAULT_ENDPOINT
    try:
        endpoints = parse_endpoints(spec)
    except ValueError as e:
        raise CommandError(f"bad endpoint {spec!r}: {e} {WHERE}") from None
    for each in endpoints:
        if "://" not in each:
            raise CommandError(
                f"bad endpoint {each!r}: write it as ipc://@/NAME or tcp://HOST:PORT {WHERE}"
            )
    wait = DEFAULT_TIMEOUT if timeout is None else timeout
    if not wait > 0:
        raise CommandError(f"--timeout must be more than 0 seconds, not {wait:g}")
    user = user or environ.get("MALAMUTE_USER") or None
    plain = None
    if user is not None:
        if password_file is not None:
            password = _read_text(password_file, "password")
        elif "MALAMUTE_PASSWORD" in environ:
            password = environ["MALAMUTE_PASSWORD"]
        else:
            raise CommandError(
                f"no password for user {user!r}: set MALAMUTE_PASSWORD or give --password-file"
            )
        plain = (user, password)
    elif password_file is not None:
        raise CommandError("--password-file needs a user: --user or MALAMUTE_USER")
    server = curve_server_key or environ.get("MALAMUTE_CURVE_SERVER_KEY")
    keys = curve_keys or environ.get("MALAMUTE_CURVE_KEYS")
    curve = None
    if server or keys:
        if plain is not None:
            raise CommandError("choose PLAIN (--user) or CURVE (--curve-...), not both")
        if not (server and keys):
            raise CommandError(
                "CURVE needs both the broker's public key (--curve-server-key, "
                "MALAMUTE_CURVE_SERVER_KEY) and this client's secret certificate "
                "(--curve-keys, MALAMUTE_CURVE_KEYS)"
            )
        try:
            public, secret = zmq.auth.load_certificate(keys)
        except (OSError, ValueError) as e:
            raise CommandError(f"cannot read the CURVE certificate {keys}: {_reason(e)}") from None
        if secret is None:
            raise CommandError(
                f"{keys} has no secret key: --curve-keys takes this client's secret certificate"
            )
        curve = CurveKeys(_server_key(server), public.decode("ascii"), secret.decode("ascii"))
    return ConnectionSettings(
        endpoints, wait, plain, curve, address or environ.get("MALAMUTE_ADDRESS") or None
    )


def explain(
    error: errors.ClientError, settings: ConnectionSettings, *, connected: bool = False
) -> str:
    """
    The one line that says what C{error} means for this connection and
    what to do; C{connected} when it came after the connection was open.
    """
    if isinstance(error, errors.AuthenticationRefusedError):
        # The library's message names the broker, what it refused and the fix.
        if settings.curve is not None:
            return f"{error} (--curve-keys, --curve-server-key)"
        if settings.plain is not None:
            return f"{error} (--user, MALAMUTE_PASSWORD or --password-file)"
        return str(error)
    if isinstance(error, errors.BadEndpointError):
        return f"bad endpoint: {error}; write it as ipc://@/NAME or tcp://HOST:PORT {WHERE}"
    if isinstance(error, errors.BrokerUnreachableError):
        if connected:
            return f"lost the broker at {settings.where}: {error}"
        return (
            f"no broker answered at {settings.where} within {settings.timeout:.1f} s: "
            f"is it running? {WHERE}"
        )
    if isinstance(error, errors.MalamuteError):
        return f"the broker refused: {error.code} {error.reason}"
    return f"{type(error).__name__}: {error}"


def open_client(
    settings: ConnectionSettings, address: str | None = None, *, auto_done: bool = True
) -> BlockingClient:
    """
    A blocking client connected as C{address} (else the settings' address,
    else a unique one).

    @raise CommandError: if it cannot connect, saying why.
    """
    chosen = address or settings.address or unique_address()
    try:
        return BlockingClient(
            list(settings.endpoints), options=settings.options(chosen, auto_done=auto_done)
        )
    except errors.ClientError as e:
        raise CommandError(explain(e, settings)) from None
    except ValueError as e:
        raise CommandError(f"cannot connect as {chosen!r}: {e}") from None


def open_bulk(settings: ConnectionSettings) -> BulkClient:
    """
    A bulk client (reads and appends of whole ranges).

    @raise CommandError: if it cannot connect, saying why.
    """
    chosen = settings.address or unique_address()
    try:
        return BulkClient(
            list(settings.endpoints),
            options=settings.options(chosen),
            timeout=settings.timeout,
        )
    except errors.ClientError as e:
        raise CommandError(explain(e, settings)) from None


# What a stream that has never had a record usually means.
NAME_HINT: Final = "is the name right? `malamute streams` lists them"


def stream_with_records(bulk: BulkClient, stream: str, hint: str = "") -> StreamStatus:
    """C{stream}'s status; CommandError if it has never had a record (a wrong name, usually)."""
    status = bulk.status(stream, mlm.EARLIEST)
    if status.last == 0:
        raise CommandError(f"stream {stream!r} has no records ({NAME_HINT}){hint}")
    return status
