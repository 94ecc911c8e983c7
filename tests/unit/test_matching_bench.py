"""
Tests for L{malamute_pack.matching.bench}: every workload runs at a tiny size
and prints its line in the documented shape. No timing is asserted.
"""

# twisted.trial's assertion methods carry no annotations.

from __future__ import annotations

import contextlib
import io
import random
import re

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.matching import SubscriptionIndex, bench

_NUMBER = r"\d+(?:\.\d+)?"


class WorkloadLineTests(SynchronousTestCase):
    def test_openamq(self) -> None:
        """The openamq workload reports sizes, both timings and the match count."""
        line = bench.openamq(subs=30, topics=20, messages=200)
        self.assertRegex(
            line,
            rf"^workload=openamq subs=30 topics=20 messages=200 "
            rf"compile_s={_NUMBER} match_s={_NUMBER} matches=\d+$",
        )

    def test_scaling(self) -> None:
        """The scaling workload reports nanoseconds per message."""
        line = bench.scaling(10, messages=100, topics=20)
        self.assertRegex(line, rf"^workload=scaling subs=10 ns_per_message={_NUMBER}$")

    def test_naive(self) -> None:
        """
        The naive workload checks the engine against the regex scan (it raises
        if their match counts differ) and reports both costs and the ratio.
        """
        line = bench.naive(subs=30, topics=20, engine_messages=200, naive_messages=50)
        self.assertRegex(
            line,
            rf"^workload=naive subs=30 speedup={_NUMBER} "
            rf"engine_ns_per_message={_NUMBER} naive_ns_per_message={_NUMBER}$",
        )

    def test_uncached(self) -> None:
        """
        The uncached workload checks the index against the old per-pattern
        scan (it raises if their match counts differ, or if a subject was
        not new) and reports both costs per new subject, the ratio, a cached
        subject's cost and the Set build time.
        """
        line = bench.uncached(
            clients=2, readers=20, subjects=300, scan_subjects=50, cached_messages=200
        )
        self.assertRegex(
            line,
            rf"^workload=uncached patterns=40 clients=2 readers=20 "
            rf"uncached_us_per_lookup={_NUMBER} scan_us_per_lookup={_NUMBER} "
            rf"speedup={_NUMBER} cached_us_per_lookup={_NUMBER} set_build_ms={_NUMBER}$",
        )

    def test_uncachedSubjectsMatchSomeReaders(self) -> None:
        """
        The uncached workload's subjects are all distinct, and some match a
        reader's regular expression, so lookups find owners, not only misses.
        """
        rng = random.Random(0)
        regexes = [bench.reader_regex(rng, c, r, 100) for c in range(3) for r in range(100)]
        subjects = [bench.fresh_subject(rng, serial, len(regexes)) for serial in range(2000)]
        self.assertEqual(len(set(subjects)), len(subjects))
        self.assertEqual(len(set(regexes)), len(regexes))
        index: SubscriptionIndex[int] = SubscriptionIndex()
        for number, regex in enumerate(regexes):
            index.subscribe(number // 100, regex)
        matched = sum(1 for subject in subjects if index.match(subject))
        self.assertGreater(matched, 20)
        self.assertLess(matched, len(subjects))

    def test_workloadOption(self) -> None:
        """--workload picks the workloads to run; an unknown name is refused."""
        self.assertEqual(bench.WORKLOADS, ("openamq", "scaling", "naive", "uncached"))
        with contextlib.redirect_stderr(io.StringIO()) as usage:
            self.assertRaises(SystemExit, bench.main, ["--workload", "nope"])
        self.assertIn("invalid choice: 'nope'", usage.getvalue())

    def test_regexTranslationAgreesWithTopic(self) -> None:
        """The naive workload's regexes mean what the topic patterns they come from mean."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        patterns = ["gold.*.usd.*.*", "*.*.*.*.spot", "oil.lon.eur.buy.late"]
        for pattern in patterns:
            index.subscribe("topic:" + pattern, "topic:" + pattern)
            index.subscribe(pattern, bench.topic_as_regex(pattern))
        for topic in bench.all_topics()[::97]:
            found = index.match(topic)
            for pattern in patterns:
                self.assertEqual(pattern in found, "topic:" + pattern in found, topic)
        self.assertIsNotNone(re.fullmatch(bench.topic_as_regex("a.*"), "a.b"))
