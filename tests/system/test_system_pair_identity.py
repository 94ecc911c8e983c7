"""
System test of identities across a pair's fail-over: two real brokers
(``--pair``, the primary on h1, the backup on h2, network namespaces, the
pair link on a LAN of its own) whose clients authenticate with PLAIN
(``--passwords``) under an access file (``--acl``), and clients on h3 (the
project's BlockingClient and BulkClient, with both endpoints, the
primary's first). What the active decided must hold on the new active
after a kill -9: the owner of an address (claimed on the active), the
access rules reloaded on the active with SIGHUP (the backup's own file is
never changed), and a stream deleted on the active through the management
API (C{--http}).

Needs root and iproute2 (skipped otherwise), and is slow
(C{MALAMUTE_SKIP_SLOW=1} skips it). Support: ``tests/pair_system_support.py``.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

from malamute_pack.broker.access import NOT_ALLOWED
from malamute_pack.testing.brokerprocess import run_python
from tests.pair_system_support import (
    ACTIVE,
    CAUGHT_UP,
    CLIENT_SUBNET,
    IN_SYNC,
    TAKING_OVER,
    PairCase,
    Record,
)

PASSWORDS = "alice = wonderland\nbob = builder\nadmin = keeper\n"
RULES = "alice write: prices gone\nbob write: prices\nadmin role: admin\n"
# What the active's file says after the reload: bob may no longer write.
REVOKED = "alice write: prices gone\nadmin role: admin\n"
HTTP_PORT = 8180
# What a broker logs (malamute_pack/transport/security.py, pair/service.py).
RELOADED = "security files reloaded"
INSTALLED = "pair: the active's client security is in force here"
DELETED = "admin: stream 'gone' deleted through"


# The client programs (run on h3, one job each, answering one JSON line).


def _password(user: str) -> str:
    return dict(line.split(" = ") for line in PASSWORDS.splitlines())[user]


def _open(job: Record) -> Record:
    """Open C{address} as C{user}; with C{stream}, become its producer and write C{count}."""
    from malamute_pack.client.blocking import BlockingClient
    from malamute_pack.client.errors import ClientError, MalamuteError

    user = job["user"]
    try:
        client = BlockingClient(
            job["endpoints"], job["address"], plain=(user, _password(user)), timeout=10.0
        )
    except MalamuteError as e:
        return {"code": e.code, "reason": e.reason}
    except ClientError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    answer: Record = {"ok": True, "at": client.endpoint}
    try:
        if job.get("stream"):
            client.set_producer(job["stream"])
            for n in range(job.get("count", 0)):
                client.send(f"{job['stream']}-{n}", [b"x"])
        if job.get("letter"):
            # STORED in sync replication: on both brokers, and everything before it.
            answer["stored"] = client.sendto(job["address"], "barrier", [b""])
    except MalamuteError as e:
        answer = {"code": e.code, "reason": e.reason}
    client.close()  # after what was sent: the broker has it all once it answers
    return answer


def _status(job: Record) -> Record:
    """The first and last sequence numbers of C{stream}, and its records read from the first."""
    from malamute_pack.client.bulk import BulkClient, RangeChunk
    from malamute_pack.client.options import ClientOptions

    user = job["user"]
    options = ClientOptions(plain=(user, _password(user)))
    with BulkClient(job["endpoints"], options=options, timeout=10.0, retries=4) as client:
        status = client.status(job["stream"])
        subjects: list[str] = []
        if status.last >= status.first:
            for item in client.read_range(job["stream"], status.first, status.last):
                if isinstance(item, RangeChunk):
                    subjects += item.subject
        return {"first": status.first, "last": status.last, "subjects": subjects}


def _post(job: Record) -> Record:
    """POST C{body} (JSON) to C{url} with basic authentication as C{user}."""
    user = job["user"]
    token = base64.b64encode(f"{user}:{_password(user)}".encode()).decode()
    request = urllib.request.Request(
        job["url"],
        data=json.dumps(job["body"]).encode(),
        headers={"content-type": "application/json", "authorization": f"Basic {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return {"status": answer.status, "body": json.loads(answer.read())}
    except urllib.error.HTTPError as e:
        with e:
            return {"status": e.code, "body": e.read().decode(errors="replace")}


_JOBS = {"open": _open, "status": _status, "post": _post}


def client_main() -> None:
    """Run the job given as JSON in C{sys.argv[1]}: one line of JSON, its answer."""
    job = json.loads(sys.argv[1])
    sys.stdout.write(json.dumps(_JOBS[job["kind"]](job)) + "\n")


_CLIENT = "from tests.system.test_system_pair_identity import client_main; client_main()"


class PairIdentityTests(PairCase):
    """The identities the active decided, on the new active after its kill."""

    PREFIXES: ClassVar[dict[str, str]] = {"test_identityFollowsFailover": "mpid"}

    def setUp(self) -> None:
        super().setUp()
        self.rules: list[Path] = []
        for index, broker in enumerate(self.brokers, start=1):
            passwords, rules = broker.directory / "passwords", broker.directory / "acl"
            broker.directory.mkdir(parents=True, exist_ok=True)
            passwords.write_text(PASSWORDS)
            rules.write_text(RULES)
            self.rules.append(rules)
            http = f"tcp:{HTTP_PORT}:interface={CLIENT_SUBNET}.{index}"
            broker.args += ("--passwords", str(passwords), "--acl", str(rules), "--http", http)

    def job(self, kind: str, **job: Any) -> Record:
        """Run a client job on h3; its answer."""
        done = run_python(
            self.lan.hosts[2].name, "-c", _CLIENT, json.dumps({"kind": kind, **job}), timeout=90
        )
        self.assertEqual(done.returncode, 0, f"{kind} {job}: {done.stderr}\n{self.logs()}")
        answer: Record = json.loads(done.stdout.strip().splitlines()[-1])
        return answer

    def open(self, user: str, address: str, **more: Any) -> Record:
        return self.job("open", endpoints=self.both, user=user, address=address, **more)

    def assertRefused(self, answer: Record, what: str) -> None:
        self.assertEqual(answer.get("code"), NOT_ALLOWED, f"{what}: {answer}\n{self.logs()}")

    def test_identityFollowsFailover(self) -> None:
        """
        On the active h1: alice opens the address alice and leaves; bob
        may write to prices; alice writes five records to the stream gone,
        which an admin deletes through h1's management API; h1's access
        file is changed (bob loses write on prices) and h1 gets SIGHUP
        (h2's file stays as it was); a letter STORED afterwards (sync
        replication) shows that h2 has it all. h1 is killed (-9): bob's
        OPEN of alice, the request that makes h2 take over, gets ERROR
        403, while alice opens it; bob's STREAM_WRITE to prices is 403
        and alice's is not; the stream gone has no records on h2.
        """
        self.start_pair()
        self.assertEqual(self.open("alice", "alice").get("ok"), True)
        self.assertEqual(self.open("bob", "bob", stream="prices").get("ok"), True)
        written = self.open("alice", "alice", stream="gone", count=5)
        self.assertEqual(written.get("ok"), True, written)
        url = f"http://{CLIENT_SUBNET}.1:{HTTP_PORT}/api/streams/gone/delete"
        deleted = self.job("post", url=url, user="admin", body={"confirm": True})
        self.assertEqual(deleted["status"], 200, deleted)
        self.assertEqual(deleted["body"]["deleted_through"], 5, deleted)
        self.rules[0].write_text(REVOKED)
        os.kill(self.broker(1).pid, signal.SIGHUP)
        self.wait_logs([(1, RELOADED), (1, DELETED), (2, INSTALLED, 2)], 20.0, "no reload")
        barrier = self.open("alice", "alice", letter=True)
        self.assertIn("stored", barrier, barrier)
        self.assertEqual(self.rules[1].read_text(), RULES)

        self.broker(1).kill()
        self.assertRefused(self.open("bob", "alice"), "bob opened alice on the new active")
        self.wait_logs([(2, TAKING_OVER), (2, ACTIVE)], 20.0, "h2 did not take over")
        self.assertEqual(self.open("alice", "alice").get("at"), self.endpoint(2))
        self.assertRefused(self.open("bob", "bob", stream="prices"), "bob wrote to prices")
        self.assertEqual(self.open("alice", "alice", stream="prices").get("ok"), True)
        gone = self.job("status", endpoints=[self.endpoint(2)], user="alice", stream="gone")
        self.assertEqual(gone["subjects"], [], gone)
        self.assertGreater(gone["first"], gone["last"], gone)
        log = self.broker(2).run_log()
        self.assertNotIn("wonderland", log)
        self.assertIn(CAUGHT_UP, log)
        self.assertIn(IN_SYNC, self.broker(1).run_log())
