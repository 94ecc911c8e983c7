"""
The broker as a real process, for the benchmark and the tests:
``twistd --nodaemon malamute``, run by the twistd of the Python running
this code, with the checkout on its C{PYTHONPATH}.

It binds a fresh abstract ipc name, or C{tcp://127.0.0.1:*}, and reads the
endpoint it really got back from its log line C{Malamute broker bound to
<endpoint>}, and with C{--http} its management API's URL from C{management
API at <url>} (never a port picked free and released, which another process
can take in between); it serves once it has answered CONNECTION_OPEN from a
throwaway probe. It can be SIGKILLed and started again on the same data
directory and the same endpoint, so that reconnecting clients find it.

Why twistd's profiler and not ``python -m cProfile``: after a clean
shutdown on SIGTERM, twistd (and ``twist``) re-raise the signal with the
default handler so that the exit status says how the process ended; that
kills the interpreter before ``python -m cProfile`` could write its file.
twistd's ``--profile`` runs just ``reactor.run`` under cProfile and dumps
the statistics as soon as it returns, before the signal is re-raised.

So a clean stop is: SIGTERM, exit status -SIGTERM (or 0), "Main loop
terminated." in the log of that run and, when profiling, a profile file.

A broker can run in a network namespace (a host of a
L{malamute_pack.testing.netns.Lan}): its command is prefixed with ``ip netns
exec NAME``, which execs it, so the pid this module holds is the broker's
own and its signals (stop, kill) reach the broker. Its endpoints are read
from its log as usual, but the readiness probe must connect from inside
that namespace (an abstract ipc name, 127.0.0.1, even the host's address
are only reachable there or from the Lan): it runs in a short subprocess
started with L{python_command}, which this process watches together with
the broker. (The log line alone is not taken as ready: bound is not yet
serving, and a probe from the namespace also proves that clients there
get in, PLAIN or CURVE included.) Clients of such a broker run inside the
namespace too (L{python_command}, L{run_python}), or on another host of
the Lan for a broker bound to its host's tcp address.

Tests: ``tests/system/test_testing_brokerprocess.py``; the benchmark that
uses it in ``tests/system/test_bench.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

import zmq

import malamute_pack
from malamute_pack.protocol import mlm
from malamute_pack.testing.netns import netns_command

# The directory that holds the malamute_pack package and twisted/plugins.
PROJECT_ROOT = Path(malamute_pack.__file__).resolve().parent.parent

# Bind this to have the broker pick a free tcp port on loopback.
ANY_TCP_PORT = "tcp://127.0.0.1:*"

# What the router logs for each endpoint it binds (malamute_pack/transport/router.py).
_BOUND = re.compile(r"Malamute broker bound to (\S+)")
# What the management API logs when it listens (--http).
_HTTP = re.compile(r"management API at (http://\S+/)")
_CLEAN_EXIT = "Main loop terminated."

_serial = itertools.count(1)


def fresh_ipc_endpoint(label: str = "broker") -> str:
    """An ipc endpoint in the abstract namespace that no other process of this host uses."""
    return f"ipc://@/malamute-{label}-{os.getpid()}-{next(_serial)}"


def twistd_command(*args: str, python_options: Sequence[str] = ()) -> list[str]:
    """
    The command that runs C{twistd *args} with the Python running this code
    (so with its Twisted, whatever script directory it has).

    @param python_options: options for the interpreter itself (C{-S}...).
    """
    return [
        sys.executable,
        *python_options,
        "-c",
        "from twisted.scripts.twistd import run; run()",
        *args,
    ]


def checkout_environment(**overrides: str) -> dict[str, str]:
    """This process's environment with the checkout first on C{PYTHONPATH}."""
    env = dict(os.environ, **overrides)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    return env


def python_command(netns: str | None, *args: str) -> list[str]:
    """
    The Python running this code with C{args} (C{"-c", code, ...} or a
    script), inside the network namespace C{netns} if one is given. Run it
    with C{env=}L{checkout_environment}C{()} to import the checkout (as
    L{run_python} does).
    """
    command = [sys.executable, *args]
    return command if netns is None else netns_command(netns, command)


def run_python(
    netns: str | None, *args: str, timeout: float = 60.0, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """
    Run L{python_command}C{(netns, *args)} with the checkout importable and
    wait for it: its output is captured as text unless C{kwargs} say
    otherwise (they go to C{subprocess.run}).
    """
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("env", checkout_environment())
    done: subprocess.CompletedProcess[str] = subprocess.run(
        python_command(netns, *args), timeout=timeout, **kwargs
    )
    return done


class BrokerError(Exception):
    """The broker did not start, did not serve, or did not exit cleanly."""


def terminate(process: subprocess.Popen[bytes], timeout: float, what: str) -> int:
    """
    SIGTERM C{process} (unless it has exited) and reap it; its exit status.

    @raise BrokerError: if it is still running after C{timeout} seconds
        (it is SIGKILLed and reaped first).
    """
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise BrokerError(f"{what} ignored SIGTERM for {timeout}s") from None
    return process.returncode


def open_connection(
    endpoint: str,
    *,
    plain: tuple[str, str] | None = None,
    curve: tuple[str, str, str] | None = None,
    check: Callable[[], None],
) -> None:
    """
    Open a connection to the broker at C{endpoint} from a throwaway DEALER
    until it answers, then close it: whatever answers arrive late go to that
    socket, not to a test's or the load's own. Between attempts (half a
    second each) C{check} is called: it raises to give up.

    @raise BrokerError: the broker answered the OPEN with anything but OK.
    """
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    probe = context.socket(zmq.DEALER)
    probe.setsockopt(zmq.LINGER, 0)
    if plain is not None:
        probe.setsockopt_string(zmq.PLAIN_USERNAME, plain[0])
        probe.setsockopt_string(zmq.PLAIN_PASSWORD, plain[1])
    if curve is not None:
        probe.setsockopt_string(zmq.CURVE_SERVERKEY, curve[0])
        probe.setsockopt_string(zmq.CURVE_PUBLICKEY, curve[1])
        probe.setsockopt_string(zmq.CURVE_SECRETKEY, curve[2])
    try:
        probe.connect(endpoint)
        while True:
            # Never blocking: a connection refused (a PLAIN or CURVE handshake
            # that failed) leaves the DEALER no pipe, and a blocking send would
            # wait there for ever instead of giving up at the deadline.
            with contextlib.suppress(zmq.Again):
                probe.send_multipart(mlm.encode(mlm.ConnectionOpen()), zmq.NOBLOCK)
            if probe.poll(500):
                reply = mlm.decode(probe.recv_multipart())
                if reply != mlm.Ok():
                    raise BrokerError(f"broker answered the probe's OPEN with {reply}")
                break
            check()
        with contextlib.suppress(zmq.Again):
            probe.send_multipart(mlm.encode(mlm.ConnectionClose()), zmq.NOBLOCK)
        probe.poll(1000)  # its OK; not waiting for it is harmless
    finally:
        probe.close(linger=0)
        context.term()


def probe_main() -> None:
    """
    The readiness probe as a process of its own (run inside a broker's
    network namespace): reads C{{"endpoint", "plain", "curve", "timeout"}}
    as JSON from stdin, exits 0 once the broker has answered OK, else 1
    with the reason on stderr.
    """
    request = json.load(sys.stdin)
    deadline = time.monotonic() + float(request["timeout"])

    def check() -> None:
        if time.monotonic() > deadline:
            raise BrokerError("broker did not serve in time")

    plain, curve = request.get("plain"), request.get("curve")
    try:
        open_connection(
            request["endpoint"],
            plain=None if plain is None else (plain[0], plain[1]),
            curve=None if curve is None else (curve[0], curve[1], curve[2]),
            check=check,
        )
    except BrokerError as e:
        print(e, file=sys.stderr)
        sys.exit(1)


_PROBE = "from malamute_pack.testing.brokerprocess import probe_main; probe_main()"


class Started:
    """
    A context manager over C{start}, C{stop} and C{kill}: started on entry
    (killed if the start fails), stopped on a clean exit (a stop that
    fails raises), killed if the block raised (that error says more).
    """

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> object:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.kill()
            raise
        return self

    def __exit__(self, *error: object) -> None:
        if error[0] is None:
            self.stop()
        else:
            self.kill()


class BrokerProcess(Started):
    """
    One broker, started and stopped as often as a test likes: every start
    appends its output to the same log, binds what the first start bound
    and uses the same data directory.

    @ivar directory: its working directory (made if missing).
    @ivar data_dir: its data directory: the one given, else the broker's
        default, C{malamute-data} in C{directory}.
    @ivar log: where its stdout and stderr go, its log lines included.
    @ivar profile: where cProfile writes its statistics, if it runs under it.
    @ivar netns: the network namespace it runs in, or None for this
        process's.
    @ivar process: the running process, or None.
    """

    def __init__(
        self,
        directory: Path,
        *,
        bind: str | None = None,
        data_dir: Path | None = None,
        journal: bool = True,
        timeout_ms: int | None = None,
        args: Sequence[str] = (),
        profile: Path | None = None,
        log: Path | None = None,
        plain: tuple[str, str] | None = None,
        curve: tuple[str, str, str] | None = None,
        netns: str | None = None,
        ready: str | None = None,
    ) -> None:
        """
        @param bind: the endpoint to bind: one with a C{*} port (such as
            L{ANY_TCP_PORT}) gets a free port; by default a fresh abstract
            ipc name.
        @param journal: whether it journals (else C{--no-journal}).
        @param timeout_ms: its C{--timeout}, if not the broker's default.
        @param args: more arguments for C{twistd malamute} (a config file,
            a password file...).
        @param plain: the user and password of the readiness probe, for a
            broker that requires PLAIN.
        @param curve: the keys of the readiness probe, for a broker that
            requires CURVE: the broker's public key, the probe's public
            and secret keys (Z85).
        @param netns: the network namespace to run it in (see the module);
            by default this process's.
        @param ready: a regular expression: the broker is ready once a line
            of its log matches it, and is not probed (a broker of a pair,
            whose readiness is "pair: (active|passive)": a probe's
            CONNECTION_OPEN would be a client request to its Binary Star).
        """
        self.directory = directory.resolve()
        self._data_dir_given = data_dir is not None
        self.data_dir = (data_dir or self.directory / "malamute-data").resolve()
        self.journal = journal
        self.timeout_ms = timeout_ms
        self.args = tuple(args)
        self.profile = profile
        self.log = log or self.directory / "broker.log"
        self.plain = plain
        self.curve = curve
        self.netns = netns
        self.ready = None if ready is None else re.compile(ready)
        self.process: subprocess.Popen[bytes] | None = None
        self._bind = bind or fresh_ipc_endpoint()
        self._endpoint: str | None = None
        self._log_start = 0

    @property
    def endpoint(self) -> str:
        """Where it listens: the endpoint its first start reported binding."""
        if self._endpoint is None:
            raise BrokerError("the broker has not started yet: its endpoint is not known")
        return self._endpoint

    @property
    def http_url(self) -> str:
        """
        The management API's base URL (C{http://HOST:PORT/}, the real port
        for C{tcp:0}), as its latest run logged it: a broker started with
        C{--http}.

        @raise BrokerError: if it logs none within ten seconds.
        """
        try:
            return self.wait_log(_HTTP, 10.0).group(1)
        except BrokerError as e:
            raise BrokerError(f"no management API (was it started with --http?): {e}") from e

    @property
    def pid(self) -> int:
        if self.process is None:
            raise BrokerError("the broker is not running")
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        """The command line of its next start."""
        profiler = (
            [f"--profile={self.profile}", "--profiler=cprofile", "--savestats"]
            if self.profile is not None
            else []
        )
        command = twistd_command(
            "--nodaemon",
            "--pidfile=",
            *profiler,
            "malamute",
            f"--endpoint={self._endpoint or self._bind}",
            *([f"--data-dir={self.data_dir}"] if self._data_dir_given else []),
            *([] if self.timeout_ms is None else [f"--timeout={self.timeout_ms}"]),
            *([] if self.journal else ["--no-journal"]),
            *self.args,
        )
        return command if self.netns is None else netns_command(self.netns, command)

    def launch(self) -> None:
        """
        Start the process and return at once, without waiting for it to
        serve (L{start} waits; many brokers launched together start in
        parallel, and their logs say when each is ready).
        """
        if self.alive():
            raise BrokerError("the broker is already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.directory,
                env=checkout_environment(PYTHONUNBUFFERED="1"),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def start(self, timeout: float = 30.0) -> None:
        """
        Start it and wait until it serves: it has logged the endpoint it
        bound and answered CONNECTION_OPEN. After the first start it binds
        that same endpoint again.

        @raise BrokerError: if it exits first or does not serve within
            C{timeout} seconds (it is killed then).
        """
        self.launch()
        deadline = time.monotonic() + timeout
        try:
            bound = self._wait_bound(deadline)
            if self._endpoint is None:
                self._endpoint = bound
            elif bound != self._endpoint:
                raise BrokerError(f"restarted broker bound {bound}, not {self._endpoint}")
            if self.ready is not None:
                self.wait_log(self.ready, deadline - time.monotonic())
            else:
                self._probe(deadline)
        except BrokerError:
            self.kill()
            raise

    def run_until_exit(self, timeout: float = 60.0) -> tuple[int, str]:
        """
        Run it in the foreground, for a start that must fail: its exit
        status and what it wrote (its log goes to the output, not the file).

        @raise BrokerError: if it is still running after C{timeout} seconds
            (it started instead of refusing; it is killed).
        """
        if self.alive():
            raise BrokerError("the broker is already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            ran = subprocess.run(
                self.command(),
                cwd=self.directory,
                env=checkout_environment(PYTHONUNBUFFERED="1"),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            output = (e.output or b"").decode(errors="replace")
            raise BrokerError(f"the broker did not exit: it started\n{output}") from e
        return ran.returncode, ran.stdout.decode(errors="replace")

    def wait_log(self, pattern: re.Pattern[str] | str, timeout: float = 30.0) -> re.Match[str]:
        """
        Wait until a line of this run's log matches C{pattern}; the match.

        @raise BrokerError: if the broker exits first or C{timeout} passes.
        """
        deadline = time.monotonic() + timeout
        expression = re.compile(pattern) if isinstance(pattern, str) else pattern
        while True:
            found = expression.search(self.run_log())
            if found:
                return found
            self._check_running(deadline, f"log {expression.pattern!r}")
            time.sleep(0.02)

    def _wait_bound(self, deadline: float) -> str:
        """The first endpoint this run logs binding."""
        while True:
            found = _BOUND.search(self.run_log())
            if found:
                return found.group(1)
            self._check_running(deadline, "bind")
            time.sleep(0.02)

    def _check_running(self, deadline: float, what: str) -> None:
        if not self.alive():
            code = None if self.process is None else self.process.returncode
            raise BrokerError(
                f"broker exited with {code} before it could {what}:\n{self.log_text()}"
            )
        if time.monotonic() > deadline:
            raise BrokerError(f"broker did not {what} in time:\n{self.log_text()}")

    def _probe(self, deadline: float) -> None:
        """
        Wait until the broker answers CONNECTION_OPEN (L{open_connection}):
        from this process, or for a broker in a network namespace from a
        probe process in that namespace, killed if the broker dies first.
        """
        if self.netns is None:
            open_connection(
                self.endpoint,
                plain=self.plain,
                curve=self.curve,
                check=lambda: self._check_running(deadline, "serve"),
            )
            return
        request = {
            "endpoint": self.endpoint,
            "plain": self.plain,
            "curve": self.curve,
            "timeout": max(0.0, deadline - time.monotonic()),
        }
        probe = subprocess.Popen(
            python_command(self.netns, "-c", _PROBE),
            env=checkout_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert probe.stdin is not None
            probe.stdin.write(json.dumps(request))
            probe.stdin.close()
            while probe.poll() is None:
                # The probe gives up at the deadline itself, saying why; the
                # grace only guards against a probe that hangs.
                self._check_running(deadline + 5.0, "serve")
                time.sleep(0.02)
        finally:
            if probe.poll() is None:
                os.kill(probe.pid, signal.SIGKILL)
            assert probe.stderr is not None
            reason = probe.stderr.read()
            probe.stderr.close()
            probe.wait()
        if probe.returncode != 0:
            raise BrokerError(
                f"the probe in {self.netns} failed ({probe.returncode}): "
                f"{reason.strip()}\n{self.log_text()}"
            )

    def kill(self) -> None:
        """SIGKILL it by its pid and reap it (a no-op if it is not running)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self, timeout: float = 60.0) -> int | None:
        """
        SIGTERM it and reap it; its exit status (None if it was not running).

        @raise BrokerError: unless it shut down cleanly (see the module);
            after C{timeout} seconds it is SIGKILLed and this is raised.
        """
        process, self.process = self.process, None
        if process is None:
            return None
        code = terminate(process, timeout, "broker")
        if code not in (0, -signal.SIGTERM):
            raise BrokerError(f"broker exited with {code}:\n{self.log_text()}")
        if _CLEAN_EXIT not in self.run_log():
            raise BrokerError(f"broker was killed, not shut down:\n{self.log_text()}")
        if self.profile is not None and not (
            self.profile.exists() and self.profile.stat().st_size > 0
        ):
            raise BrokerError(f"broker shut down but wrote no profile to {self.profile}")
        return code

    def bound(self) -> list[str]:
        """Every endpoint its latest run logged binding, in order (the first is L{endpoint})."""
        return _BOUND.findall(self.run_log())

    def run_log(self) -> str:
        """What it logged since its latest start."""
        try:
            with self.log.open("rb") as f:
                f.seek(self._log_start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_text(self, tail: int = 6000) -> str:
        """The end of its log, over all its starts, for a failure message."""
        try:
            return self.log.read_text(errors="replace")[-tail:] or "(empty log)"
        except OSError:
            return "(no log)"
