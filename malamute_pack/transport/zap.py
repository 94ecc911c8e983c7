"""
Authentication: a ZAP handler (RFC 27) served from the reactor, for every
ZeroMQ socket of the broker's context that asks for it, by the socket's
ZAP domain: the clients' ROUTERs (L{CLIENT_DOMAIN}: PLAIN against the
password file of the C broker, ``user = password`` lines, ``#`` comments,
and CURVE against the clients' public keys, each with its user:
L{malamute_pack.transport.curve}), the pack's peer inbox and gossip server
(L{PACK_DOMAIN}) and the pair link (L{PAIR_DOMAIN}), each of those two
admitting only a list of brokers' public keys (L{KeyAllowList}). A request
for a domain no authenticator serves is refused.

libzmq asks the handler on ``inproc://zeromq.zap.01`` of the same context
whenever a client connects to a PLAIN or CURVE server socket. The handler
checks every request at once, from the reactor, and answers 200 (with the
user, which libzmq then attaches to every message of that connection as
``User-Id``) at once. Refusals are counted per domain (C{counters}) and
logged at most a few lines a second, so a flood of bad attempts cannot
fill the log; on the brokers' domains, where a stranger broker tries
again for as long as it runs, once per L{BROKER_LOG_INTERVAL} for each key
and address.

The login throttle delays guesses and never refuses the right
credentials: a refusal's answer (400) is held back by a time that grows
with the recent failures of its pair (peer address, user), the user being
PLAIN's user name or the CURVE key, and the address empty for every ipc
client (L{refusal_delay}: nothing for a pair's first failure, then
L{FIRST_DELAY} doubling up to L{MAX_DELAY}); a pair's failures are
forgotten L{FAILURE_WINDOW} seconds after its last one. A client that
tries one guess after another thus waits up to L{MAX_DELAY} a guess, while
a right answer, from the same address and for the same user included, is
sent as soon as it is checked. The work held is bounded: at most
L{MAX_TRACKED} pairs are remembered (the one that failed longest ago goes
first) and at most L{MAX_PENDING} refusals wait at once (each holds a
connection, and so a file descriptor, in libzmq until answered): past
that the oldest waiting refusal is answered at once (C{hurried}), so that
a flood never holds the connections a right user needs.
docs/security.md sets this against OpenSSH and fail2ban.

Tests: ``tests/unit/test_transport_zap.py``.
"""

from __future__ import annotations

import contextlib
import hmac
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import zmq
from twisted.application.service import Service
from twisted.internet.interfaces import IDelayedCall, IReactorFDSet, IReactorTime
from twisted.logger import Logger
from zmq.utils import z85

from malamute_pack.broker.log_limit import LogLimit, OncePer
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
# The ZAP domains of the broker's sockets: its clients' ROUTERs, the
# pack's (its peers' inbox, its gossip server) and the pair link's, each
# decided by its own authenticator.
CLIENT_DOMAIN: Final = b"malamute"
PACK_DOMAIN: Final = b"malamute-pack"
PAIR_DOMAIN: Final = b"malamute-pair"

_log = Logger()

# The throttle (docs/security.md): the answer to the second failure of a
# (peer address, user) pair is delayed FIRST_DELAY seconds, each later one
# twice the one before, at most MAX_DELAY; a pair's failures are forgotten
# FAILURE_WINDOW seconds after its last one.
FIRST_DELAY: Final = 0.1
MAX_DELAY: Final = 2.0
FAILURE_WINDOW: Final = 60.0
# Pairs whose failures are remembered at most: the one that failed longest
# ago goes first.
MAX_TRACKED: Final = 10_000
# Refusals waiting for their answer at once, at most: past that the oldest
# is answered at once.
MAX_PENDING: Final = 256
# Seconds before a broker refused on a brokers' domain (the pack's, the
# pair's), by key and address, is logged again.
BROKER_LOG_INTERVAL: Final = 600.0
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


def refusal_delay(failures: int) -> float:
    """
    How long the answer to a refusal waits, in seconds, when its pair has
    failed C{failures} times lately (this refusal included): nothing for
    the first, then L{FIRST_DELAY} doubling each time, at most L{MAX_DELAY}.
    """
    if failures <= 1:
        return 0.0
    # 2**doublings beyond MAX_DELAY / FIRST_DELAY is the cap anyway: no huge powers.
    return min(MAX_DELAY, FIRST_DELAY * 2.0 ** min(failures - 2, 32))


@dataclass(frozen=True, slots=True)
class ZapRequest:
    """
    One ZAP request (RFC 27) as a ROUTER received it.

    @ivar envelope: the routing frames and the empty delimiter, for the reply.
    @ivar domain: the ZAP domain of the socket the client connected to (the
        broker sets one per kind of link: L{CLIENT_DOMAIN}, L{PACK_DOMAIN},
        L{PAIR_DOMAIN}).
    @ivar address: the client's IP address (empty for ipc).
    @ivar mechanism: C{b"NULL"}, C{b"PLAIN"} or C{b"CURVE"}.
    @ivar credentials: PLAIN's user and password, or CURVE's 32-byte key.
    """

    envelope: list[bytes]
    request_id: bytes
    domain: bytes
    address: bytes
    mechanism: bytes
    credentials: list[bytes]

    @classmethod
    def parse(cls, frames: list[bytes]) -> ZapRequest | None:
        """The request C{frames} hold, or None for frames that are not one."""
        try:
            split = frames.index(b"")
        except ValueError:
            return None
        envelope, body = frames[: split + 1], frames[split + 1 :]
        if len(body) < 6 or body[0] != b"1.0":
            return None
        return cls(envelope, body[1], body[2], body[3], body[5], body[6:])

    def curve_key(self) -> bytes | None:
        """The client's CURVE public key in Z85, or None if it offers none."""
        credentials = self.credentials
        if self.mechanism == b"CURVE" and len(credentials) == 1 and len(credentials[0]) == 32:
            return z85.encode(credentials[0])
        return None


@dataclass(frozen=True, slots=True)
class Verdict:
    """
    What an authenticator says of a request.

    @ivar user: the user id ZeroMQ attaches to the connection's messages
        (C{User-Id}); None: refused.
    @ivar who: what the log says of the client (a user, a key), never a secret.
    """

    user: str | None
    who: str


class Authenticator(Protocol):
    """Decides the requests of one ZAP domain."""

    #: What the log and the counters call the domain's clients.
    name: str
    #: Whether every refusal is logged (rate-limited: a guess each, the
    #: evidence of a brute force), or each refused key and address once per
    #: L{BROKER_LOG_INTERVAL} (a stranger broker, trying for as long as it runs).
    log_each_refusal: bool

    def check(self, request: ZapRequest) -> Verdict:
        """Accept (with a user id) or refuse C{request}, at once."""


class ClientAuthenticator:
    """
    The broker's clients: PLAIN against C{passwords}, CURVE against
    C{curve_keys} (public key in Z85 to user), NULL only when C{allow_null}
    (a broker with both NULL and secured endpoints).
    """

    name = "client"
    log_each_refusal = True

    def __init__(
        self,
        passwords: Mapping[str, str],
        curve_keys: Mapping[bytes, str] | None = None,
        allow_null: bool = False,
    ) -> None:
        self.passwords = dict(passwords)
        self.curve_keys = dict(curve_keys or {})
        self.allow_null = allow_null

    def check(self, request: ZapRequest) -> Verdict:
        mechanism, credentials = request.mechanism, request.credentials
        if mechanism == b"PLAIN" and len(credentials) == 2:
            who = f"user {credentials[0].decode('utf-8', 'replace')!r}"
            if check_plain(self.passwords, credentials[0], credentials[1]):
                return Verdict(credentials[0].decode("utf-8"), who)
            return Verdict(None, who)
        if mechanism == b"CURVE":
            key = request.curve_key()
            if key is None:
                return Verdict(None, "a malformed CURVE key")
            return Verdict(self.curve_keys.get(key), f"key {key.decode('ascii')}")
        if mechanism == b"NULL" and self.allow_null:
            return Verdict("", "")
        return Verdict(None, "")


class KeyAllowList:
    """
    A link between brokers (a pack's peers and gossip, a pair's partner):
    CURVE only, and only the listed public keys. The user id of an
    accepted connection is its key in Z85, so that what arrives on it can
    be told to come from that key.

    @ivar keys: the listed keys (Z85) with a name each, for the log.
    @ivar listeners: called with the keys no longer listed after each
        L{replace} (the pack drops those peers).
    """

    def __init__(self, name: str, keys: Mapping[bytes, str], listed_in: str) -> None:
        """
        @param name: what the log calls the clients ("pack peer", "pair partner").
        @param listed_in: where the log says the keys are listed (an option).
        """
        self.name = name
        self.log_each_refusal = False
        self.keys = dict(keys)
        self.listed_in = listed_in
        self.listeners: list[Callable[[set[bytes]], None]] = []

    def admits(self, key: bytes) -> bool:
        """Whether C{key} (Z85) is listed."""
        return key in self.keys

    def replace(self, keys: Mapping[bytes, str]) -> None:
        """List C{keys} from now on (a reload); the listeners hear which keys went."""
        gone = set(self.keys) - set(keys)
        self.keys = dict(keys)
        for listener in self.listeners:
            listener(gone)

    def check(self, request: ZapRequest) -> Verdict:
        key = request.curve_key()
        if key is None:
            mechanism = request.mechanism.decode("ascii", "replace")
            return Verdict(None, f"offering {mechanism}, not a CURVE key")
        text = key.decode("ascii")
        if key in self.keys:
            return Verdict(text, f"key {text} ({self.keys[key]})")
        return Verdict(None, f"key {text}, not in {self.listed_in}")


@dataclass(slots=True)
class DomainCounters:
    """What the handler answered for one domain."""

    accepted: int = 0
    refused: int = 0
    #: Refusals whose answer was delayed (their pair had failed lately).
    throttled: int = 0
    #: Delayed refusals answered before their time, L{MAX_PENDING} being reached.
    hurried: int = 0


class ZapHandler(Service):
    """
    Answers ZAP requests for every ZeroMQ socket of its context, by the
    request's domain: the clients' (L{CLIENT_DOMAIN}) by
    L{ClientAuthenticator}, others by what L{serve} installs. A request
    for a domain nobody serves is refused: a socket that asks for ZAP is
    never let in by default.

    Refusals are answered late, by the throttle of the module's docstring:
    L{answer} returns the reply to send now, and a delayed one goes out
    later through C{send}.

    @ivar client: the clients' authenticator (passwords and CURVE keys are
        set on it by the security service).
    @ivar counters: per domain, what was accepted, refused, throttled and
        hurried.
    @ivar max_pending: refusals waiting for their answer at once, at most.
    @ivar max_tracked: (address, user) pairs whose failures are remembered,
        at most.
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]],
        passwords: Mapping[str, str],
        allow_null: bool = False,
        curve_keys: Mapping[bytes, str] | None = None,
        *,
        send: Callable[[list[bytes]], object] | None = None,
        max_pending: int = MAX_PENDING,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        """
        @param reactor: the reactor, whose clock times the delayed answers.
        @param curve_keys: the CURVE clients allowed in: public key (Z85)
            to user.
        @param send: sends a reply that was delayed (default: on the
            handler's socket, while it runs).
        @raise ValueError: if a bound is below 1.
        """
        if max_pending < 1 or max_tracked < 1:
            raise ValueError("the throttle's bounds must be at least 1")
        self._reactor = reactor
        self._clock: IReactorTime = reactor  # type: ignore[assignment]
        self._context = context
        self.client = ClientAuthenticator(passwords, curve_keys, allow_null)
        self._domains: dict[bytes, Authenticator] = {CLIENT_DOMAIN: self.client}
        self.counters: dict[str, DomainCounters] = {"client": DomainCounters()}
        self.socket: ZmqSocket | None = None
        self._send: Callable[[list[bytes]], object] = send or self._send_on_socket
        self.max_pending = max_pending
        self.max_tracked = max_tracked
        # (peer address, user or key): (failures lately, time of the last),
        # in the order of their last failure (the first failed longest ago).
        self._failures: OrderedDict[tuple[bytes, bytes], tuple[int, float]] = OrderedDict()
        # Delayed refusals, oldest first: serial: (its timer, the reply, its counters).
        self._pending: OrderedDict[int, tuple[IDelayedCall, list[bytes], DomainCounters]] = (
            OrderedDict()
        )
        self._serial = 0
        self._log_limit = LogLimit(self._clock, _log, per_second=5)
        self._brokers_once = OncePer(self._clock, BROKER_LOG_INTERVAL)

    # The clients' settings, as the security service sets them.

    @property
    def passwords(self) -> dict[str, str]:
        return self.client.passwords

    @passwords.setter
    def passwords(self, passwords: Mapping[str, str]) -> None:
        self.client.passwords = dict(passwords)

    @property
    def curve_keys(self) -> dict[bytes, str]:
        return self.client.curve_keys

    @curve_keys.setter
    def curve_keys(self, keys: Mapping[bytes, str]) -> None:
        self.client.curve_keys = dict(keys)

    @property
    def allow_null(self) -> bool:
        return self.client.allow_null

    def serve(self, domain: bytes, authenticator: Authenticator) -> None:
        """Decide the requests of C{domain} with C{authenticator} from now on."""
        self._domains[domain] = authenticator
        self.counters.setdefault(authenticator.name, DomainCounters())

    # Totals over every domain.

    @property
    def accepted(self) -> int:
        return sum(c.accepted for c in self.counters.values())

    @property
    def refused(self) -> int:
        return sum(c.refused for c in self.counters.values())

    @property
    def throttled(self) -> int:
        return sum(c.throttled for c in self.counters.values())

    @property
    def hurried(self) -> int:
        return sum(c.hurried for c in self.counters.values())

    # What the throttle holds now.

    @property
    def pending(self) -> int:
        """Refusals waiting for their delayed answer."""
        return len(self._pending)

    @property
    def tracked(self) -> int:
        """(address, user) pairs whose recent failures are remembered."""
        return len(self._failures)

    # Lifetime

    def startService(self) -> None:
        raw = self._context.socket(zmq.ROUTER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.bind(ZAP_ENDPOINT)
        self.socket = ZmqSocket(self._reactor, raw, self._requests)
        self.socket.startReading()
        super().startService()

    def stopService(self) -> None:
        super().stopService()
        # The refusals still waiting are answered now: no timer outlives the handler.
        pending, self._pending = self._pending, OrderedDict()
        for call, reply, _ in pending.values():
            call.cancel()
            self._send(reply)
        if self.socket is not None:
            # The inproc name is freed now: a close frees it later, in
            # ZeroMQ's reaper thread, and a handler started next on this
            # context (a service restarted) would find it taken.
            with contextlib.suppress(zmq.ZMQError):
                self.socket.socket.unbind(ZAP_ENDPOINT)
            self.socket.close()
            self.socket = None

    def _send_on_socket(self, reply: list[bytes]) -> None:
        if self.socket is not None:
            self.socket.send(reply)

    def _requests(self, batch: Batch) -> None:
        for frames in batch:
            reply = self.answer(frames)
            if reply is not None:
                self._send(reply)

    def answer(self, frames: list[bytes]) -> list[bytes] | None:
        """
        The reply to one ZAP request as received on a ROUTER: the envelope,
        an empty delimiter, then version, request id, domain, address,
        identity, mechanism and credentials.

        @return: the reply to send now, or None: the request is malformed
            (it gets no answer), or it is refused and its answer delayed
            (it goes out later through C{send}). Every request is checked,
            and an accepted one is always answered now.
        """
        request = ZapRequest.parse(frames)
        if request is None:
            _log.warn("malformed ZAP request ignored")
            return None
        authenticator = self._domains.get(request.domain)
        if authenticator is None:
            verdict = Verdict(None, f"on unknown ZAP domain {request.domain!r}")
            name = "unknown"
        else:
            name = authenticator.name
            verdict = authenticator.check(request)
        counters = self.counters.setdefault(name, DomainCounters())
        if verdict.user is not None:
            counters.accepted += 1
            return self._reply(request, b"200", b"OK", verdict.user.encode("utf-8"))
        counters.refused += 1
        address = request.address
        failures = self._failed((address, self._claimed(request)))
        delay = refusal_delay(failures)
        each = authenticator is not None and authenticator.log_each_refusal
        if each or self._brokers_once.due((name, verdict.who, address)):
            self._log_limit.info(
                f"zap-refused-{name}",
                "refused {mechanism} {name} {who} from {address}"
                + (", answered in {delay}s: {failures} failures lately" if delay else ""),
                mechanism=request.mechanism.decode("ascii", "replace"),
                name=name,
                who=verdict.who,
                address=address.decode("utf-8", "replace") or "ipc",
                delay=delay,
                failures=failures,
            )
        reply = self._reply(request, b"400", b"authentication failed", b"")
        if not delay:
            return reply
        counters.throttled += 1
        if len(self._pending) >= self.max_pending:
            self._hurry()
        self._serial += 1
        call = self._clock.callLater(delay, self._due, self._serial)
        self._pending[self._serial] = (call, reply, counters)
        return None

    @staticmethod
    def _reply(request: ZapRequest, status: bytes, text: bytes, user: bytes) -> list[bytes]:
        return [*request.envelope, b"1.0", request.request_id, status, text, user, b""]

    @staticmethod
    def _claimed(request: ZapRequest) -> bytes:
        """Who the request says it is: PLAIN's user name, the CURVE key, or nothing."""
        mechanism, credentials = request.mechanism, request.credentials
        if (mechanism == b"PLAIN" and len(credentials) == 2) or (
            mechanism == b"CURVE" and len(credentials) == 1
        ):
            return credentials[0]
        return b""

    def _failed(self, pair: tuple[bytes, bytes]) -> int:
        """Count a failure of C{pair}; its failures lately, this one included."""
        now = self._clock.seconds()
        failures = self._failures
        found = failures.pop(pair, None)
        count = 1 if found is None or now - found[1] >= FAILURE_WINDOW else found[0] + 1
        # The pairs that failed longest ago come first: forget those whose
        # window has ended, and the oldest past the bound.
        while failures:
            first, (_, last) = next(iter(failures.items()))
            if now - last < FAILURE_WINDOW and len(failures) < self.max_tracked:
                break
            del failures[first]
        failures[pair] = (count, now)
        return count

    def _due(self, serial: int) -> None:
        """A delayed refusal's time has come: answer it."""
        _, reply, _ = self._pending.pop(serial)
        self._send(reply)

    def _hurry(self) -> None:
        """Answer the oldest waiting refusal now, to make room for another."""
        _, (call, reply, counters) = self._pending.popitem(last=False)
        call.cancel()
        counters.hurried += 1
        self._log_limit.info(
            "zap-hurried",
            "{pending} refusals wait for their answer, the most there may be: the oldest"
            " are answered at once (a flood of attempts?)",
            pending=len(self._pending) + 1,
        )
        self._send(reply)
