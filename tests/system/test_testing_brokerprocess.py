"""
Tests for L{malamute_pack.testing.brokerprocess}, the broker as a real
process that the system tests and the benchmark start (slow system tests):
started, killed, restarted and stopped, its extra arguments, the Python
commands it runs, and (as root) a broker in a network namespace of a
L{malamute_pack.testing.netns.Lan}.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import zmq
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import (
    ANY_TCP_PORT,
    BrokerError,
    BrokerProcess,
    python_command,
    run_python,
)
from malamute_pack.testing.netns import Lan, netns_available
from tests.support import skip_slow


class BrokerProcessTests(SynchronousTestCase):
    """L{BrokerProcess}: real broker processes, started, killed, restarted and stopped."""

    skip = skip_slow

    def setUp(self) -> None:
        self.directory = Path(self.mktemp()).resolve()
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)

    def broker(self, **kwargs: Any) -> BrokerProcess:
        """A started broker, stopped (and checked) when the test ends."""
        broker = BrokerProcess(self.directory, **kwargs)
        self.addCleanup(broker.stop)
        broker.start()
        return broker

    def command(
        self,
        endpoint: str,
        *messages: mlm.Message,
        plain: tuple[str, str] | None = None,
        then: int = 0,
    ) -> list[mlm.Message]:
        """
        The answer to each of C{messages}, sent in turn from one new DEALER,
        and C{then} more messages that follow the last answer.
        """
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        if plain is not None:
            dealer.setsockopt_string(zmq.PLAIN_USERNAME, plain[0])
            dealer.setsockopt_string(zmq.PLAIN_PASSWORD, plain[1])
        dealer.connect(endpoint)
        answers = []
        try:
            for message in messages:
                dealer.send_multipart(mlm.encode(message))
                self.assertTrue(dealer.poll(5000), f"no answer to {message}")
                answers.append(mlm.decode(dealer.recv_multipart()))
            for _ in range(then):
                self.assertTrue(dealer.poll(5000), f"{then} messages wanted after {answers}")
                answers.append(mlm.decode(dealer.recv_multipart()))
        finally:
            dealer.close()
        return answers

    def test_tcpPortReadBack(self) -> None:
        """
        Bound to a C{*} tcp port, the broker's endpoint is the port it
        really got, read from its log, and it serves there once started.
        """
        broker = self.broker(bind=ANY_TCP_PORT)
        self.assertRegex(broker.endpoint, r"^tcp://127\.0\.0\.1:[1-9][0-9]*$")
        self.assertIn(f"Malamute broker bound to {broker.endpoint}", broker.log_text())
        self.assertEqual(self.command(broker.endpoint, mlm.ConnectionOpen()), [mlm.Ok()])

    def test_killAndRestart(self) -> None:
        """
        SIGKILLed and started again, the broker is a new process on the
        same endpoint (a C{*} port included) and the same data directory:
        a letter stored before the kill is delivered after it.
        """
        broker = self.broker(bind=ANY_TCP_PORT, data_dir=self.directory / "data")
        endpoint, pid = broker.endpoint, broker.pid
        stored = self.command(
            endpoint,
            mlm.ConnectionOpen(version=2, address="tx"),
            mlm.MailboxSend("rx", "kept", "", 0, [b"x"]),
        )
        assert isinstance(stored[1], mlm.Stored)
        self.assertEqual(stored[1].status_code, mlm.SUCCESS)
        broker.kill()
        self.assertFalse(broker.alive())
        broker.start()
        self.assertEqual(broker.endpoint, endpoint)
        self.assertNotEqual(broker.pid, pid)
        self.assertTrue((self.directory / "data" / "journal.sqlite").exists())
        opened = self.command(endpoint, mlm.ConnectionOpen(version=2, address="rx"), then=1)
        self.assertEqual(
            opened,
            [mlm.Ok(), mlm.MailboxRecord(stored[1].id, "tx", "rx", "kept", "", [b"x"])],
        )

    def test_cleanStop(self) -> None:
        """
        A stop is SIGTERM: the broker exits with -SIGTERM after "Main loop
        terminated.", and a second stop does nothing.
        """
        broker = BrokerProcess(self.directory)
        broker.start()
        self.assertEqual(broker.stop(), -signal.SIGTERM)
        self.assertIn("Main loop terminated.", broker.run_log())
        self.assertIsNone(broker.stop())

    def test_killedIsNotACleanStop(self) -> None:
        """A broker killed behind the helper's back fails the stop, with its log."""
        broker = BrokerProcess(self.directory)
        broker.start()
        os.kill(broker.pid, signal.SIGKILL)
        error = self.assertRaises(BrokerError, broker.stop)
        self.assertIn(f"exited with {-signal.SIGKILL}", str(error))
        self.assertIn("Malamute broker bound to", str(error))

    def test_cannotStart(self) -> None:
        """A broker that exits before serving fails the start, with its log (the usage error)."""
        broker = BrokerProcess(self.directory, args=["--no-such-option"])
        error = self.assertRaises(BrokerError, broker.start)
        self.assertIn("no-such-option", str(error))
        self.assertFalse(broker.alive())

    def test_extraArguments(self) -> None:
        """
        Extra arguments reach C{twistd malamute}: with a password file the
        broker requires PLAIN (the probe uses the credentials it is given);
        without the journal it writes no journal file.
        """
        passwords = self.directory / "passwords.cfg"
        passwords.parent.mkdir(parents=True)
        passwords.write_text("admin = secret\n")
        broker = self.broker(
            args=["--passwords", str(passwords)], plain=("admin", "secret"), journal=False
        )
        self.assertEqual(
            self.command(broker.endpoint, mlm.ConnectionOpen(), plain=("admin", "secret")),
            [mlm.Ok()],
        )
        self.assertEqual(broker.data_dir, self.directory.resolve() / "malamute-data")
        self.assertFalse((broker.data_dir / "journal.sqlite").exists())


# Sends CONNECTION_OPEN to the broker at argv[1] and prints the answer
# (repr of the decoded message), or "nothing" after 5 seconds.
OPEN_CLIENT = textwrap.dedent(
    """
    import sys, zmq
    from malamute_pack.protocol import mlm
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(sys.argv[1])
    dealer.send_multipart(mlm.encode(mlm.ConnectionOpen()))
    print(repr(mlm.decode(dealer.recv_multipart())) if dealer.poll(5000) else "nothing")
    dealer.close()
    context.term()
    """
)


class PythonCommandTests(SynchronousTestCase):
    def test_command(self) -> None:
        """L{python_command} runs this Python, through C{ip netns exec} for a namespace."""
        self.assertEqual(python_command(None, "-c", "x"), [sys.executable, "-c", "x"])
        self.assertEqual(
            python_command("mpc2h1", "-c", "x"),
            ["ip", "netns", "exec", "mpc2h1", sys.executable, "-c", "x"],
        )

    def test_runPython(self) -> None:
        """L{run_python} runs a snippet with the checkout importable, its output as text."""
        ran = run_python(None, "-c", "import malamute_pack, sys; print(sys.argv[1])", "hi")
        self.assertEqual((ran.returncode, ran.stdout), (0, "hi\n"), ran.stderr)


class NetnsBrokerProcessTests(SynchronousTestCase):
    """
    L{BrokerProcess} in a network namespace: a host of a two-host Lan
    (10.77.13.0/24).

    @cvar PREFIXES: each test method's namespace prefix, used by no other
        test (tests run side by side, and a Lan's create() deletes what
        its prefix names).
    """

    skip = skip_slow
    PREFIXES: ClassVar[dict[str, str]] = {
        "test_ipcInsideTheNamespace": "mpr1",
        "test_tcpFromAnotherHost": "mpr2",
        "test_plainProbeInTheNamespace": "mpr3",
        "test_noSuchNamespace": "mpr4",
    }

    def setUp(self) -> None:
        reason = netns_available()
        if reason is not None:
            raise SkipTest(reason)
        self.directory = Path(self.mktemp()).resolve()
        self.prefix = self.PREFIXES[self._testMethodName]
        self.lan = Lan(self.prefix, "10.77.13", 2)
        self.addCleanup(self.lan.destroy)
        self.lan.create()

    def broker(self, **kwargs: Any) -> BrokerProcess:
        """A started broker in host 1's namespace, stopped (and checked) when the test ends."""
        broker = BrokerProcess(self.directory, netns=self.lan.hosts[0].name, **kwargs)
        self.addCleanup(broker.stop)
        broker.start()
        return broker

    def open(self, netns: str | None, endpoint: str) -> str:
        """What a client in C{netns} gets for a CONNECTION_OPEN to C{endpoint}."""
        ran = run_python(netns, "-c", OPEN_CLIENT, endpoint)
        self.assertEqual(ran.returncode, 0, ran.stderr)
        return ran.stdout.strip()

    def test_ipcInsideTheNamespace(self) -> None:
        """
        A broker on an abstract ipc name in a namespace serves CONNECTION_OPEN
        to a client in that namespace; the same name from this process's
        namespace reaches nothing. Its pid is the broker itself (the
        twistd command, in the namespace), not C{ip netns exec}; its stop
        is clean.
        """
        broker = self.broker()
        host = self.lan.hosts[0]
        self.assertTrue(broker.endpoint.startswith("ipc://@/"), broker.endpoint)
        self.assertEqual(self.open(host.name, broker.endpoint), repr(mlm.Ok()))
        self.assertEqual(self.open(None, broker.endpoint), "nothing")
        self.assertEqual(
            os.stat(f"/proc/{broker.pid}/ns/net").st_ino,
            os.stat(f"/run/netns/{host.name}").st_ino,
        )
        cmdline = Path(f"/proc/{broker.pid}/cmdline").read_bytes().split(b"\0")
        self.assertEqual(cmdline[0], sys.executable.encode())
        self.assertIn(b"malamute", cmdline)
        self.assertEqual(broker.stop(), -signal.SIGTERM)
        self.assertIn("Main loop terminated.", broker.run_log())

    def test_tcpFromAnotherHost(self) -> None:
        """
        A broker in host 1's namespace bound to C{tcp://HOST1:*} serves a
        client on host 2; SIGKILLed and started again it is a new process
        on the same endpoint, which host 2 reaches again.
        """
        host, other = self.lan.hosts
        broker = self.broker(bind=f"tcp://{host.address}:*")
        self.assertRegex(broker.endpoint, rf"^tcp://{re.escape(host.address)}:[1-9][0-9]*$")
        self.assertEqual(self.open(other.name, broker.endpoint), repr(mlm.Ok()))
        pid = broker.pid
        broker.kill()
        self.assertFalse(broker.alive())
        self.assertFalse(Path(f"/proc/{pid}").exists())
        broker.start()
        self.assertNotEqual(broker.pid, pid)
        self.assertEqual(self.open(other.name, broker.endpoint), repr(mlm.Ok()))

    def test_plainProbeInTheNamespace(self) -> None:
        """
        The probe, run in the namespace, passes the PLAIN credentials it is
        given to a broker that requires them; with a wrong password it
        gives up at the start's timeout and the start fails, saying so.
        """
        passwords = self.directory / "passwords.cfg"
        passwords.parent.mkdir(parents=True)
        passwords.write_text("admin = secret\n")
        refused = BrokerProcess(
            self.directory / "refused",
            netns=self.lan.hosts[0].name,
            args=["--passwords", str(passwords)],
            plain=("admin", "wrong"),
        )
        # Room for a slow start: tests run side by side on a loaded machine.
        error = self.assertRaises(BrokerError, refused.start, timeout=10.0)
        self.assertIn(
            f"the probe in {self.prefix}h1 failed (1): broker did not serve in time", str(error)
        )
        self.assertFalse(refused.alive())
        broker = self.broker(args=["--passwords", str(passwords)], plain=("admin", "secret"))
        self.assertIn("Malamute broker bound to", broker.run_log())

    def test_noSuchNamespace(self) -> None:
        """A broker in a namespace that does not exist fails its start, saying why."""
        missing = f"{self.prefix}nope"
        broker = BrokerProcess(self.directory, netns=missing)
        error = self.assertRaises(BrokerError, broker.start)
        self.assertIn(missing, str(error))
        self.assertFalse(broker.alive())
