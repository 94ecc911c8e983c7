"""
The benchmark's load roles (L{malamute_pack.bench.load}) run in network
namespaces for the pack benchmark: senders that wait L{SETTLE} seconds
after the go before their first message (L{settled}), and a
C{multiprocessing} context for L{malamute_pack.bench.scenarios.run}
(L{NamespaceContext}) whose processes are
L{malamute_pack.testing.brokerprocess.python_command} subprocesses in a
namespace, each running L{role_main} with its end of the runner's pipe.

Tests: ``tests/system/test_bench_pack.py``.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

from malamute_pack.bench import load, scenarios
from malamute_pack.testing.brokerprocess import checkout_environment, python_command

# Seconds a sender waits after the go: the pack learns the readers' interest.
SETTLE = 0.5


def _settle(link: load.Link) -> None:
    end = time.monotonic() + SETTLE
    while time.monotonic() < end:
        link.keepalive()
        time.sleep(0.05)


def settle_then_blast(link: load.Link, role: load.Role, job: load.Job) -> load.Report:
    """L{load.blast} after L{SETTLE} seconds (not timed: its first send starts the clock)."""
    _settle(link)
    return load.blast(link, role, job)


def settle_then_request(link: load.Link, role: load.Role, job: load.Job) -> load.Report:
    """L{load.request} after L{SETTLE} seconds (not timed)."""
    _settle(link)
    return load.request(link, role, job)


_SETTLED: dict[load.Work, load.Work] = {
    load.blast: settle_then_blast,
    load.request: settle_then_request,
}


def settled(scenario: scenarios.Scenario) -> scenarios.Scenario:
    """C{scenario} with its senders waiting L{SETTLE} seconds after the go."""
    roles = tuple(
        dataclasses.replace(role, work=_SETTLED[role.work]) if role.work in _SETTLED else role
        for role in scenario.roles
    )
    return dataclasses.replace(scenario, roles=roles)


_ROLE_MAIN = "from malamute_pack.bench.pack.roles import role_main; role_main()"


def role_main() -> None:
    """
    A load role in a namespace: its (role, endpoint, job) pickled on stdin,
    its end of the runner's pipe as the file descriptor in C{argv[1]}.
    """
    role, endpoint, job = pickle.load(sys.stdin.buffer)
    load.run_role(role, endpoint, job, Connection(int(sys.argv[1])))


class NamespaceProcess:
    """
    What L{scenarios.run} needs of a C{multiprocessing} process, for a load
    role run by L{role_main} in a network namespace.
    """

    def __init__(self, netns: str | None, args: tuple[Any, ...], name: str | None) -> None:
        self.netns = netns
        self.args = args
        self.name = name
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        role, endpoint, job, pipe = self.args
        if not isinstance(pipe, Connection):
            raise TypeError(f"not a pipe end: {pipe!r}")
        descriptor = pipe.fileno()
        self._popen = popen = subprocess.Popen(
            python_command(self.netns, "-c", _ROLE_MAIN, str(descriptor)),
            env=checkout_environment(),
            stdin=subprocess.PIPE,
            pass_fds=(descriptor,),
        )
        assert popen.stdin is not None
        popen.stdin.write(pickle.dumps((role, endpoint, job)))
        popen.stdin.close()

    @property
    def exitcode(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def terminate(self) -> None:
        if self.is_alive():
            assert self._popen is not None
            os.kill(self._popen.pid, signal.SIGTERM)

    def join(self, timeout: float | None = None) -> None:
        if self._popen is None:
            return
        with suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)


class NamespaceContext(BaseContext):
    """
    A C{multiprocessing} context for L{scenarios.run} whose processes are
    L{NamespaceProcess}es: the role named in C{placement} runs in that
    namespace, every other in C{default} (None: this process's namespace).
    """

    def __init__(self, placement: Mapping[str, str | None], default: str | None) -> None:
        self.placement = dict(placement)
        self.default = default

    def Process(
        self,
        target: Callable[..., object],
        args: tuple[Any, ...] = (),
        name: str | None = None,
        daemon: bool | None = None,
    ) -> NamespaceProcess:
        if target is not load.run_role:
            raise ValueError(f"only load roles run in a namespace, not {target!r}")
        role = args[0]
        if not isinstance(role, load.Role):
            raise TypeError(f"not a load role: {role!r}")
        return NamespaceProcess(self.placement.get(role.name, self.default), args, name)
