"""
Tests for L{malamute_pack.journal.schema}: a new database gets every
migration and WAL mode, migrations run from the stored version on, a
database newer than the code is refused, and every journal has an identity.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlite_utils import Database
from twisted.internet import reactor
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.journal import Journal, JournalError
from malamute_pack.journal.schema import MIGRATIONS, Migration, journal_identity, migrate


class MigrateTests(SynchronousTestCase):
    def connect(self) -> sqlite3.Connection:
        path = Path(self.mktemp())
        path.mkdir()
        conn = sqlite3.connect(path / "journal.db", isolation_level=None)
        self.addCleanup(conn.close)
        return conn

    def version(self, conn: sqlite3.Connection) -> int:
        return int(conn.execute("SELECT version FROM schema_version").fetchone()[0])

    def test_newDatabase(self) -> None:
        """
        A new database ends at the latest version, in WAL mode, with the
        journal's tables.
        """
        conn = self.connect()
        self.assertEqual(migrate(conn), len(MIGRATIONS))
        self.assertEqual(self.version(conn), len(MIGRATIONS))
        self.assertEqual(conn.execute("PRAGMA journal_mode").fetchone()[0], "wal")
        tables = set(Database(conn, execute_plugins=False).table_names())
        self.assertLessEqual(
            {"stream_messages", "streams", "queued_messages", "journal_counters"}, tables
        )

    def test_appliesOnlyNewMigrations(self) -> None:
        """
        Migrating again runs only the migrations added since the stored
        version, in order.
        """
        conn = self.connect()
        ran: list[str] = []

        def step(name: str) -> Migration:
            def migration(db: Database) -> None:
                ran.append(name)
                db.table(name).create({"x": int})

            return migration

        migrate(conn, [step("a")])
        migrate(conn, [step("a"), step("b"), step("c")])
        migrate(conn, [step("a"), step("b"), step("c")])
        self.assertEqual(ran, ["a", "b", "c"])
        self.assertEqual(self.version(conn), 3)

    def test_failedMigrationLeavesVersion(self) -> None:
        """
        A migration that fails is rolled back with its version bump: the
        database stays at the version before it.
        """
        conn = self.connect()

        def broken(db: Database) -> None:
            db.table("half").create({"x": int})
            raise RuntimeError("broken migration")

        migrate(conn, [])
        with self.assertRaises(RuntimeError):
            migrate(conn, [broken])
        self.assertEqual(conn.execute("SELECT count(*) FROM schema_version").fetchone()[0], 0)
        self.assertFalse(Database(conn, execute_plugins=False).table("half").exists())

    def test_newerDatabaseRefused(self) -> None:
        """
        A database whose version is newer than the code's migrations is
        refused, and Journal.open reports it as a JournalError.
        """
        conn = self.connect()
        migrate(conn)
        conn.execute("UPDATE schema_version SET version = ?", (len(MIGRATIONS) + 1,))
        with self.assertRaises(ValueError):
            migrate(conn)
        path = Path(conn.execute("PRAGMA database_list").fetchone()[2])
        with self.assertRaises(JournalError) as caught:
            Journal(path, reactor).open()
        self.assertIn("newer than this code", str(caught.exception))

    def test_identity(self) -> None:
        """
        A new journal gets a random identity (and its creation time) that
        migrating again keeps; a journal made before identities existed
        gets one when it is migrated; two journals never share one.
        """
        conn = self.connect()
        migrate(conn)
        identity, created = journal_identity(conn)
        self.assertRegex(identity, "^[0-9a-f]{32}$")
        self.assertGreater(created, 0)
        migrate(conn)
        self.assertEqual(journal_identity(conn), (identity, created))

        older = self.connect()
        migrate(older, MIGRATIONS[:1])
        self.assertFalse(Database(older, execute_plugins=False).table("journal_identity").exists())
        migrate(older)
        self.assertNotEqual(journal_identity(older)[0], identity)
