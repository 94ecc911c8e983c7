"""
Tests for L{malamute_pack.config_keys}: a config file's key that no part
of the broker reads is refused at start, in one line naming the file, the
line, the key and the known key nearest to it; keys under names the user
chooses (a stream's retention) still pass.
"""

from __future__ import annotations

from pathlib import Path

from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack import settings as _settings
from malamute_pack.config_keys import UnknownKey, first_unknown, matches, nearest
from malamute_pack.startup import read_config
from malamute_pack.zpl import parse_zpl

KNOWN = ("server/timeout", "server/endpoint", "malamute/journal/streams/*/max-count")


class MatchTests(SynchronousTestCase):
    def test_exact(self) -> None:
        """A known key matches itself and nothing longer, shorter or else."""
        self.assertTrue(matches("server/timeout", "server/timeout"))
        self.assertFalse(matches("server/timout", "server/timeout"))
        self.assertFalse(matches("server", "server/timeout"))
        self.assertFalse(matches("server/timeout/ms", "server/timeout"))

    def test_anyName(self) -> None:
        """A * part stands for any one name, not for several."""
        pattern = "malamute/journal/streams/*/max-count"
        self.assertTrue(matches("malamute/journal/streams/audit/max-count", pattern))
        self.assertFalse(matches("malamute/journal/streams/a/b/max-count", pattern))
        self.assertFalse(matches("malamute/journal/streams/audit/max-cout", pattern))


class NearestTests(SynchronousTestCase):
    def test_typo(self) -> None:
        """A misspelt key's nearest known key is the one meant."""
        self.assertEqual(nearest("server/timout", KNOWN), "server/timeout")
        self.assertEqual(nearest("server/endpiont", KNOWN), "server/endpoint")

    def test_anyNameFilledIn(self) -> None:
        """Under a name the user chose, the suggestion keeps that name."""
        self.assertEqual(
            nearest("malamute/journal/streams/audit/max-cont", KNOWN),
            "malamute/journal/streams/audit/max-count",
        )

    def test_nothingNear(self) -> None:
        """A key like no known one gets no suggestion."""
        self.assertIsNone(nearest("zzz", KNOWN))


class FirstUnknownTests(SynchronousTestCase):
    def test_allKnown(self) -> None:
        """Known keys, and keys under chosen names, pass."""
        keys = ["server/timeout", "malamute/journal/streams/audit/max-count"]
        self.assertIsNone(first_unknown(keys, KNOWN))

    def test_inFileOrder(self) -> None:
        """The first unknown key of the file is the one named, with its line."""
        tree = parse_zpl("server\n    timeout = 1\n    endpiont = x\n    timout = 5000\n")
        self.assertEqual(
            first_unknown(list(tree), KNOWN, tree.lines),
            UnknownKey("server/endpiont", 3, "server/endpoint"),
        )

    def test_describe(self) -> None:
        """The line names the file, the line, the key and the key meant."""
        self.assertEqual(
            UnknownKey("server/timout", 4, "server/timeout").describe("malamute.cfg"),
            "config error: malamute.cfg line 4: unknown key server/timout;"
            " did you mean server/timeout?",
        )
        self.assertEqual(
            UnknownKey("zzz", 2, None).describe("m.cfg"),
            "config error: m.cfg line 2: unknown key zzz",
        )


class BrokerKeysTests(SynchronousTestCase):
    """The broker's known keys (L{malamute_pack.settings.CONFIG_KEYS}) as start-up checks them."""

    def read(self, text: str) -> _settings.Settings:
        path = Path(self.mktemp())
        path.write_text(text)
        return read_config(
            path,
            lambda tree: _settings.from_zpl(tree),
            (_settings.SettingsError,),
            _settings.CONFIG_KEYS,
        )

    def refused(self, text: str) -> str:
        with self.assertRaises(usage.UsageError) as caught:
            self.read(text)
        return str(caught.exception)

    def test_typos(self) -> None:
        """The typos a user makes are refused, naming the line and the key meant."""
        for text, line in [
            (
                "server\n    timeout = 1\n    timout = 5000\n",
                "line 3: unknown key server/timout; did you mean server/timeout?",
            ),
            (
                "malamute\n    journl\n        enabled = 0\n",
                "line 3: unknown key malamute/journl/enabled;"
                " did you mean malamute/journal/enabled?",
            ),
            (
                "malamute\n    pack\n        nmae = wolves\n",
                "line 3: unknown key malamute/pack/nmae; did you mean malamute/pack/name?",
            ),
            (
                "malamute\n    bridge\n        rat = 5\n",
                "line 3: unknown key malamute/bridge/rat; did you mean malamute/bridge/rate?",
            ),
        ]:
            self.assertIn(line, self.refused(text))

    def test_everyFeaturesKeys(self) -> None:
        """Every key a feature declares is known, and read."""
        found = self.read(
            "malamute\n"
            "    journal\n"
            "        enabled = 0\n"
            "        streams\n"
            "            audit\n"
            "                max-age = 60\n"
            "    pack\n        beacon-port = 5671\n"
            "    pair\n        misses = 4\n"
            "    bridge\n        hops = 3\n"
            "    http\n        endpoint = tcp:8180\n"
            "    stats\n        interval = 2\n"
            "    limits\n        max-clients = 9\n"
        )
        self.assertEqual(
            (
                found.journal,
                found.journal_config.per_stream_retention["audit"].max_age_s,
                found.pack.beacon_port,
                found.pair.misses,
                found.bridge.hops,
                found.http,
                found.stats_interval,
                found.limits.max_clients,
            ),
            (False, 60.0, 5671, 4, 3, "tcp:8180", 2.0, 9),
        )

    def test_cBrokerConfig(self) -> None:
        """The C broker's own malamute.cfg, with keys this broker ignores, still serves."""
        found = self.read(
            "server\n"
            "    timeout = 10000\n"
            "    background = 0\n"
            "    workdir = .\n"
            "    verbose = 0\n"
            "    auth\n        verbose = 0\n"
            "mlm_server\n"
            "    verbose = 0\n"
            "    echo = binding Malamute service to 'ipc://@/malamute'\n"
            "    security\n        mechanism = null\n"
            "    bind\n        endpoint = ipc://@/malamute\n"
        )
        self.assertEqual(found.endpoints, ("ipc://@/malamute",))

    def test_unknownLimit(self) -> None:
        """A limit that is none is refused by the settings, which list the limits there are."""
        self.assertIn(
            "unknown limit; known: ", self.refused("malamute\n    limits\n        x = 1\n")
        )
