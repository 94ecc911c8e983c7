"""
Every module of the package (and the twistd plugin, and the soak beside
the package, ``soak/``) starts with a docstring that says where its tests
are: it names at least one test module (``tests/unit/test_name.py`` or
``tests/system/test_name.py``, or ``tests/unit/test_journal_*.py`` for
several, or ``tests.unit.test_name``), and every test module it names
exists. A newcomer reading a module can go straight to what checks it, and
a name left behind by a rename fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.testing.brokerprocess import PROJECT_ROOT

# A test module named by path (a * stands for any part of a name) or by
# dotted module name.
_TEST_MODULE = re.compile(
    r"\btests/((?:unit|system)/test_[\w*]+)\.py\b|\btests\.((?:unit|system)\.test_\w+)\b"
)


def checked_modules(root: Path = PROJECT_ROOT) -> list[Path]:
    """
    The modules whose docstrings are checked, relative to C{root}: the
    package's, the twistd plugin and the soak's (C{soak/}, beside the
    package).
    """
    package = sorted(
        path.relative_to(root)
        for top in ("malamute_pack", "soak")
        for path in (root / top).rglob("*.py")
    )
    return [*package, Path("twisted/plugins/malamute_plugin.py")]


def named_test_modules(docstring: str) -> list[str]:
    """
    The test modules C{docstring} names, as paths relative to the
    checkout (C{tests/unit/test_name.py}, possibly with a C{*}).
    """
    return [
        f"tests/{match.group(1) or match.group(2).replace('.', '/')}.py"
        for match in _TEST_MODULE.finditer(docstring)
    ]


def problems(module: Path, root: Path = PROJECT_ROOT) -> list[str]:
    """What is wrong with the docstring of C{module} (relative to C{root}), if anything."""
    docstring = ast.get_docstring(ast.parse((root / module).read_text(), str(module)))
    if not docstring:
        return [f"{module}: no module docstring"]
    named = named_test_modules(docstring)
    if not named:
        return [f"{module}: its docstring names no test module"]
    return [
        f"{module}: names {name}, which does not exist"
        for name in dict.fromkeys(named)
        if not any(root.glob(name))
    ]


class CheckerTests(SynchronousTestCase):
    """The checker itself, on docstrings and files made for it."""

    def test_namesFound(self) -> None:
        """
        Test modules are found by path, by a path with a wildcard and by
        dotted name, in prose or in a C{Tests:} line; a helper module or a
        package path is not a test module.
        """
        docstring = (
            "The codec.\n\nTests: ``tests/unit/test_protocol_mlm.py`` and\n"
            "tests/unit/test_journal_*.py; see also tests.system.test_tap, tests/support.py\n"
            "and malamute_pack/tests/x.py."
        )
        self.assertEqual(
            named_test_modules(docstring),
            [
                "tests/unit/test_protocol_mlm.py",
                "tests/unit/test_journal_*.py",
                "tests/system/test_tap.py",
            ],
        )

    def test_problemsReported(self) -> None:
        """
        A module without a docstring, one whose docstring names no test
        module and one that names a test module that is not there are each
        reported; one naming existing test modules (a wildcard matching
        at least one) is not.
        """
        root = Path(self.mktemp())
        (root / "tests" / "unit").mkdir(parents=True)
        (root / "tests" / "unit" / "test_a.py").write_text('"""Tests."""\n')
        modules = {
            "bare.py": "x = 1\n",
            "vague.py": '"""Does things. Tested somewhere."""\n',
            "stale.py": '"""Tests: ``tests/unit/test_a.py``, ``tests/unit/test_gone.py``."""\n',
            "fine.py": '"""Tests: ``tests/unit/test_*.py`` and tests.unit.test_a."""\n',
        }
        for name, text in modules.items():
            (root / name).write_text(text)
        self.assertEqual(
            [problem for name in modules for problem in problems(Path(name), root)],
            [
                "bare.py: no module docstring",
                "vague.py: its docstring names no test module",
                "stale.py: names tests/unit/test_gone.py, which does not exist",
            ],
        )


class ModuleDocstringTests(SynchronousTestCase):
    def test_everyModuleNamesItsTests(self) -> None:
        """
        Every module under malamute_pack/ and soak/ and the twistd plugin
        has a docstring naming at least one test module, and every test
        module named exists.
        """
        modules = checked_modules()
        self.assertIn(Path("malamute_pack/protocol/mlm.py"), modules)
        self.assertIn(Path("soak/checker.py"), modules)
        found = [problem for module in modules for problem in problems(module)]
        self.assertEqual(found, [], "\n" + "\n".join(found))
