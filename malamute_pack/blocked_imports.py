"""
Importing a library whose optional extras would make the broker heavy,
without them: L{blocked_imports}.

sqlite-utils (the journal's schema tool, L{malamute_pack.journal.schema})
imports pandas and numpy whenever they are installed, only to map their
types to SQLite column types, which the journal never uses; the Spark
extra installs both (and pyarrow, which pandas imports) into the same
environment, and they were two thirds of the broker's memory at start
(about 120 MiB of 137). Inside C{with blocked_imports("pandas",
"numpy"):} an import of those names fails as if they were not installed,
so a library that treats them as optional goes without; on leaving,
C{sys.modules} is as it was, so code that imports them deliberately
afterwards (the Spark data source, C{malamute export --parquet}) gets
them as usual.

Meant for a module's top-level imports, which run under the import lock:
a thread importing a blocked name at the same moment would fail too.

Tests: ``tests/unit/test_blocked_imports.py``,
``tests/system/test_broker_footprint.py`` (no broker process loads pandas,
numpy or pyarrow).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType


@contextmanager
def blocked_imports(*names: str) -> Iterator[None]:
    """
    While the block runs, importing any of the top-level modules C{names}
    raises C{ModuleNotFoundError}, even one already imported; afterwards
    C{sys.modules} holds for each name what it held before (nothing, or
    the module).
    """
    # None in sys.modules is the import system's own "not importable here".
    saved: dict[str, ModuleType | None] = {name: sys.modules.get(name) for name in names}
    for name in names:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
