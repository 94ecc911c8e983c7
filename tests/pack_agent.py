"""
A client process for the pack system tests: one raw DEALER speaking MLM
through the codec (deliberately not the project's client library) to the
broker of the host (network namespace) it runs in, driven by JSON lines.

Run as ``python -m tests.pack_agent ENDPOINT`` inside a host's namespace
(an abstract ipc name is only reachable there). Each line on stdin is one
command, a JSON object with an ``op``; each gets exactly one answer line on
stdout, a JSON object with ``ok`` (and ``error`` when not ok). Commands run
one at a time; between and during them the agent keeps reading its socket:
what it receives (stream messages, letters, requests, gaps, confirmations)
is kept, in arrival order, until a ``collect`` takes it.

Ops:
 - ``open`` (version, address): CONNECTION_OPEN, waits for OK;
   ``try_open`` (version, address): the same, answering what came back
   (``reply``: its name, ``status``: an ERROR's code).
 - ``write`` (stream), ``read`` (stream, pattern), ``read_from`` (stream,
   pattern, whence, position), ``offer`` (service, pattern): wait for OK.
 - ``send`` (prefix, count, start, width, interval): STREAM_SEND of subjects
   ``prefix + number`` (zero-padded to ``width``).
 - ``credit`` (amount); ``pace`` (batch, delay): from now on, each time
   ``batch`` stream messages have arrived, grant ``batch`` more credit
   ``delay`` seconds later (a slow reader).
 - ``post`` (kind ``mailbox`` or ``service``, address, subjects, tracker,
   timeout, wait ``none``/``each``/``all``, stored_timeout, interval): letters;
   with a wait (version 2), the STORED of each, in order (None for one that
   did not come in time; with ``each``, the next is sent only after it),
   and the longest a STORED took (``slowest``, seconds).
 - ``serve`` (reply, done, mail_done, delay): answer each service request
   by a MAILBOX_SEND to its sender (``reply``) and/or DONE (``done``, version
   2; ``delay`` seconds after it came, holding it meanwhile);
   ``mail_done``: DONE each MAILBOX_RECORD (the default).
 - ``collect`` (kinds, count, quiet, timeout_s, prefix): take what was
   received of those kinds once ``count`` of them have a subject starting
   with ``prefix``, or none of those came for ``quiet`` seconds, or after
   ``timeout_s`` seconds (never longer).
 - ``close``: CONNECTION_CLOSE, then exit.

Every wait is bounded; the agent exits when stdin closes (its test ended)
and after ``LIFETIME`` seconds whatever happens, so it never outlives a run.
With ``MALAMUTE_AGENT_PLAIN=user:password`` in its environment, it
authenticates with PLAIN.

Tests: ``tests/system/test_system_pack.py``.
"""

from __future__ import annotations

import json
import os
import sys
from collections import deque
from collections.abc import Callable
from time import monotonic
from typing import Any

import zmq

from malamute_pack.protocol import mlm

# The agent exits after this many seconds, even if its test forgot it.
LIFETIME = 600.0
# Pings while idle, so the broker never expires the agent for silence.
PING_INTERVAL = 1.0
_STDIN = 0

Event = dict[str, Any]


class Agent:
    """One MLM connection and what it received."""

    def __init__(self, endpoint: str) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        plain = os.environ.get("MALAMUTE_AGENT_PLAIN")
        if plain:
            user, _, password = plain.partition(":")
            self.socket.setsockopt(zmq.PLAIN_USERNAME, user.encode())
            self.socket.setsockopt(zmq.PLAIN_PASSWORD, password.encode())
        self.socket.setsockopt(zmq.SNDHWM, 100_000)
        self.socket.setsockopt(zmq.RCVHWM, 100_000)
        self.socket.connect(endpoint)
        self.version = 1
        self.events: list[Event] = []
        self.replies: deque[mlm.Message] = deque()
        self.stored: deque[mlm.Stored] = deque()
        # Who sent each MAILBOX_SEND or SERVICE_SEND still waiting for its STORED.
        self._storers: deque[str] = deque()
        self.reply = False
        self.done = False
        self.mail_done = True
        # A worker's DONE can wait (a request held for a while): (when, id).
        self.done_delay = 0.0
        self._dones: deque[tuple[float, int]] = deque()
        self.pace: tuple[int, float] | None = None
        self._paced = 0
        self._grants: list[float] = []
        self.malformed = 0
        self.served = 0
        self._last_send = monotonic()
        self._started = monotonic()
        # No ping before CONNECTION_OPEN is answered OK: one sent before the
        # open (its test slow to ask for it, on a loaded machine) is answered
        # ERROR 'command invalid', which the open would take for its answer.
        self.opened = False

    # Socket

    def send(self, message: mlm.Message) -> None:
        self.socket.send_multipart(mlm.encode(message))
        self._last_send = monotonic()

    def _sends_letter(self, message: mlm.Message, who: str) -> None:
        self.send(message)
        if self.version == 2:
            self._storers.append(who)

    def drain(self) -> None:
        """Take everything waiting on the socket."""
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message = mlm.decode(frames)
            except mlm.MalformedMessage:
                self.malformed += 1
                continue
            self.take(message)

    def take(self, message: mlm.Message) -> None:
        if isinstance(message, mlm.Ok | mlm.Error):
            self.replies.append(message)
        elif isinstance(message, mlm.Stored):
            who = self._storers.popleft() if self._storers else "post"
            if who == "post":
                self.stored.append(message)
        elif isinstance(message, mlm.StreamRecord):
            self.events.append(
                {"k": "stream", "s": message.subject, "q": message.sequence, "a": message.address}
            )
            self._count_paced()
        elif isinstance(message, mlm.StreamDeliver):
            self.events.append({"k": "stream", "s": message.subject, "a": message.address})
            self._count_paced()
        elif isinstance(message, mlm.StreamGap):
            self.events.append({"k": "gap", "missed": message.missed, "at": message.available})
        elif isinstance(message, mlm.MailboxRecord | mlm.MailboxDeliver):
            record = isinstance(message, mlm.MailboxRecord)
            self.events.append(
                {
                    "k": "mail",
                    "s": message.subject,
                    "from": message.sender,
                    "t": message.tracker,
                    "id": message.id if isinstance(message, mlm.MailboxRecord) else None,
                }
            )
            if record and self.mail_done:
                assert isinstance(message, mlm.MailboxRecord)
                self.send(mlm.Done(message.id))
        elif isinstance(message, mlm.ServiceRecord | mlm.ServiceDeliver):
            ident = message.id if isinstance(message, mlm.ServiceRecord) else None
            self.events.append(
                {"k": "service", "s": message.subject, "from": message.sender, "id": ident}
            )
            self._serve(message, ident)
        elif isinstance(message, mlm.Confirm):
            self.events.append({"k": "confirm", "t": message.tracker, "c": message.status_code})
        elif isinstance(message, mlm.ConnectionPong):
            pass
        else:
            self.events.append({"k": "other", "s": type(message).__name__})

    def _serve(self, message: mlm.ServiceRecord | mlm.ServiceDeliver, ident: int | None) -> None:
        if self.reply:
            answer = mlm.MailboxSend(
                address=message.sender, subject=f"re:{message.subject}", content=[b"done"]
            )
            self._sends_letter(answer, "serve")
        if self.done and ident is not None:
            if self.done_delay:
                self._dones.append((monotonic() + self.done_delay, ident))
            else:
                self.send(mlm.Done(ident))
        self.served += 1

    def _count_paced(self) -> None:
        if self.pace is None:
            return
        self._paced += 1
        batch, delay = self.pace
        if self._paced >= batch:
            self._paced -= batch
            self._grants.append(monotonic() + delay)

    def tick(self) -> None:
        """Timed work: credit grants that are due, a ping when idle."""
        now = monotonic()
        while self._dones and self._dones[0][0] <= now:
            self.send(mlm.Done(self._dones.popleft()[1]))
        if self._grants and self.pace is not None:
            due = [t for t in self._grants if t <= now]
            if due:
                self._grants = [t for t in self._grants if t > now]
                self.send(mlm.Credit(self.pace[0] * len(due)))
        if self.opened and now - self._last_send >= PING_INTERVAL:
            self.send(mlm.ConnectionPing())
        if now - self._started > LIFETIME:
            sys.exit(3)

    def wait(self, done: Callable[[], bool], timeout: float) -> bool:
        """Read the socket until C{done()} or C{timeout} seconds; whether done."""
        deadline = monotonic() + timeout
        while True:
            self.drain()
            self.tick()
            if done():
                return True
            left = deadline - monotonic()
            if left <= 0:
                return False
            self.socket.poll(int(min(left, 0.05) * 1000) + 1)

    def expect_ok(self, what: str, timeout: float = 10.0) -> None:
        if not self.wait(lambda: bool(self.replies), timeout):
            raise RuntimeError(f"no answer to {what} within {timeout}s")
        reply = self.replies.popleft()
        if not isinstance(reply, mlm.Ok):
            raise RuntimeError(f"{what} answered {reply}")

    # Commands

    def op_open(self, version: int = 1, address: str = "", timeout: float = 10.0) -> Event:
        self.version = version
        self.send(mlm.ConnectionOpen(version=version, address=address))
        self.expect_ok("CONNECTION_OPEN", timeout)
        self.opened = True
        return {}

    def op_try_open(self, version: int = 1, address: str = "", timeout: float = 10.0) -> Event:
        self.version = version
        self.send(mlm.ConnectionOpen(version=version, address=address))
        if not self.wait(lambda: bool(self.replies), timeout):
            raise RuntimeError(f"no answer to CONNECTION_OPEN within {timeout}s")
        reply = self.replies.popleft()
        self.opened = isinstance(reply, mlm.Ok)
        status = reply.status_code if isinstance(reply, mlm.Error) else None
        return {"reply": type(reply).__name__, "status": status}

    def op_write(self, stream: str) -> Event:
        self.send(mlm.StreamWrite(stream))
        self.expect_ok("STREAM_WRITE")
        return {}

    def op_read(self, stream: str, pattern: str) -> Event:
        self.send(mlm.StreamRead(stream, pattern))
        self.expect_ok("STREAM_READ")
        return {}

    def op_read_from(self, stream: str, pattern: str, whence: int, position: int = 0) -> Event:
        self.send(mlm.StreamReadFrom(stream, pattern, whence, position))
        self.expect_ok("STREAM_READ_FROM")
        return {}

    def op_offer(self, service: str, pattern: str) -> Event:
        self.send(mlm.ServiceOffer(service, pattern))
        self.expect_ok("SERVICE_OFFER")
        return {}

    def op_send(
        self, prefix: str, count: int, start: int = 0, width: int = 6, interval: float = 0.0
    ) -> Event:
        for i in range(start, start + count):
            self.send(mlm.StreamSend(subject=f"{prefix}{i:0{width}d}", content=[b"x" * 16]))
            if interval:
                self.wait(lambda: False, interval)
            elif i % 100 == 0:
                self.drain()
        self.drain()
        return {"sent": count}

    def op_credit(self, amount: int) -> Event:
        self.send(mlm.Credit(amount))
        return {}

    def op_pace(self, batch: int, delay: float) -> Event:
        self.pace = (batch, delay)
        self._paced = 0
        return {}

    def op_serve(
        self, reply: bool = True, done: bool = True, mail_done: bool = True, delay: float = 0.0
    ) -> Event:
        self.reply, self.done, self.mail_done = reply, done, mail_done
        self.done_delay = delay
        return {}

    def op_post(
        self,
        kind: str,
        address: str,
        subjects: list[str],
        tracker: str = "",
        timeout: int = 0,
        wait: str = "none",
        stored_timeout: float = 10.0,
        interval: float = 0.0,
    ) -> Event:
        cls = {"mailbox": mlm.MailboxSend, "service": mlm.ServiceSend}[kind]
        if wait != "none" and self.version != 2:
            raise RuntimeError("only a version 2 connection gets STORED")
        self.stored.clear()
        results: list[list[Any] | None] = []
        sent_at: list[float] = []
        slowest = 0.0

        def take_stored(n: int) -> None:
            nonlocal slowest
            for _ in range(n):
                if not self.wait(lambda: bool(self.stored), stored_timeout):
                    results.append(None)
                    continue
                s = self.stored.popleft()
                slowest = max(slowest, monotonic() - sent_at[len(results)])
                results.append([s.id, s.status_code, s.status_reason])

        for subject in subjects:
            letter = cls(
                address=address,
                subject=subject,
                tracker=tracker,
                timeout=timeout,
                content=[subject.encode()],
            )
            self._sends_letter(letter, "post")
            sent_at.append(monotonic())
            if wait == "each":
                take_stored(1)
            if interval:
                self.wait(lambda: False, interval)
        if wait == "all":
            take_stored(len(subjects))
        self.drain()
        return {"stored": results if wait != "none" else [], "slowest": slowest}

    def op_collect(
        self,
        kinds: list[str],
        count: int | None = None,
        quiet: float | None = None,
        timeout_s: float = 10.0,
        prefix: str = "",
    ) -> Event:
        wanted = set(kinds)
        # Matching events seen so far, and when that number last changed.
        seen = [0, monotonic()]

        def enough() -> bool:
            n = sum(
                1 for e in self.events if e["k"] in wanted and e.get("s", "").startswith(prefix)
            )
            if n != seen[0]:
                seen[0], seen[1] = n, monotonic()
            if count is not None and n >= count:
                return True
            return quiet is not None and monotonic() - seen[1] >= quiet

        finished = self.wait(enough, timeout_s)
        taken = [e for e in self.events if e["k"] in wanted]
        self.events = [e for e in self.events if e["k"] not in wanted]
        return {"events": taken, "timed_out": not finished, "served": self.served}

    def op_close(self) -> Event:
        self.send(mlm.ConnectionClose())
        self.wait(lambda: bool(self.replies), 2.0)
        return {"exit": True}

    def run_command(self, line: str) -> Event:
        try:
            command = json.loads(line)
            op = command.pop("op")
            handler = getattr(self, f"op_{op}", None)
            if handler is None:
                raise RuntimeError(f"unknown op {op!r}")
            answer: Event = handler(**command)
            answer["ok"] = True
        except Exception as e:  # reported to the test, which fails with it
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        answer["malformed"] = self.malformed
        return answer


def main() -> None:
    agent = Agent(sys.argv[1])
    poller = zmq.Poller()
    poller.register(agent.socket, zmq.POLLIN)
    poller.register(_STDIN, zmq.POLLIN)
    pending = b""
    while True:
        ready = dict(poller.poll(50))
        if agent.socket in ready:
            agent.drain()
        if _STDIN in ready:
            data = os.read(_STDIN, 65536)
            if not data:
                return  # the test is gone
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if not line.strip():
                    continue
                answer = agent.run_command(line.decode())
                sys.stdout.write(json.dumps(answer) + "\n")
                sys.stdout.flush()
                if answer.get("exit"):
                    return
        agent.tick()


if __name__ == "__main__":
    main()
