"""
A Zyre probe for operators and interop tests: one node that prints what it
sees as JSON lines and takes commands on stdin.

    python -m malamute_pack.pack.probe --beacon eth0 --group CHAT --name probe

Each event is one JSON object on stdout: C{{"event": "ENTER", "uuid": ...,
"name": ..., "endpoint": ..., "headers": {...}}}, then C{JOIN}, C{LEAVE}
(with C{group}), C{WHISPER}, C{SHOUT} (with C{content}, each frame as
UTF-8 text), C{EVASIVE} and C{EXIT}; C{STARTED} first with our own uuid
and endpoint, C{ERROR} for a command it could not do. Commands, one a line:
C{shout GROUP TEXT}, C{whisper PEER TEXT} (a peer's name or uuid in hex),
C{join GROUP}, C{leave GROUP}, C{peers}, C{quit}. End of input also quits.

With C{--curve-secret FILE} (its secret certificate) and C{--curve-peers
DIR} (the public certificates of the nodes it admits), the probe is a CURVE
node, as a CURVE pack's brokers and zyre with C{zyre_set_zcert}; its
gossip servers are then C{ENDPOINT|PUBLIC_KEY}, and a node it does not let
in (a key not listed, no key, another key than its connection's) is a
C{REFUSED} event (with C{why}, C{uuid}, C{endpoint} and C{key}), once a
minute at most per node.

Tests: ``tests/unit/test_pack_zyre.py`` (events and commands),
``tests/system/test_pack_interop.py`` (against pyre, in namespaces).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import zmq
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.protocols.basic import LineReceiver
from twisted.python.failure import Failure

from malamute_pack.broker.log_limit import OncePer
from malamute_pack.pack.beacon import BEACON_INTERVAL, BEACON_PORT
from malamute_pack.pack.node import ZrePeer
from malamute_pack.pack.zyre import Zyre
from malamute_pack.transport.curve import KeyPair, LinkCurve, load_client_keys
from malamute_pack.transport.zap import PACK_DOMAIN, KeyAllowList, ZapHandler

Emit = Callable[[dict[str, Any]], None]

# Seconds before the same refused node is reported again.
REFUSED_INTERVAL = 60.0


def _text(content: Sequence[bytes]) -> list[str]:
    return [frame.decode("utf-8", "backslashreplace") for frame in content]


class ProbeEvents:
    """A L{malamute_pack.pack.node.NodeEvents} that emits each event as a dict."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit

    def _peer(self, event: str, peer: ZrePeer, **fields: Any) -> None:
        self._emit({"event": event, "uuid": peer.uuid.hex(), "name": peer.name, **fields})

    def peer_entered(self, peer: ZrePeer) -> None:
        self._peer("ENTER", peer, endpoint=peer.endpoint, headers=peer.headers)

    def peer_exited(self, peer: ZrePeer) -> None:
        self._peer("EXIT", peer)

    def peer_joined(self, peer: ZrePeer, group: str) -> None:
        self._peer("JOIN", peer, group=group)

    def peer_left(self, peer: ZrePeer, group: str) -> None:
        self._peer("LEAVE", peer, group=group)

    def whispered(self, peer: ZrePeer, content: list[bytes]) -> None:
        self._peer("WHISPER", peer, content=_text(content))

    def shouted(self, peer: ZrePeer, group: str, content: list[bytes]) -> None:
        self._peer("SHOUT", peer, group=group, content=_text(content))

    def peer_evasive(self, peer: ZrePeer) -> None:
        self._peer("EVASIVE", peer)


class ProbeRefusals:
    """
    A L{malamute_pack.pack.node.Stranger} that emits a C{REFUSED} event per
    node a CURVE probe does not let in, at most once per
    L{REFUSED_INTERVAL} for each (reason, key or endpoint).
    """

    def __init__(self, emit: Emit, clock: IReactorTime) -> None:
        self._emit = emit
        self._once = OncePer(clock, REFUSED_INTERVAL)

    def __call__(self, why: str, uuid: bytes, endpoint: str, key: bytes | None) -> None:
        if self._once.due((why, key or endpoint)):
            self._emit(
                {"event": "REFUSED", "why": why, "uuid": uuid.hex(), "endpoint": endpoint,
                 "key": None if key is None else key.decode("ascii", "replace")}
            )  # fmt: skip


class ProbeCommands:
    """Runs the probe's text commands on a L{Zyre} node."""

    def __init__(self, zyre: Zyre, emit: Emit, quit: Callable[[], None]) -> None:
        self._zyre = zyre
        self._emit = emit
        self._quit = quit

    def _error(self, message: str) -> None:
        self._emit({"event": "ERROR", "message": message})

    def _find(self, peer: str) -> bytes | None:
        for uuid, known in self._zyre.node.peers.items():
            if peer in (known.name, uuid.hex()):
                return uuid
        return None

    def run(self, line: str) -> None:
        """Do one command line."""
        words = line.strip().split(" ", 2)
        command = words[0].lower()
        if command == "":
            return
        if command == "quit":
            self._quit()
        elif command == "peers":
            for uuid, peer in self._zyre.node.peers.items():
                self._emit(
                    {"event": "PEER", "uuid": uuid.hex(), "name": peer.name,
                     "endpoint": peer.endpoint, "groups": sorted(peer.groups)}
                )  # fmt: skip
        elif command in ("join", "leave") and len(words) == 2:
            try:
                getattr(self._zyre, command)(words[1])
            except ValueError as e:
                self._error(str(e))
        elif command == "shout" and len(words) == 3:
            try:
                sent = self._zyre.shout(words[1], [words[2].encode()])
            except ValueError as e:
                self._error(str(e))
            else:
                self._emit({"event": "SHOUTED", "group": words[1], "peers": sent})
        elif command == "whisper" and len(words) == 3:
            target = self._find(words[1])
            if target is None:
                self._error(f"no peer {words[1]!r}")
            elif not self._zyre.whisper(target, [words[2].encode()]):
                self._error(f"the link to {words[1]!r} is full")
        else:
            self._error(f"unknown command {line.strip()!r}")


class StdioProbe(LineReceiver):
    """Commands from stdin, events to stdout."""

    delimiter = b"\n"

    def __init__(self, on_line: Callable[[str], None], on_end: Callable[[], None]) -> None:
        self._on_line = on_line
        self._on_end = on_end

    def emit(self, fields: dict[str, Any]) -> None:
        if self.transport is not None:
            self.transport.write(json.dumps(fields).encode() + b"\n")

    def lineReceived(self, line: bytes) -> None:
        self._on_line(line.decode("utf-8", "replace"))

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._on_end()


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m malamute_pack.pack.probe",
        description="One Zyre node: events as JSON lines on stdout, commands on stdin.",
    )
    parser.add_argument("--beacon", metavar="IFACE", help="beacon on this interface (or address)")
    parser.add_argument("--port", type=int, default=BEACON_PORT, help="the beacon UDP port")
    parser.add_argument("--interval", type=float, default=BEACON_INTERVAL, help="seconds")
    parser.add_argument("--endpoint", help="inbox endpoint (default tcp://IFACE-ADDRESS:*)")
    parser.add_argument("--group", action="append", default=[], help="join (repeatable)")
    parser.add_argument("--name", help="our name (default: from the uuid)")
    parser.add_argument("--header", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--gossip-connect", action="append", default=[], metavar="EP")
    parser.add_argument("--gossip-bind", action="append", default=[], metavar="EP")
    parser.add_argument("--curve-secret", metavar="FILE", help="our secret certificate: CURVE")
    parser.add_argument("--curve-peers", metavar="DIR", help="the peers' public certificates")
    options = parser.parse_args(argv)
    if (options.curve_secret is None) != (options.curve_peers is None):
        parser.error("CURVE needs both --curve-secret and --curve-peers")
    if options.beacon is None and options.endpoint is None:
        parser.error("give --beacon IFACE, or --endpoint with gossip")
    if any("=" not in header for header in options.header):
        parser.error("a --header is KEY=VALUE")
    return options


def main(argv: Sequence[str] | None = None) -> None:
    from twisted.internet import reactor
    from twisted.internet.stdio import StandardIO

    options = parse(sys.argv[1:] if argv is None else argv)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    curve: LinkCurve | None = None
    if options.curve_secret is not None:
        allowed = KeyAllowList(
            "zyre peer", load_client_keys(Path(options.curve_peers)), options.curve_peers
        )
        curve = LinkCurve(KeyPair.load(Path(options.curve_secret)), allowed)
        zap = ZapHandler(reactor, context, {})
        zap.serve(PACK_DOMAIN, allowed)
        zap.startService()

    def quit() -> None:
        if reactor.running:
            reactor.stop()

    commands: list[ProbeCommands] = []
    stdio = StdioProbe(lambda line: commands[0].run(line), quit)

    zyre = Zyre(
        reactor,
        context,
        ProbeEvents(stdio.emit),
        name=options.name,
        headers=dict(header.split("=", 1) for header in options.header),
        groups=options.group,
        endpoint=options.endpoint,
        beacon_interface=options.beacon,
        beacon_port=options.port,
        beacon_interval=options.interval,
        gossip_bind=options.gossip_bind,
        gossip_connect=options.gossip_connect,
        curve=curve,
        stranger=ProbeRefusals(stdio.emit, reactor),
    )
    commands.append(ProbeCommands(zyre, stdio.emit, quit))
    StandardIO(stdio)  # type: ignore[no-untyped-call]
    zyre.startService()
    stdio.emit(
        {"event": "STARTED", "uuid": zyre.uuid.hex(), "name": zyre.node.name,
         "endpoint": zyre.endpoint}
    )  # fmt: skip
    reactor.addSystemEventTrigger("before", "shutdown", zyre.stopService)
    reactor.run()
    context.destroy(linger=0)


if __name__ == "__main__":
    main()
