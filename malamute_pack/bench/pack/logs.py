"""
The brokers' logs as the pack benchmark reads them: the pack event a line
says (L{parse_line}), whether a line is a warning, an error or a traceback
(L{notable}), who has joined whom as the lines are read
(L{DiscoveryWatch}), and the new lines of a growing log file
(L{LogFollower}).

Tests: ``tests/system/test_bench_pack.py``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_REACHABLE = re.compile(
    r"Malamute pack (?P<pack>\S+): broker (?P<name>\S+) \([0-9A-F]+\) reachable by peers at \S+"
)
_MEMBER = re.compile(r"\] pack (?P<pack>\S+): broker (?P<name>\S+) (?P<event>joined|left)\s*$")
_NOTABLE = re.compile(r"#(?:warn|error|critical)\]|Traceback|Unhandled")


@dataclass(frozen=True, slots=True)
class LogEvent:
    """A pack event in a broker's log: C{kind} is reachable, joined or left."""

    kind: str
    pack: str
    name: str


def parse_line(line: str) -> LogEvent | None:
    """The pack event a broker's log line says, if any."""
    found = _REACHABLE.search(line)
    if found:
        return LogEvent("reachable", found["pack"], found["name"])
    member = _MEMBER.search(line)
    if member:
        return LogEvent(member["event"], member["pack"], member["name"])
    return None


def notable(line: str) -> bool:
    """Whether a broker's log line is a warning, an error or a traceback."""
    return _NOTABLE.search(line) is not None


class DiscoveryWatch:
    """
    Who has joined whom, from the brokers' log lines as they are read.

    @ivar reachable: per broker, when its "reachable" line was read.
    @ivar joined: per broker, the peers it has logged joined, and when.
    @ivar completed: per broker, when it first had every other joined.
    @ivar left: "left" events seen, as (broker, peer).
    """

    def __init__(self, pack: str, names: Sequence[str]) -> None:
        self.pack = pack
        self.names = list(names)
        self.reachable: dict[str, float] = {}
        self.joined: dict[str, dict[str, float]] = {name: {} for name in names}
        self.completed: dict[str, float] = {}
        self.left: list[tuple[str, str]] = []

    def feed(self, name: str, line: str, now: float) -> None:
        """Broker C{name} logged C{line}, read at C{now}."""
        event = parse_line(line)
        if event is None or event.pack != self.pack:
            return
        if event.kind == "reachable":
            self.reachable.setdefault(name, now)
        elif event.kind == "joined":
            peers = self.joined[name]
            peers.setdefault(event.name, now)
            others = set(self.names) - {name}
            if name not in self.completed and others <= set(peers):
                self.completed[name] = now
        else:
            self.left.append((name, event.name))
            self.joined[name].pop(event.name, None)

    @property
    def all_reachable(self) -> float | None:
        """When the last broker's "reachable" line was read, once all were."""
        if len(self.reachable) < len(self.names):
            return None
        return max(self.reachable.values())

    @property
    def complete(self) -> bool:
        return len(self.completed) == len(self.names)

    def discovery_secs(self) -> float | None:
        """From the last "reachable" to the last broker complete; None until then."""
        start = self.all_reachable
        if start is None or not self.complete:
            return None
        return max(0.0, max(self.completed.values()) - start)

    def formation_secs(self) -> float | None:
        """From the first "reachable" to the last broker complete; None until then."""
        if self.all_reachable is None or not self.complete:
            return None
        return max(0.0, max(self.completed.values()) - min(self.reachable.values()))

    def broker_secs(self) -> dict[str, float]:
        """Per complete broker, from the last "reachable" to its completion (at least 0)."""
        start = self.all_reachable
        if start is None:
            return {}
        return {name: max(0.0, when - start) for name, when in self.completed.items()}

    def missing(self) -> dict[str, list[str]]:
        """Per incomplete broker, the others it has not logged joined."""
        return {
            name: sorted(set(self.names) - {name} - set(self.joined[name]))
            for name in self.names
            if name not in self.completed
        }


class LogFollower:
    """The complete lines a growing log file gains between two calls."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in lines]
