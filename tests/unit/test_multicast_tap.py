"""
Tests for L{malamute_pack.multicast.tap}: the options of C{twistd
malamute-bridge} and the service it runs, the C{--bridge-*} options that
C{twistd malamute} gains (L{malamute_pack.tap}), and the twistd plugin
(C{twisted/plugins/malamute_bridge_plugin.py}).
"""

from __future__ import annotations

from pathlib import Path

import zmq
from twisted.application.service import IServiceMaker, MultiService
from twisted.internet import reactor
from twisted.plugin import getPlugins
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack import tap as broker_tap
from malamute_pack.multicast import config, tap
from malamute_pack.multicast.config import BridgeSettings, Inbound, Outbound
from malamute_pack.multicast.service import BridgeService
from malamute_pack.pair.service import PairService

SOURCE = "tcp://10.0.0.2:9999"
OUT = "weather:temp.*=tcp://127.0.0.1:7002"


def bridge_options(*args: str) -> BridgeSettings:
    """The settings C{twistd malamute-bridge ARGS} runs with."""
    options = tap.Options()
    options.parseOptions(list(args))
    settings = options["settings"]
    assert isinstance(settings, BridgeSettings)
    return settings


def broker_bridges(*args: str) -> BridgeSettings:
    """The bridges of C{twistd malamute ARGS}."""
    options = broker_tap.Options()
    options.parseOptions(list(args))
    settings = options["settings"].bridge
    assert isinstance(settings, BridgeSettings)
    return settings


class BridgeOptionsTests(SynchronousTestCase):
    """C{twistd malamute-bridge}'s options."""

    def test_proxy(self) -> None:
        """
        A source and --bridge-out specs (repeatable) make the settings;
        receivers repair from the source; the defaults hold for the rest.
        """
        settings = bridge_options(
            "--bridge-source", SOURCE, "--bridge-out", OUT, "--bridge-out", "news=ipc://@/n"
        )
        self.assertEqual(
            settings.outbound,
            (
                Outbound("weather", "temp.*", "tcp://127.0.0.1:7002"),
                Outbound("news", ".*", "ipc://@/n"),
            ),
        )
        self.assertEqual((settings.source, settings.endpoint), (SOURCE, SOURCE))
        self.assertEqual(settings.origin, "")
        self.assertEqual(
            (settings.rate_kbps, settings.recovery_ms, settings.hops),
            (config.DEFAULT_RATE_KBPS, config.DEFAULT_RECOVERY_MS, config.DEFAULT_HOPS),
        )

    def test_numbersAndNames(self) -> None:
        """--bridge-rate, -recovery, -hops, -endpoint and --origin are taken."""
        settings = bridge_options(
            "--bridge-source", SOURCE, "--bridge-out", OUT,
            "--bridge-rate", "500", "--bridge-recovery", "3000", "--bridge-hops", "8",
            "--bridge-endpoint", "tcp://10.0.0.3:9999", "--origin", "east",
        )  # fmt: skip
        self.assertEqual((settings.rate_kbps, settings.recovery_ms, settings.hops), (500, 3000, 8))
        self.assertEqual((settings.endpoint, settings.origin), ("tcp://10.0.0.3:9999", "east"))

    def test_configFile(self) -> None:
        """The config file's malamute/bridge/ keys are read; options override them."""
        path = Path(self.mktemp())
        path.write_text(
            "malamute\n    bridge\n"
            f"        source = {SOURCE}\n        out = {OUT}\n        rate = 100\n"
            "        origin = west\n"
        )
        settings = bridge_options("--config", str(path), "--bridge-rate", "200")
        self.assertEqual(
            settings.outbound, (Outbound("weather", "temp.*", "tcp://127.0.0.1:7002"),)
        )
        self.assertEqual((settings.source, settings.rate_kbps), (SOURCE, 200))
        self.assertEqual(settings.origin, "west")

    def test_usageErrors(self) -> None:
        """
        No source, a --bridge-in (it needs a broker), a bad spec, a bad
        number or a missing config file are usage errors saying why.
        """
        for args, fragment in [
            (["--bridge-out", OUT], "--bridge-source"),
            (["--bridge-source", SOURCE], "--bridge-out"),
            (
                ["--bridge-source", SOURCE, "--bridge-out", OUT, "--bridge-in", "ipc://@/x=s"],
                "twistd malamute",
            ),
            (["--bridge-source", SOURCE, "--bridge-out", "weather"], "STREAM[:PATTERN]=URL"),
            (["--bridge-source", SOURCE, "--bridge-out", OUT, "--bridge-hops", "0"], "hops"),
            (["--bridge-source", SOURCE, "--bridge-out", OUT, "--bridge-rate", "fast"], "fast"),
            (["--config", "/nonexistent/bridge.cfg"], "bridge.cfg"),
        ]:
            with self.assertRaises(usage.UsageError, msg=args) as e:
                bridge_options(*args)
            self.assertIn(fragment, str(e.exception), args)

    def test_makeService(self) -> None:
        """The service is a bridge service named "bridges", with no broker of its own."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        settings = bridge_options("--bridge-source", SOURCE, "--bridge-out", OUT)
        top = tap.makeBridgeService(settings, reactor, context)
        bridges = top.getServiceNamed("bridges")
        assert isinstance(bridges, BridgeService)
        self.assertEqual(bridges.settings, settings)
        self.assertFalse(bridges.running)


class BrokerBridgeOptionsTests(SynchronousTestCase):
    """The C{--bridge-*} options of C{twistd malamute}."""

    def test_none(self) -> None:
        """Without them the broker has no bridge."""
        self.assertFalse(broker_bridges().any)

    def test_bridges(self) -> None:
        """
        --bridge-out and --bridge-in (repeatable) and the numbers are taken;
        receivers repair from the broker's first endpoint with an address.
        """
        bridges = broker_bridges(
            "-e", "ipc://@/x", "-e", "tcp://*:9999", "-e", "tcp://10.0.0.1:9999",
            "--bridge-out", OUT, "--bridge-in", "ipc://@/in=local",
            "--bridge-in", "tcp://127.0.0.1:7003=other", "--bridge-rate", "300",
        )  # fmt: skip
        self.assertEqual(bridges.outbound, (Outbound("weather", "temp.*", "tcp://127.0.0.1:7002"),))
        self.assertEqual(
            bridges.inbound,
            (Inbound("ipc://@/in", "local"), Inbound("tcp://127.0.0.1:7003", "other")),
        )
        self.assertEqual((bridges.rate_kbps, bridges.endpoint), (300, "tcp://10.0.0.1:9999"))

    def test_endpointGiven(self) -> None:
        """--bridge-endpoint wins over the broker's endpoints."""
        bridges = broker_bridges(
            "-e", "tcp://10.0.0.1:9999", "--bridge-out", OUT,
            "--bridge-endpoint", "tcp://192.0.2.1:9999",
        )  # fmt: skip
        self.assertEqual(bridges.endpoint, "tcp://192.0.2.1:9999")

    def test_configKeys(self) -> None:
        """The malamute/bridge/ keys of malamute.cfg set the broker's bridges."""
        path = Path(self.mktemp())
        path.write_text(f"malamute\n    bridge\n        out = {OUT}\n        hops = 3\n")
        bridges = broker_bridges("--config", str(path))
        self.assertEqual(len(bridges.outbound), 1)
        self.assertEqual(bridges.hops, 3)

    def test_usageErrors(self) -> None:
        """A bad spec or number, in an option or the config file, is a usage error."""
        for args, fragment in [
            (["--bridge-out", "weather"], "STREAM[:PATTERN]=URL"),
            (["--bridge-in", "weather"], "URL=STREAM"),
            (["--bridge-out", OUT, "--bridge-recovery", "0"], "recovery"),
            (["--bridge-out", OUT, "--bridge-out", OUT], "twice"),
        ]:
            with self.assertRaises(usage.UsageError, msg=args) as e:
                broker_bridges(*args)
            self.assertIn(fragment, str(e.exception), args)
        path = Path(self.mktemp())
        path.write_text("malamute\n    bridge\n        rate = fast\n")
        with self.assertRaises(usage.UsageError) as e:
            broker_bridges("--config", str(path))
        self.assertIn("malamute/bridge/rate", str(e.exception))


class PluginTests(SynchronousTestCase):
    def test_found(self) -> None:
        """
        Twisted's plugin system finds the C{malamute-bridge} service maker,
        whose options and service are this module's.
        """
        import twisted.plugins

        makers = {maker.tapname: maker for maker in getPlugins(IServiceMaker, twisted.plugins)}
        self.assertIn("malamute-bridge", makers)
        maker = makers["malamute-bridge"]
        self.assertIs(maker.options, tap.Options)
        self.assertIn("multicast", maker.description)
        self.assertIn("malamute", makers)


class BrokerCompositionTests(SynchronousTestCase):
    """Where the bridges sit in the broker's services (L{malamute_pack.tap.makeBrokerService})."""

    def broker(self, *args: str) -> MultiService:
        options = broker_tap.Options()
        options.parseOptions(["-d", self.mktemp(), "-e", "tcp://127.0.0.1:9999", *args])
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        return broker_tap.makeBrokerService(options["settings"], reactor, context)

    def test_alone(self) -> None:
        """
        A broker's bridges are one service of its own, named bridges,
        started after the clients' sockets and the pack (before only the
        operations services, the collector's settings and the notifier).
        """
        top = self.broker("--bridge-out", OUT)
        bridges = top.getServiceNamed("bridges")
        self.assertIsInstance(bridges, BridgeService)
        names = [service.name for service in top]
        self.assertEqual(
            names[names.index("bridges") :], ["bridges", "operations", "gc", "sd-notify"]
        )

    def test_none(self) -> None:
        """Without bridges there is no bridge service."""
        with self.assertRaises(KeyError):
            self.broker().getServiceNamed("bridges")

    def test_pairActiveOnly(self) -> None:
        """
        In a pair the bridges run only while this broker is active: they
        are the pair's, not the broker's top service's.
        """
        top = self.broker(
            "--bridge-out",
            OUT,
            "--pair",
            "primary",
            "--pair-bind",
            "tcp://127.0.0.1:9998",
            "--pair-connect",
            "tcp://127.0.0.1:9997",
        )
        with self.assertRaises(KeyError):
            top.getServiceNamed("bridges")
        pair = top.getServiceNamed("pair")
        assert isinstance(pair, PairService)
        self.assertIn("bridges", [s.name for s in pair.active_services])
