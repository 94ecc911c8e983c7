"""
The journal as a Twisted service: opened (and recovered) when the broker
starts, before its sockets bind, so recovered letters are back in their
queues before any client connects; flushed and closed when it stops. A
journal that cannot open (corrupt, or not the journal its data directory's
marker records) is logged and raised, so that C{twistd} exits non-zero.

While it runs, the process's GIL switch interval follows how busy the
journal's writer thread is (L{malamute_pack.journal.gil}): short while its
batches are small, so that a reactor that wants the GIL back waits for the
writer at most that long (Python's default, 5 ms, showed as the tail of
stream delivery), longer under a flood, where forced hand-overs of the GIL
cost throughput. The last journal service of the process to stop gives
back what the first found (L{malamute_pack.process_setting}).

Tests: ``tests/unit/test_broker_durable.py``, ``tests/unit/test_journal_gil.py``,
``tests/system/test_datadir.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Final

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.gil import SwitchIntervalChoice
from malamute_pack.journal.journal import Journal, Recovered
from malamute_pack.process_setting import ProcessSetting
from malamute_pack.text import plural

_log = Logger()

# The GIL switch interval, held by every running journal service of the
# process, each applying what its batches ask for (L{malamute_pack.journal.gil});
# the last to stop gives back what the first found (L{malamute_pack.process_setting}).
SWITCH_INTERVAL: Final = ProcessSetting[float](sys.getswitchinterval, sys.setswitchinterval)


class JournalService(Service):
    """Opens C{journal} on start, hands what it recovered to C{recovered}."""

    def __init__(self, journal: Journal, recovered: Callable[[Recovered], None]) -> None:
        self.journal = journal
        self._recovered = recovered
        self._switch = SwitchIntervalChoice()
        journal.on_error = self._report
        journal.on_batch = self._batch

    def startService(self) -> None:
        try:
            found = self.journal.open()
        except JournalError as e:
            _log.critical("the broker cannot start: {error}", error=e)
            raise
        _log.info(
            "journal {path}: {streams}, {letters} waiting{crash}",
            path=str(self.journal.path),
            streams=plural(len(found.streams), "stream"),
            letters=plural(len(found.queued), "letter"),
            crash=" (the last run crashed: numbering jumps past what it may have used)"
            if self.journal.crashed
            else "",
        )
        self._recovered(found)
        self._switch = SwitchIntervalChoice()
        SWITCH_INTERVAL.hold(self._switch.interval)
        super().startService()

    def stopService(self) -> Deferred[None]:
        if self.running:
            SWITCH_INTERVAL.release()
        super().stopService()
        return self.journal.close()

    def _batch(self, records: int) -> None:
        interval = self._switch.observe(records)
        if interval is not None and self.running:
            SWITCH_INTERVAL.apply(interval)

    def _report(self, error: JournalError) -> None:
        _log.error("journal write failed: {error}", error=error)
