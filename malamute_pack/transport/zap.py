"""
PLAIN authentication: a ZAP handler (RFC 27) served from the reactor, and the
password file of the C broker (``user = password`` lines, ``#`` comments).

libzmq asks the handler on ``inproc://zeromq.zap.01`` of the same context
whenever a client connects to a PLAIN server socket; the handler answers 200
or 400 at once, so it never holds up the reactor.

Tests: ``tests/test_transport_zap.py``.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from pathlib import Path

import zmq
from twisted.application.service import Service
from twisted.internet.interfaces import IReactorFDSet
from twisted.logger import Logger

from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

ZAP_ENDPOINT = "inproc://zeromq.zap.01"

_log = Logger()


class PasswordFileError(ValueError):
    """The password file cannot be read or has a line that is not C{user = password}."""


def load_passwords(path: Path) -> dict[str, str]:
    """Read a password file: one C{user = password} (or C{user=password}) a line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PasswordFileError(f"cannot read password file {path}: {e.strerror}") from e
    passwords: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        user, sep, password = stripped.partition("=")
        if not sep or not user.strip():
            raise PasswordFileError(f"{path}:{number}: expected 'user = password'")
        passwords[user.strip()] = password.strip()
    return passwords


def check_plain(passwords: Mapping[str, str], user: bytes, password: bytes) -> bool:
    """Whether C{user} and C{password} are in C{passwords} (constant-time compare)."""
    expected = passwords.get(user.decode("utf-8", "replace"))
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
    ) -> None:
        self._reactor = reactor
        self._context = context
        self.passwords = dict(passwords)
        self.allow_null = allow_null
        self.socket: ZmqSocket | None = None
        self.accepted = 0
        self.refused = 0

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
        request_id, mechanism, credentials = body[1], body[5], body[6:]
        user = b""
        if mechanism == b"PLAIN" and len(credentials) == 2:
            user = credentials[0]
            ok = check_plain(self.passwords, credentials[0], credentials[1])
        else:
            ok = mechanism == b"NULL" and self.allow_null
        if ok:
            self.accepted += 1
            status, text = b"200", b"OK"
        else:
            self.refused += 1
            status, text = b"400", b"authentication failed"
            _log.info(
                "refused {mechanism} client {user!r} from {address}",
                mechanism=mechanism.decode(),
                user=user.decode("utf-8", "replace"),
                address=body[3].decode("utf-8", "replace"),
            )
        return [*envelope, b"1.0", request_id, status, text, user, b""]
