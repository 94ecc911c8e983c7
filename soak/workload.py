"""
The soak's load, per topology: which client processes (L{soak.client}
jobs) run, on which store, doing what. Every topology has appenders (with
keys) to one stream, letters to mailboxes, requests to a service, durable
readers of the stream and a consumer group of three members; in a pack
they are spread over the brokers, so that letters, requests, records and
the group's members cross between them.

C{pair}: two appenders, a letter sender and its mailbox's owner, a
requester and two workers, a durable reader, three members: all on the
pair. C{pack3}: an appender on each broker; letters from h1 to an owner on
h2 and from h3 to one on h1; requests from h2 to workers on h1 and h3;
readers on h3 and h1; a member on each broker. C{pair-in-pack}: appenders
on the pair and on h3; letters both ways; requests from h3 to workers on
the pair and on h3; readers on h3 and on the pair; two members on the pair
and one on h3.

A job here is the part of a client's job that says what to do; the runner
adds where it writes (C{out}), its stop file and the soak's start time.

Tests: ``tests/system/test_soak.py``.
"""

from __future__ import annotations

from typing import Any, Final

from soak.topology import Layout

STREAM: Final = "orders"
GROUP: Final = "g"
SERVICE: Final = "work"
# The kinds of job that make load (stopped first at the end) and those
# that only receive (stopped once the others are done and all is quiet).
LOAD_KINDS: Final = frozenset({"append", "send", "request"})
READER_KINDS: Final = frozenset({"mailbox", "worker", "consumer", "member"})

Job = dict[str, Any]


def _plan(topology: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, store, fields) of each job of a topology, in order (their names follow)."""
    if topology == "pair":
        p = "pair"
        return [
            ("append", p, {}),
            ("append", p, {}),
            ("send", p, {"to": "box1", "via": [p]}),
            ("mailbox", p, {"address": "box1"}),
            ("request", p, {"to": SERVICE, "via": [p]}),
            ("worker", p, {"service": SERVICE}),
            ("worker", p, {"service": SERVICE}),
            ("consumer", p, {"name": "c1"}),
            ("member", p, {}),
            ("member", p, {}),
            ("member", p, {}),
        ]
    if topology == "pack3":
        return [
            ("append", "h1", {}),
            ("append", "h2", {}),
            ("append", "h3", {}),
            ("send", "h1", {"to": "box1", "via": ["h1", "h2"]}),
            ("mailbox", "h2", {"address": "box1"}),
            ("send", "h3", {"to": "box2", "via": ["h3", "h1"]}),
            ("mailbox", "h1", {"address": "box2"}),
            ("request", "h2", {"to": SERVICE, "via": ["h2", "h1", "h3"]}),
            ("worker", "h1", {"service": SERVICE}),
            ("worker", "h3", {"service": SERVICE}),
            ("consumer", "h3", {"name": "c1"}),
            ("consumer", "h1", {"name": "c2"}),
            ("member", "h1", {}),
            ("member", "h2", {}),
            ("member", "h3", {}),
        ]
    if topology == "pair-in-pack":
        p = "pair"
        return [
            ("append", p, {}),
            ("append", "h3", {}),
            ("send", p, {"to": "box1", "via": [p, "h3"]}),
            ("mailbox", "h3", {"address": "box1"}),
            ("send", "h3", {"to": "box2", "via": ["h3", p]}),
            ("mailbox", p, {"address": "box2"}),
            ("request", "h3", {"to": SERVICE, "via": ["h3", p]}),
            ("worker", p, {"service": SERVICE}),
            ("worker", "h3", {"service": SERVICE}),
            ("consumer", "h3", {"name": "c1"}),
            ("consumer", p, {"name": "c2"}),
            ("member", p, {}),
            ("member", p, {}),
            ("member", "h3", {}),
        ]
    raise ValueError(f"unknown topology {topology!r}")


def jobs(spec: Layout, seed: int, pause: float) -> list[Job]:
    """
    The jobs of a soak of C{spec}: each with its C{kind}, C{process} (a
    name unique in the run), C{store} and C{endpoints}, and what its kind
    needs; C{pause} is the seconds a load job waits between operations.
    """
    made: list[Job] = []
    counts: dict[str, int] = {}
    for kind, store, fields in _plan(spec.topology):
        counts[kind] = counts.get(kind, 0) + 1
        n = counts[kind]
        job: Job = {
            "kind": kind,
            "process": f"{kind}{n}-{store}",
            "store": store,
            "endpoints": spec.endpoints(store),
            **fields,
        }
        if kind == "append":
            job.update(
                stream=STREAM, records=4, subjects=4, pause=pause, settle=30.0, seed=seed * 100 + n
            )
        elif kind in ("send", "request"):
            job["pause"] = pause
        elif kind == "consumer":
            job.update(stream=STREAM, commit_every=20)
        elif kind == "member":
            job.update(stream=STREAM, group=GROUP, name=f"m{n}")
        made.append(job)
    return made


def final_job(spec: Layout) -> Job:
    """The final reads: every store's copy of the stream."""
    return {
        "kind": "final",
        "process": "final",
        "attempts": 5,
        "endpoints": [],
        "store": "",
        "stores": [
            {"store": store, "endpoints": spec.endpoints(store), "streams": [STREAM]}
            for store in spec.stores()
        ],
    }
