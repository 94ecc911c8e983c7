"""
The load side of the benchmark: one function per role (send a burst, send
with a window of unacknowledged durable letters, count deliveries and
answer them with DONE where asked, serve requests, make round trips), each
run in a process of its own on a raw ZeroMQ DEALER socket with frames
encoded once, before the clock starts, so that what is measured is the
broker and not the load.

Every role process follows the same protocol with the runner, over a pipe:
connect, CONNECTION_OPEN (with the role's protocol version) and the role's
setup commands (each answered OK), then ``READY``; wait for ``GO``; do the
work; send its L{Report}; wait for ``STOP``; CONNECTION_CLOSE. While it
waits it pings the broker now and then, so that a broker with the usual
heartbeat timeout (the C broker's, or ours without ``--timeout``) does not
expire a client that only listens.

Frames are written and read with the codec only, on its fast paths:
whatever a role sends over and over is encoded once
(C{mlm.header_encoder} for the DONE of each record), a role that just
counts deliveries reads their kind alone (C{mlm.message_id}), and one that
needs a field (a record's id, a STORED's status, a requester's address)
decodes the message (C{mlm.decode}).

Timestamps are ``time.monotonic()``: on Linux that is CLOCK_MONOTONIC, one
clock for every process on the host, so a send time from one process and a
receipt time from another can be subtracted.

Tests: ``tests/system/test_bench.py``.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from time import monotonic

import zmq

from malamute_pack.protocol import mlm

# Messages on the pipe between the runner and a role process.
READY, GO, REPORT, STOP, FAILED = "ready", "go", "report", "stop", "failed"

# Letters a durable sender keeps waiting for STORED, unless told otherwise.
DEFAULT_WINDOW = 1000


class LoadError(Exception):
    """The broker refused a command or did not answer in time."""


@dataclass(frozen=True, slots=True)
class Job:
    """
    What every role of one scenario run shares.

    @ivar n: messages each sender sends (round trips, for a requester).
    @ivar idle: seconds without a delivery after which a receiver gives up
        and reports what it has (the rest is lost).
    @ivar ping_interval: seconds between CONNECTION_PINGs while a role waits.
    @ivar window: letters a durable sender has sent and not yet seen STORED
        for, at most.
    @ivar rate: messages per second a paced sender keeps to (the latency
        scenario's writer, L{malamute_pack.bench.latency}); 0 for the rest.
    """

    n: int
    idle: float = 5.0
    ping_interval: float = 1.0
    window: int = DEFAULT_WINDOW
    rate: int = 0


@dataclass(slots=True)
class Report:
    """
    What one role did.

    @ivar sent: messages sent (requests, for a requester).
    @ivar received: deliveries counted (replies, for a requester).
    @ivar acked: STOREDs with status 200 (a durable sender's letters).
    @ivar first_send: when the first message left, if any did.
    @ivar last_receipt: when the last counted delivery arrived, if any did.
    @ivar last_ack: when the last STORED 200 arrived, if any did.
    @ivar last_send: when the last message left (a paced sender's), if any did.
    @ivar rtt_total: seconds summed over the completed round trips.
    @ivar samples: seconds each measured message took: a requester's round
        trips, a latency reader's deliveries (receipt minus send time).
    """

    sent: int = 0
    received: int = 0
    acked: int = 0
    first_send: float | None = None
    last_receipt: float | None = None
    last_ack: float | None = None
    last_send: float | None = None
    rtt_total: float = 0.0
    samples: list[float] = field(default_factory=list)


class Link:
    """A DEALER socket to the broker that speaks just enough MLM for a role."""

    def __init__(self, endpoint: str, ping_interval: float) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.socket: zmq.Socket[bytes] = self.context.socket(zmq.DEALER)
        # No high-water marks: the load never drops or blocks on its side,
        # so any loss reported is the broker's.
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self._ping = mlm.encode(mlm.ConnectionPing())
        self._ping_interval = ping_interval
        self._next_ping = monotonic() + ping_interval

    def command(self, message: mlm.Message, timeout: float = 30.0) -> None:
        """Send C{message} and wait for its OK (PONGs and stale deliveries are skipped)."""
        self.socket.send_multipart(mlm.encode(message))
        deadline = monotonic() + timeout
        while (left := deadline - monotonic()) > 0:
            if not self.socket.poll(int(left * 1000) + 1):
                break
            reply = mlm.decode(self.socket.recv_multipart())
            if isinstance(reply, mlm.Ok):
                return
            if isinstance(reply, mlm.Error):
                raise LoadError(
                    f"{mlm.MESSAGE_NAMES[message.ID]} refused: "
                    f"{reply.status_code} {reply.status_reason}"
                )
        raise LoadError(f"no answer to {mlm.MESSAGE_NAMES[message.ID]} within {timeout}s")

    def keepalive(self) -> None:
        """Ping the broker if the last ping is older than the interval."""
        now = monotonic()
        if now >= self._next_ping:
            self.socket.send_multipart(self._ping)
            self._next_ping = now + self._ping_interval

    def idle(self, since: float, limit: float) -> bool:
        """
        Nothing to read: ping if due and wait up to 0.1 s for input;
        whether nothing has come for more than C{limit} seconds C{since}.
        """
        self.keepalive()
        if monotonic() - since > limit:
            return True
        self.socket.poll(100)
        return False

    def wait(self, pipe: Connection, expected: str) -> object:
        """
        Wait for C{expected} from the runner, pinging meanwhile and
        discarding whatever the broker sends (nothing is being measured).
        """
        while not pipe.poll(0.2):
            self.keepalive()
            while self.socket.poll(0):
                self.socket.recv_multipart()
        kind, value = pipe.recv()
        if kind != expected:
            raise LoadError(f"runner sent {kind!r} where {expected!r} was due")
        return value

    def close(self) -> None:
        """Say goodbye (best effort: a lossy run may leave a backlog) and close."""
        with contextlib.suppress(LoadError):
            self.command(mlm.ConnectionClose(), timeout=1.0)
        self.socket.close(linger=0)
        self.context.term()


# A role's work: given its open link, its spec and the job, what it did.
Work = Callable[[Link, "Role", Job], Report]


@dataclass(frozen=True, slots=True)
class Role:
    """
    One load process of a scenario.

    @ivar name: for messages about it.
    @ivar work: the function it runs once the runner says go.
    @ivar address: its CONNECTION_OPEN address ("" is anonymous).
    @ivar setup: commands sent after OPEN, each answered OK before READY.
    @ivar frames: the message it sends, encoded once.
    @ivar counts: message id of the deliveries it counts; 0 if it counts none.
    @ivar version: the protocol version it opens with.
    @ivar done: whether it answers each counted record (a MAILBOX_RECORD or
        SERVICE_RECORD) with DONE(id, 200).
    @ivar commit_every: a consumer's (STREAM_CONSUME): it commits every
        this many STREAM_RECORDs counted, and the last one; 0 for none.
    """

    name: str
    work: Work
    address: str = ""
    setup: tuple[mlm.Message, ...] = ()
    frames: tuple[bytes, ...] = ()
    counts: int = 0
    version: int = 1
    done: bool = False
    commit_every: int = 0


def blast(link: Link, role: Role, job: Job) -> Report:
    """Send C{role.frames} C{job.n} times, as fast as the socket takes them."""
    send = link.socket.send_multipart
    frames = list(role.frames)
    first = monotonic()
    for _ in range(job.n):
        send(frames)
    return Report(sent=job.n, first_send=first)


def post(link: Link, role: Role, job: Job) -> Report:
    """
    Send C{role.frames} (a MAILBOX_SEND or SERVICE_SEND of a version 2
    sender) C{job.n} times, with at most C{job.window} still waiting for
    their STORED, and count the STOREDs with status 200. Gives up after
    C{job.idle} without a STORED (a broker that sends none).
    """
    socket = link.socket
    recv = socket.recv_multipart
    send = socket.send_multipart
    frames = list(role.frames)
    n = job.n
    window = job.window
    decode = mlm.decode
    stored = mlm.Stored
    success = mlm.SUCCESS
    sent = answered = acked = 0
    last_ack = None
    first = last_answer = monotonic()
    while answered < n:
        while sent < n and sent - answered < window:
            send(frames)
            sent += 1
        try:
            reply = decode(recv(zmq.NOBLOCK))
        except zmq.Again:
            if link.idle(last_answer, job.idle):
                break
            continue
        if not isinstance(reply, stored):
            continue  # a PONG
        answered += 1
        last_answer = monotonic()
        if reply.status_code == success:
            acked += 1
            last_ack = last_answer
        if not answered & 0x3FF:
            link.keepalive()
    return Report(sent=sent, acked=acked, first_send=first, last_ack=last_ack)


def count(link: Link, role: Role, job: Job) -> Report:
    """
    Count deliveries of kind C{role.counts} until C{job.n} or C{job.idle}
    of silence, answering each with DONE if C{role.done}.
    """
    socket = link.socket
    recv = socket.recv_multipart
    send = socket.send
    kind = role.counts
    done = role.done
    message_id = mlm.message_id
    decode = mlm.decode
    records = (mlm.MailboxRecord, mlm.ServiceRecord)
    done_header = mlm.header_encoder(mlm.Done)
    success = mlm.SUCCESS
    commit_every = role.commit_every
    received = 0
    last = None
    last_frames: list[bytes] | None = None
    quiet_since = monotonic()
    while received < job.n:
        try:
            frames = recv(zmq.NOBLOCK)
        except zmq.Again:
            if link.idle(last or quiet_since, job.idle):
                break
            continue
        if message_id(frames) == kind:
            if done:
                record = decode(frames)
                if not isinstance(record, records):
                    raise LoadError(f"DONE answers records, not {record}")
                send(done_header(record.id, success, ""))
            received += 1
            last = monotonic()
            if commit_every:
                last_frames = frames
                if not received % commit_every:
                    _commit(link, frames)
                    last_frames = None
            if not received & 0x3FF:
                link.keepalive()
    if last_frames is not None:
        _commit(link, last_frames)
    return Report(received=received, last_receipt=last)


def _commit(link: Link, frames: list[bytes]) -> None:
    """Commit the STREAM_RECORD C{frames} and those before it; the answer is not awaited."""
    record = mlm.decode(frames)
    if not isinstance(record, mlm.StreamRecord):
        raise LoadError(f"a consumer commits stream records, not {record}")
    link.socket.send_multipart(mlm.encode(mlm.StreamCommit(record.address, record.sequence)))


def serve(link: Link, role: Role, job: Job) -> Report:
    """
    Answer each SERVICE_DELIVER with a MAILBOX_SEND of the same content to
    its sender, until C{job.n} requests or C{job.idle} of silence.
    """
    socket = link.socket
    recv = socket.recv_multipart
    send = socket.send_multipart
    message_id = mlm.message_id
    decode = mlm.decode
    deliver = mlm.ServiceDeliver
    # Reply header per requester address, encoded once.
    replies: dict[str, bytes] = {}
    served = 0
    last = monotonic()
    while served < job.n:
        try:
            frames = recv(zmq.NOBLOCK)
        except zmq.Again:
            if link.idle(last, job.idle):
                break
            continue
        if message_id(frames) != deliver.ID:
            continue
        delivered = decode(frames)
        assert isinstance(delivered, deliver)
        reply = replies.get(delivered.sender)
        if reply is None:
            reply = mlm.encode_header(mlm.MailboxSend(delivered.sender, "echo"))
            replies[delivered.sender] = reply
        send([reply, *delivered.content])
        served += 1
        last = monotonic()
    return Report(sent=served)


def request(link: Link, role: Role, job: Job) -> Report:
    """
    Make C{job.n} strictly sequential round trips: send C{role.frames},
    wait for a delivery of kind C{role.counts}, and keep each one's
    seconds. A round trip unanswered within C{job.idle} counts as lost and
    the next one starts.
    """
    socket = link.socket
    recv = socket.recv_multipart
    send = socket.send_multipart
    socket.setsockopt(zmq.RCVTIMEO, max(1, int(job.idle * 1000)))
    frames = list(role.frames)
    kind = role.counts
    message_id = mlm.message_id
    # Preallocated: no list growth inside the timed loop.
    samples = [0.0] * job.n
    replies = 0
    last = None
    first = monotonic()
    for _ in range(job.n):
        started = monotonic()
        send(frames)
        try:
            while message_id(recv()) != kind:
                pass  # a PONG or a straggler: not this round trip's answer
        except zmq.Again:
            continue
        last = monotonic()
        samples[replies] = last - started
        replies += 1
    del samples[replies:]
    return Report(
        sent=job.n,
        received=replies,
        first_send=first,
        last_receipt=last,
        rtt_total=sum(samples),
        samples=samples,
    )


def run_role(role: Role, endpoint: str, job: Job, pipe: Connection) -> None:
    """The body of one role process (see the module docstring for its protocol)."""
    try:
        link = Link(endpoint, job.ping_interval)
        link.command(mlm.ConnectionOpen(version=role.version, address=role.address))
        for command in role.setup:
            link.command(command)
        pipe.send((READY, None))
        link.wait(pipe, GO)
        pipe.send((REPORT, role.work(link, role, job)))
        link.wait(pipe, STOP)
        link.close()
    except Exception:
        pipe.send((FAILED, f"{role.name}: {traceback.format_exc()}"))
    finally:
        pipe.close()
