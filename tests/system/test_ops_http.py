"""
Tests for L{malamute_pack.ops.http}: the management API as a real site
listening on loopback TCP, asked by C{twisted.web}'s L{Agent}, over the
real L{Statistics} and L{Admin} of a broker model with traffic: every
section's schema, C{/metrics} parsed back, C{/healthz} and C{/readyz},
the dashboard's files, authentication (open without a password file;
401, 403 and 200 with one, roles from the access-control file, both
reloaded), the admin actions' confirmation and effect, bounded bodies and
bad JSON. Two system tests ask real broker processes started with
C{--http}: one open, one with passwords and roles (the tap's wiring).
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import zmq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IConsumer, IListeningPort, IReactorFromThreads
from twisted.internet.task import Clock, deferLater
from twisted.protocols.policies import WrappingFactory
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import (
    Agent,
    HTTPConnectionPool,
    RequestTransmissionFailed,
    ResponseFailed,
    readBody,
)
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer

from malamute_pack.broker.access import AccessControl
from malamute_pack.ops.admin import Admin
from malamute_pack.ops.http import MAX_BODY, NO_ADMIN_WITHOUT_PASSWORDS, HttpAccess, make_site
from malamute_pack.ops.stats import SECTIONS
from malamute_pack.protocol import mlm
from malamute_pack.settings import Settings
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, BrokerProcess
from malamute_pack.transport.security import SecurityService
from tests.ops_support import COUNTERS, RATES, SCHEMA, WRITER, busy_broker
from tests.support import capture_log, skip_slow

JSON = {"content-type": "application/json"}


@implementer(IBodyProducer)
class Body:
    """A request body written at once."""

    def __init__(self, data: bytes, length: int | None = None) -> None:
        self.data = data
        self.length = len(data) if length is None else length

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self.data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class Response:
    """What came back: the status, the headers (lower-case names) and the body."""

    def __init__(self, code: int, headers: dict[str, list[str]], body: bytes) -> None:
        self.code = code
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None

    def json(self) -> Any:
        assert self.header("content-type") == "application/json", self.headers
        return json.loads(self.body)


class Served:
    """
    A site listening on C{tcp:0:interface=127.0.0.1} for one test, and an
    HTTP client for it; both closed (connections included) when the test
    ends.
    """

    def __init__(self, case: TestCase) -> None:
        self.case = case
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.agent = Agent(reactor, pool=self.pool)
        self.port: IListeningPort | None = None
        self.factory: WrappingFactory | None = None

    def listen(self, site: Any) -> None:
        self.factory = WrappingFactory(site)
        endpoint = serverFromString(reactor, "tcp:0:interface=127.0.0.1")
        # A TCP endpoint listens at once: its Deferred has fired.
        self.port = self.case.successResultOf(endpoint.listen(self.factory))
        self.case.addCleanup(lambda: Deferred.fromCoroutine(self.close()))

    async def close(self) -> None:
        await self.pool.closeCachedConnections()
        assert self.port is not None and self.factory is not None
        await maybeDeferred(self.port.stopListening)
        for protocol in list(self.factory.protocols):
            protocol.transport.loseConnection()
        for _ in range(500):
            if not self.factory.protocols:
                return
            await deferLater(reactor, 0.01, lambda: None)
        raise AssertionError("the server's connections did not close")

    @property
    def url(self) -> str:
        assert self.port is not None
        return f"http://127.0.0.1:{self.port.getHost().port}"  # type: ignore[attr-defined]

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        user: tuple[str, str] | None = None,
        headers: dict[str, str] | None = None,
        length: int | None = None,
    ) -> Response:
        """Ask C{path}, as C{user} (name, password) if given."""
        sent = Headers()
        for name, value in (headers or {}).items():
            sent.addRawHeader(name, value)
        if user is not None:
            token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
            sent.addRawHeader("authorization", f"Basic {token}")
        response = await self.agent.request(
            method.encode(),
            (self.url + path).encode(),
            sent,
            None if body is None else Body(body, length),
        )
        data = await readBody(response)
        received = {
            name.decode().lower(): [v.decode() for v in values]
            for name, values in response.headers.getAllRawHeaders()
        }
        return Response(response.code, received, data)

    async def get(self, path: str, user: tuple[str, str] | None = None) -> Response:
        return await self.request("GET", path, user=user)

    async def post(self, path: str, value: Any, user: tuple[str, str] | None = None) -> Response:
        return await self.request("POST", path, json.dumps(value).encode(), user=user, headers=JSON)


def dashboard(case: SynchronousTestCase) -> Path:
    """A dashboard directory with a page, a script and a folder without a page."""
    directory = Path(case.mktemp())
    directory.mkdir()
    (directory / "index.html").write_text("<html><title>malamute</title></html>")
    (directory / "app.js").write_text("console.log('hi');")
    (directory / "img").mkdir()
    return directory


class OpenApiTests(TestCase):
    """A broker without a password file: every GET open, every admin action refused."""

    def setUp(self) -> None:
        journal = Path(self.mktemp()) / "journal.sqlite"
        self.harness, self.statistics = busy_broker(self, journal)
        self.admin = Admin(self.harness.broker, None)
        self.not_ready: list[str | None] = [None]
        site = make_site(
            self.statistics,
            self.admin,
            HttpAccess.from_settings(Settings(), None, Clock()),
            lambda: self.not_ready[0],
            dashboard(self),
        )
        self.served = Served(self)
        self.served.listen(site)

    async def test_sectionSchemas(self) -> None:
        """Every section is JSON with every key of its schema, on every entry of a list."""
        for section in SECTIONS:
            response = await self.served.get(f"/api/{section}")
            self.assertEqual(response.code, 200, section)
            self.assertEqual(response.header("cache-control"), "no-store")
            value = response.json()
            entries = value if isinstance(value, list) else [value]
            if section != "history":
                self.assertTrue(entries, section)
            for entry in entries:
                self.assertEqual(SCHEMA[section] - set(entry), set(), section)
        overview = (await self.served.get("/api/overview")).json()
        self.assertEqual(set(overview["counters"]), COUNTERS)
        self.assertEqual(set(overview["rates"]), RATES)
        self.assertEqual(overview["counters"]["stream_messages"], 3)

    async def test_sectionFigures(self) -> None:
        """The sections show the broker's traffic: the stream, the mailbox, the service."""
        streams = (await self.served.get("/api/streams")).json()
        self.assertEqual([(s["name"], s["messages"]) for s in streams], [("weather", 3)])
        mailboxes = (await self.served.get("/api/mailboxes")).json()
        self.assertEqual([(m["address"], m["depth"]) for m in mailboxes], [("inbox", 2)])
        services = (await self.served.get("/api/services")).json()
        self.assertEqual([(s["name"], s["depth"]) for s in services], [("echo", 1)])
        clients = (await self.served.get("/api/clients")).json()
        self.assertEqual(sorted(c["address"] for c in clients), ["reader", "writer"])

    async def test_index(self) -> None:
        """C{/api} lists the sections."""
        response = await self.served.get("/api")
        self.assertEqual(response.json(), {"sections": list(SECTIONS)})
        self.assertEqual((await self.served.get("/api/")).json(), {"sections": list(SECTIONS)})

    async def test_notFound(self) -> None:
        """Unknown routes are JSON 404s; a GET of an admin action is a 405."""
        for path in ("/api/nothing", "/api/streams/weather", "/nothing", "/api/overview/x"):
            response = await self.served.get(path)
            self.assertEqual(response.code, 404, path)
            self.assertIn("error", response.json())
        response = await self.served.get("/api/mailboxes/inbox/purge")
        self.assertEqual(response.code, 405)
        self.assertEqual(response.header("allow"), "POST")

    async def test_methods(self) -> None:
        """A method a route does not take is a JSON 405 naming those it does."""
        response = await self.served.request("PUT", "/api/overview", b"{}")
        self.assertEqual(response.code, 405)
        self.assertIn("GET", str(response.header("allow")))
        self.assertIn("method not allowed", response.json()["error"])
        response = await self.served.request("POST", "/healthz", b"")
        self.assertEqual(response.code, 405)
        head = await self.served.request("HEAD", "/api/overview")
        self.assertEqual((head.code, head.body), (200, b""))

    async def test_adminRefused(self) -> None:
        """Without a password file every admin action is a 403 that says what is missing."""
        for path in (
            "/api/mailboxes/inbox/purge",
            "/api/services/echo/purge",
            "/api/streams/weather/delete",
            "/api/streams/weather/retention",
            "/api/clients/writer/disconnect",
        ):
            response = await self.served.post(path, {"confirm": True})
            self.assertEqual(response.code, 403, path)
            self.assertEqual(response.json(), {"error": NO_ADMIN_WITHOUT_PASSWORDS})
        self.assertEqual(self.statistics.mailboxes()[0]["depth"], 2)

    async def test_health(self) -> None:
        """C{/healthz} answers 200 ok."""
        response = await self.served.get("/healthz")
        self.assertEqual((response.code, response.body), (200, b"ok\n"))

    async def test_ready(self) -> None:
        """C{/readyz} is 200 while the broker serves, 503 with the reason while it does not."""
        response = await self.served.get("/readyz")
        self.assertEqual((response.code, response.body), (200, b"ready\n"))
        self.not_ready[0] = "the journal is not open"
        response = await self.served.get("/readyz")
        self.assertEqual(response.code, 503)
        self.assertEqual(response.body, b"not ready: the journal is not open\n")

    async def test_metrics(self) -> None:
        """C{/metrics} is the Prometheus text format of the same figures."""
        response = await self.served.get("/metrics")
        self.assertEqual(response.code, 200)
        self.assertTrue(str(response.header("content-type")).startswith("text/plain"))
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.body.decode())
            for sample in family.samples
        }
        self.assertEqual(samples[("malamute_stream_messages_total", ())], 3)
        self.assertEqual(
            samples[("malamute_stream_messages_written_total", (("stream", "weather"),))], 3
        )
        self.assertEqual(samples[("malamute_mailbox_depth", (("address", "inbox"),))], 2)
        self.assertEqual(samples[("malamute_http_logins_refused_total", ())], 0)

    async def test_dashboard(self) -> None:
        """C{/} is the dashboard's page and C{/dashboard/FILE} its files; no listings."""
        page = await self.served.get("/")
        self.assertEqual(page.code, 200)
        self.assertEqual(page.header("x-frame-options"), "DENY")
        self.assertEqual(page.header("x-content-type-options"), "nosniff")
        self.assertIn(b"<title>malamute</title>", page.body)
        self.assertTrue(str(page.header("content-type")).startswith("text/html"))
        script = await self.served.get("/dashboard/app.js")
        self.assertEqual((script.code, script.body), (200, b"console.log('hi');"))
        self.assertEqual((await self.served.get("/dashboard/img/")).code, 404)
        self.assertEqual((await self.served.get("/dashboard/missing.js")).code, 404)
        self.assertEqual((await self.served.get("/dashboard/../../etc/passwd")).code, 404)


PASSWORDS = "alice = wonderland\nbob = builder\n"
ACL = "alice role: admin\n* read: *\n"


class SecuredApiTests(TestCase):
    """
    A broker with a password file and an access-control file, loaded by
    the real security service (as the tap does): basic authentication,
    roles, and the admin actions.
    """

    ALICE = ("alice", "wonderland")
    BOB = ("bob", "builder")

    def setUp(self) -> None:
        self.harness, self.statistics = busy_broker(self)
        directory = Path(self.mktemp())
        directory.mkdir()
        self.passwords = directory / "passwords"
        self.passwords.write_text(PASSWORDS)
        self.acl = directory / "acl"
        self.acl.write_text(ACL)
        settings = Settings(
            endpoints=("tcp://127.0.0.1:*",),
            mechanism="plain",
            passwords=self.passwords,
            access_file=self.acl,
        )
        self.control = AccessControl(Clock())
        self.security = SecurityService(
            cast(IReactorFromThreads, reactor), settings.security_files(), None, self.control
        )
        self.access = HttpAccess.from_settings(settings, self.control, Clock())
        self.admin = Admin(self.harness.broker, None)
        site = make_site(self.statistics, self.admin, self.access, lambda: None, dashboard(self))
        self.served = Served(self)
        self.served.listen(site)

    async def test_challenge(self) -> None:
        """Without credentials every route but the health checks is a 401 with a challenge."""
        for path in ("/api/overview", "/metrics", "/", "/dashboard/app.js", "/nothing"):
            response = await self.served.get(path)
            self.assertEqual(response.code, 401, path)
            self.assertEqual(response.header("www-authenticate"), 'Basic realm="malamute"')
        self.assertEqual((await self.served.get("/healthz")).code, 200)
        self.assertEqual((await self.served.get("/readyz")).code, 200)
        self.assertEqual(self.access.logins_refused, 0)

    async def test_wrongCredentials(self) -> None:
        """Wrong passwords, unknown users and garbled headers are 401s, counted and logged."""
        events = capture_log(self)
        for user in (("alice", "wrong"), ("mallory", "x"), ("alice", "")):
            response = await self.served.get("/api/overview", user)
            self.assertEqual(response.code, 401, user)
        for header in ("Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode(), "Bearer x"):
            response = await self.served.request(
                "GET", "/api/overview", headers={"authorization": header}
            )
            self.assertEqual(response.code, 401, header)
        self.assertEqual(self.access.logins_refused, 6)
        refusals = [e for e in events if "login refused" in e.get("log_format", "")]
        self.assertEqual(len(refusals), 6)
        self.assertEqual(refusals[0]["peer"], "127.0.0.1")
        metrics = await self.served.get("/metrics", self.BOB)
        self.assertIn(b"malamute_http_logins_refused_total 6.0", metrics.body)

    async def test_monitorReads(self) -> None:
        """A user without a role line is a monitor: it reads everything."""
        for path in ("/api/overview", "/api/clients", "/metrics", "/"):
            self.assertEqual((await self.served.get(path, self.BOB)).code, 200, path)

    async def test_monitorCannotAct(self) -> None:
        """A monitor's admin action is a 403 naming the role it needs; nothing is done."""
        response = await self.served.post("/api/mailboxes/inbox/purge", {"confirm": True}, self.BOB)
        self.assertEqual(response.code, 403)
        self.assertIn("'bob role: admin'", response.json()["error"])
        self.assertEqual(self.statistics.mailboxes()[0]["depth"], 2)

    async def test_confirmationRequired(self) -> None:
        """Without C{"confirm": true} an admin's action is a 400 saying what it would do."""
        for body in ({}, {"confirm": False}, {"confirm": "yes"}):
            response = await self.served.post("/api/mailboxes/inbox/purge", body, self.ALICE)
            self.assertEqual(response.code, 400)
            answer = response.json()
            self.assertIn("confirm", answer["error"])
            self.assertEqual(
                answer["would"],
                "remove every letter waiting in the mailbox 'inbox' (2 letters, 10 bytes)",
            )
        response = await self.served.request("POST", "/api/mailboxes/inbox/purge", user=self.ALICE)
        self.assertEqual(response.code, 400)
        self.assertIn("would", response.json())
        self.assertEqual(self.statistics.mailboxes()[0]["depth"], 2)

    async def test_purgeMailbox(self) -> None:
        """An admin's confirmed purge really empties the mailbox."""
        response = await self.served.post(
            "/api/mailboxes/inbox/purge", {"confirm": True}, self.ALICE
        )
        self.assertEqual(response.code, 200)
        answer = response.json()
        self.assertEqual((answer["done"], answer["target"]), ("purge", "inbox"))
        self.assertEqual((answer["purged"], answer["bytes"]), (2, 10))
        self.assertEqual(len(self.harness.broker.post.mailboxes.get("inbox") or ()), 0)
        mailboxes = (await self.served.get("/api/mailboxes", self.ALICE)).json()
        self.assertIn([m["depth"] for m in mailboxes if m["address"] == "inbox"], ([], [0]))

    async def test_purgeService(self) -> None:
        """An admin's confirmed purge of a service drops its queued requests."""
        response = await self.served.post("/api/services/echo/purge", {"confirm": True}, self.ALICE)
        self.assertEqual(response.code, 200)
        self.assertEqual(response.json()["purged"], 1)
        self.assertEqual(self.statistics.services()[0]["depth"], 0)

    async def test_disconnect(self) -> None:
        """An admin disconnects a client by its id from the clients list."""
        clients = (await self.served.get("/api/clients", self.ALICE)).json()
        writer = next(c for c in clients if c["address"] == "writer")
        path = f"/api/clients/{writer['id']}/disconnect"
        response = await self.served.post(path, {}, self.ALICE)
        self.assertEqual(response.code, 400)
        self.assertIn("'writer'", response.json()["would"])
        response = await self.served.post(path, {"confirm": True}, self.ALICE)
        self.assertEqual(response.code, 200)
        self.assertTrue(response.json()["disconnected"])
        self.assertFalse(self.harness.connected(WRITER))

    async def test_unknownNames(self) -> None:
        """An action on a name the broker does not have is a 404 saying so."""
        response = await self.served.post(
            "/api/mailboxes/nobody/purge", {"confirm": True}, self.ALICE
        )
        self.assertEqual(response.code, 404)
        self.assertEqual(response.json(), {"error": "no mailbox 'nobody'"})
        response = await self.served.post("/api/nothing/x/purge", {"confirm": True}, self.ALICE)
        self.assertEqual(response.code, 404)

    async def test_encodedNames(self) -> None:
        """A name with a slash or spaces is one path segment, percent-encoded."""
        self.harness.send(WRITER, mlm.MailboxSend("a/b c", "s", "", 0, [b"z"]))
        response = await self.served.post(
            "/api/mailboxes/a%2Fb%20c/purge", {"confirm": True}, self.ALICE
        )
        self.assertEqual(response.code, 200, response.body)
        self.assertEqual(response.json()["purged"], 1)

    async def test_badBodies(self) -> None:
        """Bad JSON, a non-object, unknown keys, bad values and a non-JSON type are refused."""
        path = "/api/mailboxes/inbox/purge"
        cases: list[tuple[bytes, dict[str, str], int]] = [
            (b"{not json", JSON, 400),
            (b"[1, 2]", JSON, 400),
            (b'{"confirm": true, "force": 1}', JSON, 400),
            (b'{"confirm": true}', {"content-type": "text/plain"}, 415),
            (b"\xff\xfe", JSON, 400),
        ]
        for body, headers, code in cases:
            response = await self.served.request("POST", path, body, self.ALICE, headers)
            self.assertEqual(response.code, code, body)
            self.assertIn("error", response.json())
        retention = "/api/streams/weather/retention"
        for value in ({"max_bytes": -1}, {"max_records": 1.5}, {"max_age_s": "1"}):
            response = await self.served.post(retention, {**value, "confirm": True}, self.ALICE)
            self.assertEqual(response.code, 400, value)
        self.assertEqual(self.statistics.mailboxes()[0]["depth"], 2)

    async def test_retentionWithoutJournal(self) -> None:
        """A retention change is described first; without a journal it is refused (400)."""
        retention = "/api/streams/weather/retention"
        response = await self.served.post(retention, {"max_records": 10}, self.ALICE)
        self.assertEqual(response.code, 400)
        self.assertIn("max_records = 10", response.json()["would"])
        response = await self.served.post(
            retention, {"max_records": 10, "confirm": True}, self.ALICE
        )
        self.assertEqual(response.code, 404)
        self.assertIn("no journal", response.json()["error"])

    async def test_bodyBounded(self) -> None:
        """A body over the bound is a 413; one far over it closes the connection."""
        path = "/api/mailboxes/inbox/purge"
        body = b'{"confirm": true, "pad": "' + b"x" * MAX_BODY + b'"}'
        response = await self.served.request("POST", path, body, self.ALICE, JSON)
        self.assertEqual(response.code, 413)
        huge = Body(b"x" * (64 * MAX_BODY))
        with self.assertRaises((ResponseFailed, RequestTransmissionFailed)):
            await self.served.agent.request(
                b"POST",
                (self.served.url + path).encode(),
                Headers({"content-type": ["application/json"]}),
                huge,
            )
        self.assertEqual(self.statistics.mailboxes()[0]["depth"], 2)
        self.assertEqual((await self.served.get("/healthz")).code, 200)

    async def test_reload(self) -> None:
        """A reload of the security files changes passwords and roles for the next request."""
        self.passwords.write_text("alice = changed\nbob = builder\n")
        self.acl.write_text("bob role: admin\n")
        self.assertTrue(self.security.reload())
        self.assertEqual((await self.served.get("/api/overview", self.ALICE)).code, 401)
        self.assertEqual((await self.served.get("/api/overview", ("alice", "changed"))).code, 200)
        response = await self.served.post(
            "/api/mailboxes/inbox/purge", {"confirm": True}, ("alice", "changed")
        )
        self.assertEqual(response.code, 403)
        response = await self.served.post("/api/mailboxes/inbox/purge", {"confirm": True}, self.BOB)
        self.assertEqual(response.code, 200)


class JournalApiTests(TestCase):
    """The journal's section and the admin actions on streams, over a real journal."""

    ALICE = ("alice", "wonderland")

    def setUp(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir()
        self.harness, self.statistics = busy_broker(self, directory / "journal.sqlite")
        self.harness.settle()
        self.journal = self.harness.journal
        assert self.journal is not None
        passwords = directory / "passwords"
        passwords.write_text(PASSWORDS)
        access_file = directory / "acl"
        access_file.write_text(ACL)
        settings = Settings(passwords=passwords, mechanism="plain", access_file=access_file)
        control = AccessControl(Clock())
        SecurityService(
            cast(IReactorFromThreads, reactor), settings.security_files(), None, control
        )
        site = make_site(
            self.statistics,
            Admin(self.harness.broker, self.journal),
            HttpAccess.from_settings(settings, control, Clock()),
            lambda: None,
            dashboard(self),
        )
        self.served = Served(self)
        self.served.listen(site)

    async def test_journalSection(self) -> None:
        """The journal's section says where it is and what it wrote."""
        journal = (await self.served.get("/api/journal", self.ALICE)).json()
        self.assertTrue(journal["enabled"])
        assert self.journal is not None
        self.assertEqual(journal["path"], str(self.journal.path))
        self.assertGreaterEqual(journal["records_written"], 3)

    async def test_deleteStream(self) -> None:
        """A confirmed delete drops the stream's retained records."""
        path = "/api/streams/weather/delete"
        response = await self.served.post(path, {}, self.ALICE)
        self.assertEqual(response.code, 400)
        self.assertIn("the stream 'weather'", response.json()["would"])
        response = await self.served.post(path, {"confirm": True}, self.ALICE)
        self.assertEqual(response.code, 200, response.body)
        self.assertEqual(response.json()["records"], 3)
        self.harness.settle()
        assert self.journal is not None
        self.assertGreater(self.journal.first_seq("weather"), self.journal.last_seq("weather"))

    async def test_retention(self) -> None:
        """A confirmed retention change is in force, the stream pruned to it."""
        path = "/api/streams/weather/retention"
        response = await self.served.post(path, {"max_records": 1, "confirm": True}, self.ALICE)
        self.assertEqual(response.code, 200, response.body)
        self.assertEqual(response.json()["retention"]["max_records"], 1)
        self.harness.settle()
        assert self.journal is not None
        self.assertEqual(self.journal.config.retention_for("weather").max_count, 1)

    async def test_compact(self) -> None:
        """
        A compaction change is described first; confirmed, the stream is a
        last-value stream, listed as one with its subjects kept; a value
        other than "subject" or "" is a 400.
        """
        path = "/api/streams/weather/compact"
        response = await self.served.post(path, {"compact": "subject"}, self.ALICE)
        self.assertEqual(response.code, 400)
        self.assertIn("last-value stream", response.json()["would"])
        response = await self.served.post(path, {"compact": "key", "confirm": True}, self.ALICE)
        self.assertEqual(response.code, 400)
        self.assertIn("compact must be", response.json()["error"])
        response = await self.served.post(path, {"compact": "subject", "confirm": True}, self.ALICE)
        self.assertEqual(response.code, 200, response.body)
        self.assertEqual((response.json()["compact"], response.json()["previous"]), ("subject", ""))
        self.harness.settle()
        assert self.journal is not None
        self.assertTrue(self.journal.compacted("weather"))
        response = await self.served.get("/api/streams", self.ALICE)
        (weather,) = [s for s in response.json() if s["name"] == "weather"]
        self.assertEqual((weather["compact"], weather["last_values"]), ("subject", 3))


class AccessTests(SynchronousTestCase):
    def test_open(self) -> None:
        """Without a password file the API is open, every caller a monitor."""
        access = HttpAccess.from_settings(Settings(), None, Clock())
        self.assertFalse(access.secured)
        caller = access.authenticate(None, "peer")
        self.assertEqual((caller.user, caller.role) if caller else None, (None, "monitor"))

    def test_passwordsWithoutAccessControl(self) -> None:
        """A password file with no access control (NULL endpoints) is read once, all monitors."""
        passwords = Path(self.mktemp())
        passwords.write_text("carol = secret\n")
        settings = Settings(endpoints=("null:tcp://127.0.0.1:*",), passwords=passwords)
        access = HttpAccess.from_settings(settings, None, Clock())
        token = b"Basic " + base64.b64encode(b"carol:secret")
        caller = access.authenticate(token, "peer")
        self.assertEqual((caller.user, caller.role) if caller else None, ("carol", "monitor"))
        self.assertIsNone(access.authenticate(b"Basic " + base64.b64encode(b"carol:x"), "peer"))


class SystemTests(SynchronousTestCase):
    skip = skip_slow

    def test_brokerProcess(self) -> None:
        """A broker started with C{--http} serves the API, the metrics, readiness and the page."""
        broker = BrokerProcess(
            Path(self.mktemp()),
            bind=ANY_TCP_PORT,
            journal=False,
            args=["--http", "tcp:0:interface=127.0.0.1"],
        )
        with broker:
            url = broker.http_url
            self.assertRegex(url, r"^http://127\.0\.0\.1:\d+/$")
            with urllib.request.urlopen(url + "api/overview", timeout=10) as answer:
                overview = json.load(answer)
            self.assertEqual(SCHEMA["overview"] - set(overview), set())
            self.assertEqual(overview["endpoints"], [broker.endpoint])
            with urllib.request.urlopen(url + "readyz", timeout=10) as answer:
                self.assertEqual(answer.status, 200)
            with urllib.request.urlopen(url, timeout=10) as answer:
                self.assertEqual(answer.headers.get_content_type(), "text/html")
            with urllib.request.urlopen(url + "metrics", timeout=10) as answer:
                names = {f.name for f in text_string_to_metric_families(answer.read().decode())}
            self.assertIn("malamute_stream_messages", names)
            request = urllib.request.Request(
                url + "api/mailboxes/x/purge",
                data=b'{"confirm": true}',
                headers=JSON,
                method="POST",
            )
            with self.assertRaises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            self.assertEqual(refused.exception.code, 403)
            refused.exception.close()

    def test_securedBrokerProcess(self) -> None:
        """
        A broker with a password file and roles in its access-control file
        (wired by the tap, reloaded by its security service) asks for
        credentials, refuses a monitor's purge and does an admin's: the
        letter a PLAIN client left in a mailbox is gone.
        """
        directory = Path(self.mktemp()).resolve()
        directory.mkdir()
        (directory / "passwords").write_text(PASSWORDS)
        (directory / "acl").write_text(ACL)
        broker = BrokerProcess(
            directory / "broker",
            bind=ANY_TCP_PORT,
            journal=False,
            plain=("alice", "wonderland"),
            args=[
                "--passwords",
                str(directory / "passwords"),
                "--acl",
                str(directory / "acl"),
                "--http",
                "tcp:0:interface=127.0.0.1",
            ],
        )
        with broker:
            url = broker.http_url
            self.assertEqual(http_code(url + "api/overview"), 401)
            self.assertEqual(http_code(url + "healthz"), 200)
            self.assertEqual(http_code(url + "api/overview", SecuredApiTests.BOB), 200)
            with mlm_client(broker.endpoint, SecuredApiTests.ALICE, "inbox"):
                pass
            with mlm_client(broker.endpoint, SecuredApiTests.BOB, "") as bob:
                bob.send_multipart(mlm.encode(mlm.MailboxSend("inbox", "hi", "", 0, [b"x"])))
                for _ in range(500):
                    mailboxes = json.loads(http_body(url + "api/mailboxes", SecuredApiTests.BOB))
                    if mailboxes:
                        break
                    time.sleep(0.01)
            self.assertEqual([(m["address"], m["depth"]) for m in mailboxes], [("inbox", 1)])
            purge = url + "api/mailboxes/inbox/purge"
            self.assertEqual(http_code(purge, SecuredApiTests.BOB, {"confirm": True}), 403)
            self.assertEqual(http_code(purge, SecuredApiTests.ALICE, {"confirm": True}), 200)
            mailboxes = json.loads(http_body(url + "api/mailboxes", SecuredApiTests.ALICE))
            self.assertEqual([m["depth"] for m in mailboxes], [0] if mailboxes else [])


def _request(url: str, user: tuple[str, str] | None, body: Any) -> urllib.request.Request:
    headers = dict(JSON) if body is not None else {}
    if user is not None:
        token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
        headers["authorization"] = f"Basic {token}"
    data = None if body is None else json.dumps(body).encode()
    return urllib.request.Request(url, data=data, headers=headers)


def http_code(url: str, user: tuple[str, str] | None = None, body: Any = None) -> int:
    """The status of a GET (or, with a body, a POST) of C{url}, from this thread."""
    try:
        with urllib.request.urlopen(_request(url, user, body), timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        e.close()
        return e.code


def http_body(url: str, user: tuple[str, str] | None = None) -> bytes:
    """The body of a GET of C{url} that must succeed."""
    with urllib.request.urlopen(_request(url, user, None), timeout=10) as answer:
        data: bytes = answer.read()
        return data


@contextlib.contextmanager
def mlm_client(endpoint: str, user: tuple[str, str], address: str) -> Iterator[zmq.Socket[bytes]]:
    """A raw MLM connection as C{user} (PLAIN) under C{address}, closed on exit."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    client = context.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 1000)
    client.setsockopt_string(zmq.PLAIN_USERNAME, user[0])
    client.setsockopt_string(zmq.PLAIN_PASSWORD, user[1])
    client.connect(endpoint)
    try:
        client.send_multipart(mlm.encode(mlm.ConnectionOpen(address=address)))
        assert client.poll(10_000), "no answer to CONNECTION_OPEN"
        assert mlm.decode(client.recv_multipart()) == mlm.Ok()
        yield client
        client.send_multipart(mlm.encode(mlm.ConnectionClose()))
        assert client.poll(10_000), "no answer to CONNECTION_CLOSE"
        client.recv_multipart()
    finally:
        client.close()
        context.term()
