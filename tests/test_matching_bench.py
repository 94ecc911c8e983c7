"""
Tests for L{malamute_pack.matching.bench}: every workload runs at a tiny size
and prints its line in the documented shape. No timing is asserted.
"""

# twisted.trial's assertion methods carry no annotations.

from __future__ import annotations

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
