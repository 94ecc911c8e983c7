"""
systemd's readiness protocol (C{sd_notify}): under a unit with
C{Type=notify}, systemd gives the broker C{$NOTIFY_SOCKET}, a unix
datagram socket (a path, or an abstract name written with a leading
C{@}), and waits for C{READY=1} before it counts the broker started;
C{STOPPING=1} says it is shutting down and C{STATUS=...} is the line
C{systemctl status} shows. Without the variable every call here is a
no-op, so the broker runs the same outside systemd.

L{notify} sends one datagram, never blocking: a full socket drops the
state (logged), it never stalls the reactor. L{SystemdNotifier} is the
service the tap adds last to the broker's services, so that it starts
once every other service has started (endpoints bound, journal open):
it says C{READY=1} then, keeps C{STATUS=} up to date while it runs, says
C{WATCHDOG=1} from the reactor's thread when the unit has C{WatchdogSec=},
and says C{STOPPING=1} first when the broker stops.

Tests: ``tests/system/test_ops_sdnotify.py``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

_log = Logger()

ENVIRONMENT_VARIABLE = "NOTIFY_SOCKET"


def socket_address(value: str) -> str | None:
    """
    The C{AF_UNIX} address that C{$NOTIFY_SOCKET}'s C{value} names: a path,
    or an abstract name (C{@name} becomes C{"\\0name"}); None for anything
    else (empty, or systemd's C{vsock:} form, which this does not speak).
    """
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """
    Send C{state} (C{"READY=1"}, C{"STOPPING=1"}, C{"STATUS=..."}, or
    several such lines joined by newlines) to systemd; whether it was sent.
    Nothing is sent without C{$NOTIFY_SOCKET} (from C{environ}, by default
    this process's environment).
    """
    value = (os.environ if environ is None else environ).get(ENVIRONMENT_VARIABLE, "")
    if not value:
        return False
    address = socket_address(value)
    if address is None:
        _log.warn("sd_notify: cannot use NOTIFY_SOCKET={value!r}", value=value)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.setblocking(False)
            sock.connect(address)
            sock.send(state.encode("utf-8"))
    except OSError as e:
        _log.warn(
            "sd_notify: {state!r} not sent to {value}: {error}", state=state, value=value, error=e
        )
        return False
    return True


def status_line(not_ready: str | None, endpoints: Sequence[str]) -> str:
    """
    The status line of a broker: C{"serving EP, EP"}, or C{"not serving:
    REASON"} when its readiness check gives a reason.
    """
    if not_ready is not None:
        return f"not serving: {not_ready}"
    return f"serving {', '.join(endpoints)}" if endpoints else "serving"


def watchdog_period(environ: Mapping[str, str] | None = None) -> float | None:
    """
    How often to say C{WATCHDOG=1}, in seconds (half of systemd's
    C{WatchdogSec=}, which it passes as C{$WATCHDOG_USEC}); None when no
    watchdog is asked for this process (C{$WATCHDOG_PID}, when set, must
    be its pid).
    """
    environ = os.environ if environ is None else environ
    pid = environ.get("WATCHDOG_PID")
    if pid is not None and pid.strip() != str(os.getpid()):
        return None
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None


class SystemdNotifier(Service):
    """
    Tells systemd the broker is ready when this service starts, keeps its
    status line current, and says it is stopping when it stops.

    @param status: the status line (C{"serving ipc://@/malamute"}); read
        at start and then every C{interval} seconds, sent when it changes.
    @param clock: the clock for those updates; none without it.
    @param environ: where C{$NOTIFY_SOCKET} is read (default: the process's).
    @ivar sent: the states sent, oldest first (what C{systemctl} heard).
    """

    def __init__(
        self,
        status: Callable[[], str] | None = None,
        clock: IReactorTime | None = None,
        interval: float = 5.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._status = status
        self._clock = clock
        self._interval = interval
        self._environ = environ
        self._last_status: str | None = None
        self._updates: LoopingCall | None = None
        self._watchdog: LoopingCall | None = None
        self.sent: list[str] = []

    def _notify(self, state: str) -> None:
        if notify(state, self._environ):
            self.sent.append(state)

    def _status_line(self) -> str | None:
        if self._status is None:
            return None
        try:
            line = self._status()
        except Exception:
            _log.failure("sd_notify: the status line failed")
            return None
        # One line: a newline would start another assignment.
        return " ".join(line.split())

    def _update(self) -> None:
        line = self._status_line()
        if line is not None and line != self._last_status:
            self._last_status = line
            self._notify(f"STATUS={line}")

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        line = self._status_line()
        self._last_status = line
        self._notify("READY=1" if line is None else f"READY=1\nSTATUS={line}")
        if self._clock is None:
            return
        if self._status is not None:
            self._updates = LoopingCall(self._update)
            self._updates.clock = self._clock
            self._updates.start(self._interval, now=False)
        period = watchdog_period(self._environ)
        if period is not None:
            # From the reactor's thread: a reactor that hangs stops the pings,
            # and systemd restarts the broker.
            self._watchdog = LoopingCall(self._notify, "WATCHDOG=1")
            self._watchdog.clock = self._clock
            self._watchdog.start(period, now=True)

    def stopService(self) -> None:
        for loop in (self._updates, self._watchdog):
            if loop is not None and loop.running:
                loop.stop()
        self._updates = self._watchdog = None
        self._notify("STOPPING=1\nSTATUS=stopping")
        super().stopService()  # type: ignore[no-untyped-call]
