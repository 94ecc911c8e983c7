"""
Tests for L{malamute_pack.multicast.config}: the bridges' specs as the
command line and C{malamute.cfg} give them, their checks (with libzmq's
capabilities given as a plain function), and the endpoint receivers
repair from.
"""

from __future__ import annotations

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.multicast import config
from malamute_pack.multicast.config import (
    BridgeConfigError,
    BridgeSettings,
    Inbound,
    Outbound,
    check,
    from_zpl,
    parse_inbound,
    parse_outbound,
    repair_endpoint,
    unavailable,
    zmq_url,
)
from malamute_pack.zpl import parse_zpl

EPGM = "epgm://lo;239.192.1.1:5555"


def without_multicast(capability: str) -> bool:
    """A libzmq built with neither PGM nor NORM."""
    return False


def with_everything(capability: str) -> bool:
    """A libzmq built with every capability."""
    return True


class ParseOutboundTests(SynchronousTestCase):
    def test_streamAndUrl(self) -> None:
        """STREAM=URL reads the stream with a pattern that finds every subject."""
        self.assertEqual(parse_outbound(f"weather={EPGM}"), Outbound("weather", ".*", EPGM))

    def test_pattern(self) -> None:
        """STREAM:PATTERN=URL gives the pattern; a pattern may itself hold ':'."""
        self.assertEqual(
            parse_outbound("weather:temp.*=norm://lo;239.1.1.1:7000"),
            Outbound("weather", "temp.*", "norm://lo;239.1.1.1:7000"),
        )
        self.assertEqual(
            parse_outbound("weather:prefix:temp.=tcp://127.0.0.1:7002"),
            Outbound("weather", "prefix:temp.", "tcp://127.0.0.1:7002"),
        )

    def test_patternWithEquals(self) -> None:
        """A pattern holding '=' is split at the '=' that precedes the URL."""
        self.assertEqual(
            parse_outbound(f"orders:fields:side=buy={EPGM}"),
            Outbound("orders", "fields:side=buy", EPGM),
        )

    def test_emptyPattern(self) -> None:
        """STREAM:=URL (an empty pattern) reads every subject, as no pattern does."""
        self.assertEqual(parse_outbound(f"weather:={EPGM}").pattern, ".*")

    def test_otherEndpoints(self) -> None:
        """A tcp:// or ipc:// URL is taken (a bridge where there is no multicast)."""
        self.assertEqual(parse_outbound("s=ipc://@/bridge").url, "ipc://@/bridge")
        self.assertEqual(parse_outbound("s=tcp://127.0.0.1:*").url, "tcp://127.0.0.1:*")

    def test_refused(self) -> None:
        """A spec that is not STREAM[:PATTERN]=URL is refused with what is wrong."""
        for spec, fragment in [
            ("weather", "STREAM[:PATTERN]=URL"),
            ("weather=", "STREAM[:PATTERN]=URL"),
            (f"={EPGM}", "STREAM[:PATTERN]=URL"),
            ("weather=239.1.1.1:5555", "STREAM[:PATTERN]=URL"),
            (f":temp={EPGM}", "names no stream"),
            ("weather=epgm://lo", "epgm://IFACE;GROUP:PORT"),
            ("weather=norm://lo;group:7000", "norm://IFACE;GROUP:PORT"),
        ]:
            with self.assertRaises(BridgeConfigError, msg=spec) as e:
                parse_outbound(spec)
            self.assertIn(fragment, str(e.exception), spec)

    def test_badPattern(self) -> None:
        """
        A pattern that does not compile, or a stream or pattern longer than
        a header holds, is refused at once, with the reason.
        """
        with self.assertRaises(BridgeConfigError) as e:
            parse_outbound(f"weather:temp(={EPGM}")
        self.assertIn("weather:temp(", str(e.exception))
        with self.assertRaises(BridgeConfigError) as e:
            parse_outbound(f"weather:{'x' * 300}={EPGM}")
        self.assertIn("longer than 255 bytes", str(e.exception))
        with self.assertRaises(BridgeConfigError):
            parse_outbound(f"{'s' * 300}={EPGM}")


class ParseInboundTests(SynchronousTestCase):
    def test_urlAndStream(self) -> None:
        """URL=STREAM: the URL's ';' is part of it."""
        self.assertEqual(parse_inbound(f"{EPGM}=weather"), Inbound(EPGM, "weather"))
        self.assertEqual(
            parse_inbound("tcp://127.0.0.1:7002=weather"),
            Inbound("tcp://127.0.0.1:7002", "weather"),
        )

    def test_streamWithEquals(self) -> None:
        """The URL ends at the first '=' after it: the rest is the stream's name."""
        self.assertEqual(parse_inbound(f"{EPGM}=a=b"), Inbound(EPGM, "a=b"))

    def test_refused(self) -> None:
        """A spec that is not URL=STREAM is refused, saying the form."""
        for spec in ["weather", f"{EPGM}=", f"weather={EPGM}", "=weather", "epgm://lo=s"]:
            with self.assertRaises(BridgeConfigError, msg=spec) as e:
                parse_inbound(spec)
            self.assertTrue(
                "URL=STREAM" in str(e.exception) or "IFACE;GROUP:PORT" in str(e.exception),
                str(e.exception),
            )


class CheckTests(SynchronousTestCase):
    def test_fine(self) -> None:
        """Bridges that can run pass."""
        check(
            BridgeSettings(
                outbound=(Outbound("a", ".*", EPGM), Outbound("b", ".*", EPGM)),
                inbound=(Inbound("norm://lo;239.1.1.2:7000", "c"),),
            ),
            with_everything,
        )
        check(BridgeSettings(), without_multicast)

    def test_unknownInterface(self) -> None:
        """
        A PGM URL naming an interface this host does not have is refused,
        naming it; an address or a network is taken as it is, and a name
        becomes its address for libzmq (which takes no name for PGM).
        """
        url = "epgm://nosuchif0;239.1.1.1:5555"
        with self.assertRaises(BridgeConfigError) as caught:
            check(BridgeSettings(outbound=(Outbound("s", ".*", url),)))
        self.assertIn("'nosuchif0'", str(caught.exception))
        for given in ("epgm://10.0.0.1;239.1.1.1:5555", "pgm://10.0.0.0/24;239.1.1.1:5555"):
            self.assertEqual(zmq_url(given), given)
        self.assertEqual(zmq_url("epgm://lo;239.1.1.1:5555"), "epgm://127.0.0.1;239.1.1.1:5555")
        self.assertEqual(zmq_url("norm://lo;239.1.1.1:5555"), "norm://lo;239.1.1.1:5555")

    def test_badNumbers(self) -> None:
        """A rate, recovery interval or hop count below 1 is refused, naming it."""
        for changes, fragment in [
            ({"rate_kbps": 0}, "rate"),
            ({"recovery_ms": -1}, "recovery interval"),
            ({"hops": 0}, "multicast hops"),
        ]:
            settings = BridgeSettings(**changes)  # type: ignore[arg-type]
            with self.assertRaises(BridgeConfigError) as e:
                check(settings, with_everything)
            self.assertIn(fragment, str(e.exception))

    def test_duplicate(self) -> None:
        """The same stream bridged twice to one URL is refused."""
        twice = (Outbound("a", ".*", EPGM), Outbound("a", "x.*", EPGM))
        with self.assertRaises(BridgeConfigError) as e:
            check(BridgeSettings(outbound=twice), with_everything)
        self.assertIn("twice", str(e.exception))
        # To two URLs it is fine (from the broker's own stream).
        two = (Outbound("a", ".*", EPGM), Outbound("a", ".*", "tcp://127.0.0.1:*"))
        check(BridgeSettings(outbound=two), with_everything)

    def test_sourceStreamOnce(self) -> None:
        """
        A proxy reads each stream from its source once: a stream bridged to
        two URLs from a source is refused.
        """
        two = (Outbound("a", ".*", EPGM), Outbound("a", ".*", "tcp://127.0.0.1:*"))
        with self.assertRaises(BridgeConfigError) as e:
            check(BridgeSettings(outbound=two, source="tcp://10.0.0.1:9999"), with_everything)
        self.assertIn("one URL", str(e.exception))

    def test_sourceWithoutOutbound(self) -> None:
        """A source with nothing to bridge out is refused."""
        with self.assertRaises(BridgeConfigError) as e:
            check(BridgeSettings(source="tcp://10.0.0.1:9999"), with_everything)
        self.assertIn("--bridge-out", str(e.exception))

    def test_noMulticast(self) -> None:
        """
        Where libzmq has no PGM, a PGM bridge is refused with a message that
        names PGM, this libzmq's version and the fix.
        """
        settings = BridgeSettings(outbound=(Outbound("a", ".*", EPGM),))
        with self.assertRaises(BridgeConfigError) as e:
            check(settings, without_multicast)
        message = str(e.exception)
        self.assertIn("PGM", message)
        self.assertIn(EPGM, message)
        self.assertIn(f"libzmq {zmq.zmq_version()}", message)
        self.assertIn("--no-binary pyzmq", message)
        self.assertIn("libzmq3-dev", message)

    def test_noNorm(self) -> None:
        """An inbound NORM bridge is refused by a libzmq without NORM, which is named."""
        asked: list[str] = []

        def has(capability: str) -> bool:
            asked.append(capability)
            return capability == "pgm"

        settings = BridgeSettings(inbound=(Inbound("norm://lo;239.1.1.2:7000", "c"),))
        with self.assertRaises(BridgeConfigError) as e:
            check(settings, has)
        self.assertIn("NORM", str(e.exception))
        self.assertEqual(asked, ["norm"])

    def test_otherUrlsNeedNothing(self) -> None:
        """tcp:// and ipc:// bridges run with any libzmq: nothing is asked of it."""
        asked: list[str] = []

        def has(capability: str) -> bool:
            asked.append(capability)
            return False

        self.assertIsNone(unavailable("tcp://127.0.0.1:7002", has))
        self.assertIsNone(unavailable("ipc://@/bridge", has))
        self.assertEqual(asked, [])
        self.assertIsNotNone(unavailable("pgm://lo;239.1.1.1:5555", has))
        self.assertEqual(asked, ["pgm"])


class FromZplTests(SynchronousTestCase):
    def test_keys(self) -> None:
        """The malamute/bridge/ keys of a config file set every bridge setting."""
        text = (
            "malamute\n"
            "    bridge\n"
            f'        out = "weather:temp.*={EPGM}"\n'
            "        out = orders=tcp://127.0.0.1:7002\n"
            f'        in = "{EPGM}=remote"\n'
            "        rate = 5000\n"
            "        recovery = 2000\n"
            "        hops = 4\n"
            "        endpoint = tcp://10.0.0.1:9999\n"
            "        source = tcp://10.0.0.2:9999\n"
            "        origin = east\n"
        )
        settings = from_zpl(parse_zpl(text), BridgeSettings())
        self.assertEqual(
            settings,
            BridgeSettings(
                outbound=(
                    Outbound("weather", "temp.*", EPGM),
                    Outbound("orders", ".*", "tcp://127.0.0.1:7002"),
                ),
                inbound=(Inbound(EPGM, "remote"),),
                rate_kbps=5000,
                recovery_ms=2000,
                hops=4,
                endpoint="tcp://10.0.0.1:9999",
                source="tcp://10.0.0.2:9999",
                origin="east",
            ),
        )

    def test_baseKept(self) -> None:
        """Keys the file does not give keep the base's values."""
        base = BridgeSettings(rate_kbps=7, endpoint="tcp://10.0.0.1:1")
        settings = from_zpl({"malamute/bridge/hops": ["3"]}, base)
        self.assertEqual((settings.rate_kbps, settings.hops), (7, 3))
        self.assertEqual(settings.endpoint, "tcp://10.0.0.1:1")
        self.assertEqual(from_zpl({}, base), base)
        self.assertEqual(BridgeSettings().rate_kbps, config.DEFAULT_RATE_KBPS)

    def test_badValues(self) -> None:
        """A number that is not one, or a bad spec, is refused naming the key or spec."""
        with self.assertRaises(BridgeConfigError) as e:
            from_zpl({"malamute/bridge/rate": ["fast"]}, BridgeSettings())
        self.assertIn("malamute/bridge/rate", str(e.exception))
        with self.assertRaises(BridgeConfigError) as e:
            from_zpl({"malamute/bridge/in": ["weather"]}, BridgeSettings())
        self.assertIn("URL=STREAM", str(e.exception))


class RepairEndpointTests(SynchronousTestCase):
    outbound = (Outbound("a", ".*", EPGM),)

    def test_firstAddress(self) -> None:
        """The first tcp:// endpoint with an address and a port is taken."""
        settings = repair_endpoint(
            BridgeSettings(outbound=self.outbound),
            ["ipc://@/malamute", "tcp://*:9999", "tcp://0.0.0.0:9999", "tcp://10.0.0.1:9999"],
        )
        self.assertEqual(settings.endpoint, "tcp://10.0.0.1:9999")

    def test_wildcardsSkipped(self) -> None:
        """
        Wildcard hosts and ports are skipped (a receiver could not connect
        there): with nothing else, no endpoint.
        """
        endpoints = ["tcp://*:1", "tcp://[::]:1", "tcp://0.0.0.0:1", "tcp://127.0.0.1:*"]
        settings = repair_endpoint(BridgeSettings(outbound=self.outbound), endpoints)
        self.assertEqual(settings.endpoint, "")

    def test_securityPrefix(self) -> None:
        """A curve: or plain: prefix is not part of the endpoint."""
        for prefix in ("curve:", "plain:", "null:"):
            settings = repair_endpoint(
                BridgeSettings(outbound=self.outbound), [f"{prefix}tcp://10.0.0.1:9998"]
            )
            self.assertEqual(settings.endpoint, "tcp://10.0.0.1:9998", prefix)

    def test_sourceUsed(self) -> None:
        """A proxy's receivers repair from its source."""
        settings = BridgeSettings(outbound=self.outbound, source="tcp://10.0.0.2:9999")
        self.assertEqual(
            repair_endpoint(settings, ["tcp://10.0.0.1:9999"]).endpoint, "tcp://10.0.0.2:9999"
        )

    def test_givenKept(self) -> None:
        """An endpoint given is kept; with no outbound bridge nothing is filled in."""
        given = BridgeSettings(outbound=self.outbound, endpoint="tcp://h:1")
        self.assertEqual(repair_endpoint(given, ["tcp://10.0.0.1:9999"]), given)
        inbound_only = BridgeSettings(inbound=(Inbound(EPGM, "s"),))
        self.assertEqual(repair_endpoint(inbound_only, ["tcp://10.0.0.1:9999"]), inbound_only)
