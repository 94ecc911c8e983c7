"""
The load roles of the multicast benchmark (L{malamute_pack.bench.multicast}),
played by L{malamute_pack.bench.scenarios.run} with the raw pyzmq load of
L{malamute_pack.bench.load}: a producer that writes numbered records
(L{produce}: record I{i}'s 100-byte payload starts with I{i} in ten digits,
all encoded before the clock starts) and readers that count them and check
their order (L{read_in_order}, reporting an L{OrderReport}).

Each role runs in its host's network namespace and connects to its own
broker (L{HostContext}: a L{NamespaceContext} that also gives each role its
endpoint), so that one L{scenarios.run} plays the producer on host 1 and
the readers on hosts 2 and 3 at once.

Tests: ``tests/system/test_bench_multicast.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import monotonic
from typing import Any

import zmq

from malamute_pack.bench import load, scenarios
from malamute_pack.bench.pack.roles import NamespaceContext, NamespaceProcess
from malamute_pack.broker.streams import NOTICE
from malamute_pack.protocol import mlm

# The stream bridged, and the subjects of the measured and the warm-up records.
STREAM = "bench"
SUBJECT = "bench"
WARMUP_SUBJECT = "warmup"
PAYLOAD_SIZE = len(scenarios.PAYLOAD)
# Digits of the record number at the start of a payload.
DIGITS = 10

PRODUCER = "producer"


def payload(index: int) -> bytes:
    """The payload of record C{index}: its number in L{DIGITS} digits, padded to 100 bytes."""
    number = b"%0*d" % (DIGITS, index)
    return number + b"x" * (PAYLOAD_SIZE - len(number))


def index_of(content: bytes) -> int | None:
    """The record number a payload of L{payload} carries; None for any other content."""
    if len(content) != PAYLOAD_SIZE:
        return None
    number = content[:DIGITS]
    return int(number) if number.isdigit() else None


@dataclass(slots=True)
class OrderReport(load.Report):
    """
    What a reader of numbered records saw, beyond L{load.Report}'s count
    (C{received}: distinct records of the run) and last receipt.

    @ivar duplicates: records delivered again.
    @ivar out_of_order: records delivered after one with a higher number.
    @ivar notices: gap notices (subject C{$gap}): losses the bridge reports.
    @ivar others: records that are not the run's (a warm-up record).
    """

    duplicates: int = 0
    out_of_order: int = 0
    notices: int = 0
    others: int = 0


def produce(link: load.Link, role: load.Role, job: load.Job) -> load.Report:
    """
    Write records 0 to C{job.n - 1} (L{payload}) with the STREAM_SEND header
    C{role.frames[0]}, as fast as the socket takes them; the clock starts
    at the first send, once every message is encoded.
    """
    header = role.frames[0]
    messages = [[header, payload(i)] for i in range(job.n)]
    send = link.socket.send_multipart
    first = monotonic()
    for frames in messages:
        send(frames)
    return load.Report(sent=job.n, first_send=first)


def read_in_order(link: load.Link, role: load.Role, job: load.Job) -> OrderReport:
    """
    Count the distinct records 0 to C{job.n - 1} delivered (STREAM_DELIVER),
    and the duplicates, late ones and gap notices, until all have come or
    C{job.idle} seconds pass without one.
    """
    recv = link.socket.recv_multipart
    message_id = mlm.message_id
    deliver = mlm.StreamDeliver.ID
    n = job.n
    seen = bytearray(n)
    received = duplicates = late = notices = others = 0
    highest = -1
    last = None
    quiet_since = monotonic()
    while received < n:
        try:
            frames = recv(zmq.NOBLOCK)
        except zmq.Again:
            if link.idle(last or quiet_since, job.idle):
                break
            continue
        try:
            if message_id(frames) != deliver:
                continue  # a PONG
        except mlm.MalformedMessage:
            others += 1
            continue
        index = index_of(frames[-1])
        if index is None or index >= n:
            if _is_notice(frames):
                notices += 1
            else:
                others += 1
            continue
        if seen[index]:
            duplicates += 1
            continue
        seen[index] = 1
        received += 1
        if index < highest:
            late += 1
        else:
            highest = index
        last = monotonic()
        if not received & 0x3FF:
            link.keepalive()
    return OrderReport(
        received=received,
        last_receipt=last,
        duplicates=duplicates,
        out_of_order=late,
        notices=notices,
        others=others,
    )


def _is_notice(frames: list[bytes]) -> bool:
    try:
        message = mlm.decode(frames)
    except mlm.MalformedMessage:
        return False
    return isinstance(message, mlm.StreamDeliver) and message.subject == NOTICE


def _writer(work: load.Work, subject: str) -> load.Role:
    message = mlm.StreamSend(subject, [scenarios.PAYLOAD])
    return load.Role(
        PRODUCER, work, PRODUCER, (mlm.StreamWrite(STREAM),), tuple(mlm.encode(message))
    )


def measured(readers: tuple[str, ...]) -> scenarios.Scenario:
    """The measured run: L{produce} and one L{read_in_order} per reader name."""
    roles = tuple(
        load.Role(name, read_in_order, setup=(mlm.StreamRead(STREAM, ""),)) for name in readers
    )
    return scenarios.Scenario("multicast", (*roles, _writer(produce, SUBJECT)), 0)


def warmup(readers: tuple[str, ...]) -> scenarios.Scenario:
    """
    The warm-up: one record (subject L{WARMUP_SUBJECT}) that each reader
    must get, so that every receiving bridge follows the producer's broker
    before the clock starts.
    """
    roles = tuple(
        load.Role(
            name, load.count, setup=(mlm.StreamRead(STREAM, ""),), counts=mlm.StreamDeliver.ID
        )
        for name in readers
    )
    return scenarios.Scenario("multicast_warmup", (*roles, _writer(load.blast, WARMUP_SUBJECT)), 1)


class HostContext(NamespaceContext):
    """
    A L{NamespaceContext} whose roles run each in the namespace
    C{placement} gives it and connect to the endpoint C{endpoints} gives it
    (whatever endpoint L{scenarios.run} was given).
    """

    def __init__(self, placement: Mapping[str, str], endpoints: Mapping[str, str]) -> None:
        super().__init__(placement, None)
        self.endpoints = dict(endpoints)

    def Process(
        self,
        target: Callable[..., object],
        args: tuple[Any, ...] = (),
        name: str | None = None,
        daemon: bool | None = None,
    ) -> NamespaceProcess:
        role, _, job, pipe = args
        if not isinstance(role, load.Role) or role.name not in self.endpoints:
            raise ValueError(f"no endpoint for the role {role!r}")
        return super().Process(target, (role, self.endpoints[role.name], job, pipe), name, daemon)
