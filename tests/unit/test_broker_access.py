"""
Tests for L{malamute_pack.broker.access} and the broker's use of it: globs
(linear time, pathological ones included), the access-control file, the
ownership of addresses, and every right checked where the broker acts,
with in-memory sessions of named users and with MLM sessions whose
routing id passes to another user's connection.
"""

from __future__ import annotations

import fnmatch
import random
import time
from pathlib import Path

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.access import (
    ADMIN,
    MAX_ADDRESSES_PER_USER,
    MONITOR,
    NOT_ALLOWED,
    AccessControl,
    AccessFileError,
    AccessPolicy,
    Claim,
    Glob,
    Owners,
    Right,
    glob_matches,
    load_access,
    parse_access,
)
from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.limits import Limits
from malamute_pack.protocol import mlm
from malamute_pack.transport.sessions import MlmSessions
from tests.memory_session import InMemorySession
from tests.support import capture_log

ACL = """
# addresses
alice: alice alice.*
bob: bob
alice write: prices.*
*     read: prices.*     # everyone reads prices
bob   read: private
-     read: public
bob   offer: echo
alice call: echo
"""


class GlobTests(SynchronousTestCase):
    def test_matches(self) -> None:
        """C{*} is any run (dots included), C{?} one character, the rest itself."""
        cases = [
            ("alice.*", "alice.inbox", True),
            ("alice.*", "alice.", True),
            ("alice.*", "alice", False),
            ("*", "", True),
            ("", "", True),
            ("", "a", False),
            ("a?c", "abc", True),
            ("a?c", "ac", False),
            ("*.inbox", "x.y.inbox", True),
            ("prices", "prices2", False),
            ("a*b*c", "aXXbYYc", True),
            ("a*b*c", "aXXcYYb", False),
            ("a**b", "ab", True),
            ("*a*", "*a*", True),
            ("[ab]", "a", False),  # no character classes: "[" is itself
            ("[ab]", "[ab]", True),
        ]
        for glob, name, expected in cases:
            self.assertEqual(glob_matches(glob, name), expected, (glob, name))

    def test_agreesWithFnmatch(self) -> None:
        """On globs of C{*}, C{?} and plain characters, the answers are fnmatch's."""
        rng = random.Random(7)
        for _ in range(3000):
            glob = "".join(rng.choice("ab.*?") for _ in range(rng.randint(0, 8)))
            name = "".join(rng.choice("ab.") for _ in range(rng.randint(0, 10)))
            self.assertEqual(
                Glob(glob).matches(name), fnmatch.fnmatchcase(name, glob), (glob, name)
            )

    def test_pathologicalGlobsRunLinear(self) -> None:
        """
        Globs that make a backtracking matcher explode (many stars, a name
        that fails at the end) take one step per character of the name:
        doubling the name about doubles the time, and 200 000 characters
        take well under a second.
        """
        glob = Glob("*a*a*a*a*a*a*a*a*a*a*b")

        def timed(length: int) -> float:
            name = "a" * length
            start = time.perf_counter()
            self.assertFalse(glob.matches(name))
            return time.perf_counter() - start

        timed(1000)  # warm up
        short, long = timed(50_000), timed(200_000)
        self.assertLess(long, 1.0)
        self.assertLess(long, short * 12)  # 4x the name: about 4x the time, never 16x


class FileTests(SynchronousTestCase):
    def test_parse(self) -> None:
        """Each line gives its user globs for its right (address when none is named)."""
        policy = parse_access(ACL.splitlines())
        self.assertEqual(policy.rules[Right.ADDRESS]["alice"], (Glob("alice"), Glob("alice.*")))
        self.assertEqual(policy.rules[Right.READ]["*"], (Glob("prices.*"),))
        self.assertNotIn(Right.SEND, policy.rules)

    def test_badLines(self) -> None:
        """A line that is not a rule, or names an unknown right, is refused with its number."""
        for text, fragment in [
            ("alice alice.*", ":1: expected"),
            ("alice:", ":1: expected"),
            ("\nalice delete: x", ":2: unknown right 'delete'"),
            ("a b c: x", ":1: expected"),
        ]:
            with self.assertRaises(AccessFileError) as ctx:
                parse_access(text.splitlines(), "acl")
            self.assertIn(fragment, str(ctx.exception))

    def test_load(self) -> None:
        """A file is read as UTF-8; one that cannot be read is an AccessFileError."""
        path = Path(self.mktemp())
        path.write_text(ACL, encoding="utf-8")
        self.assertTrue(load_access(path).allows("bob", Right.READ, "private"))
        self.assertRaises(AccessFileError, load_access, Path(self.mktemp()))
        path.write_bytes(b"alice: \xff\n")
        self.assertRaises(AccessFileError, load_access, path)


class PolicyTests(SynchronousTestCase):
    def test_rights(self) -> None:
        """
        A right named in the file is granted only by a matching line for
        the user or for everyone; a right the file never names is open.
        """
        policy = parse_access(ACL.splitlines())
        self.assertTrue(policy.allows("alice", Right.ADDRESS, "alice.jobs"))
        self.assertFalse(policy.allows("bob", Right.ADDRESS, "alice.jobs"))
        self.assertFalse(policy.allows("carol", Right.ADDRESS, "carol"))
        self.assertTrue(policy.allows("carol", Right.READ, "prices.eu"))
        self.assertFalse(policy.allows("alice", Right.READ, "private"))
        self.assertTrue(policy.allows("carol", Right.SEND, "anyone"))

    def test_unauthenticated(self) -> None:
        """
        A client without a user (a NULL endpoint) has the C{-} lines only,
        not C{*}'s; an empty policy allows everyone everything.
        """
        policy = parse_access(ACL.splitlines())
        self.assertTrue(policy.allows(None, Right.READ, "public"))
        self.assertFalse(policy.allows(None, Right.READ, "prices.eu"))
        self.assertTrue(policy.allows(None, Right.SEND, "anyone"))
        self.assertTrue(AccessPolicy().allows(None, Right.WRITE, "anything"))
        self.assertTrue(AccessPolicy().allows("anyone", Right.WRITE, "anything"))


class RoleTests(SynchronousTestCase):
    def test_roles(self) -> None:
        """
        A user is an admin when a C{role} line of its own or C{*}'s names
        admin, else a monitor; role lines grant no other right.
        """
        policy = parse_access(["alice role: admin", "bob role: monitor", "bob: bob"])
        self.assertEqual(policy.role("alice"), ADMIN)
        self.assertEqual(policy.role("bob"), MONITOR)
        self.assertEqual(policy.role("carol"), MONITOR)
        self.assertFalse(policy.allows("alice", Right.ADDRESS, "bob"))
        everyone = parse_access(["* role: admin"])
        self.assertEqual(everyone.role("carol"), ADMIN)

    def test_defaultMonitor(self) -> None:
        """Without role lines (or without a file) everyone is a monitor."""
        self.assertEqual(AccessPolicy().role("alice"), MONITOR)
        self.assertEqual(parse_access(ACL.splitlines()).role("alice"), MONITOR)

    def test_unknownRole(self) -> None:
        """A role line's words are role names: anything else (a glob too) is an error."""
        for text in ("alice role: root", "alice role: adm*", "alice role: admin superuser"):
            with self.assertRaises(AccessFileError) as ctx:
                parse_access([text], "acl")
            self.assertIn("acl:1: unknown role", str(ctx.exception))


class OwnersTests(SynchronousTestCase):
    def test_firstUserOwns(self) -> None:
        """The first user to open an address owns it; the same user may again, others not."""
        owners = Owners()
        owners.claim("alice", "inbox")
        owners.claim("alice", "inbox")
        with self.assertRaises(Refused) as ctx:
            owners.claim("bob", "inbox")
        self.assertEqual(ctx.exception.code, NOT_ALLOWED)
        self.assertEqual((owners.owner("inbox"), len(owners)), ("alice", 1))

    def test_claimsStored(self) -> None:
        """
        Each new claim, and only a new one, goes to the store with the time
        it was made; stored claims load back.
        """
        saved: list[tuple[str, str, float]] = []

        class Store:
            def save_owner(self, address: str, user: str, claimed: float) -> None:
                saved.append((address, user, claimed))

        clock = Clock()
        clock.advance(100)
        owners = Owners(Store(), clock=clock)
        owners.claim("alice", "inbox")
        clock.advance(1)
        owners.claim("alice", "inbox")
        owners.claim("bob", "bob")
        self.assertEqual(saved, [("inbox", "alice", 100.0), ("bob", "bob", 101.0)])
        again = Owners()
        again.load({address: (user, claimed) for address, user, claimed in saved})
        self.assertRaises(Refused, again.claim, "bob", "inbox")
        self.assertEqual(
            again.claims(), [("inbox", Claim("alice", 100.0)), ("bob", Claim("bob", 101.0))]
        )

    def test_listenersHearLocalClaims(self) -> None:
        """The listeners hear each claim made here, not those learned from other brokers."""
        heard: list[tuple[str, Claim]] = []
        owners = Owners(clock=Clock())
        owners.listeners.append(lambda address, claim: heard.append((address, claim)))
        owners.claim("alice", "alice")
        owners.claim("alice", "alice")
        owners.learn("bob", Claim("bob", 5.0))
        self.assertEqual(heard, [("alice", Claim("alice", 0.0))])

    def test_learnedClaimsConverge(self) -> None:
        """
        Two brokers that each took a claim on one address while apart end
        with the same owner whichever hears the other first: the earlier
        claim, then the smaller user name; the loser loses the address.
        """
        first, second = Owners(clock=Clock()), Owners(clock=Clock())
        first.load({"x": ("bob", 20.0)})
        second.load({"x": ("alice", 10.0)})
        self.assertTrue(first.learn("x", Claim("alice", 10.0)))
        self.assertFalse(second.learn("x", Claim("bob", 20.0)))
        self.assertEqual((first.owner("x"), second.owner("x")), ("alice", "alice"))
        with self.assertRaises(Refused):
            first.claim("bob", "x")
        tie_a, tie_b = Owners(), Owners()
        tie_a.load({"y": ("zed", 1.0)})
        tie_b.load({"y": ("amy", 1.0)})
        tie_a.learn("y", Claim("amy", 1.0))
        tie_b.learn("y", Claim("zed", 1.0))
        self.assertEqual((tie_a.owner("y"), tie_b.owner("y")), ("amy", "amy"))

    def test_learnedClaimsStoredAndBounded(self) -> None:
        """
        A learned claim that changes the owners is stored; one that would
        make a user own more than one user may is ignored and counted.
        """
        saved: list[tuple[str, str, float]] = []

        class Store:
            def save_owner(self, address: str, user: str, claimed: float) -> None:
                saved.append((address, user, claimed))

        owners = Owners(Store(), per_user=1)
        self.assertTrue(owners.learn("a", Claim("u", 1.0)))
        self.assertFalse(owners.learn("a", Claim("u", 1.0)))
        self.assertFalse(owners.learn("b", Claim("u", 2.0)))
        self.assertEqual((saved, owners.ignored), ([("a", "u", 1.0)], 1))

    def test_boundedPerUser(self) -> None:
        """
        One user owns at most C{per_user} addresses (claims never lapse, so
        nobody can push another's claim out); other users are not affected.
        """
        owners = Owners(per_user=2)
        owners.load({"a": ("u", 0.0)})
        owners.claim("u", "b")
        with self.assertRaises(Refused) as ctx:
            owners.claim("u", "c")
        self.assertIn("owns 2 addresses", ctx.exception.reason)
        owners.claim("v", "c")
        self.assertEqual(owners.owner("a"), "u")
        self.assertGreater(MAX_ADDRESSES_PER_USER, 1000)


class AccessControlTests(SynchronousTestCase):
    def test_refusalsCountedAndLogLimited(self) -> None:
        """
        Every refusal is a 403 Refused counted under its right; the log
        takes at most ten lines a second however many there are.
        """
        access = AccessControl(Clock(), parse_access(ACL.splitlines()))
        logged = capture_log(self)
        for _ in range(50):
            with self.assertRaises(Refused) as ctx:
                access.check("bob", Right.WRITE, "prices.eu")
            self.assertEqual(ctx.exception.code, NOT_ALLOWED)
        self.assertEqual(access.refused, {"write": 50})
        refusals = [e for e in logged if e.get("log_format") == "refused: {reason}"]
        self.assertEqual(len(refusals), 10)

    def test_aclDecidesAddresses(self) -> None:
        """
        When the file names the address right, it alone decides: nothing is
        claimed, and two users granted one address may both open it.
        """
        access = AccessControl(Clock(), parse_access(["alice: shared", "bob: shared"]))
        access.open("alice", "shared")
        access.open("bob", "shared")
        self.assertRaises(Refused, access.open, "bob", "other")
        self.assertEqual(len(access.owners), 0)

    def test_unauthenticatedOwnsNothing(self) -> None:
        """
        Without a user a client opens only addresses nobody owns, and
        claims none; the empty address is always allowed.
        """
        access = AccessControl(Clock())
        access.open(None, "free")
        access.open("alice", "free")
        self.assertRaises(Refused, access.open, None, "free")
        access.open(None, "")
        access.open("bob", "")
        self.assertEqual(access.owners.owner("free"), "alice")


def _open(broker: Broker, session: InMemorySession, address: str) -> str:
    broker.receive(session, mlm.ConnectionOpen(version=2, address=address))
    said = session.take()
    return said[0].what if said else ""


class BrokerAccessTests(SynchronousTestCase):
    """The broker checks each right where it acts, by the session's user."""

    def setUp(self) -> None:
        self.broker = Broker(Clock(), BrokerConfig())
        self.broker.access = AccessControl(Clock(), parse_access(ACL.splitlines()))

    def session(self, user: str | None, address: str) -> InMemorySession:
        session = InMemorySession(f"{user}-{address}", user=user)
        _open(self.broker, session, address)
        return session

    def test_openRefusedWith403(self) -> None:
        """An OPEN of an address the file does not grant gets ERROR 403; nothing registers."""
        bob = InMemorySession("bob", user="bob")
        self.broker.receive(bob, mlm.ConnectionOpen(version=2, address="alice.inbox"))
        [said] = bob.take()
        self.assertEqual(said.what, "error")
        self.assertEqual(said.values[0], NOT_ALLOWED)
        self.assertIn("not allowed: user 'bob' may not open the address", str(said.values[1]))
        self.assertIsNone(self.broker.registry.get(bob))
        self.assertEqual(self.broker.counters.by_reason.get("not allowed"), 1)

    def test_rightsAtEachCommand(self) -> None:
        """STREAM_WRITE, STREAM_READ, SERVICE_OFFER are refused with ERROR 403 and a reason."""
        bob = self.session("bob", "bob")
        for command in (
            mlm.StreamWrite("prices.eu"),
            mlm.StreamRead("private2", ""),
            mlm.StreamReadFrom("private2", "", 0, 0),
            mlm.ServiceOffer("other", ""),
        ):
            self.broker.receive(bob, command)
            [said] = bob.take()
            self.assertEqual((said.what, said.values[0]), ("error", NOT_ALLOWED), command)
            self.assertIn("not allowed: user 'bob'", str(said.values[1]), command)
        for command in (mlm.StreamRead("private", ""), mlm.ServiceOffer("echo", "")):
            self.broker.receive(bob, command)
            self.assertEqual([s.what for s in bob.take()], ["ok"], command)

    def test_lettersRefusedWithTheirReceipt(self) -> None:
        """A letter to a service the user may not call gets its refusal as STORED 403."""
        bob = self.session("bob", "bob")
        self.broker.receive(bob, mlm.ServiceSend("echo", "s", "", 0, [b"x"]))
        [said] = bob.take()
        self.assertEqual(said.what, "stored")
        [receipt] = bob.receipts
        self.assertEqual(receipt.code, NOT_ALLOWED)
        self.assertIn("may not send to the service", receipt.reason)


class OwnershipTests(SynchronousTestCase):
    """First-come ownership in the broker (no address rules): the defect's scenario."""

    def setUp(self) -> None:
        self.broker = Broker(Clock(), BrokerConfig())
        self.broker.access = AccessControl(Clock())

    def test_otherUserNeverGetsTheLetters(self) -> None:
        """
        alice opens her address and holds a letter without DONE; bob's OPEN
        of her address is refused while she is connected and after she is
        gone, and he receives none of her letters (held or queued); alice,
        back, gets both; she can take her address over from herself.
        """
        broker = self.broker
        alice = InMemorySession("alice", user="alice")
        self.assertEqual(_open(broker, alice, "inbox"), "ok")
        carol = InMemorySession("carol", user="carol")
        _open(broker, carol, "carol")
        broker.receive(carol, mlm.MailboxSend("inbox", "held", "", 0, [b"1"]))
        self.assertEqual([letter.subject for letter in alice.letters], ["held"])
        bob = InMemorySession("bob", user="bob")
        self.assertEqual(_open(broker, bob, "inbox"), "error")
        broker.receive(alice, mlm.ConnectionClose())
        broker.receive(carol, mlm.MailboxSend("inbox", "queued", "", 0, [b"2"]))
        self.assertEqual(_open(broker, bob, "inbox"), "error")
        self.assertEqual(bob.letters, [])
        self.assertIsNone(broker.registry.get(bob))
        back = InMemorySession("alice again", user="alice")
        self.assertEqual(_open(broker, back, "inbox"), "ok")
        self.assertEqual([letter.subject for letter in back.letters], ["held", "queued"])
        takeover = InMemorySession("alice third", user="alice")
        self.assertEqual(_open(broker, takeover, "inbox"), "ok")
        self.assertEqual(back.attachments, [1, -1])

    def test_refusedOpenKeepsThePreviousConnection(self) -> None:
        """A session already open that asks for another user's address keeps its own."""
        alice = InMemorySession("alice", user="alice")
        _open(self.broker, alice, "inbox")
        bob = InMemorySession("bob", user="bob")
        _open(self.broker, bob, "bob")
        self.assertEqual(_open(self.broker, bob, "inbox"), "error")
        connection = self.broker.registry.get(bob)
        assert connection is not None
        self.assertEqual(connection.address, "bob")

    def test_withoutAccessControlAsBefore(self) -> None:
        """A broker without access control (no authentication) lets anyone take any address."""
        broker = Broker(Clock(), BrokerConfig())
        _open(broker, InMemorySession("a", user="alice"), "inbox")
        self.assertEqual(_open(broker, InMemorySession("b", user="bob"), "inbox"), "ok")


class ReusedRoutingIdTests(SynchronousTestCase):
    """
    A peer may choose its routing id and take one that a closed connection
    left: a message from a known routing id but another user is a new party.
    """

    def setUp(self) -> None:
        self.broker = Broker(Clock(), BrokerConfig())
        self.broker.access = AccessControl(Clock())
        self.sent: list[tuple[bytes, list[bytes]]] = []
        self.sessions = MlmSessions(self.broker, self.record, Limits())

    def record(self, route: bytes, frames: object) -> bool:
        self.sent.append((route, list(frames)))  # type: ignore[call-overload]
        return True

    def replies(self) -> list[mlm.Message]:
        found = [mlm.decode(frames) for _, frames in self.sent]
        self.sent.clear()
        return found

    def test_otherUserOnTheSameRoute(self) -> None:
        """
        alice's connection on route R holds a letter; bob's connection on R
        is a stranger (ERROR 500 to his PING, not alice's PONG), alice's
        connection ends, and the letter is not delivered to R again.
        """
        send = self.sessions.receive
        send(b"R", mlm.encode(mlm.ConnectionOpen(version=2, address="inbox")), "alice")
        send(b"S", mlm.encode(mlm.ConnectionOpen(version=2, address="carol")), "carol")
        send(b"S", mlm.encode(mlm.MailboxSend("inbox", "secret", "", 0, [b"x"])), "carol")
        self.assertIn("secret", [getattr(m, "subject", None) for m in self.replies()])
        send(b"R", mlm.encode(mlm.ConnectionPing()), "bob")
        [reply] = self.replies()
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.COMMAND_INVALID)
        self.assertEqual(self.sessions.reused, 1)
        self.assertIsNone(self.broker.registry.holder("inbox"))
        self.assertEqual(len(self.broker.post.mailbox("inbox")), 1)  # back in the queue
        send(b"R", mlm.encode(mlm.ConnectionOpen(version=2, address="inbox")), "bob")
        [reply] = self.replies()
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, NOT_ALLOWED)

    def test_sameUserKeepsItsSession(self) -> None:
        """Messages of the same user on a route are one session, as without security."""
        send = self.sessions.receive
        send(b"R", mlm.encode(mlm.ConnectionOpen(version=1, address="inbox")), "alice")
        send(b"R", mlm.encode(mlm.ConnectionPing()), "alice")
        self.assertEqual(self.replies(), [mlm.Ok(), mlm.ConnectionPong()])
        self.assertEqual(self.sessions.reused, 0)
