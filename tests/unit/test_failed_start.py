"""
Tests for what a failed start leaves (L{malamute_pack.startup.FailFast},
L{malamute_pack.datadir.DataDirService}): the reason logged once, whoever
logs it, and a data directory that was missing or empty before a failed
first start left as it was found, in this process with real files.
"""

from __future__ import annotations

from pathlib import Path

from twisted.application.service import Service
from twisted.logger import LogEvent, Logger, LogLevel, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack import startup
from malamute_pack.datadir import LOCK_NAME, DataDirError, DataDirLock, DataDirService, prepare
from tests.support import capture_log


class Writes(Service):
    """A service that, started, writes the file C{path} (as the journal makes its file)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def startService(self) -> None:
        self.path.write_text("made by this start\n")
        super().startService()


class Refuses(Service):
    """
    A service that refuses to start with C{error}, having logged C{logged}
    as critical first if given (C{error} itself, as the data directory's
    lock and the journal do, or another).
    """

    def __init__(self, error: Exception, logged: Exception | None = None) -> None:
        self.error = error
        self.logged = logged

    def startService(self) -> None:
        if self.logged is not None:
            Logger().critical("{error}", error=self.logged)
        raise self.error


def critical(log: list[LogEvent]) -> list[str]:
    """The critical events of C{log}, as text."""
    return [formatEvent(e) for e in log if e.get("log_level") == LogLevel.critical]


class ReasonOnceTests(SynchronousTestCase):
    def test_serviceLoggedIt(self) -> None:
        """A service that logged why it refuses as critical: FailFast does not log it again."""
        log = capture_log(self)
        top = startup.FailFast("malamute")
        refused = DataDirError("data directory d is in use")
        Refuses(refused, logged=refused).setServiceParent(top)
        with self.assertRaises(startup.StartupFailed) as caught:
            top.startService()
        self.assertEqual(caught.exception.line, "malamute: data directory d is in use")
        self.assertEqual(critical(log), ["data directory d is in use"])

    def test_failFastLogsIt(self) -> None:
        """A service that refuses without a word: FailFast logs the line, once."""
        log = capture_log(self)
        top = startup.FailFast("malamute")
        Refuses(DataDirError("data directory d is in use")).setServiceParent(top)
        self.assertRaises(startup.StartupFailed, top.startService)
        self.assertEqual(critical(log), ["malamute: data directory d is in use"])

    def test_anotherErrorLogged(self) -> None:
        """A critical line about another error does not stand for the one that stopped the start."""
        log = capture_log(self)
        top = startup.FailFast("malamute")
        Refuses(DataDirError("second"), logged=DataDirError("first")).setServiceParent(top)
        self.assertRaises(startup.StartupFailed, top.startService)
        self.assertEqual(critical(log), ["first", "malamute: second"])

    def test_logsToStdout(self) -> None:
        """twistd logs on its stdout with -n and no log file (or -), syslog or logger."""
        self.assertTrue(startup.logs_to_stdout({"nodaemon": True, "logfile": None}))
        self.assertTrue(startup.logs_to_stdout({"nodaemon": True, "logfile": "-"}))
        self.assertFalse(startup.logs_to_stdout({"nodaemon": True, "logfile": "twistd.log"}))
        self.assertFalse(startup.logs_to_stdout({"nodaemon": False, "logfile": None}))
        self.assertFalse(startup.logs_to_stdout({"nodaemon": True, "syslog": True}))
        self.assertFalse(startup.logs_to_stdout({"nodaemon": True, "logger": "a.b"}))


class FailedFirstStartTests(SynchronousTestCase):
    def fail_start(self, data_dir: Path) -> DataDirService:
        """
        Make a broker-like service on C{data_dir} (the lock, the directory
        prepared, a service that writes in it, one that refuses) and start
        it: it fails. Its data directory service.
        """
        top = startup.FailFast("malamute")
        lock = DataDirService(data_dir)
        lock.setServiceParent(top)
        prepare(data_dir)
        Writes(data_dir / "journal.sqlite").setServiceParent(top)
        Refuses(DataDirError("cannot bind x")).setServiceParent(top)
        top.privilegedStartService()  # the lock, as twistd takes it
        self.assertRaises(startup.StartupFailed, top.startService)
        self.assertFalse(lock.running)
        return lock

    def test_missingDirectory(self) -> None:
        """A data directory the failed start made is removed, with the parents it made."""
        base = Path(self.mktemp())
        base.mkdir()
        self.fail_start(base / "new" / "data")
        self.assertEqual(list(base.iterdir()), [])

    def test_emptyDirectory(self) -> None:
        """An empty data directory is emptied again, and kept."""
        data_dir = Path(self.mktemp())
        data_dir.mkdir()
        self.fail_start(data_dir)
        self.assertEqual(list(data_dir.iterdir()), [])

    def test_notFirstStart(self) -> None:
        """A data directory that held something is left with all the failed start made."""
        data_dir = Path(self.mktemp())
        data_dir.mkdir()
        (data_dir / "pack-id").write_text("x\n")
        self.fail_start(data_dir)
        self.assertEqual(
            sorted(p.name for p in data_dir.iterdir()),
            sorted([LOCK_NAME, "journal.sqlite", "pack-id"]),
        )

    def test_lockRefused(self) -> None:
        """A start refused the lock (a new directory another broker took) removes nothing."""
        data_dir = Path(self.mktemp())
        service = DataDirService(data_dir)  # made while it is missing
        holder = DataDirLock(data_dir)
        holder.acquire()
        self.addCleanup(holder.release)
        (data_dir / "journal.sqlite").write_text("the holder's\n")
        top = startup.FailFast("malamute")
        service.setServiceParent(top)
        self.assertRaises(startup.StartupFailed, top.privilegedStartService)
        self.assertTrue((data_dir / "journal.sqlite").exists())
        self.flushLoggedErrors()

    def test_lockTakenSince(self) -> None:
        """A directory another broker locked once the failed start let go is left to it."""
        data_dir = Path(self.mktemp())
        data_dir.mkdir()
        (data_dir / LOCK_NAME).write_text("")
        holder = DataDirLock(data_dir)
        holder.acquire()
        self.addCleanup(holder.release)
        (data_dir / "journal.sqlite").write_text("the holder's\n")
        self.assertFalse(DataDirLock(data_dir).discard(None))
        self.assertTrue((data_dir / "journal.sqlite").exists())
        self.assertTrue((data_dir / LOCK_NAME).exists())

    def test_lockAgainAfterDiscard(self) -> None:
        """Once a failed first start has removed the lock file, a broker locks the path anew."""
        data_dir = Path(self.mktemp())
        self.fail_start(data_dir)
        self.assertFalse(data_dir.exists())
        lock = DataDirLock(data_dir)
        holder = lock.acquire()
        self.addCleanup(lock.release)
        self.assertEqual(DataDirLock(data_dir).holder(), holder)
