"""
A blocking client for moving many stream records at once: the bulk reads
and idempotent appends of protocol version 2 (``docs/protocol.md`` "Bulk
reads and idempotent appends"). The Spark data source reads and writes
through it, from the driver and from every executor.

One L{BulkClient} is one DEALER socket and one connection to the broker,
used from one thread. Its calls wait for their answers:

- L{BulkClient.status}: a stream's first retained and last committed
  sequence numbers, and where a position (earliest, latest, a sequence
  number, a time) falls;
- L{BulkClient.read_range}: the records between two sequence numbers,
  filtered by any pattern, as column chunks, with the gaps retention made;
  paced by credit; resumed after the last record it yielded if the broker
  goes silent (a restart), never repeating or skipping one;
- L{BulkClient.append}: records written all or none under a key the broker
  remembers, so that sending it again (a retry, a restarted query) writes
  nothing twice; retried across a broker restart.

A broker that does not answer within the timeout is an error
(L{BrokerUnreachableError}) that says so, never a short answer.

The endpoint may be several (a list, or separated by commas: a
primary/backup pair). The client opens on the first that accepts it,
trying them in order (each for its share of the timeout; ERROR 503, the
passive of a pair, moves on at once, and after a full round of refusals it
backs off briefly and goes round again until the timeout), and a read or
append cut short by silence or ERROR 503 is tried again on the next. As
for the other clients, its DEALER's monitor says at once when the
connection breaks (a broker killed: the call goes to the next without
waiting for the timeout), and an endpoint where no connection comes up
within a short grace is left for the next (``malamute_pack.client.monitor``).
With one endpoint or several, the monitor also says at once when the
broker refuses the credentials (or requires some and none were given):
L{AuthenticationRefusedError}, never retried; and when a CURVE client's
handshakes keep being broken off (its key for the broker is wrong):
L{WrongServerKeyError}, as soon as two were, or at the timeout after one.
An open the broker refuses (one endpoint: a passive's ERROR 503 is the
call's error) gives that connection up: the next call opens again.

A broker restarted on the same endpoint (killed or stopped cleanly) does
not know the connection: ZeroMQ reconnects the socket silently, and the
new broker answers whatever comes on it before a CONNECTION_OPEN with
ERROR 500 "command invalid: NAME", NAME the command's (as it answers a
connection it expired for silence). The client tells that answer apart
from a refusal by its exact text (L{forgotten}: a command of this client
the broker knows, once the connection is open, never gets it; a refusal
of the message itself, such as "... needs protocol version 2" or
"malformed: ...", says more), opens again and sends the call once more on
the new connection: a query, an append (its key makes a second send
harmless) or a range read (from the record after the last one yielded,
so a read cut short this way mid-range, its CREDIT answered so, goes on
without repeating or skipping one). Forgotten again on the new connection
(before a read made progress), the call fails with that ERROR 500.
The client sends no heartbeat: an idle connection is opened again before
the next call instead (C{REOPEN_AFTER}), and one the broker expired all
the same is forgotten as above.

Tests: ``tests/system/test_client_bulk.py``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import zmq
from twisted.logger import Logger

from malamute_pack.client.dealer import check_endpoints, make_watched_dealer
from malamute_pack.client.endpoints import (
    BACK_OFF,
    HANDSHAKE_GRACE,
    NOT_ACTIVE,
    EndpointRing,
    EndpointSpec,
    parse_endpoints,
)
from malamute_pack.client.errors import (
    AuthenticationRefusedError,
    BrokerUnreachableError,
    ClientError,
    MalamuteError,
)
from malamute_pack.client.monitor import (
    Handshakes,
    LinkChange,
    Refusal,
    link_change,
    refusal_error,
    unwatch,
    wait_writable,
)
from malamute_pack.client.options import ClientOptions
from malamute_pack.protocol import chunks, mlm
from malamute_pack.protocol.mlm import LATEST

_log = Logger()

M = TypeVar("M", bound=mlm.Message)
C = TypeVar("C")

# Records a range read lets the broker send ahead of what was consumed.
CREDIT_WINDOW: Final = 32_768
# A connection idle this long is opened again before its next call: the
# broker expires a silent client (10 s by default) and a Spark driver may
# keep a client between micro-batches for longer.
REOPEN_AFTER: Final = 2.0
# The largest append the broker takes by default (max-message-bytes, 4 MiB),
# less room for the header.
MAX_APPEND_BYTES: Final = 4 * 1024 * 1024 - 1024


@dataclass(frozen=True, slots=True)
class StreamStatus:
    """
    A stream as STREAM_STATUS describes it: the first sequence number still
    retained (last + 1 when none), the last committed (0 for none), and
    where the position asked for falls.
    """

    stream: str
    first: int
    last: int
    position: int


@dataclass(frozen=True, slots=True)
class RangeChunk:
    """
    Records of a range read, in sequence order, column by column; each
    C{content} is the record's frames encoded by
    L{malamute_pack.protocol.chunks.encode_frames}.
    """

    stream: str
    seq: list[int]
    timestamp_us: list[int]
    sender: list[str]
    subject: list[str]
    content: list[bytes]


# Makes a chunk of a range read from a STREAM_CHUNK's stream, content frame
# and record count; gives it with its last record's sequence number.
# MalformedMessage if the content is not that many records.
ChunkDecoder = Callable[[str, bytes, int], tuple[C, int]]


def range_chunk(stream: str, data: bytes, count: int) -> tuple[RangeChunk, int]:
    """A STREAM_CHUNK's records as a L{RangeChunk} (the decoder of L{BulkClient.read_range})."""
    columns = chunks.decode_chunk(data, count)
    return RangeChunk(stream, *columns), columns.seq[-1] if columns.seq else 0


@dataclass(frozen=True, slots=True)
class RangeGap:
    """Retention removed records C{missed} to C{available - 1} before they were read."""

    stream: str
    missed: int
    available: int


@dataclass(frozen=True, slots=True)
class Appended:
    """
    The outcome of an append: the sequence numbers its records got; with
    C{duplicate}, the key was written before and these are the first
    append's numbers (nothing was written now).
    """

    stream: str
    key: str
    first: int
    last: int
    duplicate: bool


class DataLossError(ClientError):
    """Records of a stream were lost to retention before they were read."""

    def __init__(self, stream: str, missed: int, available: int) -> None:
        super().__init__(
            f"stream {stream!r}: records {missed} to {available - 1} were removed by "
            f"retention before they were read ({available - missed} sequence numbers lost)"
        )
        self.stream = stream
        self.missed = missed
        self.available = available


class _Silent(Exception):
    """The broker said nothing for the timeout (or, with several endpoints, is gone)."""


class _NotActive(_Silent):
    """(Several endpoints) the broker answered ERROR 503: it does not serve."""


class _Forgotten(Exception):
    """
    The broker does not know this connection (L{forgotten}): open again.

    @ivar error: its answer, what the call fails with if that happens again.
    """

    def __init__(self, error: mlm.Error) -> None:
        super().__init__(f"{error.status_code} {error.status_reason}")
        self.error = error


# The commands a bulk client sends once open: what the broker answers
# "command invalid: NAME" on a connection it does not know.
_COMMANDS: Final = (mlm.StreamQuery, mlm.StreamReadRange, mlm.StreamAppend, mlm.Credit)
_FORGOTTEN_REASONS: Final = frozenset(
    f"command invalid: {mlm.MESSAGE_NAMES[command.ID]}" for command in _COMMANDS
)


def forgotten(error: mlm.Error) -> bool:
    """
    Whether C{error} is the broker's answer to a command on a connection
    it does not know (it restarted, or expired it): ERROR 500 with exactly
    the reason "command invalid: NAME" for one of the commands a bulk
    client sends (the broker's answer to anything but CONNECTION_OPEN from
    a party with no connection). An open connection's own refusals differ:
    another status, or a longer reason ("command invalid: NAME needs
    protocol version 2", "malformed: ...").
    """
    return error.status_code == mlm.COMMAND_INVALID and error.status_reason in _FORGOTTEN_REASONS


class BulkClient:
    """
    A version 2 connection to the broker at C{endpoint} for bulk reads and
    appends (see the module). C{timeout}: seconds of silence from the
    broker before a call fails (or, for reads and appends, is tried again
    on a new connection, C{retries} times). C{endpoint} may be several (a
    list, or separated by commas): the client fails over between them.

    @ivar endpoints: every endpoint, in the order they are tried.

    @raise BrokerUnreachableError: no broker answered in time.
    @raise AuthenticationRefusedError: the broker refused the credentials
        (at once, not after the timeout; never retried).
    @raise MalamuteError: the broker refused the connection.
    """

    def __init__(
        self,
        endpoint: EndpointSpec,
        *,
        options: ClientOptions | None = None,
        timeout: float = 30.0,
        retries: int = 2,
        max_append_bytes: int = MAX_APPEND_BYTES,
    ) -> None:
        self.endpoints = parse_endpoints(endpoint)
        self._ring = EndpointRing(self.endpoints)
        self.max_append_bytes = max_append_bytes
        self._options = options if options is not None else ClientOptions()
        self._timeout = timeout
        self._retries = retries
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._socket: zmq.Socket[bytes] | None = None
        # The monitor of the socket (refusals; with several endpoints, the
        # connection up or lost), and whether its connection is up.
        self._monitor: zmq.Socket[bytes] | None = None
        self._linked = False
        self._handshakes = Handshakes()
        self._credit = 0  # credit the broker holds for this connection
        self._last_sent = 0.0
        try:
            check_endpoints(self._context, self.endpoints[1:])
            self._open()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> BulkClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the broker forgets it when it expires)."""
        if self._socket is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._socket.send_multipart(mlm.encode(mlm.ConnectionClose()), zmq.NOBLOCK)
        self._drop()
        self._context.term()

    @property
    def endpoint(self) -> str:
        """The endpoint the client is on (or tries next)."""
        return self._ring.current

    @property
    def switches(self) -> int:
        """How many times the client moved to another endpoint (fail-overs)."""
        return self._ring.switches

    # Connection

    def _open(self) -> None:
        """
        A new socket and connection: what was under way on the old one is
        dropped. With several endpoints, each is tried in turn from the
        current one (for its share of the timeout; at once after ERROR 503),
        with a back-off after each full round, until the timeout.
        """
        if not self._ring.several:
            try:
                self._open_at(self._timeout)
            except _Silent:
                raise self._refused_or(
                    BrokerUnreachableError(
                        f"no Malamute broker answered at {self.endpoint} within {self._timeout:g} s"
                    )
                ) from None
            return
        deadline = time.monotonic() + self._timeout
        share = self._timeout / len(self.endpoints)
        while True:
            try:
                self._open_at(min(share, max(0.0, deadline - time.monotonic())))
                self._ring.accepted()
                return
            except _Silent as e:
                why = "ERROR 503, not active" if isinstance(e, _NotActive) else "silent"
                self._drop()
                left = self.endpoint
                round_failed = self._fail_over()
            if time.monotonic() >= deadline:
                raise self._refused_or(
                    BrokerUnreachableError(
                        f"no Malamute broker at {', '.join(self.endpoints)} accepted us within "
                        f"{self._timeout:g} s (the last: {left}, {why})"
                    )
                )
            if round_failed:
                time.sleep(min(BACK_OFF, max(0.0, deadline - time.monotonic())))

    def _open_at(self, wait: float) -> None:
        """
        Open on the current endpoint, waiting C{wait} seconds at most for OK
        (with several endpoints, at most a short grace for the connection).
        """
        self._drop()
        options = self._options
        self._credit = 0
        opening = mlm.ConnectionOpen(version=2, address=options.address)
        if not self._ring.several:
            self._socket, self._monitor = make_watched_dealer(
                self._context, self.endpoint, options.plain, options.curve, immediate=False
            )
            self._opened(opening, wait)
            return
        started = time.monotonic()
        self._socket, self._monitor = make_watched_dealer(
            self._context, self.endpoint, options.plain, options.curve
        )
        self._linked = False
        grace = min(HANDSHAKE_GRACE, self._timeout / 4, wait)
        while not self._linked:
            left = started + grace - time.monotonic()
            if left <= 0 or not self._monitor.poll(int(left * 1000) + 1):
                raise _Silent()  # no connection: nobody listens there
            self._read_monitor()
        self._opened(opening, max(0.0, started + wait - time.monotonic()))

    def _opened(self, opening: mlm.ConnectionOpen, wait: float) -> None:
        """
        Send C{opening} on the new connection and wait C{wait} seconds at
        most for its OK. Refused (an ERROR, such as a passive's 503), the
        connection is given up, so that the next call opens again rather
        than send on a connection the broker never opened (which it would
        answer "command invalid", call after call).
        """
        try:
            self._command(opening, mlm.Ok, wait)
        except MalamuteError:
            self._drop()
            raise

    def _read_monitor(self) -> None:
        """
        What the monitor says: L{AuthenticationRefusedError} if the broker
        refused the credentials; with several endpoints, _Silent if the
        connection broke.
        """
        assert self._monitor is not None
        try:
            while True:
                change = self._handshakes.heard(
                    link_change(self._monitor.recv_multipart(zmq.NOBLOCK))
                )
                if isinstance(change, Refusal):
                    options = self._options
                    raise refusal_error(change, self.endpoint, options.plain, options.curve)
                if change is LinkChange.LOST and self._ring.several:
                    self._linked = False
                    raise _Silent()
                if change is LinkChange.MADE:
                    self._linked = True
        except zmq.Again:
            pass

    def _refused_or(self, error: BrokerUnreachableError) -> BrokerUnreachableError:
        """
        C{error} (no answer in time), or the refusal the handshakes make (a
        broker that broke them off) if any.
        """
        refusal = self._handshakes.refusal()
        if refusal is None:
            return error
        return refusal_error(refusal, self.endpoint, self._options.plain, self._options.curve)

    def _fail_over(self) -> bool:
        """
        (Several endpoints) the current endpoint failed: move to the next;
        True when every endpoint failed in a row.
        """
        round_failed = self._ring.failed()
        self._ring.switched()
        return round_failed

    def _send(self, message: mlm.Message) -> None:
        assert self._socket is not None
        frames = mlm.encode(message)
        if not self._ring.several:
            self._socket.send_multipart(frames)
        else:
            self._send_watched(frames)
        self._last_sent = time.monotonic()

    def _send_watched(self, frames: list[bytes]) -> None:
        """
        (Several endpoints) the socket queues only on a connection that is
        up: without room, wait for some (the timeout at most), but not once
        the monitor says the connection broke (_Silent).
        """
        assert self._socket is not None and self._monitor is not None
        until = time.monotonic() + self._timeout
        while True:
            try:
                self._socket.send_multipart(frames, zmq.NOBLOCK)
                return
            except zmq.Again:
                pass
            self._read_monitor()
            if not self._linked or time.monotonic() >= until:
                raise _Silent()
            wait_writable(self._socket, self._monitor, until)

    def _receive(self, wait: float | None = None) -> mlm.Message:
        """
        The next message from the broker; _Silent after C{wait} (the
        timeout), or at once if the connection breaks (several endpoints);
        L{AuthenticationRefusedError} if the broker refused us.
        """
        assert self._socket is not None
        wait = self._timeout if wait is None else wait
        if self._monitor is None:
            if not self._socket.poll(int(wait * 1000)):
                raise _Silent()
        else:
            self._await_input(time.monotonic() + wait)
        try:
            return mlm.decode(self._socket.recv_multipart())
        except mlm.MalformedMessage as e:
            raise ClientError(f"the broker at {self.endpoint} sent a malformed message: {e}") from e

    def _await_input(self, until: float) -> None:
        """
        Wait until the socket has input; _Silent at C{until}, or (several
        endpoints) when the monitor says the connection broke (what the
        broker sent before it went is read first).
        """
        assert self._socket is not None and self._monitor is not None
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            left = until - time.monotonic()
            ready = dict(poller.poll(max(0, int(left * 1000)))) if left > 0 else {}
            if self._socket in ready:
                return
            if self._monitor in ready:
                self._read_monitor()
            elif left <= 0:
                raise _Silent()

    def _command(self, message: mlm.Message, answer: type[M], wait: float | None = None) -> M:
        """
        Send C{message} and wait for its C{answer}; MalamuteError for ERROR
        (_NotActive for 503 with several endpoints; _Forgotten when the
        broker does not know the connection).
        """
        self._send(message)
        while True:
            reply = self._receive(wait)
            if isinstance(reply, answer):
                return reply
            if isinstance(reply, mlm.Error):
                self._check_error(reply)
                raise MalamuteError(reply.status_code, reply.status_reason)
            # Anything else (a PONG, the tail of an abandoned read) is not for us.

    def _check_error(self, error: mlm.Error) -> None:
        """
        With several endpoints, ERROR 503 is a broker to leave: _NotActive;
        the broker's answer to a connection it does not know: _Forgotten
        (the connection is given up: the next call opens again).
        """
        if self._ring.several and error.status_code == NOT_ACTIVE:
            raise _NotActive()
        if forgotten(error):
            self._drop()
            raise _Forgotten(error)

    def _forgotten_again(self, e: _Forgotten, reopened: bool) -> None:
        """
        The broker forgot the connection: the call goes once more on a new
        one (the next C{_fresh} opens it), or, if it was forgotten there
        too (C{reopened}), fails with the broker's answer.
        """
        if reopened:
            raise MalamuteError(e.error.status_code, e.error.status_reason) from None
        _log_forgotten(self.endpoint, e.error)

    def _retry_elsewhere(self) -> None:
        """A call was cut short (silence, 503): drop the connection; with several, move on."""
        self._drop()
        if self._ring.several:
            self._fail_over()

    def _fresh(self) -> None:
        """
        Open again if there is no connection (an abandoned read gave it up)
        or the broker may have expired it for silence.
        """
        if self._socket is None or time.monotonic() - self._last_sent > REOPEN_AFTER:
            self._open()

    def _unreachable(self, what: str) -> BrokerUnreachableError:
        where = ", ".join(self.endpoints) if self._ring.several else self.endpoint
        return BrokerUnreachableError(
            f"the broker at {where} did not answer for {self._timeout:g} s {what}"
        )

    # Calls

    def status(self, stream: str, whence: int = LATEST, position: int = 0) -> StreamStatus:
        """
        C{stream}'s first retained and last committed sequence numbers, and
        the sequence number (C{whence}, C{position}) points at: EARLIEST the
        first, LATEST last + 1, SEQUENCE C{position}, TIME the first record
        at or after C{position} (ms since the epoch; last + 1 if none).
        """
        query = mlm.StreamQuery(stream, whence, position)
        attempts = 0
        reopened = False
        while True:
            try:
                self._fresh()
                got = self._command(query, mlm.StreamStatus)
                break
            except AuthenticationRefusedError:
                raise  # trying again would be refused again
            except _Forgotten as e:
                self._forgotten_again(e, reopened)
                reopened = True
            except (_Silent, BrokerUnreachableError) as e:
                attempts += 1
                if not self._ring.several and isinstance(e, BrokerUnreachableError):
                    raise  # no broker to open on: its own error
                if not self._ring.several or attempts > self._retries:
                    raise self._unreachable(f"to a query of stream {stream!r}") from None
                self._retry_elsewhere()
        return StreamStatus(stream, got.first, got.last, got.position)

    def read_range(
        self, stream: str, first: int, last: int, pattern: str = ""
    ) -> Generator[RangeChunk | RangeGap, None, None]:
        """
        Every retained record of C{stream} from C{first} to C{last}
        (clamped to the last committed) whose subject matches C{pattern}
        ("" for all), as chunks in order, with a L{RangeGap} where retention
        removed records first. If the broker goes silent, the read starts
        again on a new connection after the last record yielded, up to
        C{retries} times; then BrokerUnreachableError.
        """
        return self.read_chunks(stream, first, last, range_chunk, pattern)

    def read_chunks(
        self, stream: str, first: int, last: int, decode: ChunkDecoder[C], pattern: str = ""
    ) -> Generator[C | RangeGap, None, None]:
        """
        As L{read_range}, each chunk made by C{decode} from its packed
        records (a reader that wants columns of its own, such as Arrow,
        decodes them once, its own way).
        """
        position = first
        attempts = 0
        # Where the read was last forgotten by the broker: forgotten again
        # before it went further, it fails.
        reopened_at: int | None = None
        while True:
            try:
                for item in self._read_once(stream, position, last, pattern, decode):
                    if isinstance(item, RangeGap):
                        position = max(position, item.available)
                        yield item
                    else:
                        chunk, position = item[0], max(position, item[1] + 1)
                        yield chunk
                return
            except AuthenticationRefusedError:
                raise
            except _Forgotten as e:
                self._forgotten_again(e, reopened_at == position)
                reopened_at = position
            except (_Silent, BrokerUnreachableError):
                # Silent mid-read, or not back yet: again on a new connection.
                attempts += 1
                if attempts > self._retries:
                    raise self._unreachable(
                        f"while reading stream {stream!r} (read up to {position - 1} of "
                        f"{first}-{last}; tried {attempts} times)"
                    ) from None
                self._retry_elsewhere()

    def _read_once(
        self, stream: str, first: int, last: int, pattern: str, decode: ChunkDecoder[C]
    ) -> Generator[tuple[C, int] | RangeGap, None, None]:
        self._fresh()
        self._command(mlm.StreamReadRange(stream, pattern, first, last), mlm.Ok)
        finished = False
        try:
            self._grant()
            while True:
                reply = self._receive()
                if isinstance(reply, mlm.StreamChunk):
                    if len(reply.content) != 1:
                        raise ClientError(f"STREAM_CHUNK with {len(reply.content)} frames")
                    try:
                        decoded = decode(reply.address, reply.content[0], reply.count)
                    except mlm.MalformedMessage as e:
                        raise ClientError(f"malformed STREAM_CHUNK: {e}") from e
                    self._credit -= reply.count
                    if self._credit < CREDIT_WINDOW // 2:
                        self._grant()
                    yield decoded
                elif isinstance(reply, mlm.StreamGap):
                    yield RangeGap(reply.address, reply.missed, reply.available)
                elif isinstance(reply, mlm.StreamEnd):
                    finished = True
                    return
                elif isinstance(reply, mlm.Error):
                    # A 503: not finished, go elsewhere; forgotten (a CREDIT
                    # answered "command invalid"): not finished, open again.
                    self._check_error(reply)
                    finished = True  # the broker ended the read
                    raise MalamuteError(reply.status_code, reply.status_reason)
        finally:
            if not finished:
                # Abandoned (or silent): what is still in flight belongs to a
                # connection that is given up.
                self._drop()

    def _drop(self) -> None:
        """Give the connection up; the next call opens a new one."""
        if self._socket is not None:
            if self._monitor is not None:
                unwatch(self._socket)
                self._monitor.close(linger=0)
                self._monitor = None
            self._socket.close(linger=0)
            self._socket = None

    def _grant(self) -> None:
        """Give the broker credit up to the window."""
        wanted = CREDIT_WINDOW - self._credit
        while wanted > 0:
            amount = min(wanted, 0xFFFF)
            self._send(mlm.Credit(amount))
            self._credit += amount
            wanted -= amount

    def append(
        self, stream: str, key: str, records: Sequence[tuple[str, Sequence[bytes]]]
    ) -> Appended:
        """
        Write C{records} (subject, frames) to C{stream}, all or none, under
        C{key}; durable when this returns. A key the stream already has is
        not written again (C{duplicate}). Tried again on a new connection
        if the broker goes silent, or does not know the connection (it
        restarted): the key makes that safe.

        @raise ValueError: the append is larger than C{max_append_bytes}.
        @raise MalamuteError: the broker refused it (the status and reason).
        """
        data = chunks.encode_append(records)
        if len(data) > self.max_append_bytes:
            raise ValueError(
                f"an append of {len(data)} bytes is larger than {self.max_append_bytes}: split it"
            )
        message = mlm.StreamAppend(stream, key, [data])
        attempts = 0
        reopened = False
        while True:
            try:
                self._fresh()
                got = self._command(message, mlm.StreamAppended)
                break
            except AuthenticationRefusedError:
                raise
            except _Forgotten as e:
                self._forgotten_again(e, reopened)
                reopened = True
            except (_Silent, BrokerUnreachableError):
                attempts += 1
                if attempts > self._retries:
                    raise self._unreachable(
                        f"to an append to stream {stream!r} (tried {attempts} times)"
                    ) from None
                self._retry_elsewhere()
        if got.status_code == mlm.ALREADY_WRITTEN:
            return Appended(stream, key, got.first, got.last, True)
        if got.status_code != mlm.SUCCESS:
            raise MalamuteError(got.status_code, got.status_reason)
        return Appended(stream, key, got.first, got.last, False)


def _log_forgotten(endpoint: str, error: mlm.Error) -> None:
    _log.info(
        "the broker at {endpoint} does not know this connection ({code} {reason}): opening again",
        endpoint=endpoint,
        code=error.status_code,
        reason=error.status_reason,
    )
