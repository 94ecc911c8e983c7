"""
Authentication: a ZAP handler (RFC 27) served from the reactor, for PLAIN
(the password file of the C broker, ``user = password`` lines, ``#``
comments) and CURVE (client public keys, each with its user:
L{malamute_pack.transport.curve}).

libzmq asks the handler on ``inproc://zeromq.zap.01`` of the same context
whenever a client connects to a PLAIN or CURVE server socket; the handler
answers 200 (with the user, which libzmq then attaches to every message of
that connection as ``User-Id``) or 400 at once, so it never holds up the
reactor. Refusals are counted (C{refused}, C{throttled}) and logged at
most a few lines a second, so a flood of bad attempts cannot fill the log.
A peer address (an IP address; ipc clients have none) with
L{MAX_FAILURES} failed attempts within L{FAILURE_WINDOW} seconds is
refused without a check until its window ends, which slows down password
guessing; at most L{MAX_TRACKED} addresses are remembered.

Tests: ``tests/test_transport_zap.py``.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import zmq
from twisted.application.service import Service
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.logger import Logger
from zmq.utils import z85

from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

ZAP_ENDPOINT = "inproc://zeromq.zap.01"

_log = Logger()

MAX_FAILURES: Final = 5
FAILURE_WINDOW: Final = 10.0
# Peer addresses whose failures are remembered at most: the oldest go first.
MAX_TRACKED: Final = 10_000
# Names that the access file uses for "every user" and "no user".
RESERVED_USERS: Final = frozenset({"*", "-"})


class PasswordFileError(ValueError):
    """The password file cannot be read or has a line that is not C{user = password}."""


def load_passwords(path: Path) -> dict[str, str]:
    """Read a password file: one C{user = password} (or C{user=password}) a line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PasswordFileError(f"cannot read password file {path}: {e.strerror}") from e
    except UnicodeError as e:
        raise PasswordFileError(f"cannot read password file {path}: {e}") from e
    passwords: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        user, sep, password = stripped.partition("=")
        if not sep or not user.strip():
            raise PasswordFileError(f"{path}:{number}: expected 'user = password'")
        if user.strip() in RESERVED_USERS:
            raise PasswordFileError(
                f"{path}:{number}: {user.strip()!r} cannot be a user: the access file"
                " gives it a meaning"
            )
        passwords[user.strip()] = password.strip()
    return passwords


def check_plain(passwords: Mapping[str, str], user: bytes, password: bytes) -> bool:
    """Whether C{user} and C{password} are in C{passwords} (constant-time compare)."""
    try:
        expected = passwords.get(user.decode("utf-8"))
    except UnicodeDecodeError:
        return False
    return expected is not None and hmac.compare_digest(expected.encode("utf-8"), password)


class ZapHandler(Service):
    """
    Answers ZAP requests: PLAIN against C{passwords}; NULL is allowed only
    when C{allow_null} (a broker with both PLAIN and NULL endpoints).
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]],
        passwords: Mapping[str, str],
        allow_null: bool = False,
        curve_keys: Mapping[bytes, str] | None = None,
    ) -> None:
        """
        @param curve_keys: the CURVE clients allowed in: public key (Z85)
            to user.
        """
        self._reactor = reactor
        self._clock: IReactorTime = reactor  # type: ignore[assignment]
        self._context = context
        self.passwords = dict(passwords)
        self.curve_keys = dict(curve_keys or {})
        self.allow_null = allow_null
        self.socket: ZmqSocket | None = None
        self.accepted = 0
        self.refused = 0
        self.throttled = 0
        # Peer address: (start of its window, failures in it).
        self._failures: dict[bytes, tuple[float, int]] = {}
        self._log_limit = LogLimit(self._clock, _log, per_second=5)

    def startService(self) -> None:
        raw = self._context.socket(zmq.ROUTER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.bind(ZAP_ENDPOINT)
        self.socket = ZmqSocket(self._reactor, raw, self._requests)
        self.socket.startReading()
        super().startService()

    def stopService(self) -> None:
        super().stopService()
        if self.socket is not None:
            self.socket.close()
            self.socket = None

    def _requests(self, batch: Batch) -> None:
        assert self.socket is not None
        for frames in batch:
            reply = self.answer(frames)
            if reply is not None:
                self.socket.send(reply)

    def answer(self, frames: list[bytes]) -> list[bytes] | None:
        """
        The reply to one ZAP request as received on a ROUTER: the envelope,
        an empty delimiter, then version, request id, domain, address,
        identity, mechanism and credentials.
        """
        try:
            split = frames.index(b"")
        except ValueError:
            return None
        envelope, body = frames[: split + 1], frames[split + 1 :]
        if len(body) < 6 or body[0] != b"1.0":
            _log.warn("malformed ZAP request ignored")
            return None
        request_id, address, mechanism, credentials = body[1], body[3], body[5], body[6:]
        user = b""
        who = ""  # what the log says of the client
        if self._throttled(address):
            self.throttled += 1
            self._log_limit.info(
                "zap-throttled",
                "refused {mechanism} client from {address} unchecked: too many failures",
                mechanism=mechanism.decode("ascii", "replace"),
                address=address.decode("utf-8", "replace"),
            )
            return [*envelope, b"1.0", request_id, b"400", b"too many failures", b"", b""]
        if mechanism == b"PLAIN" and len(credentials) == 2:
            ok = check_plain(self.passwords, credentials[0], credentials[1])
            user = credentials[0] if ok else b""
            who = f"user {credentials[0].decode('utf-8', 'replace')!r}"
        elif mechanism == b"CURVE" and len(credentials) == 1 and len(credentials[0]) == 32:
            key = z85.encode(credentials[0])
            known = self.curve_keys.get(key)
            ok = known is not None
            user = known.encode("utf-8") if known is not None else b""
            who = f"key {key.decode('ascii')}"
        else:
            ok = mechanism == b"NULL" and self.allow_null
        if ok:
            self.accepted += 1
            status, text = b"200", b"OK"
        else:
            self.refused += 1
            if address:  # every ipc client has the empty address: not throttled
                self._failed(address)
            status, text = b"400", b"authentication failed"
            self._log_limit.info(
                "zap-refused",
                "refused {mechanism} client {who} from {address}",
                mechanism=mechanism.decode("ascii", "replace"),
                who=who,
                address=address.decode("utf-8", "replace"),
            )
        return [*envelope, b"1.0", request_id, status, text, user, b""]

    def _throttled(self, address: bytes) -> bool:
        """Whether C{address} failed L{MAX_FAILURES} times in its current window."""
        found = self._failures.get(address)
        if found is None:
            return False
        if self._clock.seconds() - found[0] >= FAILURE_WINDOW:
            del self._failures[address]
            return False
        return found[1] >= MAX_FAILURES

    def _failed(self, address: bytes) -> None:
        now = self._clock.seconds()
        start, count = self._failures.pop(address, (now, 0))
        if now - start >= FAILURE_WINDOW:
            start, count = now, 0
        if len(self._failures) >= MAX_TRACKED:
            del self._failures[next(iter(self._failures))]
        self._failures[address] = (start, count + 1)
