"""
The multicast bridges' settings: what ``--bridge-out 'STREAM[:PATTERN]=URL'``
and ``--bridge-in 'URL=STREAM'`` (and their ``malamute.cfg`` keys) say,
checked, and whether this process's libzmq can carry them.

A URL is ``epgm://IFACE;GROUP:PORT`` (PGM over UDP), ``pgm://IFACE;GROUP:PORT``
(PGM over IP, needs root), ``norm://IFACE;GROUP:PORT`` (NORM), or any other
ZeroMQ endpoint (``tcp://``, ``ipc://``: a PUB bound there, SUBs connecting:
the same bridge where the network has no multicast).

PGM and NORM need a libzmq built with them. Debian's is; the pyzmq wheels
on PyPI carry one that is not: L{unavailable} says so, and how to fix it,
and the broker refuses to start with a bridge it could not run.

Tests: ``tests/unit/test_multicast_config.py``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import psutil
import zmq

from malamute_pack.matching import PatternError, validate_pattern
from malamute_pack.protocol import multicast

# ZeroMQ's defaults suit a LAN of low rate (100 kbit/s, 10 s of recovery):
# ours carry a broker's streams.
DEFAULT_RATE_KBPS: Final = 1_000_000
DEFAULT_RECOVERY_MS: Final = 5_000
DEFAULT_HOPS: Final = 1
# What the multicast URLs need from libzmq, by scheme.
MULTICAST: Final = {"epgm": "pgm", "pgm": "pgm", "norm": "norm"}
_PREFIXES = ("null", "plain", "curve")
_URL = re.compile(r"(?P<scheme>[a-z]+)://(?P<rest>.+)")
_GROUP = re.compile(r"(?:[^;]*;)?(?P<group>[0-9.]+):(?P<port>[0-9]+)")

# The config file's keys under malamute/bridge/ (out and in repeat).
CONFIG_KEYS: Final = tuple(
    f"malamute/bridge/{key}"
    for key in ("out", "in", "rate", "recovery", "hops", "endpoint", "source", "origin")
)

FIX: Final = (
    "install Debian's libzmq3-dev and build pyzmq against it:"
    " pip install --force-reinstall --no-binary pyzmq pyzmq (scripts/bootstrap does)"
)


class BridgeConfigError(ValueError):
    """A bridge that cannot be configured as asked (the message says why)."""


@dataclass(frozen=True, slots=True)
class Outbound:
    """Publish the records of C{stream} that C{pattern} finds on C{url}."""

    stream: str
    pattern: str
    url: str


@dataclass(frozen=True, slots=True)
class Inbound:
    """Write what arrives on C{url} into the local stream C{stream}."""

    url: str
    stream: str


@dataclass(frozen=True, slots=True)
class BridgeSettings:
    """
    Every bridge of a broker (or of ``twistd malamute-bridge``).

    @ivar endpoint: the TCP endpoint receivers repair losses from (this
        broker's, or with C{source} the source broker's); "" for none.
    @ivar source: read the outbound streams from this broker over TCP
        (a proxy) instead of this broker's own.
    @ivar origin: the name the records' origin goes by in headers (with a
        C{source}; a broker's own is its journal's identity).
    """

    outbound: tuple[Outbound, ...] = ()
    inbound: tuple[Inbound, ...] = ()
    rate_kbps: int = DEFAULT_RATE_KBPS
    recovery_ms: int = DEFAULT_RECOVERY_MS
    hops: int = DEFAULT_HOPS
    endpoint: str = ""
    source: str = ""
    origin: str = ""

    @property
    def any(self) -> bool:
        return bool(self.outbound or self.inbound)


def _check_url(url: str) -> str:
    match = _URL.fullmatch(url)
    if match is None:
        raise BridgeConfigError(f"{url!r} is not a URL (epgm://IFACE;GROUP:PORT, norm://...)")
    scheme = match["scheme"]
    if scheme in MULTICAST and _GROUP.fullmatch(match["rest"].split(",", 1)[-1]) is None:
        raise BridgeConfigError(f"{url!r}: a multicast URL is {scheme}://IFACE;GROUP:PORT")
    return url


def _split_url(spec: str, url_first: bool) -> tuple[str, str]:
    """C{spec} as (the other part, URL), split at the C{=} that borders the URL."""
    for at in [m.start() for m in re.finditer("=", spec)]:
        left, right = spec[:at], spec[at + 1 :]
        url, other = (left, right) if url_first else (right, left)
        if _URL.fullmatch(url) and other:
            return other, _check_url(url)
    form = "URL=STREAM" if url_first else "STREAM[:PATTERN]=URL"
    raise BridgeConfigError(f"{spec!r} is not {form}")


def parse_outbound(spec: str) -> Outbound:
    """C{STREAM[:PATTERN]=URL} (the pattern finds every subject if omitted)."""
    left, url = _split_url(spec, url_first=False)
    stream, _, pattern = left.partition(":")
    if not stream:
        raise BridgeConfigError(f"{spec!r} names no stream")
    pattern = pattern or ".*"
    # Refused here, not when the bridge starts (the broker would refuse it
    # then, and the header could not carry it).
    try:
        validate_pattern(pattern)
        multicast.encode_source("", "", stream, pattern)
    except (PatternError, ValueError) as e:
        raise BridgeConfigError(f"{spec!r}: {e}") from None
    return Outbound(stream, pattern, url)


def parse_inbound(spec: str) -> Inbound:
    """C{URL=STREAM}."""
    stream, url = _split_url(spec, url_first=True)
    return Inbound(url, stream)


def zmq_url(url: str) -> str:
    """
    C{url} as libzmq takes it: for PGM, an interface given by name becomes
    its IPv4 address.

    @raise ValueError: no interface of that name has an IPv4 address.
    """
    scheme, _, rest = url.partition("://")
    if scheme not in ("epgm", "pgm") or ";" not in rest:
        return url
    interface, _, group = rest.partition(";")
    try:
        ipaddress.ip_network(interface, strict=False)
        return url  # an address or a network already
    except ValueError:
        pass
    for entry in psutil.net_if_addrs().get(interface, []):
        if entry.family == socket.AF_INET:
            return f"{scheme}://{entry.address};{group}"
    raise ValueError(f"{url}: no interface named {interface!r} with an IPv4 address")


def unavailable(url: str, has: Callable[[str], bool] = zmq.has) -> str | None:
    """
    Why this process cannot carry a bridge on C{url}, or None if it can.

    @param has: whether libzmq has a capability (L{zmq.has}).
    """
    scheme = url.split("://", 1)[0]
    need = MULTICAST.get(scheme)
    if need is None or has(need):
        return None
    return (
        f"the bridge on {url} needs a libzmq built with {need.upper()}, and this one"
        f" (libzmq {zmq.zmq_version()}, pyzmq {zmq.__version__}) has none: pyzmq's wheels"
        f" from PyPI are built without it; {FIX}"
    )


def check(settings: BridgeSettings, has: Callable[[str], bool] = zmq.has) -> None:
    """
    @raise BridgeConfigError: bridges that cannot run as configured.
    """
    for number, name in (
        (settings.rate_kbps, "rate"),
        (settings.recovery_ms, "recovery interval"),
        (settings.hops, "multicast hops"),
    ):
        if number < 1:
            raise BridgeConfigError(f"the bridges' {name} must be at least 1: {number}")
    if settings.source and not settings.outbound:
        raise BridgeConfigError("a bridge source is read for --bridge-out: none is given")
    seen: set[tuple[str, str]] = set()
    for out in settings.outbound:
        if (out.stream, out.url) in seen:
            raise BridgeConfigError(f"stream {out.stream!r} is bridged to {out.url} twice")
        seen.add((out.stream, out.url))
    streams = [out.stream for out in settings.outbound]
    if settings.source and len(set(streams)) < len(streams):
        # A proxy reads each stream once from its source, with one pattern.
        raise BridgeConfigError("a bridge source's stream can be bridged to one URL only")
    for url in [o.url for o in settings.outbound] + [i.url for i in settings.inbound]:
        reason = unavailable(url, has)
        if reason is not None:
            raise BridgeConfigError(reason)
        try:
            zmq_url(url)
        except ValueError as e:
            raise BridgeConfigError(str(e)) from None


def _number(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise BridgeConfigError(f"{key}: {value!r} is not a whole number") from None


def from_zpl(config: Mapping[str, list[str]], base: BridgeSettings) -> BridgeSettings:
    """
    C{base} with what the C{malamute/bridge/} keys of a config file give:
    C{out} and C{in} (repeatable), C{rate} (kbit/s), C{recovery} (ms),
    C{hops}, C{endpoint}, C{source} and C{origin}.
    """
    changes: dict[str, object] = {}
    if values := config.get("malamute/bridge/out"):
        changes["outbound"] = tuple(parse_outbound(v) for v in values)
    if values := config.get("malamute/bridge/in"):
        changes["inbound"] = tuple(parse_inbound(v) for v in values)
    for key, name in (("rate", "rate_kbps"), ("recovery", "recovery_ms"), ("hops", "hops")):
        if values := config.get(f"malamute/bridge/{key}"):
            changes[name] = _number(f"malamute/bridge/{key}", values[-1])
    for key in ("endpoint", "source", "origin"):
        if values := config.get(f"malamute/bridge/{key}"):
            changes[key] = values[-1]
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def repair_endpoint(settings: BridgeSettings, endpoints: Sequence[str]) -> BridgeSettings:
    """
    C{settings} with the endpoint receivers repair from filled in when not
    given: the source's (a proxy), else the first of the broker's
    C{endpoints} that names an address and a port (C{tcp://10.0.0.1:9999},
    not C{tcp://*:9999} or C{tcp://10.0.0.1:*}).
    """
    if settings.endpoint or not settings.outbound:
        return settings
    if settings.source:
        return dataclasses.replace(settings, endpoint=settings.source)
    for endpoint in endpoints:
        # A security prefix (curve:tcp://...) is not part of the endpoint.
        endpoint = endpoint.split(":", 1)[1] if endpoint.split(":", 1)[0] in _PREFIXES else endpoint
        host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
        if (
            endpoint.startswith("tcp://")
            and host not in ("*", "0.0.0.0", "[::]", "")
            and port not in ("*", "0")  # a port picked when bound: not known here
        ):
            return dataclasses.replace(settings, endpoint=endpoint)
    return settings
