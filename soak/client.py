"""
The soak's client program: one process per job, run inside a host's
network namespace (``python -m soak.client JOB``, the job as JSON), using
the project's clients (L{malamute_pack.client.bulk.BulkClient},
L{malamute_pack.client.blocking.BlockingClient}) and writing one history
line per event (L{soak.history}) to the job's C{out} file.

Jobs (C{kind}), what they do and the C{f} of their events:

- C{append}: idempotent appends of 1 to C{records} records to C{stream},
  each under a new key, one after the other (C{append}); a key not
  acknowledged (refused, or no answer) is tried again, as a fresh
  operation with the same key, until it is: its records are never
  overtaken by the next key's, so each subject's records are in the order
  written. Value: C{store}, C{stream}, C{key}, C{records} ([id, subject]);
  ok: C{first}, C{last}, C{dup} (208), C{at} (the endpoint).
- C{send} / C{request}: a letter to the mailbox C{to} / a request to the
  service C{to}, one at a time, each waiting for its STORED (C{send},
  C{request}). Value: C{store}, C{to}, C{rid}, C{subject}, C{via} (the
  stores that may hold it); ok: C{id}.
- C{mailbox} / C{worker}: the owner of a mailbox / a worker of a
  service: each delivery is an observation (C{letter}, C{served}) with
  C{id}, C{subject} and C{body} (DONE is sent as it is handed over).
- C{consumer}: a durable named reader of C{stream} (resumed from its
  position): each record is an observation (C{consumed}: C{seq},
  C{subject}, C{body}, C{epoch}); every C{commit_every} records, or half
  a second, it commits the last one (C{commit}: C{seq}; ok: C{position}).
- C{member}: a member of a consumer group: each record is an observation
  (C{member}) and is committed at once (C{commit}: C{seq}, C{rid};
  ok: C{position}).
- C{final}: the final reads: every stream of every store, read whole with
  a range read (C{final-read}: ok with C{rows} [seq, subject, body] and
  C{gaps} [missed, available], or fail with the broker's C{code}, or
  info).

A STREAM_GAP a reader or member is sent (the broker saying it cannot
serve records C{missed} to C{available} - 1: retention, or a damaged
journal) is an observation too (C{gap}).

A client process that dies by itself (a crash in its own stack) is
started again by the runner with the same job and the next C{incarnation}:
it goes on from its history file (its op ids, keys and letter numbers
continue; an appender tries its last key again if it was not
acknowledged; a consumer or member comes back under the same name).

Every job ends when its C{stop} file appears (a load after the
operation under way and, for an append, once its key is acknowledged or
C{settle} seconds have passed; a reader at once, after what it already
has); the final reads end when done. Bodies are made and read by
L{soak.records}.

Tests: ``tests/system/test_soak.py``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.bulk import BulkClient, RangeChunk, RangeGap
from malamute_pack.client.errors import ClientError, MalamuteError
from malamute_pack.client.events import Gap
from malamute_pack.protocol import chunks, mlm
from soak.history import FAIL, INFO, INVOKE, OK, Recorder, op_number, resume
from soak.records import append_rid, body, text_of

Job = dict[str, Any]

# The clients' silence timeout and heartbeat (seconds): a broker stopped
# for longer is left, or tried again.
TIMEOUT: Final = 3.0
HEARTBEAT: Final = 1.0


def stopped(job: Job) -> bool:
    return os.path.exists(job["stop"])


def blocking(
    job: Job, address: str = "", on_gap: Callable[[Gap], object] | None = None
) -> BlockingClient:
    """A BlockingClient on the job's endpoints (raises if none answers in time)."""
    return BlockingClient(
        job["endpoints"],
        address,
        timeout=TIMEOUT,
        heartbeat=HEARTBEAT,
        max_held=100_000,
        on_gap=on_gap,
    )


def dropped(client: BlockingClient | None) -> None:
    """Close C{client} (its broker failed it) and wait a moment before a new one."""
    if client is not None:
        client.close()
    time.sleep(0.5)


def error_value(e: BaseException) -> dict[str, Any]:
    value: dict[str, Any] = {"error": f"{type(e).__name__}: {e}"[:300]}
    if isinstance(e, MalamuteError):
        value["code"] = e.code
    return value


def outcome(e: BaseException) -> str:
    """A refusal (the broker answered no) is a fail; anything else leaves the outcome unknown."""
    return FAIL if isinstance(e, MalamuteError) else INFO


def run_append(job: Job, history: Recorder) -> None:
    rng = random.Random(f"{job['seed']}-{job.get('incarnation', 0)}")
    process, stream, store = history.process, job["stream"], job["store"]
    client: BulkClient | None = None
    n = 0
    # A restarted appender goes on from its last key: the same key again if it
    # was never acknowledged (its records may be written), else the next.
    unfinished: list[tuple[str, str]] | None = None
    invokes = [e for e in job.get("before", []) if e.type == INVOKE and e.f == "append"]
    if invokes:
        last = invokes[-1]
        n = int(str(last.value["key"]).rsplit("-", 1)[1])
        acked = any(e.op == last.op and e.type == OK for e in job["before"])
        if not acked:
            n -= 1
            unfinished = [(str(r), str(s)) for r, s in last.value["records"]]
    while not stopped(job):
        n += 1
        key = f"{process}-{n:06d}"
        records = []
        if unfinished is not None:
            records, unfinished = unfinished, None
        for j in range(rng.randint(1, job["records"]) if not records else 0):
            subject = f"{process}.s{rng.randrange(job['subjects'])}"
            records.append((append_rid(process, n, j), subject))
        settle_until: float | None = None
        while True:
            if stopped(job):
                settle_until = settle_until or time.monotonic() + job["settle"]
                if time.monotonic() > settle_until:
                    break
            if client is None:
                try:
                    client = BulkClient(job["endpoints"], timeout=TIMEOUT, retries=2)
                except ClientError:
                    time.sleep(0.5)
                    continue
            op = history.invoke(
                "append",
                {"store": store, "stream": stream, "key": key, "records": records},
            )
            try:
                got = client.append(
                    stream, key, [(subject, [body(rid, subject)]) for rid, subject in records]
                )
            except ClientError as e:
                history.complete(op, outcome(e), "append", error_value(e))
                if not isinstance(e, MalamuteError):
                    client.close()
                    client = None
                time.sleep(0.3)
                continue
            history.complete(
                op,
                OK,
                "append",
                {"first": got.first, "last": got.last, "dup": got.duplicate, "at": client.endpoint},
            )
            break
        time.sleep(job["pause"])
    if client is not None:
        client.close()


def run_send(job: Job, history: Recorder) -> None:
    process, store = history.process, job["store"]
    f = "send" if job["kind"] == "send" else "request"
    client: BlockingClient | None = None
    # A restarted sender numbers on after what it sent before.
    sent = [e for e in job.get("before", []) if e.type == INVOKE and e.f == f]
    n = max((int(str(e.value["rid"]).rsplit(".", 1)[1]) for e in sent), default=0)
    while not stopped(job):
        if client is None:
            try:
                client = blocking(job, process)
            except ClientError:
                time.sleep(0.5)
                continue
        n += 1
        rid = f"{process}.{n}"
        subject = f"{f}.{n % 8}"
        send = client.sendto if f == "send" else client.sendfor
        before = (client.switches, client.reconnects)
        op = history.invoke(
            f, {"store": store, "to": job["to"], "rid": rid, "subject": subject, "via": job["via"]}
        )
        try:
            ident = send(job["to"], subject, [body(rid, subject)])
        except ClientError as e:
            history.complete(op, outcome(e), f, error_value(e))
            # Turn the client's loop meanwhile (not time.sleep): a one-endpoint
            # BlockingClient that lost its broker only reconnects while its
            # loop turns, and send calls alone never turn it (they raise at
            # once while it is disconnected).
            try:
                client.pause(0.5)
            except ClientError:
                client.close()
                client = None
            continue
        moved = (client.switches, client.reconnects) != before
        history.complete(op, OK, f, {"id": ident, "at": client.endpoint, "moved": moved})
        client.pause(job["pause"])
    if client is not None:
        client.close()


def epoch(client: BlockingClient, opened: int, incarnation: int = 0) -> str:
    """
    Which connection a delivery came on: the process's incarnation, its
    client, its reopenings and moves.
    """
    return f"{incarnation}.{opened}/{client.reconnects}/{client.switches}"


def run_receive(job: Job, history: Recorder) -> None:
    """A mailbox owner or a worker: every delivery is an observation."""
    process, store = history.process, job["store"]
    f = "letter" if job["kind"] == "mailbox" else "served"
    address = job["address"] if job["kind"] == "mailbox" else process
    client: BlockingClient | None = None
    while not stopped(job):
        try:
            if client is None:
                client = blocking(job, address)
                if job["kind"] == "worker":
                    client.set_worker(job["service"], ".*")
            delivery = client.recv(timeout=0.5)
        except ClientError:
            dropped(client)
            client = None
            continue
        if delivery is None:
            continue
        history.observe(
            f,
            {
                "store": store,
                "address": delivery.address,
                "id": delivery.id,
                "subject": delivery.subject,
                "body": text_of(delivery.content[0] if delivery.content else b""),
                "at": client.endpoint,
            },
        )
    if client is not None:
        client.close()


def commit(
    history: Recorder, client: BlockingClient, value: dict[str, Any], stream: str, seq: int
) -> None:
    op = history.invoke("commit", value)
    try:
        position = client.commit(stream, seq)
    except ClientError as e:
        history.complete(op, outcome(e), "commit", error_value(e))
        return
    history.complete(op, OK, "commit", {"position": position})


def run_consume(job: Job, history: Recorder) -> None:
    """A durable reader (C{consumer}) or a group member (C{member})."""
    process, store, stream = history.process, job["store"], job["stream"]
    member = job["kind"] == "member"
    name = job["name"]
    group = job.get("group", "") if member else ""
    client: BlockingClient | None = None
    opened = 0
    pending: int | None = None  # a reader's last record not yet committed
    uncommitted = 0
    last_commit = time.monotonic()
    base = {"store": store, "stream": stream, "consumer": name, "group": group}

    def gap(notice: Gap) -> None:
        # The broker says it cannot serve these (retention, or damage).
        history.observe(
            "gap", {**base, "member": name, "missed": notice.missed, "available": notice.available}
        )

    while not stopped(job):
        try:
            if client is None:
                client = blocking(job, process, gap)
                opened += 1
                client.consume(stream, "", name, group, mlm.RESUME)
            delivery = client.recv(timeout=0.2)
        except ClientError:
            dropped(client)
            client = None
            continue
        if delivery is not None and delivery.sequence is not None:
            content = delivery.content[0] if delivery.content else b""
            seq = delivery.sequence
            value = {
                **base,
                "seq": seq,
                "subject": delivery.subject,
                "body": text_of(content),
                "epoch": epoch(client, opened, job.get("incarnation", 0)),
                "at": client.endpoint,
            }
            if member:
                value["member"] = name
                history.observe("member", value)
                rid = content.split(b" ", 1)[0].decode("ascii", "replace")
                commit(
                    history, client, {**base, "member": name, "seq": seq, "rid": rid}, stream, seq
                )
                continue
            history.observe("consumed", value)
            pending = seq
            uncommitted += 1
        due = uncommitted >= job.get("commit_every", 1) or time.monotonic() - last_commit > 0.5
        if pending is not None and due:
            commit(history, client, {**base, "seq": pending}, stream, pending)
            pending, uncommitted, last_commit = None, 0, time.monotonic()
    if client is not None:
        if pending is not None:
            commit(history, client, {**base, "seq": pending}, stream, pending)
        client.close()


def first_frame(content: bytes) -> bytes:
    """
    A range-read record's first frame; its packed frames as they came if
    they cannot be unpacked (a damaged record served: the checker says so).
    """
    try:
        frames = chunks.decode_frames(content)
    except ValueError:
        return content
    return frames[0] if frames else b""


def read_whole(client: BulkClient, stream: str) -> dict[str, Any]:
    """Every record of C{stream} from 1: rows of [seq, subject, body], and gaps."""
    status = client.status(stream)
    rows: list[list[Any]] = []
    gaps: list[list[int]] = []
    if status.last >= 1:
        # From 1, not from the first retained: the soak sets no retention,
        # so a broker that lost the start of its copy (a salvage) says so
        # with a gap there.
        for item in client.read_range(stream, 1, status.last):
            if isinstance(item, RangeGap):
                gaps.append([item.missed, item.available])
            elif isinstance(item, RangeChunk):
                for seq, subject, content in zip(item.seq, item.subject, item.content, strict=True):
                    rows.append([seq, subject, text_of(first_frame(content))])
    return {"first": status.first, "last": status.last, "rows": rows, "gaps": gaps}


def run_final(job: Job, history: Recorder) -> None:
    for target in job["stores"]:
        for stream in target["streams"]:
            base = {"store": target["store"], "stream": stream}
            for attempt in range(job["attempts"]):
                try:
                    with BulkClient(target["endpoints"], timeout=10.0, retries=3) as client:
                        got = read_whole(client, stream)
                except MalamuteError as e:
                    history.complete(
                        history.new_op(), FAIL, "final-read", {**base, **error_value(e)}
                    )
                    break
                except (ClientError, ValueError) as e:
                    # (ValueError: a chunk that cannot be decoded at all.)
                    if attempt + 1 < job["attempts"]:
                        time.sleep(2.0)
                        continue
                    history.complete(
                        history.new_op(), INFO, "final-read", {**base, **error_value(e)}
                    )
                    break
                history.observe("final-read", {**base, **got})
                break


RUNS: Final[dict[str, Callable[[Job, Recorder], None]]] = {
    "append": run_append,
    "send": run_send,
    "request": run_send,
    "mailbox": run_receive,
    "worker": run_receive,
    "consumer": run_consume,
    "member": run_consume,
    "final": run_final,
}


def main(argv: list[str] | None = None) -> None:
    """Run the job given as JSON in the first argument."""
    job: Job = json.loads((argv or sys.argv[1:])[0])
    path = Path(job["out"])
    before = resume(path) if job.get("incarnation") else []
    job["before"] = before
    last_op = max((op_number(e.op) for e in before), default=0)
    with path.open("a") as out:
        history = Recorder(out, job["process"], job["t0"], last_op)
        RUNS[job["kind"]](job, history)


if __name__ == "__main__":
    main()
