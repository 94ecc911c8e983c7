"""
Who may do what on a broker that authenticates its clients (PLAIN or
CURVE): the access-control file with its globs, the ownership of
addresses, and L{AccessControl}, which the broker asks before it acts.

The file has one rule a line, ``USER [RIGHT]: GLOB [GLOB ...]``, with
``#`` comments and blank lines ignored::

    alice: alice alice.*          # the addresses alice may open
    alice write: prices.*         # the streams she may write to
    *     read: prices.*          # every authenticated user may read prices
    bob   call: echo              # the services bob may send requests to
    -     read: public.*          # clients of a NULL endpoint (no user)

RIGHT is one of ``address`` (the default), ``write`` (STREAM_WRITE),
``read`` (STREAM_READ), ``offer`` (SERVICE_OFFER), ``call``
(SERVICE_SEND) and ``send`` (MAILBOX_SEND), or ``role``, whose words
are not globs but the user's role in the management API, ``monitor`` or
``admin`` (``alice role: admin``; see L{AccessPolicy.role}). USER ``*``
stands for every authenticated user and ``-`` for clients that did not
authenticate. A right that no line of the file names is not restricted;
once a line names it, a client may exercise it only on names that one of
its lines (its user's, or ``*``'s) for that right matches.

A glob's ``*`` matches any run of characters (dots included) and ``?``
any one character; everything else matches itself. A glob is matched by a
bit-parallel automaton, one step per character of the name: linear time
whatever the glob, never a backtracking or regular-expression engine.

Addresses: the empty address (an anonymous client) is always allowed.
If the file names the ``address`` right, it alone decides who may open an
address (several users may be granted one; they take it over from each
other as one user's connections do). Otherwise an address belongs to the
first authenticated user who opens it (L{Owners}; kept in the journal
when there is one): no other user may open it, so no other user ever
receives the letters waiting there or held there without DONE, and a
client that did not authenticate may open only addresses nobody owns (and
owns nothing).

Refusals are ERROR (or, for MAILBOX_SEND and SERVICE_SEND, STORED or
CONFIRM) with status L{NOT_ALLOWED} (403) and a reason starting
``not allowed:``; they are counted per right and logged a few lines a
second at most.

Tests: ``tests/unit/test_broker_access.py``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.errors import Refused
from malamute_pack.broker.log_limit import LogLimit

_log = Logger()

# The status of a refusal for want of a right (an extension of MLM's codes,
# in the same HTTP-like spirit as 200, 300 and 500).
NOT_ALLOWED: Final = 403
ANY_USER: Final = "*"
UNAUTHENTICATED: Final = "-"
# Addresses one user may own at most (first-come ownership): an
# authenticated client cannot grow the ownership table without bound.
MAX_ADDRESSES_PER_USER: Final = 10_000


class Right(enum.Enum):
    ADDRESS = "address"
    WRITE = "write"
    READ = "read"
    OFFER = "offer"
    CALL = "call"
    SEND = "send"
    ROLE = "role"


# The management API's roles (L{AccessPolicy.role}): a monitor reads, an
# admin also acts (purges, deletes, disconnects).
MONITOR: Final = "monitor"
ADMIN: Final = "admin"
ROLES: Final = (MONITOR, ADMIN)

_VERBS: Final = {
    Right.ADDRESS: "open the address",
    Right.WRITE: "write to the stream",
    Right.READ: "read the stream",
    Right.OFFER: "offer the service",
    Right.CALL: "send to the service",
    Right.SEND: "send to the mailbox",
    Right.ROLE: "have the role",
}


class AccessFileError(ValueError):
    """The access-control file cannot be read or has a line that is not a rule."""


class Glob:
    """
    A compiled glob: C{*} any run of characters, C{?} one character.

    Matching runs a nondeterministic automaton with one state per glob
    character, all its states at once as the bits of an integer, so each
    character of the name costs a few integer operations: no backtracking,
    whatever the stars.
    """

    __slots__ = ("_accept", "_any", "_masks", "_stars", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        # Consecutive stars match what one star does.
        collapsed: list[str] = []
        for char in text:
            if not (char == "*" and collapsed and collapsed[-1] == "*"):
                collapsed.append(char)
        masks: dict[str, int] = {}
        any_char = stars = 0
        for i, char in enumerate(collapsed):
            bit = 1 << i
            if char == "*":
                stars |= bit
            elif char == "?":
                any_char |= bit
            else:
                masks[char] = masks.get(char, 0) | bit
        # State i: the first i glob characters are matched. A character
        # moves state i to i + 1 if glob character i is it or "?"; a star
        # keeps its state on any character.
        self._masks = {char: mask | any_char for char, mask in masks.items()}
        self._any = any_char
        self._stars = stars
        self._accept = 1 << len(collapsed)

    def __repr__(self) -> str:
        return f"Glob({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Glob) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def matches(self, name: str) -> bool:
        """Whether the whole of C{name} matches."""
        stars = self._stars
        masks = self._masks
        other = self._any
        states = 1
        states |= (states & stars) << 1  # a star matches the empty run too
        for char in name:
            states = ((states & masks.get(char, other)) << 1) | (states & stars)
            if not states:
                return False
            states |= (states & stars) << 1
        return bool(states & self._accept)


def glob_matches(glob: str, name: str) -> bool:
    """Whether C{name} matches C{glob} (see L{Glob})."""
    return Glob(glob).matches(name)


@dataclass(frozen=True)
class AccessPolicy:
    """
    The rules of an access-control file: per right it names, per user, the
    globs that user may exercise it on. An empty policy allows everything.
    """

    rules: Mapping[Right, Mapping[str, tuple[Glob, ...]]] = field(default_factory=dict)

    def restricts(self, right: Right) -> bool:
        """Whether the file names C{right} (so it is granted, not open to all)."""
        return right in self.rules

    def allows(self, user: str | None, right: Right, name: str) -> bool:
        """Whether C{user} (None: not authenticated) may exercise C{right} on C{name}."""
        by_user = self.rules.get(right)
        if by_user is None:
            return True
        if user is None:
            globs = by_user.get(UNAUTHENTICATED, ())
        else:
            globs = by_user.get(user, ()) + by_user.get(ANY_USER, ())
        return any(glob.matches(name) for glob in globs)

    def role(self, user: str) -> str:
        """
        C{user}'s role in the management API: L{ADMIN} if a C{role} line
        (its own or C{*}'s) grants it, else L{MONITOR}.
        """
        if not self.restricts(Right.ROLE):
            return MONITOR
        return ADMIN if self.allows(user, Right.ROLE, ADMIN) else MONITOR


def parse_access(lines: Iterable[str], source: str = "access file") -> AccessPolicy:
    """The policy of an access-control file's lines; C{source} names it in errors."""
    rules: dict[Right, dict[str, tuple[Glob, ...]]] = {}
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        head, colon, tail = text.partition(":")
        words = head.split()
        if not colon or not 1 <= len(words) <= 2 or not tail.split():
            raise AccessFileError(f"{source}:{number}: expected 'USER [RIGHT]: GLOB ...'")
        user = words[0]
        try:
            right = Right(words[1]) if len(words) == 2 else Right.ADDRESS
        except ValueError:
            known = ", ".join(r.value for r in Right)
            raise AccessFileError(
                f"{source}:{number}: unknown right {words[1]!r} (known: {known})"
            ) from None
        if right is Right.ROLE and (unknown := set(tail.split()) - set(ROLES)):
            raise AccessFileError(
                f"{source}:{number}: unknown role {sorted(unknown)[0]!r}"
                f" (known: {', '.join(ROLES)})"
            )
        by_user = rules.setdefault(right, {})
        by_user[user] = by_user.get(user, ()) + tuple(Glob(g) for g in tail.split())
    return AccessPolicy(rules)


def load_access(path: Path) -> AccessPolicy:
    """Read the access-control file at C{path}."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as e:
        raise AccessFileError(f"cannot read access file {path}: {e}") from e
    return parse_access(text.splitlines(), str(path))


@dataclass(frozen=True, slots=True)
class Claim:
    """A user's claim on an address, and when it was first made (seconds since the epoch)."""

    user: str
    claimed: float

    def prevails(self, other: Claim) -> bool:
        """
        Whether this claim wins over C{other} when two brokers of a pack
        hold different owners for one address (a claim made on each while
        they were apart): the earlier claim, then the smaller user name.
        Every broker applies the same rule, so they agree once each has
        heard both.
        """
        return (self.claimed, self.user) < (other.claimed, other.user)


class OwnerStore(Protocol):
    """Where ownership is kept across restarts (the journal)."""

    def save_owner(self, address: str, user: str, claimed: float) -> None:
        """
        Record that C{user} owns C{address} since C{claimed}, replacing any
        other owner it had (soon; never waits on disk).
        """


# Claims learned from other brokers of a pack that one broker keeps at most.
MAX_LEARNED: Final = 1_000_000


class Owners:
    """
    Which user owns which address: the first authenticated user to open it.
    A claim is for good (an administrator frees an address by deleting its
    row from the journal while the broker is stopped, or decides addresses
    with the access file instead). In a CURVE pack the brokers tell each
    other their claims (L{learn}), so an address is its owner's on every
    broker of the pack.

    @ivar store: where new claims are recorded, if anywhere.
    @ivar listeners: told of each claim made here (not of those learned):
        the pack tells its peers.
    @ivar ignored: claims learned from other brokers and not kept (the
        user owns the most addresses one user may, or L{MAX_LEARNED} are
        held).
    """

    def __init__(
        self,
        store: OwnerStore | None = None,
        per_user: int = MAX_ADDRESSES_PER_USER,
        clock: IReactorTime | None = None,
    ) -> None:
        """@param clock: when claims are made (the wall clock by default)."""
        self.store = store
        self._per_user = per_user
        self._clock = clock
        self._claims: dict[str, Claim] = {}
        self._owned: dict[str, int] = {}
        self._learned = 0
        self.ignored = 0
        self.listeners: list[Callable[[str, Claim], None]] = []

    def __len__(self) -> int:
        return len(self._claims)

    def load(self, claims: Mapping[str, tuple[str, float]]) -> None:
        """Take back the claims a store kept: address to (user, when claimed)."""
        for address, (user, claimed) in claims.items():
            if address not in self._claims:
                self._claims[address] = Claim(user, claimed)
                self._owned[user] = self._owned.get(user, 0) + 1

    def owner(self, address: str) -> str | None:
        claim = self._claims.get(address)
        return None if claim is None else claim.user

    def claims(self) -> list[tuple[str, Claim]]:
        """Every claim held (a copy), as (address, claim)."""
        return list(self._claims.items())

    def claim(self, user: str, address: str) -> None:
        """
        C{user} opens C{address}: it becomes the owner if there is none.

        @raise Refused: (403) if another user owns it, or C{user} owns the
            most addresses one user may.
        """
        existing = self._claims.get(address)
        if existing is not None:
            if existing.user == user:
                return
            raise Refused(
                f"not allowed: the address {address!r} belongs to another user", NOT_ALLOWED
            )
        owned = self._owned.get(user, 0)
        if owned >= self._per_user:
            raise Refused(
                f"not allowed: user {user!r} owns {owned} addresses, the most one user may",
                NOT_ALLOWED,
            )
        # Whole microseconds, as the pack's OWNER message carries it: a claim
        # that travels and comes back compares equal to itself.
        claim = Claim(user, round(self._now() * 1_000_000) / 1_000_000)
        self._claims[address] = claim
        self._owned[user] = owned + 1
        if self.store is not None:
            self.store.save_owner(address, user, claim.claimed)
        for listener in self.listeners:
            listener(address, claim)

    def learn(self, address: str, claim: Claim) -> bool:
        """
        Another broker of the pack says C{claim} holds C{address}: kept if
        nobody here owns it, or if it prevails over the claim here
        (L{Claim.prevails}).

        @return: whether it changed the owners here (stored if so).
        """
        existing = self._claims.get(address)
        if existing is not None and (existing == claim or not claim.prevails(existing)):
            return False
        if existing is None or existing.user != claim.user:
            owned = self._owned.get(claim.user, 0)
            if owned >= self._per_user or (existing is None and self._learned >= MAX_LEARNED):
                self.ignored += 1
                return False
            self._owned[claim.user] = owned + 1
            if existing is not None:
                self._owned[existing.user] -= 1
            else:
                self._learned += 1
        self._claims[address] = claim
        if self.store is not None:
            self.store.save_owner(address, claim.user, claim.claimed)
        return True

    def _now(self) -> float:
        return time.time() if self._clock is None else self._clock.seconds()


class AccessControl:
    """
    The broker's gatekeeper when clients authenticate: the access policy
    (replaced whole on a reload) and the owners of addresses.

    @ivar policy: the rules in force.
    @ivar owners: the first-come owners of addresses.
    @ivar refused: refusals, by right.
    @ivar passwords: the PLAIN password table in force (user to password),
        set by the security service when it loads or reloads the password
        file; None without one. The management API's basic authentication
        reads it.
    """

    def __init__(
        self,
        clock: IReactorTime,
        policy: AccessPolicy | None = None,
        owners: Owners | None = None,
    ) -> None:
        self.policy = policy if policy is not None else AccessPolicy()
        self.owners = owners if owners is not None else Owners(clock=clock)
        self.refused: dict[str, int] = {}
        self.passwords: Mapping[str, str] | None = None
        self._log_limit = LogLimit(clock, _log)

    def check(self, user: str | None, right: Right, name: str, log: bool = True) -> None:
        """
        Refuse (403) unless C{user} (None: not authenticated) may exercise
        C{right} on C{name}. C{log}: log the refusal here (False where the
        broker logs it anyway).
        """
        if not self.policy.allows(user, right, name):
            who = "a client without a user" if user is None else f"user {user!r}"
            self._refuse(right, f"not allowed: {who} may not {_VERBS[right]} {name!r}", log)

    def open(self, user: str | None, address: str) -> None:
        """Refuse (403) unless C{user} may open C{address}; claim it if it is free."""
        if not address:
            return
        if self.policy.restricts(Right.ADDRESS):
            self.check(user, Right.ADDRESS, address)
            return
        if user is None:
            if self.owners.owner(address) is not None:
                self._refuse(
                    Right.ADDRESS,
                    f"not allowed: the address {address!r} belongs to a user;"
                    " authenticate to open it",
                )
            return
        try:
            self.owners.claim(user, address)
        except Refused as e:
            self._refuse(Right.ADDRESS, e.reason)

    def _refuse(self, right: Right, reason: str, log: bool = True) -> None:
        self.refused[right.value] = self.refused.get(right.value, 0) + 1
        if log:
            self._log_limit.info("not allowed", "refused: {reason}", reason=reason)
        raise Refused(reason, NOT_ALLOWED)
