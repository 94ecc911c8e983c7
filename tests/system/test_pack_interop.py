"""
Interop with pyre (``colmena-zeromq-pyre``, zeromq's pure Python Zyre), as
slow system tests run as root: two hosts made as network namespaces on one
LAN (L{malamute_pack.testing.netns.Lan}, 10.77.12.0/24), our probe
(C{python -m malamute_pack.pack.probe}) on one and a small pyre node on the
other. Each finds the other by UDP beacons, sees it ENTER and JOIN the
group, and they exchange WHISPER and SHOUT both ways; when our probe quits,
pyre sees it EXIT.

Both programs speak the same JSON lines: events out, commands in.
"""

from __future__ import annotations

import importlib.util
import json
import os
import selectors
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, ClassVar, cast

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from malamute_pack.testing.brokerprocess import PROJECT_ROOT
from malamute_pack.testing.netns import Lan, netns_available
from tests.support import skip_slow

# This helper's share of the project's addresses (see the brief; each test's
# namespace prefix is in its class's PREFIXES).
SUBNET = "10.77.12"
GROUP = "CHAT"

# A pyre node on eth0 named argv[1] in GROUP: its events as JSON lines on
# stdout, commands on stdin (shout GROUP TEXT, whisper NAME TEXT, quit).
# (pyzmq's Poller gives back the fd of a file registered, not the file.)
PYRE_NODE = textwrap.dedent(
    """
    import json, os, sys, uuid, zmq
    from pyre import Pyre

    def say(**fields):
        print(json.dumps(fields), flush=True)

    node = Pyre(sys.argv[1])
    node.set_interface("eth0")
    node.set_header("X-ROLE", "pyre")
    node.join(sys.argv[2])
    node.start()
    say(event="STARTED", uuid=node.uuid().hex, endpoint=node.endpoint())
    names = {}
    stdin = sys.stdin.fileno()
    poller = zmq.Poller()
    poller.register(node.socket(), zmq.POLLIN)
    poller.register(stdin, zmq.POLLIN)
    typed = b""
    running = True
    while running:
        for item, _ in poller.poll(100):
            if item == stdin:
                data = os.read(stdin, 65536)
                running = bool(data)
                *lines, typed = (typed + data).split(b"\\n")
                for line in lines:
                    words = line.decode().split(" ", 2)
                    if words[0] == "quit":
                        running = False
                    elif words[0] == "shout":
                        node.shout(words[1], words[2].encode())
                    elif words[0] == "whisper":
                        node.whisper(names[words[1]], words[2].encode())
                continue
            frames = node.recv()
            kind, peer, name = frames[0].decode(), uuid.UUID(bytes=frames[1]), frames[2].decode()
            fields = {"event": kind, "uuid": peer.hex, "name": name}
            if kind == "ENTER":
                names[name] = peer
                fields["headers"] = json.loads(frames[3].decode())
            elif kind in ("JOIN", "LEAVE"):
                fields["group"] = frames[3].decode()
            elif kind == "SHOUT":
                fields["group"] = frames[3].decode()
                fields["content"] = [f.decode() for f in frames[4:]]
            elif kind == "WHISPER":
                fields["content"] = [f.decode() for f in frames[3:]]
            say(**fields)
    node.stop()
    """
)


class Program:
    """A program on a host, spoken to in JSON lines; what it said is kept."""

    def __init__(self, process: subprocess.Popen[bytes], label: str, stderr: Path) -> None:
        self.process = process
        self.label = label
        self.stderr = stderr
        self.heard: list[dict[str, Any]] = []
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        assert process.stdout is not None
        self._selector.register(process.stdout, selectors.EVENT_READ)

    def _read(self, timeout: float) -> None:
        assert self.process.stdout is not None
        if not self._selector.select(timeout):
            return
        chunk = os.read(self.process.stdout.fileno(), 65536)
        if not chunk:
            raise AssertionError(f"{self.label} ended: {self.heard}\n{self.errors()}")
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        self.heard += [json.loads(line) for line in lines if line.strip()]

    def expect(self, timeout: float = 15.0, **fields: Any) -> dict[str, Any]:
        """The first event said (until now or within C{timeout}) with C{fields}."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.heard:
                if all(event.get(k) == v for k, v in fields.items()):
                    return event
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.label} never said {fields}; said {self.heard}\n{self.errors()}"
                )
            self._read(min(left, 0.2))

    def errors(self) -> str:
        """The end of what it wrote on stderr."""
        return f"{self.label} stderr: {self.stderr.read_text()[-3000:]}"

    def command(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((line + "\n").encode())
        self.process.stdin.flush()


class PyreInteropTests(SynchronousTestCase):
    skip = skip_slow
    # Each test method's namespace prefix, used by no other test: tests run
    # side by side, and a Lan's create() deletes what its prefix names.
    PREFIXES: ClassVar[dict[str, str]] = {"test_pyre": "mpb2"}

    def setUp(self) -> None:
        why = netns_available()
        if why is not None:
            raise SkipTest(why)
        if importlib.util.find_spec("pyre") is None:
            raise SkipTest("pyre (colmena-zeromq-pyre) is not installed")
        self.lan = Lan(self.PREFIXES[self._testMethodName], SUBNET, 2)
        self.addCleanup(self.lan.destroy)
        self.lan.create()

    def start(self, host: int, argv: list[str], label: str) -> Program:
        stderr = Path(self.mktemp())
        with stderr.open("wb") as errors:
            process = self.lan.hosts[host].popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                cwd=PROJECT_ROOT,
                text=False,
            )
        self.addCleanup(_end, process)
        return Program(cast("subprocess.Popen[bytes]", process), label, stderr)

    def test_pyre(self) -> None:
        """
        Our probe and a pyre node see each other ENTER (with headers) and
        JOIN, exchange WHISPER and SHOUT both ways, and pyre sees our EXIT.
        """
        pyre = self.start(1, [sys.executable, "-c", PYRE_NODE, "pyre", GROUP], "pyre")
        ours = self.start(
            0,
            [sys.executable, "-m", "malamute_pack.pack.probe", "--beacon", "eth0",
             "--group", GROUP, "--name", "ours", "--header", "X-ROLE=broker"],
            "probe",
        )  # fmt: skip
        started = ours.expect(event="STARTED")
        self.assertRegex(started["endpoint"], r"^tcp://10\.77\.12\.1:[0-9]+$")
        pyre_started = pyre.expect(event="STARTED")

        entered = ours.expect(event="ENTER", name="pyre")
        self.assertEqual(entered["uuid"], pyre_started["uuid"])
        self.assertEqual(entered["headers"], {"X-ROLE": "pyre"})
        ours.expect(event="JOIN", name="pyre", group=GROUP)
        entered = pyre.expect(event="ENTER", name="ours")
        self.assertEqual(entered["uuid"], started["uuid"])
        self.assertEqual(entered["headers"], {"X-ROLE": "broker"})
        pyre.expect(event="JOIN", name="ours", group=GROUP)

        ours.command("whisper pyre hello pyre")
        ours.command(f"shout {GROUP} hello all")
        pyre.command("whisper ours hello ours")
        pyre.command(f"shout {GROUP} hello from pyre")
        pyre.expect(event="WHISPER", name="ours", content=["hello pyre"])
        pyre.expect(event="SHOUT", name="ours", group=GROUP, content=["hello all"])
        ours.expect(event="WHISPER", name="pyre", content=["hello ours"])
        ours.expect(event="SHOUT", name="pyre", group=GROUP, content=["hello from pyre"])
        self.assertEqual([e for e in ours.heard if e["event"] == "ERROR"], [])

        ours.command("quit")
        pyre.expect(event="EXIT", name="ours")
        self.assertEqual(ours.process.wait(10), 0)


def _end(process: subprocess.Popen[Any]) -> None:
    """End a program this test started (by its pid), and reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()
