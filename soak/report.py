"""
The soak's run directory and its summary. A run writes, under
C{--out DIR}, a directory named for its topology, seed and start:

- C{history.jsonl}: every client event, in time order (L{soak.history});
- C{faults.jsonl}: every fault started and ended, with its target and
  parameters, and what the brokers did meanwhile (exits, refusals, damage
  reports, journals started afresh) (L{soak.nemesis});
- C{hN/broker.log}: each broker's log, every start of it;
  C{clients/NAME.jsonl} and C{.err}: each client's own events and errors;
- C{memory.jsonl}: every memory sample (process, kind, RSS in bytes);
- C{summary.json}: the operations acknowledged by kind, the faults by
  kind, the violations (each with the op ids and values involved), what
  was excused and why, each broker's memory at start and end (MiB), and
  the command that replays the seed.

A run that passes keeps only C{summary.json}, unless told to keep all
(C{--keep}); one that fails keeps everything (and the brokers' data
directories, moved beside their logs).

Tests: ``tests/system/test_soak.py``.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from soak.checker import Report, Result, Sample
from soak.history import Event
from soak.history import write as write_history
from soak.memory import figures

# Violations written in the summary at most, per kind (their count is exact).
LISTED: Final = 50
# Acknowledged operations, as the summary counts them (the checker's names).
ACKNOWLEDGED: Final = {
    "appends": "appends acknowledged",
    "records": "records acknowledged",
    "letters": "send acknowledged",
    "requests": "request acknowledged",
    "reader commits": "reader commits acknowledged",
    "member commits": "member commits acknowledged",
}


def summary(
    *,
    run: Mapping[str, Any],
    result: Result,
    faults: Mapping[str, int],
    broker_events: Mapping[str, int],
    reports: Sequence[Report],
    samples: Sequence[Sample],
    restarts: Mapping[str, int],
) -> dict[str, Any]:
    """The summary of a run (see the module)."""
    listed: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for violation in result.violations:
        if len(listed[violation.kind]) < LISTED:
            listed[violation.kind].append(violation.as_json())
    excused: dict[str, Counter[str]] = defaultdict(Counter)
    for item in result.excused:
        excused[item.kind][item.reason] += 1
    brokers = figures(samples, "broker")
    for name, count in restarts.items():
        brokers.setdefault(name, {})["starts"] = count
    clients = figures(samples, "client")
    return {
        **run,
        "passed": result.ok,
        "acknowledged": {k: result.counts.get(v, 0) for k, v in ACKNOWLEDGED.items()},
        "counts": result.counts,
        "faults": dict(sorted(faults.items())),
        "broker_events": dict(sorted(broker_events.items())),
        "violations": {"total": len(result.violations), "by_kind": result.by_kind()},
        "violation_list": dict(listed),
        "excused": {kind: dict(reasons) for kind, reasons in excused.items()},
        "reports": [
            {"time": r.time, "broker": r.broker, "store": r.store, "scope": r.scope, "line": r.line}
            for r in reports
        ],
        "memory": {
            "brokers": brokers,
            "clients_max_mib": max((c["max_mib"] for c in clients.values()), default=0),
        },
    }


def write(
    run_dir: Path, events: Sequence[Event], data: Mapping[str, Any], samples: Sequence[Sample]
) -> None:
    """Write the history, the memory samples and the summary into the run directory."""
    write_history(run_dir / "history.jsonl", events)
    with (run_dir / "memory.jsonl").open("w") as out:
        for s in samples:
            line = {"time": round(s.time, 3), "process": s.process, "kind": s.kind, "rss": s.rss}
            out.write(json.dumps(line) + "\n")
    (run_dir / "summary.json").write_text(json.dumps(data, indent=1) + "\n")


def read_samples(path: Path) -> list[Sample]:
    """The memory samples L{write} wrote (none if there is no such file)."""
    if not path.exists():
        return []
    return [
        Sample(f["time"], f["process"], f["kind"], f["rss"])
        for f in map(json.loads, path.read_text().splitlines())
    ]


def prune(run_dir: Path) -> None:
    """Remove everything of a run directory but its summary."""
    for path in run_dir.iterdir():
        if path.name == "summary.json":
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def length(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def text(data: Mapping[str, Any]) -> str:
    """The summary for a terminal: figures, and each violation kind's first few."""
    lines = [
        f"soak {data['topology']} seed {data['seed']}: {length(data['seconds'])} of load, "
        + ("PASSED" if data["passed"] else f"FAILED: {data['violations']['total']} violation(s)"),
        "acknowledged: " + ", ".join(f"{k} {v}" for k, v in data["acknowledged"].items()),
        "faults: " + (", ".join(f"{k} {v}" for k, v in data["faults"].items()) or "none"),
    ]
    if data["broker_events"]:
        lines.append(
            "by themselves: " + ", ".join(f"{k} {v}" for k, v in data["broker_events"].items())
        )
    memory = data["memory"]["brokers"]
    lines.append(
        "broker memory (MiB start/end/max): "
        + ", ".join(
            f"{name} {m.get('start_mib')}/{m.get('end_mib')}/{m.get('max_mib')}"
            for name, m in sorted(memory.items())
        )
    )
    for kind, reasons in data["excused"].items():
        total = sum(reasons.values())
        lines.append(f"excused {kind}: {total} ({'; '.join(list(reasons)[:2])})")
    for kind, items in data["violation_list"].items():
        count = data["violations"]["by_kind"][kind]
        lines.append(f"VIOLATION {kind} ({count}):")
        lines += [f"  {item['text']}  [ops {', '.join(item['ops'][:4])}]" for item in items[:5]]
    lines.append(f"replay: {data['command']}")
    if "run_dir" in data:
        lines.append(f"run directory: {data['run_dir']}")
    return "\n".join(lines)
