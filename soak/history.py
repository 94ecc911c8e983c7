"""
The soak's history, as Jepsen keeps one: every event of every client
process is one JSON line

    {"time": 12.345, "process": "append-h1", "type": "invoke", "f": "append",
     "op": "append-h1:17", "value": {...}}

C{time} is seconds since the soak started (the machine's monotonic clock,
which every process of the machine shares); C{type} is

- C{invoke}: an operation starts (its C{value} says what it asks);
- C{ok}: it succeeded (the broker acknowledged it: STORED 200,
  STREAM_APPENDED 200 or 208, STREAM_COMMITTED 200); its C{value} has the
  answer;
- C{fail}: the broker refused it (a status other than 200): not
  acknowledged;
- C{info}: its outcome is unknown (no answer within the client's timeout,
  the connection lost): it may or may not have happened.

An C{ok} with no C{invoke} before it is an observation: a delivery (a
letter, a request, a consumer's or a group member's record) or a final
read, each under an op id of its own. What each C{f} carries is in
L{soak.client} and L{soak.checker}.

Each client process writes its own file (one writer each, so lines never
interleave); L{merge} reads them all into one history in time order.

Tests: ``tests/unit/test_soak_checker.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

INVOKE: Final = "invoke"
OK: Final = "ok"
FAIL: Final = "fail"
INFO: Final = "info"
TYPES: Final = (INVOKE, OK, FAIL, INFO)


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the history (see the module)."""

    time: float
    process: str
    type: str
    f: str
    op: str
    value: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """The event as one JSON line (without the newline)."""
        return json.dumps(
            {
                "time": round(self.time, 6),
                "process": self.process,
                "type": self.type,
                "f": self.f,
                "op": self.op,
                "value": self.value,
            },
            separators=(",", ":"),
        )


def parse(line: str) -> Event:
    """
    The event of one JSON line.

    @raise ValueError: the line is not an event.
    """
    fields = json.loads(line)
    if not isinstance(fields, dict) or fields.get("type") not in TYPES:
        raise ValueError(f"not a history event: {line[:200]!r}")
    return Event(
        float(fields["time"]),
        str(fields["process"]),
        str(fields["type"]),
        str(fields["f"]),
        str(fields["op"]),
        dict(fields.get("value") or {}),
    )


def read(path: Path) -> list[Event]:
    """
    The events of a file; a last line cut short (its process was killed
    while writing it) is left out.
    """
    text = path.read_text(errors="replace")
    events = []
    for line in text.split("\n")[:-1]:
        if line.strip():
            events.append(parse(line))
    return events


def merge(histories: Iterable[Iterable[Event]]) -> list[Event]:
    """Several processes' events as one history, in time order (stable for equal times)."""
    return sorted((e for events in histories for e in events), key=lambda e: e.time)


def write(path: Path, events: Iterable[Event]) -> None:
    """Write C{events} to C{path}, one line each."""
    with path.open("w") as out:
        for event in events:
            out.write(event.line() + "\n")


class Recorder:
    """
    What a client process writes its events with: each C{invoke} gets the
    next op id of the process; every line is flushed at once (the process
    may be killed at any time).

    @ivar t0: the monotonic time the soak started (times are relative to it).
    """

    def __init__(self, out: IO[str], process: str, t0: float, last_op: int = 0) -> None:
        """@param last_op: the number of the last op id it used before (a restarted process)."""
        self._out = out
        self.process = process
        self.t0 = t0
        self._next = last_op

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _write(self, event: Event) -> None:
        self._out.write(event.line() + "\n")
        self._out.flush()

    def new_op(self) -> str:
        """A fresh op id of this process."""
        self._next += 1
        return f"{self.process}:{self._next}"

    def invoke(self, f: str, value: dict[str, Any]) -> str:
        """Write an invoke; its op id."""
        op = self.new_op()
        self._write(Event(self.now(), self.process, INVOKE, f, op, value))
        return op

    def complete(self, op: str, kind: str, f: str, value: dict[str, Any]) -> None:
        """Write how op C{op} ended: C{kind} is C{ok}, C{fail} or C{info}."""
        self._write(Event(self.now(), self.process, kind, f, op, value))

    def observe(self, f: str, value: dict[str, Any]) -> None:
        """Write an observation (an C{ok} with no invoke) under an op id of its own."""
        self._write(Event(self.now(), self.process, OK, f, self.new_op(), value))


def resume(path: Path) -> list[Event]:
    """
    The events a process wrote to C{path} before it died, for its next
    incarnation to go on from: a last line cut short is removed from the
    file (that event was never written whole).
    """
    if not path.exists():
        return []
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        with path.open("r+b") as f:
            f.truncate(len(whole))
    return read(path)


def op_number(op: str) -> int:
    """The number of an op id (C{process:n})."""
    tail = op.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def ops(events: Iterable[Event]) -> Iterator[tuple[Event, Event | None]]:
    """
    Each invoked operation with how it ended (None: it never did, its
    process was killed or the soak ended first), in the order invoked.
    """
    ended: dict[str, Event] = {}
    invoked: list[Event] = []
    for event in events:
        if event.type == INVOKE:
            invoked.append(event)
        else:
            ended.setdefault(event.op, event)
    for event in invoked:
        yield event, ended.get(event.op)
