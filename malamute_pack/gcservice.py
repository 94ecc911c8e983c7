"""
How CPython's cyclic garbage collector runs while the broker runs.

By default CPython collects its youngest generation every 700 net
allocations of container objects (tuples, lists, dicts, instances). The
broker allocates several for every message it handles (the decoded
message, the record, the journal's row, the delivery's frames), so at tens
of thousands of messages a second the collector ran hundreds of times a
second, and every run walked again whatever was in flight: the journal's
rows not yet committed, the letters waiting in queues. ``python -m
malamute_pack.bench --scenario stream_1to1 --scenario mailbox`` with the
first threshold at 10,000 against the default, alternating in one sitting
(docs/performance.md): stream 1:1 +40% without the journal and +31% with
it, mailbox with the journal +30%, fan-out +70-90%.

L{GarbageCollectorService}, the tap's last service but one, so that it
starts once everything else has, does two things while it runs:

- the youngest generation is collected every L{GENERATION0_THRESHOLD}
  allocations: the bound on cyclic garbage waiting for a collection is
  that many container objects, a few megabytes, as long as no reference
  cycle holds a message. One did (a refused letter's exception, kept with
  its traceback, whose frames held the letter): 400 refused 1 MiB letters
  then grew the broker by 260 MiB where its letter budget is 48 MiB
  (C{tests/system/test_system_memory.py}). The memory tests pass with the
  collector saving every piece of cyclic garbage instead of freeing it
  (C{gc.DEBUG_SAVEALL}): the message paths they drive make no cycles;
- everything made while the broker started (modules, settings, bound
  sockets, the letters the journal recovered) is frozen (C{gc.freeze}):
  no collection walks it again, so the rare full collection does not pause
  for it. A frozen object is still freed when its last reference goes;
  only a reference cycle among frozen objects waits for the service to
  stop.

Stopping gives back the collector's thresholds as they were and unfreezes
(once the last such service in the process stops).

Tests: ``tests/unit/test_gcservice.py``.
"""

from __future__ import annotations

import gc
from typing import Final

from twisted.application.service import Service
from twisted.logger import Logger

from malamute_pack.process_setting import ProcessSetting

_log = Logger()

# Net container allocations between collections of the youngest
# generation; the older generations keep CPython's ratios (10 and 10).
GENERATION0_THRESHOLD: Final = 10_000
THRESHOLDS: Final = (GENERATION0_THRESHOLD, 10, 10)


# Held while a broker runs, by every broker of the process
# (L{malamute_pack.process_setting}): the first saves, the last gives back.
COLLECTOR_THRESHOLDS: Final = ProcessSetting[tuple[int, int, int]](
    gc.get_threshold, lambda thresholds: gc.set_threshold(*thresholds)
)
# Holding it freezes what exists then; the last to let go unfreezes.
START_UP_FROZEN: Final = ProcessSetting[bool](
    lambda: False, lambda frozen: gc.freeze() if frozen else gc.unfreeze()
)


class GarbageCollectorService(Service):
    """Sets L{THRESHOLDS} and freezes start-up's objects while it runs."""

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        START_UP_FROZEN.hold(True)
        COLLECTOR_THRESHOLDS.hold(THRESHOLDS)
        _log.info(
            "garbage collector: generation 0 every {threshold:,} allocations, "
            "{frozen:,} objects of start-up frozen",
            threshold=GENERATION0_THRESHOLD,
            frozen=gc.get_freeze_count(),
        )

    def stopService(self) -> None:
        if self.running:
            COLLECTOR_THRESHOLDS.release()
            START_UP_FROZEN.release()
        super().stopService()  # type: ignore[no-untyped-call]
