"""
Tests for L{malamute_pack.feature}: what the features say of themselves,
as the settings and the tap compose them, and the number readers they
share.
"""

from __future__ import annotations

import dataclasses

from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack import settings as _settings
from malamute_pack.feature import SettingsError, count, last, parse_seconds, whole_number
from malamute_pack.tap import Options


class NumberTests(SynchronousTestCase):
    def test_wholeNumber(self) -> None:
        """Whole numbers of 0 or more are read; max only where allowed; others refused by key."""
        self.assertEqual(whole_number("k", "12"), 12)
        self.assertIsNone(whole_number("k", " MAX ", allow_max=True))
        self.assertEqual(count("k", "0"), 0)
        for value, why in [("max", "not a whole number"), ("-1", "negative")]:
            with self.assertRaises(SettingsError) as caught:
                whole_number("k", value)
            self.assertEqual(str(caught.exception), f"k: {value!r} is {why}")

    def test_seconds(self) -> None:
        """Seconds are more than 0 and finite."""
        self.assertEqual(parse_seconds("k", "0.5"), 0.5)
        for value in ("0", "inf", "soon"):
            self.assertRaises(SettingsError, parse_seconds, "k", value)

    def test_last(self) -> None:
        """A key's last value wins; a missing key has none."""
        self.assertEqual(last({"k": ["1", "2"]}, "k"), "2")
        self.assertIsNone(last({}, "k"))


class FeaturesTests(SynchronousTestCase):
    """The features as L{malamute_pack.settings.FEATURES} lists them."""

    def test_order(self) -> None:
        """Their services start in this order, operations (which show the others) last."""
        self.assertEqual(
            [feature.name for feature in _settings.FEATURES],
            ["journal", "pack", "bridges", "pair", "operations"],
        )

    def test_oneDecidesActivity(self) -> None:
        """Only the pair decides whether the broker is active; the pack and bridges wait on it."""
        features = {feature.name: feature for feature in _settings.FEATURES}
        self.assertEqual([n for n, f in features.items() if f.decides_activity], ["pair"])
        self.assertEqual([n for n, f in features.items() if f.while_active], ["pack", "bridges"])
        self.assertEqual([n for n, f in features.items() if f.reads], ["pack", "bridges", "pair"])

    def test_sections(self) -> None:
        """Each feature's section of the default settings is its own default, and goes back."""
        default = _settings.Settings()
        for feature in _settings.FEATURES:
            found = _settings.section(default, feature)
            self.assertEqual(found, feature.section_type())
            self.assertEqual(_settings.with_section(default, feature, found), default)

    def test_flatSections(self) -> None:
        """A section whose fields are the settings' own is written to those fields."""
        [ops] = [f for f in _settings.FEATURES if f.name == "operations"]
        changed = dataclasses.replace(_settings.section(_settings.Settings(), ops), http="tcp:1")
        self.assertEqual(_settings.with_section(_settings.Settings(), ops, changed).http, "tcp:1")

    def test_keysDeclared(self) -> None:
        """Every feature's config keys are among the broker's known ones."""
        for feature in _settings.FEATURES:
            self.assertTrue(feature.config_keys, feature.name)
            for key in feature.config_keys:
                self.assertIn(key, _settings.CONFIG_KEYS)

    def test_options(self) -> None:
        """The broker's options are its own and each feature's."""
        options = Options()
        for name in ("config", "no-journal", "pack", "gossip-bind", "bridge-out", "pair", "http"):
            self.assertIn(name, options.synonyms)
        self.assertRaises(usage.UsageError, options.parseOptions, ["--stats-interval", "0"])
