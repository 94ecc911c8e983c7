"""
The broker's security files as a service: the password file (PLAIN), the
CURVE clients' keys, the access-control file and the keys of the brokers
a CURVE pack or pair link admits, read when the broker
starts and again on SIGHUP, into the ZAP handler (who may connect, as
which user) and the broker's access control (what each user may do; it
also keeps the password table, which the management API's basic
authentication reads).

A reload is all or nothing: if any file is missing or bad, the error is
logged and every rule in force stays. Clients already connected stay
connected; what they ask from then on is checked against the new rules
(a subscription or an open address they already have is kept).

The clients' part of what is loaded (passwords, CURVE clients, access
rules: L{ClientSecurity}) can also come from elsewhere: a pair's passive
installs its active's (L{SecurityService.install}), which the active sends
after each reload it makes (L{SecurityService.reloaded}) and at each
catch-up (L{malamute_pack.pair.replication}).

SIGHUP arrives in a signal handler, between two bytecodes of whatever the
reactor was doing; the handler only asks the reactor, through
C{callFromThread} (safe there: it only queues and wakes the reactor), to
run the reload at its next turn.

Tests: ``tests/unit/test_transport_security.py``, ``tests/system/test_system_security.py``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorFromThreads
from twisted.logger import Logger

from malamute_pack.broker.access import AccessControl, AccessFileError, AccessPolicy, load_access
from malamute_pack.transport.curve import CurveError, load_client_keys
from malamute_pack.transport.zap import (
    KeyAllowList,
    PasswordFileError,
    ZapHandler,
    load_passwords,
)

_log = Logger()

# What a bad security file raises.
SecurityFileError = (AccessFileError, PasswordFileError, CurveError)


@dataclass(frozen=True)
class SecurityFiles:
    """
    The clients' security files and which of them are read: the password
    file for PLAIN endpoints, the CURVE clients' keys for CURVE ones, and
    the access-control file (None: none given).

    @ivar mechanisms: the security the broker's endpoints require
        (C{"null"}, C{"plain"}, C{"curve"}).
    """

    mechanisms: frozenset[str]
    passwords: Path | None = None
    curve_clients: Path | None = None
    access_file: Path | None = None


@dataclass(frozen=True)
class ClientSecurity:
    """
    What decides which clients get in, as whom, and what each may do: the
    PLAIN password table (user to password; None without a PLAIN
    endpoint), the CURVE clients (public key in Z85 to user; None without a
    CURVE endpoint) and the access policy. Its repr leaves the passwords out.
    """

    passwords: Mapping[str, str] | None = field(repr=False)
    curve_keys: Mapping[bytes, str] | None
    policy: AccessPolicy


class SecurityService(Service):
    """
    Loads the security C{files} into C{zap} and C{access} now, and again
    on SIGHUP while it runs.

    @ivar reloads: reloads done; C{failed_reloads}: reloads refused.
    @ivar clients: the clients' security in force (None when no endpoint
        authenticates clients).
    @ivar reloaded: told of the clients' security after each successful
        reload (not of the first load, nor of what L{install} puts in force).
    """

    def __init__(
        self,
        reactor: IReactorFromThreads,
        files: SecurityFiles,
        zap: ZapHandler | None,
        access: AccessControl | None,
        links: Sequence[tuple[Path, KeyAllowList]] = (),
    ) -> None:
        """
        @param links: the keys files of the CURVE links between brokers (the
            pack's C{--pack-keys}, the pair's C{--pair-key}), each with the
            allow-list its ZAP domain and its link consult.
        """
        self._reactor = reactor
        self._files = files
        self._zap = zap
        self._access = access
        self._links = list(links)
        self._previous: Any = None
        self._installed = False
        self.reloads = 0
        self.failed_reloads = 0
        self.clients: ClientSecurity | None = None
        self.reloaded: list[Callable[[ClientSecurity], None]] = []
        self.load()

    def load(self) -> None:
        """Read every file; raises one of L{SecurityFileError} (changing nothing) if one is bad."""
        files = self._files
        used = files.mechanisms
        policy = load_access(files.access_file) if files.access_file is not None else AccessPolicy()
        passwords = (
            load_passwords(files.passwords)
            if "plain" in used and files.passwords is not None
            else None
        )
        keys = (
            load_client_keys(files.curve_clients)
            if "curve" in used and files.curve_clients is not None
            else None
        )
        brokers = [load_client_keys(path) for path, _ in self._links]
        for (path, _), listed in zip(self._links, brokers, strict=True):
            if not listed:
                raise CurveError(f"{path}: no public certificate (*.key) there")
        if self._access is not None:
            self._access.policy = policy
            self._access.passwords = passwords
            self.clients = ClientSecurity(passwords, keys, policy)
        if self._zap is not None:
            if passwords is not None:
                self._zap.passwords = passwords
            if keys is not None:
                self._zap.curve_keys = keys
        for (_, allowed), listed in zip(self._links, brokers, strict=True):
            allowed.replace(listed)

    def install(self, state: ClientSecurity) -> bool:
        """
        Put C{state} in force for the clients, as a reload of the files
        would (its passwords and keys replace this broker's unless None),
        without reading or writing any file: a pair's passive taking its
        active's. Whether anything was installed (not on a broker whose
        endpoints authenticate no client).
        """
        access, current = self._access, self.clients
        if access is None or current is None:
            return False
        passwords = current.passwords if state.passwords is None else dict(state.passwords)
        keys = current.curve_keys if state.curve_keys is None else dict(state.curve_keys)
        access.policy = state.policy
        access.passwords = passwords
        if self._zap is not None:
            if passwords is not None:
                self._zap.passwords = passwords
            if keys is not None:
                self._zap.curve_keys = keys
        self.clients = ClientSecurity(passwords, keys, state.policy)
        return True

    def reload(self) -> bool:
        """Read every file again (see L{load}); whether the new rules are in force."""
        try:
            self.load()
        except SecurityFileError as e:
            self.failed_reloads += 1
            _log.error("security reload failed, the rules in force stay: {error}", error=e)
            return False
        self.reloads += 1
        _log.info(
            "security files reloaded: passwords, CURVE clients, access rules{links}",
            links="".join(f", {allowed.listed_in}" for _, allowed in self._links),
        )
        if self.clients is not None:
            for listener in self.reloaded:
                try:
                    listener(self.clients)
                except Exception:
                    _log.failure("a listener of the security reload failed")
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
