"""
Tests for L{malamute_pack.startup}: a broker (or a bridge) that cannot
start says why in one line on stderr and exits non-zero, with no
traceback, no usage, no process left running and no pid file left behind.
The pure parts (the lines, the plurals and spellings of the messages) are
tested here without processes; each error case a new user meets is then
tried with the real C{twistd}.
"""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import zmq
from twisted.application.service import MultiService, Service
from twisted.python import usage
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from malamute_pack import settings as _settings
from malamute_pack import startup
from malamute_pack.datadir import DataDirError, prepare
from malamute_pack.multicast import tap as bridge_tap
from malamute_pack.tap import Options
from malamute_pack.testing.brokerprocess import (
    BrokerProcess,
    checkout_environment,
    fresh_ipc_endpoint,
    twistd_command,
)
from malamute_pack.transport.router import BindError, bind_error_message
from tests.support import skip_slow


class BindMessageTests(SynchronousTestCase):
    def test_inUse(self) -> None:
        """An endpoint in use names it, the reason, and says to stop the other or pick another."""
        line = bind_error_message("ipc://@/malamute", errno.EADDRINUSE)
        self.assertEqual(
            line,
            "cannot bind ipc://@/malamute: Address already in use (another broker or program"
            " is bound there: stop it, or give this one another -e)",
        )

    def test_malformed(self) -> None:
        """A malformed endpoint is answered with examples of good ones."""
        line = bind_error_message("tcp://nonsense", errno.EINVAL)
        self.assertEqual(
            line,
            "cannot bind tcp://nonsense: Invalid argument (give an endpoint like tcp://*:9999,"
            " tcp://127.0.0.1:9999 or ipc://@/name)",
        )

    def test_hints(self) -> None:
        """Each usual refusal has its own fix."""
        for endpoint, number, fragment in [
            ("tcp://localhost:9999", errno.ENODEV, "not a host name"),
            ("tcp://10.99.99.99:9999", errno.EADDRNOTAVAIL, "no interface of this host"),
            ("tcp://*:80", errno.EACCES, "below 1024"),
            ("ipc:///no/such/dir/x", errno.ENOENT, "directory must exist"),
            ("udp://*:5", zmq.ENOCOMPATPROTO, "tcp:// and ipc://"),
            ("tcp://*:99999", errno.EINVAL, "at most 65535"),
        ]:
            self.assertIn(fragment, bind_error_message(endpoint, number), endpoint)

    def test_bindError(self) -> None:
        """A BindError is still a ZMQError with its errno, and its message is the line."""
        error = BindError("tcp://nonsense", zmq.ZMQError(errno.EINVAL))
        self.assertIsInstance(error, zmq.ZMQError)
        self.assertEqual(error.errno, errno.EINVAL)
        self.assertEqual(str(error), bind_error_message("tcp://nonsense", errno.EINVAL))


class DescribeTests(SynchronousTestCase):
    def test_forTheUser(self) -> None:
        """Errors written for the user are their own message, on one line."""
        self.assertEqual(startup.describe(DataDirError("a\n  b")), "a b")
        self.assertEqual(startup.describe(usage.UsageError("bad")), "bad")

    def test_osError(self) -> None:
        """An OSError names its file and the reason, without errno numbers."""
        error = FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/y")
        self.assertEqual(startup.describe(error), "/x/y: No such file or directory")

    def test_zmqError(self) -> None:
        """pyzmq's refusal of an endpoint is explained like the router's."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        socket = context.socket(zmq.ROUTER)
        self.addCleanup(socket.close, 0)
        with self.assertRaises(zmq.ZMQError) as caught:
            socket.bind("tcp://nonsense")
        self.assertEqual(
            startup.describe(caught.exception),
            bind_error_message("tcp://nonsense", errno.EINVAL, "use"),
        )

    def test_bug(self) -> None:
        """An error that is nobody's configuration (a bug) is not described: its traceback is."""
        self.assertIsNone(startup.describe(KeyError("x")))


class UsageLineTests(SynchronousTestCase):
    def parse_as_subcommand(self, options: usage.Options, *args: str) -> str:
        """What parsing C{args} as a twistd subcommand exits with."""
        parent = usage.Options()
        parent["pidfile"] = ""
        options.parent = parent
        with self.assertRaises(SystemExit) as caught:
            options.parseOptions(list(args))
        return str(caught.exception.code)

    def test_unknownOption(self) -> None:
        """An unknown option is one line that points at --help."""
        self.assertEqual(
            self.parse_as_subcommand(Options(), "--bogus"),
            "malamute: option --bogus not recognized (twistd malamute --help lists the options)",
        )

    def test_notANumber(self) -> None:
        """A number option given a word says so plainly."""
        self.assertEqual(
            self.parse_as_subcommand(Options(), "--timeout", "abc"),
            "malamute: 'abc' is not a whole number (twistd malamute --help lists the options)",
        )

    def test_settings(self) -> None:
        """A setting refused is its reason, with no usage around it."""
        line = self.parse_as_subcommand(Options(), "--acl", "/x")
        self.assertTrue(line.startswith("malamute: an access file (--acl"), line)
        self.assertIn("-p", line)

    def test_configFile(self) -> None:
        """A config file that cannot be read, or holds a bad value, is named in the line."""
        missing = Path(self.mktemp())
        self.assertEqual(
            self.parse_as_subcommand(Options(), "-c", str(missing)),
            f"malamute: cannot read config file {missing}: No such file or directory",
        )
        bad = Path(self.mktemp())
        bad.write_text("server\n    timeout = abc\n")
        self.assertEqual(
            self.parse_as_subcommand(Options(), "-c", str(bad)),
            f"malamute: config file {bad}: server/timeout: 'abc' is not a whole number",
        )

    def test_bridge(self) -> None:
        """twistd malamute-bridge's lines carry its own name."""
        self.assertEqual(
            self.parse_as_subcommand(bridge_tap.Options()),
            "malamute-bridge: say which broker to read: --bridge-source EP",
        )

    def test_alone(self) -> None:
        """Parsed on their own (no twistd around them) the options raise UsageError as usual."""
        self.assertRaises(usage.UsageError, Options().parseOptions, ["--bogus"])

    def test_help(self) -> None:
        """--help still prints the whole usage and exits 0, one option's lines unindented."""
        options = Options()
        self.assertIn("-e, --endpoint=", str(options))
        self.assertNotIn("  a null:", " ".join(str(options).split("\n")))


class PidFileTests(SynchronousTestCase):
    def test_running(self) -> None:
        """A pid file naming a running process (our parent) refuses the start, saying which."""
        path = Path(self.mktemp())
        path.write_text(f"{os.getppid()}")
        with self.assertRaises(startup.StartupError) as caught:
            startup.check_pid_file(str(path))
        self.assertIn(f"process {os.getppid()} is already running", str(caught.exception))
        self.assertIn("--pidfile", str(caught.exception))

    def test_stale(self) -> None:
        """A pid file that is missing, garbled, ours or names a dead process is left to twistd."""
        path = Path(self.mktemp())
        startup.check_pid_file(str(path))
        startup.check_pid_file("")
        path.write_text("garbage")
        startup.check_pid_file(str(path))
        path.write_text(f"{os.getpid()}")
        startup.check_pid_file(str(path))
        done = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        )
        path.write_text(done.stdout.strip())
        startup.check_pid_file(str(path))


class Recorder(Service):
    """A service that records its starts and stops in C{events}, or fails to start."""

    def __init__(self, name: str, events: list[str], fail: Exception | None = None) -> None:
        self.label = name
        self.events = events
        self.fail = fail

    def startService(self) -> None:
        if self.fail is not None:
            raise self.fail
        self.events.append(f"start {self.label}")
        super().startService()

    def stopService(self) -> None:
        self.events.append(f"stop {self.label}")
        super().stopService()


class FailFastTests(SynchronousTestCase):
    def test_startFails(self) -> None:
        """
        A child that fails to start: what had started stops, the last first,
        and the failure is StartupFailed with the line.
        """
        events: list[str] = []
        top = startup.FailFast("malamute")
        inner = MultiService()
        inner.setServiceParent(top)
        for service in [
            Recorder("a", events),
            Recorder("b", events),
            Recorder("c", events, DataDirError("data directory d is in use")),
            Recorder("d", events),
        ]:
            service.setServiceParent(inner)
        with self.assertRaises(startup.StartupFailed) as caught:
            top.startService()
        self.assertEqual(caught.exception.line, "malamute: data directory d is in use")
        self.assertEqual(events, ["start a", "start b", "stop b", "stop a"])
        self.assertFalse(top.running)
        self.assertFalse(inner.running)

    def test_bug(self) -> None:
        """An unexpected error still ends the start, pointing at the log's traceback."""
        events: list[str] = []
        top = startup.FailFast("malamute")
        Recorder("a", events, KeyError("x")).setServiceParent(top)
        with self.assertRaises(startup.StartupFailed) as caught:
            top.startService()
        self.assertIn("KeyError", caught.exception.line)
        self.assertIn("the log has the traceback", caught.exception.line)
        self.flushLoggedErrors(KeyError)

    def test_makeFails(self) -> None:
        """An error while making the service is SystemExit with the line; a bug is raised."""

        def refused() -> MultiService:
            raise DataDirError("data directory x is a file, not a directory")

        with self.assertRaises(SystemExit) as caught:
            startup.make_or_exit("malamute", refused)
        self.assertEqual(
            caught.exception.code, "malamute: data directory x is a file, not a directory"
        )

        def bug() -> MultiService:
            raise KeyError("x")

        self.assertRaises(KeyError, startup.make_or_exit, "malamute", bug)


class ExcepthookTests(SynchronousTestCase):
    def test_lineAlone(self) -> None:
        """An uncaught StartupFailed is printed as its line alone on the real stderr."""
        self.addCleanup(setattr, sys, "excepthook", sys.excepthook)
        seen: list[type[BaseException]] = []
        sys.excepthook = lambda kind, value, traceback: seen.append(kind)
        stderr = io.StringIO()
        self.patch(sys, "__stderr__", stderr)
        startup.install_excepthook()
        failed = startup.StartupFailed("malamute: cannot bind x")
        sys.excepthook(startup.StartupFailed, failed, None)
        self.assertEqual(stderr.getvalue(), "malamute: cannot bind x\n")
        sys.excepthook(KeyError, KeyError("x"), None)
        self.assertEqual(seen, [KeyError])  # anything else goes to the hook before


class DataDirTests(SynchronousTestCase):
    def test_prepare(self) -> None:
        """A missing data directory is made; a file, or a path under a file, says what to do."""
        directory = Path(self.mktemp()) / "a" / "b"
        prepare(directory)
        self.assertTrue(directory.is_dir())
        afile = Path(self.mktemp())
        afile.write_text("")
        with self.assertRaises(DataDirError) as caught:
            prepare(afile)
        self.assertIn("is a file, not a directory: give --data-dir", str(caught.exception))
        with self.assertRaises(DataDirError) as caught:
            prepare(afile / "data")
        self.assertIn("cannot be made: Not a directory", str(caught.exception))


class SmallTruthsTests(SynchronousTestCase):
    def test_limitSpelling(self) -> None:
        """Limits are named as the config file spells them (max-clients)."""
        with self.assertRaises(_settings.SettingsError) as caught:
            _settings.from_zpl({"malamute/limits/max-clients": ["0"]})
        self.assertIn("limit max-clients must be", str(caught.exception))
        with self.assertRaises(_settings.SettingsError) as refused:
            _settings.from_zpl({"malamute/limits/max-bogus": ["1"]})
        self.assertIn("max-clients", str(refused.exception))
        self.assertNotIn("_", str(refused.exception).split("known:")[1])

    def test_journalSpelling(self) -> None:
        """A bad journal setting names its config key, not the field behind it."""
        for key in ("commit-batch", "crash-skip", "prune-interval"):
            with self.assertRaises(_settings.SettingsError) as caught:
                _settings.from_zpl({f"malamute/journal/{key}": ["0"]})
            self.assertIn(f"malamute/journal/{key} must be", str(caught.exception), key)
        with self.assertRaises(_settings.SettingsError) as caught:
            _settings.from_zpl({"malamute/journal/stream-synchronous": ["sometimes"]})
        self.assertIn("malamute/journal/stream-synchronous must be one of", str(caught.exception))


class Run:
    """One finished run of twistd: its exit status, stderr and stdout."""

    def __init__(self, status: int, stderr: str, stdout: str) -> None:
        self.status = status
        self.stderr = stderr
        self.stdout = stdout


class TwistdTests(SynchronousTestCase):
    """Each error case, with the real twistd, as a new user meets it."""

    skip = skip_slow

    def setUp(self) -> None:
        self.directory = Path(self.mktemp()).resolve()
        self.directory.mkdir()

    def twistd(
        self,
        *args: str,
        plugin: str = "malamute",
        twistd_options: tuple[str, ...] = (),
        timeout: float = 20.0,
    ) -> Run:
        """Run C{twistd -n [twistd_options] PLUGIN args} in the test's directory to its end."""
        process = subprocess.Popen(
            twistd_command("--nodaemon", *twistd_options, plugin, *args),
            cwd=self.directory,
            env=checkout_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(_kill, process)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"twistd {plugin} {' '.join(args)} still runs after {timeout} s")
        return Run(process.returncode, stderr, stdout)

    def assertOneLine(self, run: Run, *fragments: str, program: str = "malamute") -> str:
        """C{run} failed with one line on stderr holding C{fragments}, and left nothing."""
        self.assertNotEqual(run.status, 0)
        lines = run.stderr.splitlines()
        self.assertEqual(len(lines), 1, run.stderr)
        [line] = lines
        self.assertTrue(line.startswith(f"{program}: "), line)
        for fragment in fragments:
            self.assertIn(fragment, line)
        for output in (run.stderr, run.stdout):
            self.assertNotIn("Traceback", output)
            self.assertNotIn("Usage:", output)
        self.assertFalse((self.directory / "twistd.pid").exists(), "twistd.pid left behind")
        return line

    def test_nonsenseEndpoint(self) -> None:
        """An endpoint that is not one: the line says what one looks like."""
        run = self.twistd("-e", "tcp://nonsense", "-d", "data")
        self.assertEqual(
            self.assertOneLine(run),
            "malamute: cannot bind tcp://nonsense: Invalid argument (give an endpoint like"
            " tcp://*:9999, tcp://127.0.0.1:9999 or ipc://@/name)",
        )
        self.assertIn("Main loop terminated.", run.stdout)  # the journal was closed first

    def test_endpointInUse(self) -> None:
        """A second broker on a bound endpoint names the endpoint and the way out."""
        endpoint = fresh_ipc_endpoint("start")
        (self.directory / "pw").write_text("user = secret\n")
        with BrokerProcess(self.directory / "first", bind=endpoint):
            run = self.twistd("-e", endpoint, "-d", "second")
            self.assertOneLine(run, f"cannot bind {endpoint}: Address already in use", "-e")
            # A PLAIN socket binds once the ZAP handler runs.
            run = self.twistd("-e", f"plain:{endpoint}", "-p", "pw", "-d", "third")
            self.assertOneLine(run, f"cannot bind {endpoint}: Address already in use")

    def test_dataDirLocked(self) -> None:
        """A data directory another broker holds names that broker."""
        with BrokerProcess(self.directory / "first") as first:
            run = self.twistd("-e", fresh_ipc_endpoint("start"), "-d", str(first.data_dir))
            self.assertOneLine(run, "in use by another broker", f"process {first.pid}")

    def test_sameDirectory(self) -> None:
        """A second broker started where one runs is told about the first, not about pid files."""
        first = subprocess.Popen(
            twistd_command("--nodaemon", "malamute", "-e", fresh_ipc_endpoint("start")),
            cwd=self.directory,
            env=checkout_environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.addCleanup(_kill, first)
        pid_file = self.directory / "twistd.pid"
        deadline = time.monotonic() + 20
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        run = self.twistd("-e", fresh_ipc_endpoint("start"))
        self.assertNotEqual(run.status, 0)
        self.assertEqual(
            run.stderr.splitlines(),
            [
                f"malamute: process {first.pid} is already running from this directory (its pid"
                f" file is {pid_file}): stop it, or start this one from another directory or"
                " with twistd --pidfile OTHER.pid"
            ],
        )
        self.assertEqual(pid_file.read_text(), str(first.pid))  # the first's, untouched

    def test_dataDirIsAFile(self) -> None:
        """-d naming a file: one line, no FileExistsError."""
        (self.directory / "afile").write_text("")
        run = self.twistd("-e", fresh_ipc_endpoint("start"), "-d", "afile")
        self.assertOneLine(run, "data directory afile is a file", "--data-dir")

    def test_dataDirReadOnly(self) -> None:
        """A data directory on a read-only file system: one line that says so."""
        if os.getuid() != 0:
            raise SkipTest("mounting a read-only tmpfs needs root")
        mount = self.directory / "ro"
        mount.mkdir()
        mount_command = ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)]
        subprocess.run(mount_command, check=True)
        self.addCleanup(subprocess.run, ["umount", str(mount)], check=True)
        run = self.twistd("-e", fresh_ipc_endpoint("start"), "-d", str(mount))
        self.assertOneLine(run, f"data directory {mount} is not writable", "--data-dir")
        run = self.twistd("-e", fresh_ipc_endpoint("start"), "-d", str(mount / "data"))
        self.assertOneLine(run, "cannot be made: Read-only file system")

    def test_securityFiles(self) -> None:
        """A password or access file that is missing is named, with what it should hold."""
        run = self.twistd("-e", fresh_ipc_endpoint("start"), "-d", "d", "-p", "/nonexistent")
        self.assertOneLine(
            run, "cannot read password file /nonexistent: No such file or directory", "-p"
        )
        (self.directory / "pw").write_text("user = secret\n")
        run = self.twistd(
            "-e", fresh_ipc_endpoint("start"), "-d", "d", "-p", "pw", "--acl", "/nonexistent"
        )
        self.assertOneLine(run, "cannot read access file /nonexistent", "--acl")

    def test_badConfigAndOptions(self) -> None:
        """A bad config file, an unknown option: one line each, no usage."""
        (self.directory / "bad.cfg").write_text("server\n    timeout = abc\n")
        run = self.twistd("-c", "bad.cfg")
        self.assertOneLine(run, "config file bad.cfg: server/timeout: 'abc' is not a whole number")
        run = self.twistd("--bogus")
        self.assertOneLine(run, "option --bogus not recognized", "--help")
        run = self.twistd("--bogus", plugin="malamute-bridge")
        self.assertOneLine(run, "option --bogus not recognized", program="malamute-bridge")

    def test_unknownConfigKey(self) -> None:
        """A misspelt config key stops the start, in one line naming it and the key meant."""
        (self.directory / "malamute.cfg").write_text(
            "server\n    timeout = 1000\nmalamute\n    data-dir = d\nserver\n    timout = 5000\n"
        )
        run = self.twistd("-c", "malamute.cfg", "-e", fresh_ipc_endpoint("start"))
        self.assertEqual(
            self.assertOneLine(run),
            "malamute: config error: malamute.cfg line 6: unknown key server/timout;"
            " did you mean server/timeout?",
        )
        self.assertFalse((self.directory / "d").exists(), "the broker made its data directory")

    def test_failsAfterTheJournalOpened(self) -> None:
        """
        A failure once the journal runs (its threads) still ends the
        process: what had started is stopped first.
        """
        run = self.twistd(
            "-e",
            fresh_ipc_endpoint("start"),
            "-d",
            "d",
            "--pack",
            "p",
            "--gossip-bind",
            "tcp://nonsense",
            "--peer-endpoint",
            "tcp://127.0.0.1:*",
        )
        self.assertOneLine(run, "cannot use tcp://nonsense: Invalid argument")
        self.assertIn("journal", run.stdout)

    def test_help(self) -> None:
        """twistd malamute --help still prints the whole usage and exits 0."""
        run = self.twistd("--help")
        self.assertEqual(run.status, 0)
        self.assertIn("--endpoint=", run.stdout)
        self.assertIn("--data-dir=", run.stdout)


def _kill(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)
