"""
Benchmark of the matching engine: ``python -m malamute_pack.matching.bench``.

Prints one line per workload:

- ``openamq``: the OpenAMQ test from the whitepaper (2000 topic subscriptions
  with ``*``/``#``, 2000 topics from five word tables, 1M messages). OpenAMQ
  took 12 s to compile and 26 s to match on a 2 GHz machine.
- ``scaling``: nanoseconds per message, subjects cached, as the number of
  subscriptions grows from 100 to 100k.
- ``naive``: this engine against what the C broker does, a scan of compiled
  regular expressions per message, with the same regular expressions and
  the same subjects.
- ``uncached``: microseconds per subject never seen before (a cache miss, so
  the regular-expression index really runs) with 15 clients x 1000 distinct
  regular-expression readers, against the per-pattern scan that index used
  to do (Python's ``re``, each pattern in turn) on the same subjects; also
  the Set build and a cached subject's cost.

The garbage collector is paused while a loop is timed (as ``timeit`` does).

``--workload NAME`` (repeatable) runs only those workloads.

Tests: ``tests/unit/test_matching_bench.py`` (runs every workload small).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import re
import time
from collections.abc import Callable, Sequence

from pyroaring import BitMap

from malamute_pack.matching.index import SubscriptionIndex

#: The OpenAMQ test's five word tables: 6 x 7 x 6 x 5 x 6 = 7560 topics.
WORD_TABLES: tuple[tuple[str, ...], ...] = (
    ("gold", "oil", "pork", "chips", "bonds", "debt"),
    ("lon", "ny", "hk", "jo", "tk", "sg", "mo"),
    ("usd", "eur", "gbp", "jpy", "chy", "aud"),
    ("buy", "sell", "hold", "short", "long"),
    ("spot", "early", "late", "open", "close", "future"),
)


class Subscriber:
    """Stands for a broker client: hashable by identity, as client objects are."""

    __slots__ = ("number",)

    def __init__(self, number: int) -> None:
        self.number = number


def all_topics() -> list[str]:
    """Every topic the word tables spell, in table order."""
    return [".".join(words) for words in itertools.product(*WORD_TABLES)]


def wildcard_topic(rng: random.Random, star: float, hash_tail: float) -> str:
    """
    A topic pattern over the word tables: each word is ``*`` with probability
    ``star``, and with probability ``hash_tail`` a tail of it becomes ``#``.
    """
    words = [rng.choice(table) if rng.random() >= star else "*" for table in WORD_TABLES]
    if rng.random() < hash_tail:
        start = rng.randrange(len(words))
        words[start:] = ["#"]
    return ".".join(words)


def topic_as_regex(pattern: str) -> str:
    """The regular expression a v1 client would send for a ``*``-only topic pattern."""
    return "^" + r"\.".join("[^.]+" if w == "*" else re.escape(w) for w in pattern.split(".")) + "$"


def _timed(loop: Callable[[], int]) -> tuple[float, int]:
    """Seconds ``loop`` takes with the collector paused, and what it returned."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        value = loop()
        return time.perf_counter() - start, value
    finally:
        gc.enable()


def _count_matches(index: SubscriptionIndex[Subscriber], subjects: Sequence[str]) -> int:
    match = index.match
    total = 0
    for subject in subjects:
        total += len(match(subject))
    return total


def openamq(subs: int = 2000, topics: int = 2000, messages: int = 1_000_000, seed: int = 1) -> str:
    """The OpenAMQ test: compile every topic, then match ``messages`` random ones."""
    rng = random.Random(seed)
    index: SubscriptionIndex[Subscriber] = SubscriptionIndex(cache_size=max(topics, 1))
    # Subscribers draw patterns independently, so some coincide and share a
    # bit; about 9% of them match a message, like OpenAMQ's 170M matches.
    for number in range(subs):
        pattern = wildcard_topic(rng, star=0.4, hash_tail=0.15)
        index.subscribe(Subscriber(number), "topic:" + pattern)
    chosen = rng.sample(all_topics(), topics)
    stream = rng.choices(chosen, k=messages)
    compile_s, _ = _timed(lambda: _count_matches(index, chosen))
    match_s, matches = _timed(lambda: _count_matches(index, stream))
    return (
        f"workload=openamq subs={subs} topics={topics} messages={messages} "
        f"compile_s={compile_s:.3f} match_s={match_s:.3f} matches={matches}"
    )


def scaling(subs: int, messages: int = 1_000_000, topics: int = 2000, seed: int = 2) -> str:
    """Cost of a message whose subject is cached, with ``subs`` subscriptions."""
    rng = random.Random(seed)
    index: SubscriptionIndex[Subscriber] = SubscriptionIndex(cache_size=max(topics, 1))
    for number in range(subs):
        pattern = wildcard_topic(rng, star=0.3, hash_tail=0.0)
        index.subscribe(Subscriber(number), "topic:" + pattern)
    chosen = rng.sample(all_topics(), topics)
    _count_matches(index, chosen)
    stream = rng.choices(chosen, k=messages)
    seconds, _ = _timed(lambda: _count_matches(index, stream))
    return f"workload=scaling subs={subs} ns_per_message={seconds / messages * 1e9:.0f}"


def naive(
    subs: int = 10_000,
    topics: int = 2000,
    engine_messages: int = 1_000_000,
    naive_messages: int = 1000,
    seed: int = 3,
) -> str:
    """This engine against a per-message scan of the same regular expressions."""
    rng = random.Random(seed)
    subscribers = [Subscriber(number) for number in range(subs)]
    regexes = [topic_as_regex(wildcard_topic(rng, star=0.3, hash_tail=0.0)) for _ in subscribers]
    chosen = rng.sample(all_topics(), topics)
    stream = rng.choices(chosen, k=max(engine_messages, naive_messages))

    index: SubscriptionIndex[Subscriber] = SubscriptionIndex(cache_size=max(topics, 1))
    for subscriber, regex in zip(subscribers, regexes, strict=True):
        index.subscribe(subscriber, regex)
    _count_matches(index, chosen)
    engine_stream, naive_stream = stream[:engine_messages], stream[:naive_messages]
    engine_s, _ = _timed(lambda: _count_matches(index, engine_stream))

    # The C broker's way: every subscriber's expression against every message.
    scan = [
        (re.compile(regex).search, subscriber)
        for regex, subscriber in zip(regexes, subscribers, strict=True)
    ]

    def scan_all() -> int:
        total = 0
        for subject in naive_stream:
            total += len({subscriber for search, subscriber in scan if search(subject)})
        return total

    naive_s, naive_matches = _timed(scan_all)
    check = _count_matches(index, naive_stream)
    if check != naive_matches:
        raise AssertionError(f"engine found {check} matches, the scan {naive_matches}")
    engine_ns = engine_s / engine_messages * 1e9
    naive_ns = naive_s / naive_messages * 1e9
    return (
        f"workload=naive subs={subs} speedup={naive_ns / engine_ns:.0f} "
        f"engine_ns_per_message={engine_ns:.0f} naive_ns_per_message={naive_ns:.0f}"
    )


#: Measurements a sensor reader of the ``uncached`` workload asks for.
MEASUREMENTS = ("temp", "humidity", "pressure", "co2", "light")


def reader_regex(rng: random.Random, client: int, reader: int, readers: int) -> str:
    """
    A distinct regular expression as a monitoring client would send, in one
    of four shapes; ``client * readers + reader`` makes it unique.
    """
    number, measurement = client * readers + reader, rng.choice(MEASUREMENTS)
    shape = reader % 4
    if shape == 0:
        return rf"^sensor\.{number}\..*{measurement}$"
    if shape == 1:
        return rf"^site{client}\.rack{reader}\.(cpu|disk)\d+\.{measurement}"
    if shape == 2:
        return rf"^building\.{client}\.floor\.{reader % 50}\.[a-z]+\.{measurement}$"
    return rf"alarm\.{number}\b"


def fresh_subject(rng: random.Random, serial: int, patterns: int) -> str:
    """
    A subject no earlier one equals (``serial`` is in it) in one of the
    readers' four shapes, for a random reader number: some match a reader.
    """
    number, measurement = rng.randrange(patterns + patterns // 10), rng.choice(MEASUREMENTS)
    shape = rng.randrange(4)
    if shape == 0:
        return f"sensor.{number}.room{serial}.{measurement}"
    if shape == 1:
        return f"site{number % 15}.rack{number % 1000}.cpu{serial}.{measurement}"
    if shape == 2:
        return f"building.{number % 15}.floor.{number % 50}.x{serial}.{measurement}"
    return f"alarm.{number}.{serial}"


def uncached(
    clients: int = 15,
    readers: int = 1000,
    subjects: int = 100_000,
    scan_subjects: int = 1000,
    cached_messages: int = 1_000_000,
    seed: int = 4,
) -> str:
    """
    Cost of a new subject with ``clients`` x ``readers`` regular-expression
    readers, through the index (a cache miss each: the RE2 Set runs) and
    through the old per-pattern scan, with the same subjects; then the cost
    of a cached subject.
    """
    rng = random.Random(seed)
    owners = [Subscriber(number) for number in range(clients)]
    regexes = [
        reader_regex(rng, client, reader, readers)
        for client in range(clients)
        for reader in range(readers)
    ]
    fresh = [fresh_subject(rng, serial, len(regexes)) for serial in range(subjects)]
    index: SubscriptionIndex[Subscriber] = SubscriptionIndex(cache_size=10_000)
    for number, regex in enumerate(regexes):
        index.subscribe(owners[number // readers], regex)

    # The first lookup compiles the Set: a burst of subscriptions costs one build.
    build_s, _ = _timed(lambda: len(index.match("warm.up")))
    uncached_s, _ = _timed(lambda: _count_matches(index, fresh))
    if index.stats.hits:
        raise AssertionError(f"{index.stats.hits} subjects were not new")
    recent = fresh[-min(len(fresh), index.cache_size) :]
    repeated = rng.choices(recent, k=cached_messages)
    cached_s, _ = _timed(lambda: _count_matches(index, repeated))

    # What the regular-expression index did before: each pattern in turn,
    # with Python's re (the bench's patterns are ours, so re is safe here).
    scan = [(bit, re.compile(regex).search) for bit, regex in enumerate(regexes)]
    scanned = fresh[:scan_subjects]

    def scan_all() -> int:
        total = 0
        for subject in scanned:
            total += len(BitMap([bit for bit, search in scan if search(subject)]))
        return total

    scan_s, scan_matches = _timed(scan_all)
    check = sum(len(index.match_bits(subject)) for subject in scanned)
    if check != scan_matches:
        raise AssertionError(f"the index found {check} matches, the scan {scan_matches}")
    set_us = uncached_s / len(fresh) * 1e6
    scan_us = scan_s / len(scanned) * 1e6
    cached_us = cached_s / cached_messages * 1e6
    return (
        f"workload=uncached patterns={len(regexes)} clients={clients} readers={readers} "
        f"uncached_us_per_lookup={set_us:.2f} scan_us_per_lookup={scan_us:.0f} "
        f"speedup={scan_us / set_us:.0f} cached_us_per_lookup={cached_us:.2f} "
        f"set_build_ms={build_s * 1e3:.0f}"
    )


SCALING_SIZES = (100, 1000, 10_000, 100_000)
WORKLOADS = ("openamq", "scaling", "naive", "uncached")


def main(argv: Sequence[str] | None = None) -> None:
    """Run every workload, printing each line as soon as it is known."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--messages", type=int, default=1_000_000, help="messages per timed loop (default 1M)"
    )
    parser.add_argument(
        "--workload",
        action="append",
        choices=WORKLOADS,
        help="run this workload (repeatable; default: all of them)",
    )
    options = parser.parse_args(argv)
    chosen = options.workload or WORKLOADS
    if "openamq" in chosen:
        print(openamq(messages=options.messages), flush=True)
    if "scaling" in chosen:
        for size in SCALING_SIZES:
            print(scaling(size, messages=options.messages), flush=True)
    if "naive" in chosen:
        print(naive(engine_messages=options.messages), flush=True)
    if "uncached" in chosen:
        print(uncached(cached_messages=options.messages), flush=True)


if __name__ == "__main__":
    main()
