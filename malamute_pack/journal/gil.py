"""
The GIL switch interval the journal asks for, chosen from how busy its
writer thread is.

The writer thread shares the GIL with the reactor. While the writer is
light (small batches: a few thousand records a second), a short switch
interval keeps delivery latency low: a reactor that wants the GIL back
waits at most that long. Under a flood it costs throughput instead: every
interval the writer, back from SQLite, forces the reactor to hand over the
GIL, and each hand-over costs both threads a wake-up. Measured with
libmlm's client against the broker, journal on (docs/performance.md):
stream 1:1 at 0.5 ms 72,900 msgs/s, at 2 ms 94,200; p99 latency at
10,000 msgs/s 1,481 us at 0.5 ms and 2,041 us at 2 ms; at 50,000 msgs/s
97 ms and 30 ms. So the interval follows the batch sizes: long once a
batch holds C{BUSY_RECORDS} records or more, short again once one holds
fewer than C{LIGHT_RECORDS} (the gap between the two keeps it from
flapping).

Tests: ``tests/unit/test_journal_gil.py``.
"""

from __future__ import annotations

from typing import Final

# Seconds a thread holding the GIL keeps it while another waits for it.
LIGHT_INTERVAL_S: Final = 0.0005
BUSY_INTERVAL_S: Final = 0.002
# Records in one committed batch: at the default 5 ms commit interval,
# 200 records is 40,000 a second, 100 is 20,000.
BUSY_RECORDS: Final = 200
LIGHT_RECORDS: Final = 100


class SwitchIntervalChoice:
    """The interval for the batches seen so far; it starts light."""

    def __init__(self) -> None:
        self.interval = LIGHT_INTERVAL_S

    def observe(self, records: int) -> float | None:
        """A batch of C{records} committed: the new interval, or None if it stays."""
        if self.interval == LIGHT_INTERVAL_S and records >= BUSY_RECORDS:
            self.interval = BUSY_INTERVAL_S
            return self.interval
        if self.interval == BUSY_INTERVAL_S and records < LIGHT_RECORDS:
            self.interval = LIGHT_INTERVAL_S
            return self.interval
        return None
