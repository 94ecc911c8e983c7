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

Tests: ``tests/test_client_bulk.py``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import zmq

from malamute_pack.client.dealer import make_dealer
from malamute_pack.client.errors import BrokerUnreachableError, ClientError, MalamuteError
from malamute_pack.client.options import ClientOptions
from malamute_pack.protocol import chunks, mlm
from malamute_pack.protocol.mlm import LATEST

M = TypeVar("M", bound=mlm.Message)

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
    """The broker said nothing for the timeout."""


class BulkClient:
    """
    A version 2 connection to the broker at C{endpoint} for bulk reads and
    appends (see the module). C{timeout}: seconds of silence from the
    broker before a call fails (or, for reads and appends, is tried again
    on a new connection, C{retries} times).

    @raise BrokerUnreachableError: no broker answered in time.
    @raise MalamuteError: the broker refused the connection.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        options: ClientOptions | None = None,
        timeout: float = 30.0,
        retries: int = 2,
        max_append_bytes: int = MAX_APPEND_BYTES,
    ) -> None:
        self.endpoint = endpoint
        self.max_append_bytes = max_append_bytes
        self._options = options if options is not None else ClientOptions()
        self._timeout = timeout
        self._retries = retries
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._socket: zmq.Socket[bytes] | None = None
        self._credit = 0  # credit the broker holds for this connection
        self._last_sent = 0.0
        try:
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
            self._socket.close(linger=0)
            self._socket = None
        self._context.term()

    # Connection

    def _open(self) -> None:
        """A new socket and connection: what was under way on the old one is dropped."""
        if self._socket is not None:
            self._socket.close(linger=0)
        options = self._options
        self._socket = make_dealer(self._context, self.endpoint, options.plain, options.curve)
        self._credit = 0
        opening = mlm.ConnectionOpen(version=2, address=options.address)
        try:
            self._command(opening, mlm.Ok)
        except _Silent:
            raise BrokerUnreachableError(
                f"no Malamute broker answered at {self.endpoint} within {self._timeout:g} s"
            ) from None

    def _send(self, message: mlm.Message) -> None:
        assert self._socket is not None
        self._socket.send_multipart(mlm.encode(message))
        self._last_sent = time.monotonic()

    def _receive(self) -> mlm.Message:
        """The next message from the broker; _Silent after the timeout."""
        assert self._socket is not None
        if not self._socket.poll(int(self._timeout * 1000)):
            raise _Silent()
        try:
            return mlm.decode(self._socket.recv_multipart())
        except mlm.MalformedMessage as e:
            raise ClientError(f"the broker at {self.endpoint} sent a malformed message: {e}") from e

    def _command(self, message: mlm.Message, answer: type[M]) -> M:
        """Send C{message} and wait for its C{answer}; MalamuteError for ERROR."""
        self._send(message)
        while True:
            reply = self._receive()
            if isinstance(reply, answer):
                return reply
            if isinstance(reply, mlm.Error):
                raise MalamuteError(reply.status_code, reply.status_reason)
            # Anything else (a PONG, the tail of an abandoned read) is not for us.

    def _fresh(self) -> None:
        """
        Open again if there is no connection (an abandoned read gave it up)
        or the broker may have expired it for silence.
        """
        if self._socket is None or time.monotonic() - self._last_sent > REOPEN_AFTER:
            self._open()

    def _unreachable(self, what: str) -> BrokerUnreachableError:
        return BrokerUnreachableError(
            f"the broker at {self.endpoint} did not answer for {self._timeout:g} s {what}"
        )

    # Calls

    def status(self, stream: str, whence: int = LATEST, position: int = 0) -> StreamStatus:
        """
        C{stream}'s first retained and last committed sequence numbers, and
        the sequence number (C{whence}, C{position}) points at: EARLIEST the
        first, LATEST last + 1, SEQUENCE C{position}, TIME the first record
        at or after C{position} (ms since the epoch; last + 1 if none).
        """
        self._fresh()
        try:
            got = self._command(mlm.StreamQuery(stream, whence, position), mlm.StreamStatus)
        except _Silent:
            raise self._unreachable(f"to a query of stream {stream!r}") from None
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
        position = first
        attempts = 0
        while True:
            try:
                for item in self._read_once(stream, position, last, pattern):
                    if isinstance(item, RangeChunk):
                        position = item.seq[-1] + 1
                    else:
                        position = max(position, item.available)
                    yield item
                return
            except (_Silent, BrokerUnreachableError):
                # Silent mid-read, or not back yet: again on a new connection.
                attempts += 1
                if attempts > self._retries:
                    raise self._unreachable(
                        f"while reading stream {stream!r} (read up to {position - 1} of "
                        f"{first}-{last}; tried {attempts} times)"
                    ) from None
                self._drop()

    def _read_once(
        self, stream: str, first: int, last: int, pattern: str
    ) -> Generator[RangeChunk | RangeGap, None, None]:
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
                        columns = chunks.decode_chunk(reply.content[0], reply.count)
                    except mlm.MalformedMessage as e:
                        raise ClientError(f"malformed STREAM_CHUNK: {e}") from e
                    self._credit -= reply.count
                    if self._credit < CREDIT_WINDOW // 2:
                        self._grant()
                    yield RangeChunk(reply.address, *columns)
                elif isinstance(reply, mlm.StreamGap):
                    yield RangeGap(reply.address, reply.missed, reply.available)
                elif isinstance(reply, mlm.StreamEnd):
                    finished = True
                    return
                elif isinstance(reply, mlm.Error):
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
        if the broker goes silent (the key makes that safe).

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
        while True:
            try:
                self._fresh()
                got = self._command(message, mlm.StreamAppended)
                break
            except (_Silent, BrokerUnreachableError):
                attempts += 1
                if attempts > self._retries:
                    raise self._unreachable(
                        f"to an append to stream {stream!r} (tried {attempts} times)"
                    ) from None
                self._drop()
        if got.status_code == mlm.ALREADY_WRITTEN:
            return Appended(stream, key, got.first, got.last, True)
        if got.status_code != mlm.SUCCESS:
            raise MalamuteError(got.status_code, got.status_reason)
        return Appended(stream, key, got.first, got.last, False)
