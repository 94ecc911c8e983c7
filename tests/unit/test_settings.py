"""
Tests for L{malamute_pack.settings}: the settings composed of the
broker's own and each feature's section, from a config file and the
options, checked by each feature.
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack import settings as _settings
from malamute_pack.config_keys import first_unknown
from malamute_pack.transport.security import SecurityFiles


class ComposeTests(SynchronousTestCase):
    def test_fromZpl(self) -> None:
        """The broker's keys and every feature's are read from one config."""
        found = _settings.from_zpl(
            {
                "server/timeout": ["7000"],
                "malamute/journal/commit-batch": ["50"],
                "malamute/pack/name": ["wolves"],
                "malamute/pair/role": ["backup"],
                "malamute/bridge/rate": ["5"],
                "malamute/stats/interval": ["3"],
            }
        )
        self.assertEqual(
            (
                found.timeout_ms,
                found.journal_config.commit_max_batch,
                found.pack.name,
                found.pair.role,
                found.bridge.rate_kbps,
                found.stats_interval,
            ),
            (7000, 50, "wolves", "backup", 5, 3.0),
        )

    def test_fromOptions(self) -> None:
        """Each feature reads its own options over what the config gave."""
        base = _settings.from_zpl({"malamute/pack/name": ["a"], "malamute/pair/misses": ["4"]})
        found = _settings.from_options(
            {"pack": "b", "no-journal": True, "http": "tcp:1", "bridge-hops": 2}, base
        )
        self.assertEqual(
            (found.pack.name, found.pair.misses, found.journal, found.http, found.bridge.hops),
            ("b", 4, False, "tcp:1", 2),
        )

    def test_checkEachFeature(self) -> None:
        """Each feature's check sees the broker's own settings (a pair needs the journal)."""
        pair = _settings.from_zpl(
            {
                "malamute/journal/enabled": ["0"],
                "malamute/pair/role": ["primary"],
                "malamute/pair/bind": ["tcp://a:1"],
                "malamute/pair/connect": ["tcp://b:1"],
            }
        )
        with self.assertRaises(_settings.SettingsError) as caught:
            _settings.check(pair)
        self.assertIn("--no-journal", str(caught.exception))

    def test_checkCompletes(self) -> None:
        """A feature's check may complete its section: the bridges' repair endpoint."""
        found = _settings.check(
            _settings.from_zpl(
                {
                    "mlm_server/bind/endpoint": ["tcp://10.0.0.1:9999"],
                    "malamute/bridge/out": ["s=tcp://127.0.0.1:7000"],
                }
            )
        )
        self.assertEqual(found.bridge.endpoint, "tcp://10.0.0.1:9999")

    def test_securityFiles(self) -> None:
        """The security service gets the four fields it reads, with the mechanisms in use."""
        settings = _settings.Settings(
            endpoints=("plain:tcp://*:1", "tcp://*:2"),
            passwords=Path("pw"),
            access_file=Path("acl"),
        )
        self.assertEqual(
            settings.security_files(),
            SecurityFiles(frozenset({"plain", "null"}), Path("pw"), None, Path("acl")),
        )


class LastValueStreamTests(SynchronousTestCase):
    def test_compactBySubject(self) -> None:
        """
        C{malamute/streams/NAME/compact = subject} makes NAME a last-value
        stream; an empty value makes it an ordinary one again; the limit
        on subjects is a limit like the others.
        """
        found = _settings.from_zpl(
            {
                "malamute/streams/ticks/compact": ["subject"],
                "malamute/streams/quotes/compact": ["subject"],
                "malamute/limits/last-value-subjects": ["500"],
            }
        )
        self.assertEqual(found.journal_config.compacted, frozenset({"ticks", "quotes"}))
        self.assertEqual(found.limits.last_value_subjects, 500)
        off = _settings.from_zpl({"malamute/streams/ticks/compact": ["subject", ""]}, found)
        self.assertEqual(off.journal_config.compacted, frozenset({"quotes"}))
        self.assertEqual(_settings.Settings().limits.last_value_subjects, 1_000_000)

    def test_otherCompactionRefused(self) -> None:
        """Any other value is refused, in one line naming the key and what it takes."""
        with self.assertRaises(_settings.SettingsError) as caught:
            _settings.from_zpl({"malamute/streams/ticks/compact": ["key"]})
        message = str(caught.exception)
        self.assertIn("malamute/streams/ticks/compact", message)
        self.assertIn("subject", message)
        self.assertNotIn("\n", message)

    def test_keyKnown(self) -> None:
        """The compaction key is a known config key; a misspelt one is not."""
        keys = ["malamute/streams/ticks/compact", "malamute/streams/ticks/compcat"]
        unknown = first_unknown(keys, _settings.CONFIG_KEYS)
        assert unknown is not None
        self.assertEqual(unknown.key, "malamute/streams/ticks/compcat")
