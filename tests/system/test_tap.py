"""
Tests for L{malamute_pack.tap}, L{malamute_pack.settings} and the twistd
plugin: options, the C broker's config keys, and real C{twistd malamute}
processes (default endpoint, SIGTERM, the plugin after C{pip install .}).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

import twisted
from malamute_pack import settings as _settings
from malamute_pack.broker.limits import Limits
from malamute_pack.startup import FailFast
from malamute_pack.tap import Options, makeBrokerService, makeService
from malamute_pack.testing.brokerprocess import (
    PROJECT_ROOT,
    BrokerProcess,
    fresh_ipc_endpoint,
    twistd_command,
)
from malamute_pack.transport.curve import write_certificates
from tests.support import skip_slow


def parse(*args: str) -> _settings.Settings:
    options = Options()
    options.parseOptions(list(args))
    result = options["settings"]
    assert isinstance(result, _settings.Settings)
    return result


class OptionsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        """With no options the broker binds ipc://@/malamute, 10 s timeout, NULL security."""
        settings = parse()
        self.assertEqual(settings.endpoints, ("ipc://@/malamute",))
        self.assertEqual(settings.timeout_ms, 10_000)
        self.assertEqual(settings.mechanism, "null")
        self.assertEqual(settings.data_dir, Path("malamute-data"))

    def test_options(self) -> None:
        """--endpoint repeats; --timeout, --data-dir and --passwords are taken."""
        endpoints = ["--endpoint", "tcp://*:9999", "-e", "ipc://@/x"]
        others = ["--timeout", "3000", "--data-dir", "/tmp/d", "--passwords", "pw.cfg"]
        settings = parse(*endpoints, *others)
        self.assertEqual(settings.endpoints, ("tcp://*:9999", "ipc://@/x"))
        self.assertEqual(settings.timeout_ms, 3000)
        self.assertEqual(settings.data_dir, Path("/tmp/d"))
        self.assertEqual((settings.mechanism, settings.passwords), ("plain", Path("pw.cfg")))

    def test_configFile(self) -> None:
        """
        The C broker's malamute.cfg keys set timeout, PLAIN, endpoints and
        queue limits; our own keys set the data directory and any limit;
        command-line options override the file.
        """
        config = Path(self.mktemp())
        config.write_text(
            "server\n    timeout = 7000\n    auth\n        plain = pw.cfg\n"
            "mlm_server\n    security\n        mechanism = plain\n"
            "    bind\n        endpoint = tcp://*:9999\n        endpoint = ipc://@/y\n"
            "    mailbox\n        size-limit = 1000\n"
            "    service\n        queue\n            size-limit = max\n"
            "malamute\n    data-dir = /var/lib/m\n    limits\n        max-clients = 7\n"
        )
        settings = parse("--config", str(config), "--timeout", "9000")
        self.assertEqual(settings.timeout_ms, 9000)
        self.assertEqual(settings.endpoints, ("tcp://*:9999", "ipc://@/y"))
        self.assertEqual((settings.mechanism, settings.passwords), ("plain", Path("pw.cfg")))
        self.assertEqual(settings.limits.mailbox_max_bytes, 1000)
        self.assertEqual(settings.limits.service_max_bytes, Limits().service_max_bytes)
        self.assertEqual(settings.limits.max_clients, 7)
        self.assertEqual(settings.data_dir, Path("/var/lib/m"))

    def test_journalKeys(self) -> None:
        """
        The journal's keys set commit, synchronous levels, retention (also
        per stream) and crash skip; --no-journal turns it off.
        """
        config = Path(self.mktemp())
        config.write_text(
            "malamute\n    journal\n        commit-interval = 20\n        commit-batch = 50\n"
            "        stream-synchronous = off\n        crash-skip = 99\n"
            "        retention\n            max-count = 10\n            max-age = 60\n"
            "        streams\n            audit\n                max-bytes = 4096\n"
        )
        settings = parse("--config", str(config))
        journal = settings.journal_config
        self.assertEqual((journal.commit_interval_s, journal.commit_max_batch), (0.02, 50))
        self.assertEqual((journal.stream_synchronous, journal.crash_skip), ("OFF", 99))
        self.assertEqual((journal.retention.max_count, journal.retention.max_age_s), (10, 60.0))
        audit = journal.per_stream_retention["audit"]
        self.assertEqual((audit.max_count, audit.max_bytes), (10, 4096))
        self.assertTrue(settings.journal)
        self.assertFalse(parse("--no-journal").journal)
        self.assertEqual(settings.journal_path, Path("malamute-data/journal.sqlite"))

    def test_pairOptions(self) -> None:
        """
        --pair and its endpoints, replication and heartbeat are taken, the
        config file's malamute/pair keys too, options winning.
        """
        config = Path(self.mktemp())
        config.write_text(
            "malamute\n    pair\n        role = backup\n        bind = tcp://10.0.0.2:9998\n"
            "        connect = tcp://10.0.0.1:9998\n        replication = async\n"
            "        heartbeat = 250\n        misses = 4\n"
        )
        pair = parse("--config", str(config)).pair
        self.assertEqual(
            (pair.role, pair.bind, pair.connect, pair.replication, pair.heartbeat_ms, pair.misses),
            ("backup", "tcp://10.0.0.2:9998", "tcp://10.0.0.1:9998", "async", 250, 4),
        )
        pair = parse(
            "--config", str(config), "--pair", "primary", "--pair-replication", "sync",
            "--pair-heartbeat", "500",
        ).pair  # fmt: skip
        self.assertEqual((pair.role, pair.replication, pair.heartbeat_ms), ("primary", "sync", 500))
        self.assertIsNone(parse().pair.role)

    def test_badPairSettings(self) -> None:
        """A pair that cannot work is a usage error that says why."""
        link = ["--pair-bind", "tcp://a:1", "--pair-connect", "tcp://b:1"]
        for args, fragment in [
            (["--pair", "leader", *link], "primary or backup"),
            (["--pair", "primary"], "--pair-bind"),
            (["--pair", "primary", "--pair-replication", "maybe", *link], "sync or async"),
            (["--pair", "primary", "--no-journal", *link], "--no-journal"),
            (["--pair", "primary", "--pair-heartbeat", "1", *link], "at least 10 ms"),
        ]:
            with self.assertRaises(usage.UsageError) as ctx:
                parse(*args)
            self.assertIn(fragment, str(ctx.exception))

    def test_badSettings(self) -> None:
        """Inconsistent or unknown settings are usage errors that say why."""
        config = Path(self.mktemp())
        for text, fragment in [
            ("mlm_server\n    security\n        mechanism = gssapi\n", "not supported"),
            ("mlm_server\n    security\n        mechanism = curve\n", "secret certificate"),
            ("server\n    auth\n        acl = acl\n", "needs authentication"),
            ("mlm_server\n    security\n        mechanism = plain\n", "password file"),
            ("malamute\n    limits\n        max-bogus = 1\n", "unknown limit"),
            ("server\n    timeout = soon\n", "not a whole number"),
            ("malamute\n    journal\n        queue-synchronous = sometimes\n", "synchronous"),
        ]:
            config.write_text(text)
            with self.assertRaises(usage.UsageError) as ctx:
                parse("--config", str(config))
            self.assertIn(fragment, str(ctx.exception))

    def test_endpointsBySecurity(self) -> None:
        """
        An endpoint's null:, plain: or curve: prefix sets the security it
        requires; the others take the default (curve once --curve-secret is
        given); the security files' options and config keys are read.
        """
        clients = Path(self.mktemp())
        settings = parse(
            "--curve-secret",
            "server.key_secret",
            "--curve-clients",
            str(clients),
            "--acl",
            "acl",
            "-e",
            "tcp://*:9999",
            "-e",
            "null:ipc://@/local",
            "-e",
            "curve:tcp://*:9998",
        )
        self.assertEqual(
            settings.endpoints_by_mechanism(),
            {"curve": ["tcp://*:9999", "tcp://*:9998"], "null": ["ipc://@/local"]},
        )
        self.assertEqual(settings.curve_clients, clients)
        self.assertEqual(
            (settings.curve_secret, settings.access_file), (Path("server.key_secret"), Path("acl"))
        )
        config = Path(self.mktemp())
        config.write_text(
            "server\n    auth\n        plain = pw\n        acl = rules\n"
            "        curve\n            secret = s.key_secret\n            clients = c\n"
            "mlm_server\n    security\n        mechanism = plain\n"
        )
        settings = parse("--config", str(config))
        self.assertEqual(
            (settings.passwords, settings.access_file, settings.curve_secret),
            (Path("pw"), Path("rules"), Path("s.key_secret")),
        )
        self.assertEqual(settings.curve_clients, Path("c"))

    def test_missingConfig(self) -> None:
        """A config file that does not exist is a usage error."""
        self.assertRaises(usage.UsageError, parse, "--config", "/nonexistent/malamute.cfg")


class MakeServiceTests(SynchronousTestCase):
    def test_failFast(self) -> None:
        """twistd's service is the broker's, in a FailFast that makes start-up errors one line."""
        self.addCleanup(setattr, sys, "excepthook", sys.excepthook)  # make_or_exit sets it
        options = Options()
        options.parseOptions(["-d", self.mktemp(), "-e", "ipc://@/unused", "--no-journal"])
        top = makeService(options)
        self.assertIsInstance(top, FailFast)
        self.assertEqual(len(list(top)), 1)  # type: ignore[call-overload]

    def test_dataDirIsAFile(self) -> None:
        """A data directory that is a file ends twistd with one line, before anything starts."""
        data = Path(self.mktemp())
        data.write_text("")
        options = Options()
        options.parseOptions(["-d", str(data)])
        with self.assertRaises(SystemExit) as caught:
            makeService(options)
        self.assertEqual(
            caught.exception.code,
            f"malamute: data directory {data} is a file, not a directory: give --data-dir a"
            " directory this user can write (it is made if missing)",
        )


class TwistdTests(SynchronousTestCase):
    skip = skip_slow

    def mktemp_dir(self) -> Path:
        path = Path(self.mktemp()).resolve()
        path.mkdir(parents=True)
        return path

    def test_sigtermShutsDownCleanly(self) -> None:
        """
        C{twistd -n malamute} serves, and on SIGTERM logs a clean shutdown
        and exits; with no --data-dir its data directory was made in its
        working directory.
        """
        endpoint = fresh_ipc_endpoint("tap")
        broker = BrokerProcess(self.mktemp_dir(), bind=endpoint)
        broker.start()
        self.assertEqual(broker.stop(), -signal.SIGTERM)
        log = broker.run_log()
        self.assertIn("Malamute broker bound to " + endpoint, log)
        self.assertIn("Main loop terminated.", log)
        self.assertTrue((broker.directory / "malamute-data").is_dir())

    def test_pluginListedAfterPipInstall(self) -> None:
        """
        After a plain (non-editable) C{pip install .}, C{twistd --help}
        lists the malamute plugin: the plugin file is shipped although
        twisted/plugins has no __init__.py. The interpreter runs without
        its site initialisation (C{-S}, Twisted's directory given by hand),
        so that the checkout, which scripts/bootstrap puts on the path of
        .venv, does not answer in place of the installed copy.
        """
        target = self.mktemp_dir()
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
        subprocess.run(
            [*pip, "--no-build-isolation", "--target", str(target), str(PROJECT_ROOT)],
            check=True,
            capture_output=True,
        )
        self.assertTrue((target / "twisted" / "plugins" / "malamute_plugin.py").is_file())
        self.assertFalse((target / "twisted" / "plugins" / "__init__.py").exists())
        site_packages = Path(twisted.__file__).resolve().parent.parent
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(site_packages)]))

        def help_text(cwd: Path) -> str:
            return subprocess.run(
                twistd_command("--help", python_options=["-S"]),
                cwd=cwd,
                env=env,
                capture_output=True,
                check=True,
            ).stdout.decode()

        self.assertIn("malamute", help_text(self.mktemp_dir()))
        # Without the installed copy the same command finds no plugin.
        env["PYTHONPATH"] = str(site_packages)
        self.assertNotIn("malamute", help_text(self.mktemp_dir()))


class PackOptionsTests(SynchronousTestCase):
    def test_noPackByDefault(self) -> None:
        """Without --pack the broker joins no pack."""
        self.assertIsNone(parse().pack.name)

    def test_packOptions(self) -> None:
        """The pack options (--pack, --beacon, --gossip-*, --peer-endpoint...) are taken."""
        pack = parse(
            "--pack",
            "prod",
            "--beacon",
            "eth0",
            "--beacon-port",
            "5671",
            "--gossip-bind",
            "tcp://10.0.0.1:5680",
            "--gossip-connect",
            "tcp://10.0.0.2:5680",
            "--gossip-connect",
            "tcp://10.0.0.3:5680",
            "--peer-endpoint",
            "tcp://10.0.0.1:*",
            "--broker-name",
            "b1",
        ).pack
        self.assertEqual(
            (pack.name, pack.beacon, pack.beacon_port, pack.peer_endpoint, pack.broker_name),
            ("prod", "eth0", 5671, "tcp://10.0.0.1:*", "b1"),
        )
        self.assertEqual(pack.gossip_bind, ("tcp://10.0.0.1:5680",))
        self.assertEqual(pack.gossip_connect, ("tcp://10.0.0.2:5680", "tcp://10.0.0.3:5680"))

    def test_packConfigKeys(self) -> None:
        """The malamute/pack/ keys of malamute.cfg set the pack; options override them."""
        path = Path(self.mktemp())
        path.write_text(
            "malamute\n"
            "    pack\n"
            "        name = prod\n"
            "        beacon = 10.1.2.3\n"
            "        beacon-interval = 500\n"
            "        expired = 9000\n"
            "        gossip-connect = tcp://g1:5680\n"
            "        gossip-connect = tcp://g2:5680\n"
        )
        pack = parse("--config", str(path)).pack
        self.assertEqual((pack.name, pack.beacon), ("prod", "10.1.2.3"))
        self.assertEqual((pack.beacon_interval_ms, pack.expired_ms), (500, 9000))
        self.assertEqual(pack.gossip_connect, ("tcp://g1:5680", "tcp://g2:5680"))
        self.assertEqual(parse("--config", str(path), "--pack", "other").pack.name, "other")

    def test_packNeedsAWayToFindOthers(self) -> None:
        """A pack with neither beacons nor gossip is refused with the reason."""
        with self.assertRaises(usage.UsageError) as e:
            parse("--pack", "prod")
        self.assertIn("beacons", str(e.exception))

    def test_gossipNeedsPeerEndpoint(self) -> None:
        """Without beacons, the endpoint peers reach the broker at must be given."""
        with self.assertRaises(usage.UsageError) as e:
            parse("--pack", "prod", "--gossip-connect", "tcp://g:1")
        self.assertIn("--peer-endpoint", str(e.exception))
        with self.assertRaises(usage.UsageError):
            parse("--pack", "p", "--gossip-connect", "tcp://g:1", "--peer-endpoint", "ipc://@/x")

    def test_unknownBeaconInterface(self) -> None:
        """A beacon interface the host does not have is refused with one clear error."""
        settings = parse("--pack", "p", "--beacon", "no-such-if0", "-d", self.mktemp())
        with self.assertRaises(usage.UsageError) as e:
            makeBrokerService(settings)
        self.assertIn("no-such-if0", str(e.exception))


class CurvePackOptionsTests(SynchronousTestCase):
    """The CURVE pack's options: --pack-keys, --pack-secret, gossip servers with keys."""

    gossip = ("--pack", "p", "--peer-endpoint", "tcp://127.0.0.1:*")

    def keys(self) -> tuple[Path, Path]:
        """A directory with one broker's public certificate, and its secret certificate."""
        directory = Path(self.mktemp())
        _, secret = write_certificates(directory / "made", "h1")
        listed = directory / "listed"
        listed.mkdir()
        (listed / "h1.key").write_text((directory / "made" / "h1.key").read_text())
        return listed, secret

    def test_optionsAndConfigKeys(self) -> None:
        """
        --pack-keys and --pack-secret, or malamute/pack/keys and .../secret,
        make a CURVE pack.
        """
        pack = parse(*self.gossip, "--gossip-connect", "tcp://g:1|K", "--pack-keys", "k").pack
        self.assertEqual((pack.keys, pack.secret, pack.curve), (Path("k"), None, True))
        path = Path(self.mktemp())
        path.write_text(
            "malamute\n    pack\n        name = p\n        beacon = 10.0.0.1\n"
            "        keys = /etc/pack-keys\n        secret = /etc/pack.key_secret\n"
        )
        pack = parse("--config", str(path)).pack
        self.assertEqual(pack.keys, Path("/etc/pack-keys"))
        self.assertEqual(pack.secret, Path("/etc/pack.key_secret"))
        self.assertFalse(parse(*self.gossip, "--gossip-bind", "tcp://*:1").pack.curve)

    def test_gossipServersKeysMatchThePack(self) -> None:
        """
        A CURVE pack's gossip servers need their keys (ENDPOINT|KEY); an open
        pack's may not have one; a pack secret needs the pack's keys.
        """
        with self.assertRaises(usage.UsageError) as e:
            parse(*self.gossip, "--gossip-connect", "tcp://g:1", "--pack-keys", "k")
        self.assertIn("ENDPOINT|PUBLIC_KEY", str(e.exception))
        with self.assertRaises(usage.UsageError) as e:
            parse(*self.gossip, "--gossip-connect", "tcp://g:1|KEY")
        self.assertIn("--pack-keys", str(e.exception))
        with self.assertRaises(usage.UsageError) as e:
            parse(*self.gossip, "--gossip-bind", "tcp://*:1", "--pack-secret", "s")
        self.assertIn("needs --pack-keys", str(e.exception))

    def test_keysLoadedWhenTheServiceIsMade(self) -> None:
        """
        The service serves the pack's ZAP domain with the listed keys; an
        empty or missing key directory, or a secret others may read, is one
        clear error.
        """
        listed, secret = self.keys()
        base = (*self.gossip, "--gossip-bind", "tcp://127.0.0.1:*", "-d", self.mktemp())
        service = makeBrokerService(
            parse(*base, "--pack-keys", str(listed), "--pack-secret", str(secret))
        )
        zap = service.getServiceNamed("zap")
        self.assertEqual(list(zap.counters), ["client", "pack peer"])
        empty = Path(self.mktemp())
        empty.mkdir()
        for keys, fragment in ((empty, "no public certificate"), (Path("/no/such"), "cannot")):
            with self.assertRaises(usage.UsageError) as e:
                makeBrokerService(parse(*base, "--pack-keys", str(keys)))
            self.assertIn(fragment, str(e.exception))
        secret.chmod(0o644)
        with self.assertRaises(usage.UsageError) as e:
            makeBrokerService(
                parse(*base, "--pack-keys", str(listed), "--pack-secret", str(secret))
            )
        self.assertIn(f"chmod 600 {secret}", str(e.exception))
