"""
The management API over HTTP: a small fixed tree of C{twisted.web}
resources over the broker's L{Statistics} and L{Admin}.

Routes (L{make_site}): C{GET /api/SECTION} for each of L{SECTIONS}
(JSON), C{GET /metrics} (Prometheus text, L{malamute_pack.ops.metrics}),
C{GET /healthz} and C{GET /readyz} (for supervisors; never
authenticated), C{GET /} the dashboard page and C{GET /dashboard/FILE}
its static files (C{malamute_pack/ops/dashboard/}), and the admin
actions, C{POST /api/mailboxes/NAME/purge}, C{/api/services/NAME/purge},
C{/api/streams/NAME/delete}, C{/api/streams/NAME/retention},
C{/api/streams/NAME/compact} (C{"compact": "subject"} or C{""}) and
C{/api/clients/ID/disconnect}, each with a JSON body that must say
C{"confirm": true} (else 400 saying what it would do).

Who may do what (L{HttpAccess}): without a password file every GET is
open (the monitor role) and every admin action refused (403). With one,
every request but C{/healthz} and C{/readyz} needs HTTP basic
credentials from the broker's password file (401 with a challenge
otherwise); the user's role (C{monitor} by default, C{admin}) comes from
the access-control file's C{role} lines. Both tables are read at each
request, so a SIGHUP reload applies to the next one. Refused logins are
counted and logged a few lines a second at most.

Bad requests are answered, never raised into the reactor: bodies are
bounded (L{MAX_BODY}), bad JSON is a 400, an unknown route a 404, and
errors are JSON C{{"error": "..."}}.

Tests: ``tests/system/test_ops_http.py``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web import http, resource, server, static
from twisted.web.error import UnsupportedMethod

from malamute_pack.broker.access import ADMIN, MONITOR, AccessControl, AccessPolicy
from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.ops.admin import Admin, AdminError
from malamute_pack.ops.config import OpsView
from malamute_pack.ops.metrics import CONTENT_TYPE, MetricsRenderer
from malamute_pack.ops.stats import SECTIONS, Statistics
from malamute_pack.text import plural
from malamute_pack.transport.zap import check_plain, load_passwords

_log = Logger()

# The largest request body read; bigger ones are answered 413 (and their
# excess never kept), and one far bigger closes the connection.
MAX_BODY: Final = 64 * 1024
_ABORT_BODY: Final = 16 * MAX_BODY
# Idle HTTP connections are closed after this many seconds.
IDLE_TIMEOUT: Final = 60
REALM: Final = "malamute"
DASHBOARD: Final = Path(__file__).resolve().parent / "dashboard"
NO_ADMIN_WITHOUT_PASSWORDS: Final = (
    "admin actions need --passwords and an admin role in the ACL file"
)
_JSON: Final = b"application/json"
_EMPTY_POLICY: Final = AccessPolicy()


# What purging each kind of queue does, and what it holds.
_QUEUES: Final = {
    "mailboxes": ("remove every letter waiting in the mailbox {name!r}", "letter"),
    "services": ("remove every request queued for the service {name!r}", "request"),
}


class _Request(Protocol):
    """What this module uses of a C{twisted.web} request (whose own methods are untyped)."""

    method: bytes
    path: bytes
    postpath: list[bytes]
    content: IO[bytes] | None

    def setResponseCode(self, code: int) -> None: ...

    def setHeader(self, name: bytes, value: bytes) -> None: ...

    def getHeader(self, key: bytes) -> bytes | None: ...

    def getClientAddress(self) -> object: ...


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: the user (None without authentication) and its role."""

    user: str | None
    role: str


class HttpAccess:
    """
    The management API's authentication and roles.

    @param passwords: the password table in force (read at each request),
        or None for an API open to all as monitors.
    @param policy: the access-control rules in force, whose C{role} lines
        give the roles (read at each request).
    @ivar logins_refused: requests with credentials that were wrong.
    """

    def __init__(
        self,
        passwords: Callable[[], Mapping[str, str] | None] | None,
        policy: Callable[[], AccessPolicy] = lambda: _EMPTY_POLICY,
        clock: IReactorTime | None = None,
    ) -> None:
        if clock is None:
            from twisted.internet import reactor

            clock = reactor
        assert clock is not None
        self._passwords = passwords
        self._policy = policy
        self._log_limit = LogLimit(clock, _log)
        self.logins_refused = 0

    @classmethod
    def from_settings(
        cls,
        settings: OpsView,
        access_control: AccessControl | None,
        clock: IReactorTime | None = None,
    ) -> HttpAccess:
        """
        The API's access for a broker of C{settings}: open without a
        password file; else the password table and the roles that
        C{access_control} holds (the security service reloads them on
        SIGHUP). A broker whose endpoints do not use PLAIN has no table
        there: the file is read once, here.

        @raise malamute_pack.transport.zap.PasswordFileError: if it must
            be read here and cannot be.
        """
        if settings.passwords is None:
            return cls(None, clock=clock)
        if access_control is None:
            table = load_passwords(settings.passwords)
            return cls(lambda: table, clock=clock)
        control = access_control
        if control.passwords is None:
            fixed = load_passwords(settings.passwords)
            return cls(
                lambda: control.passwords if control.passwords is not None else fixed,
                lambda: control.policy,
                clock,
            )
        return cls(lambda: control.passwords, lambda: control.policy, clock)

    @property
    def secured(self) -> bool:
        """Whether requests must authenticate."""
        return self._passwords is not None

    def authenticate(self, authorization: bytes | None, peer: str) -> Caller | None:
        """
        The caller that the C{Authorization} header names, or None if it
        must authenticate (no header, or a wrong one: counted and logged).
        """
        if self._passwords is None:
            return Caller(None, MONITOR)
        if authorization is None:
            return None
        scheme, _, encoded = authorization.strip().partition(b" ")
        user = b""
        if scheme.lower() == b"basic":
            try:
                user, colon, password = base64.b64decode(encoded.strip(), validate=True).partition(
                    b":"
                )
            except (binascii.Error, ValueError):
                colon = b""
            passwords = self._passwords() or {}
            if colon and check_plain(passwords, user, password):
                name = user.decode("utf-8")
                return Caller(name, self._policy().role(name))
        self.logins_refused += 1
        self._log_limit.info(
            "HTTP login refused",
            "management API: login refused for user {user!r} from {peer}",
            user=user.decode("utf-8", "replace"),
            peer=peer,
        )
        return None


def _finite(value: Any) -> Any:
    """C{value} with every infinite or NaN float made None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _json(request: _Request, code: int, value: Any) -> bytes:
    """Answer C{request} with C{code} and C{value} as JSON; the body."""
    try:
        body = json.dumps(value, allow_nan=False, default=str)
    except ValueError:
        body = json.dumps(_finite(value), allow_nan=False, default=str)
    request.setResponseCode(code)
    request.setHeader(b"content-type", _JSON)
    request.setHeader(b"cache-control", b"no-store")
    return body.encode("utf-8") + b"\n"


def _text(request: _Request, code: int, text: str, content_type: bytes = b"text/plain") -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", content_type + b"; charset=utf-8")
    request.setHeader(b"cache-control", b"no-store")
    return text.encode("utf-8") + b"\n"


class _Error(resource.Resource):
    """A JSON error for any method (and, for 401, the basic challenge)."""

    isLeaf = True

    def __init__(self, code: int, message: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._code = code
        self._message = message

    def render(self, request: _Request) -> bytes:
        if self._code == http.UNAUTHORIZED:
            request.setHeader(b"www-authenticate", f'Basic realm="{REALM}"'.encode())
        return _json(request, self._code, {"error": self._message})


class _Leaf(resource.Resource):
    """
    A route with no children whose failures are JSON answers: an
    unsupported method a 405, a L{_BadRequest} its code, anything else a
    logged 500 (never a traceback page, never an error into the reactor).
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    def render(self, request: _Request) -> bytes:
        try:
            return super().render(request)  # type: ignore[no-any-return,no-untyped-call]
        except UnsupportedMethod as e:
            allowed = b", ".join(e.allowedMethods)
            request.setHeader(b"allow", allowed)
            return _json(
                request, http.NOT_ALLOWED, {"error": f"method not allowed: use {allowed.decode()}"}
            )
        except _BadRequest as e:
            return _json(request, e.code, {"error": e.message, **e.more})
        except Exception as e:
            _log.failure(
                "management API: {method} {path} failed", method=request.method, path=request.path
            )
            return _json(request, http.INTERNAL_SERVER_ERROR, {"error": f"internal error: {e}"})


class _Health(_Leaf):
    """C{/healthz}: the reactor runs, or nobody would answer."""

    def render_GET(self, request: _Request) -> bytes:
        return _text(request, http.OK, "ok")


class _Ready(_Leaf):
    """C{/readyz}: 200 while the broker serves, else 503 with the reason."""

    def __init__(self, ready: Callable[[], str | None]) -> None:
        super().__init__()
        self._ready = ready

    def render_GET(self, request: _Request) -> bytes:
        try:
            reason = self._ready()
        except Exception as e:
            _log.failure("readiness check failed")
            reason = f"readiness check failed: {e}"
        if reason is None:
            return _text(request, http.OK, "ready")
        return _text(request, http.SERVICE_UNAVAILABLE, f"not ready: {reason}")


class _Metrics(_Leaf):
    """C{/metrics}: the Prometheus text format."""

    def __init__(self, renderer: MetricsRenderer) -> None:
        super().__init__()
        self._renderer = renderer

    def render_GET(self, request: _Request) -> bytes:
        body = self._renderer.render()
        request.setHeader(b"content-type", CONTENT_TYPE.encode())
        request.setHeader(b"cache-control", b"no-store")
        return body


class _Static(static.File):
    """The dashboard's files: no directory listings, JSON 404s."""

    def directoryListing(self) -> resource.Resource:
        return _Error(http.NOT_FOUND, "not found")

    childNotFound = _Error(http.NOT_FOUND, "not found")  # type: ignore[assignment]


# Admin actions: POST /api/COLLECTION/NAME/ACTION.
_ACTIONS: Final = frozenset(
    {
        ("mailboxes", "purge"),
        ("services", "purge"),
        ("streams", "delete"),
        ("streams", "retention"),
        ("streams", "compact"),
        ("clients", "disconnect"),
    }
)
_RETENTION_KEYS: Final = ("max_age_s", "max_bytes", "max_records")
# What each action's body may say besides "confirm".
_BODY_KEYS: Final = {"retention": _RETENTION_KEYS, "compact": ("compact",)}


class _BadRequest(Exception):
    """A request the API answers with C{code} and C{message}."""

    def __init__(self, code: int, message: str, **more: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.more = more


class _Api(_Leaf):
    """C{/api/...}: the sections (GET) and the admin actions (POST), for one caller."""

    def __init__(self, statistics: Statistics, admin: Admin, caller: Caller) -> None:
        super().__init__()
        self._statistics = statistics
        self._admin = admin
        self._caller = caller

    def _path(self, request: _Request) -> list[str]:
        try:
            return [p.decode("utf-8") for p in request.postpath]
        except UnicodeDecodeError:
            raise _BadRequest(http.BAD_REQUEST, "the path is not UTF-8") from None

    def render_GET(self, request: _Request) -> bytes:
        path = self._path(request)
        if path in ([], [""]):
            return _json(request, http.OK, {"sections": list(SECTIONS)})
        if len(path) == 1 and path[0] in SECTIONS:
            return _json(request, http.OK, self._statistics.section(path[0]))
        if len(path) == 3 and (path[0], path[2]) in _ACTIONS:
            request.setHeader(b"allow", b"POST")
            raise _BadRequest(http.NOT_ALLOWED, "admin actions are POSTs")
        raise _BadRequest(http.NOT_FOUND, f"no such API route: /api/{'/'.join(path)}")

    def render_POST(self, request: _Request) -> bytes:
        path = self._path(request)
        if len(path) != 3 or (path[0], path[2]) not in _ACTIONS or not path[1]:
            raise _BadRequest(http.NOT_FOUND, f"no such admin action: /api/{'/'.join(path)}")
        collection, name, action = path
        if self._caller.user is None:
            raise _BadRequest(http.FORBIDDEN, NO_ADMIN_WITHOUT_PASSWORDS)
        if self._caller.role != ADMIN:
            raise _BadRequest(
                http.FORBIDDEN,
                f"user {self._caller.user!r} has the {self._caller.role} role; admin actions"
                f" need the admin role ('{self._caller.user} role: admin' in the ACL file)",
            )
        body = _body(request)
        retention = _retention(body) if action == "retention" else {}
        unknown = set(body) - {"confirm", *_BODY_KEYS.get(action, ())}
        if unknown:
            raise _BadRequest(http.BAD_REQUEST, f"unknown key {sorted(unknown)[0]!r} in the body")
        compact = _compact(body) if action == "compact" else ""
        if body.get("confirm") is not True:
            raise _BadRequest(
                http.BAD_REQUEST,
                'not done: say {"confirm": true} to do it',
                would=self._describe(collection, name, action, retention, compact),
            )
        try:
            done = self._do(collection, name, action, retention, compact)
        except AdminError as e:
            # Admin says "no mailbox 'x'" (and so on) for a name it does not know.
            code = http.NOT_FOUND if str(e).startswith("no ") else http.BAD_REQUEST
            raise _BadRequest(code, str(e)) from None
        _log.info(
            "management API: user {user!r} did {action} on {collection} {name!r}: {done}",
            user=self._caller.user,
            action=action,
            collection=collection,
            name=name,
            done=done,
        )
        return _json(request, http.OK, {"done": action, "target": name, **done})

    def _do(
        self,
        collection: str,
        name: str,
        action: str,
        retention: dict[str, float | int | None],
        compact: str,
    ) -> dict[str, Any]:
        admin = self._admin
        if collection == "mailboxes":
            return admin.purge_mailbox(name)
        if collection == "services":
            return admin.purge_service(name)
        if collection == "clients":
            return admin.disconnect(name)
        if action == "delete":
            return admin.delete_stream(name)
        if action == "compact":
            return admin.set_compaction(name, compact)
        max_age = retention.get("max_age_s")
        max_bytes = retention.get("max_bytes")
        max_records = retention.get("max_records")
        return admin.set_retention(
            name,
            None if max_age is None else float(max_age),
            None if max_bytes is None else int(max_bytes),
            None if max_records is None else int(max_records),
        )

    def _describe(
        self,
        collection: str,
        name: str,
        action: str,
        retention: dict[str, float | int | None],
        compact: str,
    ) -> str:
        """What the action would do, with the target's current figures if it is listed."""
        entry = self._find(collection, name)
        if collection in _QUEUES:
            what, item = _QUEUES[collection]
            what = what.format(name=name)
            if entry is not None:
                what += f" ({plural(entry['depth'], item)}, {plural(entry['bytes'], 'byte')})"
            return what
        if collection == "clients":
            what = f"disconnect the client {name!r}"
            if entry is not None:
                what += f" (address {entry.get('address')!r}, user {entry.get('user')!r})"
            return what
        if action == "delete":
            what = f"delete the retained records of the stream {name!r}"
            if entry is not None:
                what += (
                    f" ({entry.get('retained_records')} records,"
                    f" {entry.get('retained_bytes')} bytes)"
                )
            return what
        if action == "compact":
            if compact:
                return (
                    f"make the stream {name!r} a last-value stream (keep each subject's latest"
                    " record), until the broker restarts"
                )
            return f"make the stream {name!r} not compacted (forget its last values)"
        limits = ", ".join(f"{k} = {json.dumps(retention.get(k))}" for k in _RETENTION_KEYS)
        return f"set the retention of the stream {name!r} to {limits} (null: as it is; 0: no limit)"

    def _find(self, collection: str, name: str) -> Mapping[str, Any] | None:
        key = {"mailboxes": "address", "clients": "id"}.get(collection, "name")
        for entry in self._statistics.section(collection):
            if str(entry.get(key)) == name or (
                collection == "clients" and entry.get("address") == name
            ):
                return entry  # type: ignore[no-any-return]
        return None


def _body(request: _Request) -> dict[str, Any]:
    """The request's body as a JSON object ({} if empty)."""
    if getattr(request, "too_large", False):
        raise _BadRequest(http.REQUEST_ENTITY_TOO_LARGE, f"the body is over {MAX_BODY} bytes")
    content_type = (request.getHeader(b"content-type") or b"").split(b";")[0].strip().lower()
    assert request.content is not None
    request.content.seek(0)
    raw = request.content.read(MAX_BODY + 1)
    if not raw.strip():
        return {}
    # Only JSON, which a cross-site form cannot send without asking first.
    if content_type != _JSON:
        raise _BadRequest(
            http.UNSUPPORTED_MEDIA_TYPE, "admin actions take a JSON body (application/json)"
        )
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise _BadRequest(http.BAD_REQUEST, f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise _BadRequest(http.BAD_REQUEST, "the body must be a JSON object")
    return body


def _compact(body: Mapping[str, Any]) -> str:
    """The compaction a body gives: C{"subject"} or C{""} (not compacted)."""
    value = body.get("compact")
    if value not in ("subject", ""):
        raise _BadRequest(
            http.BAD_REQUEST,
            f'compact must be "subject" (a last-value stream) or "" (not compacted): {value!r}',
        )
    return str(value)


def _retention(body: Mapping[str, Any]) -> dict[str, float | int | None]:
    """The retention limits a body gives, checked (absent or null: left as it is; 0: none)."""
    limits: dict[str, float | int | None] = {}
    for key in _RETENTION_KEYS:
        value = body.get(key)
        if value is None:
            limits[key] = None
            continue
        whole = key != "max_age_s"
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (whole and not isinstance(value, int))
            or not math.isfinite(value)
            or value < 0
        ):
            kind = "a whole number" if whole else "a number"
            raise _BadRequest(
                http.BAD_REQUEST, f"{key} must be {kind} of at least 0, or null: {value!r}"
            )
        limits[key] = value
    return limits


class _Root(resource.Resource):
    """The tree's root: authenticates, then hands each route its resource."""

    def __init__(
        self,
        statistics: Statistics,
        admin: Admin,
        access: HttpAccess,
        ready: Callable[[], str | None],
        dashboard: Path,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._statistics = statistics
        self._admin = admin
        self._access = access
        self._health = _Health()
        self._ready = _Ready(ready)
        self._metrics = _Metrics(MetricsRenderer(statistics, lambda: access.logins_refused))
        self._index = _Static(str(dashboard / "index.html"))
        self._files = _Static(str(dashboard))

    def getChildWithDefault(self, path: bytes, request: _Request) -> resource.Resource:
        # Never framed by another site (no clicking an admin action through
        # a page on top), never sniffed as another type.
        request.setHeader(b"x-frame-options", b"DENY")
        request.setHeader(b"x-content-type-options", b"nosniff")
        if path == b"healthz":
            return self._health
        if path == b"readyz":
            return self._ready
        peer = request.getClientAddress()
        caller = self._access.authenticate(
            request.getHeader(b"authorization"), str(getattr(peer, "host", peer))
        )
        if caller is None:
            return _Error(
                http.UNAUTHORIZED, "authentication required: the broker's user and password"
            )
        if path == b"api":
            return _Api(self._statistics, self._admin, caller)
        if path == b"metrics":
            return self._metrics
        if path == b"dashboard":
            return self._files
        if path in (b"", b"index.html"):
            return self._index
        return _Error(http.NOT_FOUND, "not found")


class _BoundedRequest(server.Request):
    """A request whose body is kept only up to L{MAX_BODY} bytes."""

    too_large = False
    _received = 0

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > _ABORT_BODY:
            self.too_large = True
            self._abort()
        super().gotLength(  # type: ignore[no-untyped-call]
            MAX_BODY + 1 if length is None else min(length, MAX_BODY + 1)
        )

    def handleContentChunk(self, data: bytes) -> None:
        self._received += len(data)
        if self._received > _ABORT_BODY:
            self._abort()
        if self._received > MAX_BODY:
            self.too_large = True
            return
        super().handleContentChunk(data)  # type: ignore[no-untyped-call]

    def _abort(self) -> None:
        """Close the connection: a body this big is not worth reading to answer it."""
        transport = self.channel.transport if self.channel is not None else None
        if transport is not None:
            transport.loseConnection()


class ManagementSite(server.Site):
    """The API's site: no traceback pages, no per-request log lines."""

    displayTracebacks = False
    noisy = False

    def log(self, request: http.Request) -> None:
        # A dashboard polls every few seconds: an access log would drown the broker's.
        pass


def make_site(
    statistics: Statistics,
    admin: Admin,
    access: HttpAccess,
    ready: Callable[[], str | None],
    dashboard: Path = DASHBOARD,
) -> server.Site:
    """
    The management API's site, to listen with any stream endpoint.

    @param ready: None while the broker serves, else why it does not (for
        C{/readyz}).
    @param dashboard: the dashboard's directory (its C{index.html} is C{/}).
    """
    root = _Root(statistics, admin, access, ready, dashboard)
    site = ManagementSite(root, timeout=IDLE_TIMEOUT)  # type: ignore[no-untyped-call]
    site.requestFactory = _BoundedRequest
    return site
