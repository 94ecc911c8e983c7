"""
The broker's security files as a service: the password file (PLAIN), the
CURVE clients' keys and the access-control file, read when the broker
starts and again on SIGHUP, into the ZAP handler (who may connect, as
which user) and the broker's access control (what each user may do; it
also keeps the password table, which the management API's basic
authentication reads).

A reload is all or nothing: if any file is missing or bad, the error is
logged and every rule in force stays. Clients already connected stay
connected; what they ask from then on is checked against the new rules
(a subscription or an open address they already have is kept).

SIGHUP arrives in a signal handler, between two bytecodes of whatever the
reactor was doing; the handler only asks the reactor, through
C{callFromThread} (safe there: it only queues and wakes the reactor), to
run the reload at its next turn.

Tests: ``tests/test_transport_security.py``, ``tests/test_system_security.py``.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorFromThreads
from twisted.logger import Logger

from malamute_pack.broker.access import AccessControl, AccessFileError, AccessPolicy, load_access
from malamute_pack.settings import Settings
from malamute_pack.transport.curve import CurveError, load_client_keys
from malamute_pack.transport.zap import PasswordFileError, ZapHandler, load_passwords

_log = Logger()

# What a bad security file raises.
SecurityFileError = (AccessFileError, PasswordFileError, CurveError)


class SecurityService(Service):
    """
    Loads C{settings}' security files into C{zap} and C{access} now, and
    again on SIGHUP while it runs.

    @ivar reloads: reloads done; C{failed_reloads}: reloads refused.
    """

    def __init__(
        self,
        reactor: IReactorFromThreads,
        settings: Settings,
        zap: ZapHandler | None,
        access: AccessControl | None,
    ) -> None:
        self._reactor = reactor
        self._settings = settings
        self._zap = zap
        self._access = access
        self._previous: Any = None
        self._installed = False
        self.reloads = 0
        self.failed_reloads = 0
        self.load()

    def load(self) -> None:
        """Read every file; raises one of L{SecurityFileError} (changing nothing) if one is bad."""
        settings = self._settings
        used = settings.endpoints_by_mechanism()
        policy = (
            load_access(settings.access_file)
            if settings.access_file is not None
            else AccessPolicy()
        )
        passwords = (
            load_passwords(settings.passwords)
            if "plain" in used and settings.passwords is not None
            else None
        )
        keys = (
            load_client_keys(settings.curve_clients)
            if "curve" in used and settings.curve_clients is not None
            else None
        )
        if self._access is not None:
            self._access.policy = policy
            self._access.passwords = passwords
        if self._zap is not None:
            if passwords is not None:
                self._zap.passwords = passwords
            if keys is not None:
                self._zap.curve_keys = keys

    def reload(self) -> bool:
        """Read every file again (see L{load}); whether the new rules are in force."""
        try:
            self.load()
        except SecurityFileError as e:
            self.failed_reloads += 1
            _log.error("security reload failed, the rules in force stay: {error}", error=e)
            return False
        self.reloads += 1
        _log.info("security files reloaded: passwords, CURVE clients, access rules")
        return True

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        self._reactor.callFromThread(self.reload)

    def startService(self) -> None:
        # Only the main thread may set signal handlers (a broker in a test's
        # thread is reloaded by calling reload()).
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGHUP, self._signalled)
            self._installed = True
        super().startService()  # type: ignore[no-untyped-call]

    def stopService(self) -> None:
        super().stopService()  # type: ignore[no-untyped-call]
        if self._installed:
            signal.signal(signal.SIGHUP, self._previous)
            self._installed = False
            self._previous = None
