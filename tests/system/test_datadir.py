"""
Tests for L{malamute_pack.datadir} (one broker per data directory: the
lock, who holds it, its release by the kernel when the holder dies, the
service that holds it first in the broker's composition) and for
L{malamute_pack.journal.identity} (the marker that records which journal a
data directory holds: a journal file deleted or replaced is refused with
a message saying what to do; one emptied is salvaged with the marker's
identity, L{malamute_pack.journal.salvage}).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import zmq
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.logger import LogLevel
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack import settings as _settings
from malamute_pack.datadir import (
    LOCK_NAME,
    PACK_ID_FILE,
    DataDirError,
    DataDirLock,
    DataDirService,
    Holder,
    pack_identity,
)
from malamute_pack.journal import (
    JOURNAL_MARKER,
    Journal,
    JournalError,
    JournalIdentityError,
)
from malamute_pack.journal.gil import BUSY_INTERVAL_S, BUSY_RECORDS, LIGHT_INTERVAL_S
from malamute_pack.journal.identity import read_marker
from malamute_pack.journal.service import JournalService
from malamute_pack.tap import makeBrokerService
from tests.support import capture_log
from tests.unit.test_journal_journal import Inline

# A child process that takes the lock of the directory argv[1], says so and waits.
_HOLD_LOCK = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from malamute_pack.datadir import DataDirLock\n"
    "DataDirLock(Path(sys.argv[1])).acquire()\n"
    "print('locked', flush=True)\n"
    "time.sleep(60)\n"
)


class LockTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.directory = Path(self.mktemp()).absolute() / "data"

    def lock(self) -> DataDirLock:
        lock = DataDirLock(self.directory)
        self.addCleanup(lock.release)
        return lock

    def test_lockRecordsHolder(self) -> None:
        """
        The lock is taken in a data directory made if missing; its lock
        file records this process (pid, host, start time); releasing it
        clears the record and keeps the file.
        """
        lock = self.lock()
        holder = lock.acquire()
        self.assertTrue(lock.locked)
        self.assertEqual(holder.pid, os.getpid())
        path = self.directory / LOCK_NAME
        self.assertEqual(json.loads(path.read_bytes())["pid"], os.getpid())
        self.assertEqual(lock.holder(), holder)
        lock.release()
        self.assertFalse(lock.locked)
        self.assertTrue(path.exists())
        self.assertIsNone(lock.holder())

    def test_secondLockRefusedNamingHolder(self) -> None:
        """
        While one lock holds the directory another cannot take it: the
        error names the holder's pid and says what to do. Once the first
        is released the second takes it.
        """
        first, second = self.lock(), self.lock()
        first.acquire()
        with self.assertRaises(DataDirError) as caught:
            second.acquire()
        message = str(caught.exception)
        self.assertIn(f"data directory {self.directory} is in use by another broker", message)
        self.assertIn(f"process {os.getpid()} on ", message)
        self.assertIn("Stop that broker first, or give this one another --data-dir", message)
        self.assertFalse(second.locked)
        first.release()
        self.assertEqual(second.acquire().pid, os.getpid())

    def test_kernelReleasesLockOfKilledProcess(self) -> None:
        """
        A lock held by another process is refused naming that process; once
        it is killed with SIGKILL (no chance to clean up) the lock file is
        still there, and the lock can be taken.
        """
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        child = subprocess.Popen(
            [sys.executable, "-c", _HOLD_LOCK, str(self.directory)],
            stdout=subprocess.PIPE,
            env=env,
        )
        self.addCleanup(child.wait)
        self.addCleanup(child.kill)
        assert child.stdout is not None
        self.assertEqual(child.stdout.readline(), b"locked\n")
        lock = self.lock()
        with self.assertRaises(DataDirError) as caught:
            lock.acquire()
        self.assertIn(f"process {child.pid} on ", str(caught.exception))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        self.assertTrue((self.directory / LOCK_NAME).exists())
        self.assertEqual(lock.acquire().pid, os.getpid())

    def test_holderNotRecorded(self) -> None:
        """
        A holder that has not written who it is yet (or wrote garbage) is
        still refused, with a message that says so.
        """
        self.directory.mkdir(parents=True)
        (self.directory / LOCK_NAME).write_bytes(b"not json")
        first = self.lock()
        first.acquire()
        (self.directory / LOCK_NAME).write_bytes(b"not json")
        with self.assertRaises(DataDirError) as caught:
            self.lock().acquire()
        self.assertIn("a process that has not said which", str(caught.exception))
        self.assertIsNone(Holder.from_bytes(b""))

    def test_unusableDirectory(self) -> None:
        """A data directory that cannot be made is a DataDirError that says so."""
        blocker = Path(self.mktemp())
        blocker.write_text("a file, not a directory")
        with self.assertRaises(DataDirError) as caught:
            DataDirLock(blocker / "data").acquire()
        self.assertIn("cannot open its lock file", str(caught.exception))


class ServiceTests(SynchronousTestCase):
    def test_serviceHoldsLockWhileRunning(self) -> None:
        """
        DataDirService holds the lock from start to stop; a second one on
        the same directory fails to start, logging the refusal as critical.
        """
        directory = Path(self.mktemp())
        first, second = DataDirService(directory), DataDirService(directory)
        first.startService()

        def stop_first() -> None:
            if first.running:
                first.stopService()

        self.addCleanup(stop_first)
        self.assertTrue(first.lock.locked)
        log = capture_log(self)
        with self.assertRaises(DataDirError):
            second.startService()
        self.assertFalse(second.running)
        critical = [e for e in log if e.get("log_level") == LogLevel.critical]
        self.assertEqual(len(critical), 1)
        self.assertIn("in use by another broker", str(critical[0]["error"]))
        first.stopService()
        self.assertFalse(first.lock.locked)
        second.startService()
        self.assertTrue(second.lock.locked)
        second.stopService()

    def test_lockFirstInComposition(self) -> None:
        """
        The broker's service starts with the data directory's lock, with or
        without a journal, and gives its journal the data directory's marker.
        """
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        data_dir = Path(self.mktemp()).absolute()
        for journal in (True, False):
            settings = _settings.Settings(data_dir=data_dir, journal=journal)
            top = makeBrokerService(settings, reactor, context)
            first = next(iter(top))
            assert isinstance(first, DataDirService)
            self.assertEqual(first.lock.directory, data_dir)
            self.assertEqual(first.name, "data-dir")
        opener = makeBrokerService(
            _settings.Settings(data_dir=data_dir), reactor, context
        ).getServiceNamed("journal")
        assert isinstance(opener, JournalService)
        self.assertEqual(opener.journal.marker, data_dir / JOURNAL_MARKER)


class MarkerTests(TestCase):
    """The journal's identity checked against its data directory's marker."""

    def setUp(self) -> None:
        self.data_dir = Path(self.mktemp()).resolve()
        self.path = self.data_dir / "journal.sqlite"
        self.marker = self.data_dir / JOURNAL_MARKER

    def journal(self) -> Journal:
        return Journal(self.path, reactor, marker=self.marker)

    @inlineCallbacks
    def fill(self) -> Inline:
        """A journal made here holding three letters, closed."""
        journal = self.journal()
        journal.open()
        for i in range(3):
            journal.store_queued(
                "mailbox", "box", "a", f"letter-{i}", "", None, [b"x"], lambda error: None
            )
        yield journal.close()

    @inlineCallbacks
    def reopen(self) -> Inline:
        """Open the journal here; it must hold the three letters."""
        journal = self.journal()
        found = journal.open()
        self.assertEqual(len(found.queued), 3)
        yield journal.close()

    def refused(self) -> str:
        """Opening the journal here is refused; the message."""
        with self.assertRaises(JournalIdentityError) as caught:
            self.journal().open()
        self.assertIsInstance(caught.exception, JournalError)
        return str(caught.exception)

    @inlineCallbacks
    def test_markerWrittenWhenCreated(self) -> Inline:
        """
        The first open in a data directory records the journal's path and
        identity in the marker; the identity is the one the journal stores,
        and reopening keeps both.
        """
        journal = self.journal()
        journal.open()
        yield journal.close()
        marker = read_marker(self.marker)
        assert marker is not None
        self.assertEqual(marker.journal, str(self.path))
        self.assertEqual(marker.identity, journal.identity)
        again = self.journal()
        again.open()
        yield again.close()
        self.assertEqual(again.identity, journal.identity)
        self.assertEqual(read_marker(self.marker), marker)

    @inlineCallbacks
    def test_truncatedJournalRefused(self) -> Inline:
        """
        A journal file truncated to 0 bytes where the marker says a journal
        was created is refused (nothing in it to salvage), left as it is,
        not made anew; the backup put back in its place opens with its
        letters. A file cut short but not empty is salvaged instead.
        """
        yield self.fill()
        backup = self.data_dir / "backup"
        shutil.copy(self.path, backup)
        self.path.write_bytes(b"")
        message = self.refused()
        self.assertIn(f"journal {self.path} is empty (0 bytes: it was truncated)", message)
        self.assertIn(f"remove {self.marker}", message)
        self.assertEqual(self.path.read_bytes(), b"")
        self.assertEqual(list(self.data_dir.glob("journal.sqlite.*")), [])

        self.path.write_bytes(backup.read_bytes()[:50])
        journal = self.journal()
        journal.open()
        salvaged = journal.salvaged
        assert salvaged is not None
        self.assertIn("shorter than SQLite's header", salvaged.reason)
        yield journal.close()

        for name in self.data_dir.glob("journal.sqlite*"):
            name.unlink()
        shutil.copy(backup, self.path)
        yield self.reopen()

    @inlineCallbacks
    def test_missingJournalRefused(self) -> Inline:
        """
        A journal file deleted where the marker says a journal was created
        is refused, and not made anew; restored, it opens with its letters.
        """
        yield self.fill()
        backup = self.data_dir / "backup"
        self.path.rename(backup)
        message = self.refused()
        self.assertIn(f"journal {self.path} is missing", message)
        self.assertIn(f"remove {self.marker}", message)
        self.assertFalse(self.path.exists())
        backup.rename(self.path)
        yield self.reopen()

    @inlineCallbacks
    def test_replacedJournalRefused(self) -> Inline:
        """
        A journal file that is another journal (another identity) is
        refused, naming both identities.
        """
        yield self.fill()
        marker = read_marker(self.marker)
        assert marker is not None
        self.path.unlink()
        other = Journal(self.path, reactor)
        other.open()
        yield other.close()
        message = self.refused()
        self.assertIn("is not the journal that was created in this data directory", message)
        self.assertIn(f"its identity is {other.identity}", message)
        self.assertIn(marker.identity, message)

    @inlineCallbacks
    def test_removingMarkerStartsAfresh(self) -> Inline:
        """
        With the marker removed on purpose, an emptied journal starts
        afresh, with a new identity recorded in a new marker.
        """
        yield self.fill()
        old = read_marker(self.marker)
        self.path.write_bytes(b"")
        self.marker.unlink()
        journal = self.journal()
        self.assertEqual(journal.open().queued, [])
        yield journal.close()
        new = read_marker(self.marker)
        assert old is not None and new is not None
        self.assertNotEqual(new.identity, old.identity)

    @inlineCallbacks
    def test_journalWithoutMarkerAdopted(self) -> Inline:
        """
        A journal made before markers existed (none in its directory) is
        adopted: opening it records its identity in a new marker.
        """
        unmarked = Journal(self.path, reactor)
        unmarked.open()
        yield unmarked.close()
        self.assertFalse(self.marker.exists())
        journal = self.journal()
        journal.open()
        yield journal.close()
        marker = read_marker(self.marker)
        assert marker is not None
        self.assertEqual(marker.identity, unmarked.identity)

    def test_unreadableMarkerRefused(self) -> None:
        """A marker that is not what the journal writes is refused, saying so."""
        self.data_dir.mkdir(parents=True)
        self.marker.write_text("{not json")
        message = self.refused()
        self.assertIn(f"journal marker {self.marker} cannot be read", message)
        self.assertIn("remove it", message)

    @inlineCallbacks
    def test_serviceLogsRefusal(self) -> Inline:
        """
        The journal service that cannot open its journal logs why as
        critical and raises, so that the broker does not start.
        """
        yield self.fill()
        self.path.unlink()
        log = capture_log(self)
        service = JournalService(self.journal(), lambda found: None)
        with self.assertRaises(JournalIdentityError):
            service.startService()
        self.assertFalse(service.running)
        [event] = [e for e in log if e.get("log_level") == LogLevel.critical]
        self.assertIn("is missing", str(event["error"]))

    @inlineCallbacks
    def test_shortSwitchIntervalWhileRunning(self) -> Inline:
        """
        While the journal service runs (its writer thread sharing the GIL
        with the reactor) the GIL switch interval is the short one, the
        long one once the journal reports a big batch; it is what it was
        again once the service stops.
        """
        before = sys.getswitchinterval()
        journal = self.journal()
        service = JournalService(journal, lambda found: None)
        service.startService()
        try:
            self.assertEqual(sys.getswitchinterval(), LIGHT_INTERVAL_S)
            assert journal.on_batch is not None
            journal.on_batch(BUSY_RECORDS)  # as the hand-over reports a committed batch
            self.assertEqual(sys.getswitchinterval(), BUSY_INTERVAL_S)
        finally:
            yield service.stopService()
        self.assertEqual(sys.getswitchinterval(), before)


class IdentityTests(SynchronousTestCase):
    def test_madeOnceAndKept(self) -> None:
        """The first call makes a 16-byte identity in the data directory; later calls read it."""
        base = Path(self.mktemp())
        base.mkdir()
        first = pack_identity(base)
        self.assertEqual(len(first), 16)
        self.assertEqual((base / PACK_ID_FILE).read_text().strip(), first.hex().upper())
        self.assertEqual(pack_identity(base), first)

    def test_newJournalNewIdentity(self) -> None:
        """
        The identity is kept with its journal's: the same journal keeps it,
        a journal started afresh (another identity) gets a new one; a file
        made before journals were recorded adopts the journal it meets.
        """
        base = Path(self.mktemp())
        base.mkdir()
        old = pack_identity(base)
        self.assertEqual(pack_identity(base, "journal-1"), old)
        self.assertEqual(
            (base / PACK_ID_FILE).read_text().split(), [old.hex().upper(), "journal-1"]
        )
        self.assertEqual(pack_identity(base, "journal-1"), old)
        self.assertEqual(pack_identity(base), old)
        new = pack_identity(base, "journal-2")
        self.assertNotEqual(new, old)
        self.assertEqual(pack_identity(base, "journal-2"), new)

    def test_damagedFileRefused(self) -> None:
        """A pack-id file that holds no identity is refused, not replaced."""
        base = Path(self.mktemp())
        base.mkdir()
        (base / PACK_ID_FILE).write_text("not hex\n")
        with self.assertRaises(ValueError):
            pack_identity(base)
        self.assertEqual((base / PACK_ID_FILE).read_text(), "not hex\n")
