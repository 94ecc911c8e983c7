"""
Start-up that tells the truth: a broker (or a bridge) that cannot start
says why in one line on stderr, naming the problem and the fix
(C{malamute: cannot bind tcp://nonsense: Invalid argument (give an
endpoint like ...)}), and ends with exit status 1: never a traceback, never
a page of usage, never a process left running that serves nothing, never
a stale pid file.

C{twistd} meets an error at one of three moments (its flow is in
C{twisted/application/app.py} and C{twisted/scripts/_twistd_unix.py}),
and each has its own way out:

 - Parsing the options (L{OneLineOptions}): twistd answers a
   C{UsageError} with its whole usage; as a twistd subcommand our options
   raise C{SystemExit} with the line instead. Parsed on their own (as the
   tests do) they raise C{UsageError} as usual.
 - Making the service (L{make_or_exit}): it happens before twistd starts
   logging (which takes stdout and stderr) and writes its pid file, so an
   error there is a C{SystemExit} with the line.
 - Starting the service (L{FailFast}): after the pid file is written, with
   stderr going to the log, before the reactor runs. A child service that
   fails to start (in C{privilegedStartService}, where the broker locks its
   data directory, or in C{startService}, where it opens its journal and
   binds its endpoints) is described in one line and logged, and what had
   started is stopped, running the reactor briefly if that takes it (the
   journal's threads would otherwise keep the process alive). The failure
   is raised as L{StartupFailed}: twistd removes its pid file and re-raises
   it, and the hook L{make_or_exit} installed prints the line alone on the
   real stderr as the interpreter exits with status 1.

The reason is said once: in the log (by the service that refused, if it
logged why as critical, else by L{FailFast}) and on stderr, unless the log
has already shown it there (C{twistd -n} logging on a stdout that is
stderr's file too: a terminal, C{2>&1}). A failed first start on a data
directory (missing or empty before) leaves nothing in it
(L{malamute_pack.datadir.DataDirService.discard_failed_start}).

Tests: ``tests/system/test_startup.py``, ``tests/unit/test_failed_start.py``,
``tests/system/test_failed_start.py``.
"""

from __future__ import annotations

import errno
import getopt
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Final, NoReturn, TypeVar, cast

import zmq
from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.interfaces import IReactorCore, IReactorTime
from twisted.logger import ILogObserver, LogEvent, Logger, LogLevel, globalLogPublisher
from twisted.python import usage
from twisted.python.failure import Failure

from malamute_pack.config_keys import first_unknown
from malamute_pack.datadir import DataDirError, DataDirService
from malamute_pack.feature import SettingsError
from malamute_pack.store import StoreError
from malamute_pack.transport.router import BindError, bind_error_message
from malamute_pack.zpl import ZplError, load_zpl

_Settings = TypeVar("_Settings")

_log = Logger()

# How pyzmq names the endpoint of a refused bind or connect.
_ADDRESS: Final = re.compile(r"\(addr='([^']*)'\)$")

# What int() says of an option's value that is not a number.
_NOT_AN_INT: Final = re.compile(r"invalid literal for int\(\) with base 10: ('.*')")

# How long a failed start waits for what had started to stop.
STOP_TIMEOUT: Final = 10.0

# Whether twistd logs on its stdout, as its options said (set when
# OneLineOptions are parsed as its subcommand's).
_log_on_stdout = False


class StartupError(Exception):
    """The broker cannot start; the message says why and what to do, in one line."""


class StartupFailed(Exception):
    """
    A service failed to start; C{line} is what the user is told
    (C{"malamute: ..."}), on stderr unless C{shown}: the log has shown the
    reason there already.
    """

    def __init__(self, line: str, *, shown: bool = False) -> None:
        super().__init__(line)
        self.line = line
        self.shown = shown


# Exceptions whose message is written for the user: shown as it is.
_FOR_THE_USER: Final = (
    StartupError,
    usage.UsageError,
    DataDirError,
    BindError,
    SettingsError,
    StoreError,
)


def describe(error: BaseException) -> str | None:
    """
    The one line (without the program's name) that says what C{error}
    means to the user, or None if it is not one we expect (a bug, whose
    traceback is worth having).
    """
    if isinstance(error, _FOR_THE_USER):
        return _one_line(str(error))
    if isinstance(error, OSError):
        what = error.strerror or str(error)
        if error.filename is not None:
            return _one_line(f"{error.filename}: {what}")
        return _one_line(what)
    if isinstance(error, zmq.ZMQError):
        # pyzmq names the endpoint of a refused bind or connect.
        named = _ADDRESS.search(str(error))
        if named is not None:
            return bind_error_message(named.group(1), error.errno, "use")
        return _one_line(f"ZeroMQ refused: {error}")
    if isinstance(error, ValueError):
        # Configuration checks made at start (an interface, a key) say so in a ValueError.
        return _one_line(str(error))
    return None


def read_config(
    path: Path,
    apply: Callable[[dict[str, list[str]]], _Settings],
    errors: tuple[type[Exception], ...],
    known: Sequence[str] | None = None,
) -> _Settings:
    """
    C{apply} to the config file at C{path}; what goes wrong (the file
    unreadable, not ZPL, a key none of C{known} is (when given:
    L{malamute_pack.config_keys}), a value refused with one of C{errors})
    is a UsageError naming the file.
    """
    try:
        tree = load_zpl(path)
    except OSError as e:
        raise usage.UsageError(f"cannot read config file {path}: {e.strerror or e}") from e
    except ZplError as e:
        raise usage.UsageError(f"config file {path}: {e}") from e
    if known is not None:
        unknown = first_unknown(list(tree), known, tree.lines)
        if unknown is not None:
            raise usage.UsageError(unknown.describe(path))
    try:
        return apply(tree)
    except errors as e:
        raise usage.UsageError(f"config file {path}: {e}") from e


def _one_line(text: str) -> str:
    return " ".join(text.split())


def usage_line(program: str, error: usage.UsageError) -> str:
    """The line for an error in the options of C{twistd PROGRAM}."""
    text = str(error).removeprefix("Parameter type enforcement failed: ")
    text = _NOT_AN_INT.sub(r"\1 is not a whole number", text)
    if isinstance(error.__context__, getopt.GetoptError) or text != str(error):
        # getopt's (an unknown option, a missing value) or a value of the wrong type.
        text += f" (twistd {program} --help lists the options)"
    return f"{program}: {_one_line(text)}"


def check_pid_file(path: str | None) -> None:
    """
    Refuse to start (L{StartupError}) if twistd's pid file C{path} names a
    process that runs: twistd would refuse too, with a paragraph.
    """
    if not path:
        return
    try:
        pid = int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return  # missing (the usual case), or twistd's own check says what is wrong
    if pid == os.getpid() or not _running(pid):
        return  # twistd removes a stale one
    raise StartupError(
        f"process {pid} is already running from this directory (its pid file is"
        f" {os.path.abspath(path)}): stop it, or start this one from another directory"
        f" or with twistd --pidfile OTHER.pid"
    )


def logs_to_stdout(twistd: Mapping[str, object]) -> bool:
    """Whether C{twistd} given these options (its own, not a plugin's) logs on its stdout."""
    if twistd.get("syslog") or twistd.get("logger"):
        return False
    return bool(twistd.get("nodaemon")) and twistd.get("logfile") in (None, "", "-")


def log_shows_stderr() -> bool:
    """
    Whether what twistd logs shows where stderr goes: it logs on its
    stdout, and stdout and stderr are the same file (a terminal, C{2>&1}).
    """
    if not _log_on_stdout:
        return False
    try:
        out, err = os.fstat(1), os.fstat(2)
    except OSError:
        return False
    return (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    return True


class OneLineOptions(usage.Options):
    """
    The options of a twistd plugin whose errors, when parsed as a twistd
    subcommand, are one line on stderr and exit status 1 (twistd itself
    would print the whole usage first). Parsed on their own (no C{parent}),
    they raise C{UsageError} as usual.
    """

    program: ClassVar[str] = "malamute"

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        # An opt_ method's docstring keeps its indentation in --help
        # (textwrap replaces newlines, not the spaces after them).
        self.docs = {name: " ".join(doc.split()) if doc else doc for name, doc in self.docs.items()}

    def parseOptions(self, options: list[str] | None = None) -> None:
        try:
            super().parseOptions(options)  # type: ignore[no-untyped-call]
            if self.parent is not None:
                global _log_on_stdout
                _log_on_stdout = logs_to_stdout(self.parent)
                check_pid_file(self.parent.get("pidfile"))
        except usage.UsageError as e:
            if self.parent is None:
                raise
            raise SystemExit(usage_line(self.program, e)) from None
        except StartupError as e:
            raise SystemExit(f"{self.program}: {e}") from None


def make_or_exit(program: str, make: Callable[[], IService]) -> FailFast:
    """
    The service C{twistd PROGRAM} runs: what C{make} returns, in a
    L{FailFast}. An error C{make} raises that L{describe} knows is a
    C{SystemExit} with its line (a bug is raised as it is). Installs the
    hook that prints a L{StartupFailed} as its line alone.
    """
    try:
        service = make()
    except Exception as e:
        line = describe(e)
        if line is None:
            raise
        raise SystemExit(f"{program}: {line}") from None
    install_excepthook()
    top = FailFast(program)
    service.setServiceParent(top)  # type: ignore[no-untyped-call]
    return top


def install_excepthook() -> None:
    """
    Have the interpreter print an uncaught L{StartupFailed} as its line
    alone, on the real stderr (twistd has sent C{sys.stderr} to the log)
    unless the log has shown it there, and anything else as before.
    """
    previous = sys.excepthook

    def hook(
        kind: type[BaseException], value: BaseException, traceback: TracebackType | None
    ) -> None:
        if isinstance(value, StartupFailed):
            stream = sys.__stderr__
            if stream is not None and not value.shown:
                print(value.line, file=stream, flush=True)
        else:
            previous(kind, value, traceback)

    sys.excepthook = hook


class FailFast(MultiService):
    """
    The service twistd runs: its children, started in order; if one fails
    to start, what had started is stopped and L{StartupFailed} raised with
    the line that says why.
    """

    def __init__(self, program: str, reactor: IReactorCore | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.program = program
        self._reactor = reactor

    def privilegedStartService(self) -> None:
        with _logged_critical() as said:
            try:
                super().privilegedStartService()  # type: ignore[no-untyped-call]
            except Exception as e:
                self._fail(e, said)

    def startService(self) -> None:
        with _logged_critical() as said:
            try:
                super().startService()  # type: ignore[no-untyped-call]
            except Exception as e:
                self._fail(e, said)

    def _fail(self, error: Exception, said: list[BaseException]) -> NoReturn:
        what = describe(error)
        if what is None:
            _log.failure("starting failed", Failure(error))  # type: ignore[no-untyped-call]
            what = f"cannot start: {type(error).__name__}: {error} (the log has the traceback)"
        line = f"{self.program}: {what}"
        if not any(logged is error for logged in said):
            # A service that refuses to start may have logged why itself
            # (the data directory's lock, the journal): not twice.
            _log.critical("{line}", line=line)
        if self._wait(stop_started(self)):
            for service in _walk(self):
                if isinstance(service, DataDirService):
                    service.discard_failed_start()
        raise StartupFailed(line, shown=log_shows_stderr()) from error

    def _wait(self, stopped: Deferred[None]) -> bool:
        """
        Run the reactor (not started yet) until C{stopped} fires, if it has
        not; whether it has (else it gave up after L{STOP_TIMEOUT}).
        """
        if stopped.called:
            return True
        reactor = self._reactor
        if reactor is None:
            from twisted.internet import reactor as installed

            reactor = cast(IReactorCore, installed)

        def stop(_: object = None) -> None:
            if reactor.running:
                reactor.stop()

        stopped.addBoth(stop)
        cast(IReactorTime, reactor).callLater(STOP_TIMEOUT, stop)
        reactor.run()
        return stopped.called


@contextmanager
def _logged_critical() -> Iterator[list[BaseException]]:
    """The errors logged as critical (C{error=} or a failure) while the block runs."""
    errors: list[BaseException] = []

    def observe(event: LogEvent) -> None:
        if event.get("log_level") != LogLevel.critical:
            return
        failure = event.get("log_failure")
        error = failure.value if isinstance(failure, Failure) else event.get("error")
        if isinstance(error, BaseException):
            errors.append(error)

    observer = cast(ILogObserver, observe)
    globalLogPublisher.addObserver(observer)
    try:
        yield errors
    finally:
        globalLogPublisher.removeObserver(observer)


def _walk(service: IService) -> Iterator[IService]:
    """C{service} and all the services under it."""
    yield service
    if isinstance(service, MultiService):
        for child in service:
            yield from _walk(child)


def stop_started(service: IService) -> Deferred[None]:
    """
    Stop what of C{service} is running, the last started first; fires when
    all has stopped (a failure to stop is logged).
    """
    if not isinstance(service, MultiService) or type(service).stopService is not (
        MultiService.stopService
    ):
        # A leaf, or a service that stops its own way: all of it had started.
        return maybeDeferred(service.stopService).addErrback(
            lambda failure: _log.failure("stopping {service} failed", failure, service=service)
        )
    stopping = [stop_started(child) for child in reversed(list(service)) if child.running]
    if service.running:
        Service.stopService(service)  # type: ignore[no-untyped-call]
    done: Deferred[None] = gatherResults(stopping).addCallback(lambda _: None)
    return done
