"""
Tests for L{malamute_pack.blocked_imports}: inside the block a library
goes without the optional modules named, as if they were not installed;
afterwards they import as usual and C{sys.modules} is as it was. The
modules imported here are made for each test in its own directory.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.blocked_imports import blocked_imports

# A library that uses an optional module when it is installed, the way
# sqlite-utils uses pandas and numpy.
_LIBRARY = """
try:
    import {heavy}
except ImportError:
    {heavy} = None
"""

# Each test's modules have names of their own: an import is cached by name.
_serial = itertools.count(1)


class BlockedImportsTests(SynchronousTestCase):
    def setUp(self) -> None:
        serial = next(_serial)
        directory = Path(self.mktemp())
        directory.mkdir()
        self.heavy = f"blocked_heavy_{serial}"
        self.library = f"blocked_library_{serial}"
        (directory / f"{self.heavy}.py").write_text("LOADED = True\n")
        (directory / f"{self.library}.py").write_text(_LIBRARY.format(heavy=self.heavy))
        sys.path.insert(0, str(directory))
        importlib.invalidate_caches()
        self.addCleanup(sys.path.remove, str(directory))
        for name in (self.heavy, self.library):
            self.addCleanup(sys.modules.pop, name, None)

    def test_libraryGoesWithout(self) -> None:
        """
        A library imported in the block finds its optional module missing,
        and nothing of that module is left loaded after it.
        """
        with blocked_imports(self.heavy):
            library = importlib.import_module(self.library)
        self.assertIsNone(getattr(library, self.heavy))
        self.assertNotIn(self.heavy, sys.modules)

    def test_importsAfterwards(self) -> None:
        """Once the block has ended, the blocked module imports as usual."""
        with blocked_imports(self.heavy):
            importlib.import_module(self.library)
        heavy = importlib.import_module(self.heavy)
        self.assertTrue(heavy.LOADED)

    def test_alreadyImported(self) -> None:
        """
        A module imported before the block cannot be imported inside it, and
        is the same module in C{sys.modules} after it.
        """
        heavy = importlib.import_module(self.heavy)
        with blocked_imports(self.heavy):
            self.assertRaises(ModuleNotFoundError, importlib.import_module, self.heavy)
            library = importlib.import_module(self.library)
        self.assertIsNone(getattr(library, self.heavy))
        self.assertIs(sys.modules[self.heavy], heavy)

    def test_restoredOnError(self) -> None:
        """An error raised in the block still leaves C{sys.modules} as it was."""
        with self.assertRaises(KeyError), blocked_imports(self.heavy):
            raise KeyError("x")
        self.assertNotIn(self.heavy, sys.modules)
        self.assertTrue(importlib.import_module(self.heavy).LOADED)
