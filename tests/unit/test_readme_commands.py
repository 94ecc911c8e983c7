"""
The commands README.md and the examples' docstrings give run as written
from a fresh clone: Python and twistd are the ones in C{.venv} (bare
C{python} and C{twistd} are not on C{PATH}, and C{PYTHONPATH} is not
needed), a broker is started with C{scripts/broker}, and no block of
commands starts a second broker on the data directory of one still
running (it would fail on the lock).
"""

from __future__ import annotations

import ast
import re

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.testing.brokerprocess import PROJECT_ROOT

README = PROJECT_ROOT / "README.md"
EXAMPLES = sorted((PROJECT_ROOT / "examples").glob("*.py"))

# A fenced block: its language and its lines.
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# An inline code span that runs python or twistd bare.
_BARE_SPAN = re.compile(r"`(?:python3?|twistd)\s[^`]*`")
# A command line that runs python or twistd bare (after sudo or env settings).
_BARE_COMMAND = re.compile(r"^(?:sudo\s+)?(?:\w+=\S*\s+)*(?:python3?|twistd)\b")


def shell_blocks(text: str) -> list[list[str]]:
    """The command lines (comments and blank lines left out) of C{text}'s ```sh blocks."""
    return [commands for _, commands in shell_blocks_after(text)]


def shell_blocks_after(text: str) -> list[tuple[str, list[str]]]:
    """
    C{text}'s ```sh blocks: for each, the prose since the block before it
    and its command lines (comments and blank lines left out).
    """
    blocks = []
    since = 0
    for fence in _FENCE.finditer(text):
        language, body = fence.groups()
        if language == "sh":
            lines = [line.split("#", 1)[0].strip() for line in body.splitlines()]
            blocks.append((text[since : fence.start()], [line for line in lines if line]))
        since = fence.end()
    return blocks


def prose(text: str) -> str:
    """C{text} without its fenced blocks."""
    return _FENCE.sub("", text)


def starts_broker_on_default_data(command: str) -> bool:
    """Whether C{command} starts a broker on the default data directory (no -d)."""
    words = command.split()
    return (
        bool(words)
        and words[0].endswith("scripts/broker")
        and not (
            {"-d", "--data-dir"} & set(words) or any(w.startswith("--data-dir=") for w in words)
        )
    )


class ReadmeTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.text = README.read_text()

    def test_venvCommands(self) -> None:
        """No command of the README runs a bare python or twistd."""
        for block in shell_blocks(self.text):
            for command in block:
                self.assertIsNone(_BARE_COMMAND.match(command), command)
        self.assertEqual(_BARE_SPAN.findall(prose(self.text)), [])

    def test_oneBrokerPerDataDir(self) -> None:
        """
        A block of commands starts at most one broker on the default data
        directory, and one after the first only once the text before it
        has said to stop the first; a broker started in the background
        (beside one the reader may have running) has a data directory of
        its own.
        """
        started = 0
        for before, block in shell_blocks_after(self.text):
            defaults = [c for c in block if starts_broker_on_default_data(c)]
            self.assertLessEqual(len(defaults), 1, block)
            if defaults and started:
                self.assertIn("stop", before, defaults[0])
            started += len(defaults)
            for command in block:
                if "scripts/broker" in command and command.endswith("&"):
                    self.assertFalse(starts_broker_on_default_data(command), command)

    def test_checker(self) -> None:
        """The checks above catch the commands that did not run as written."""
        self.assertIsNotNone(_BARE_COMMAND.match("PYTHONPATH=. python examples/x.py"))
        self.assertIsNotNone(_BARE_COMMAND.match("twistd -n malamute"))
        self.assertIsNone(_BARE_COMMAND.match(".venv/bin/python -m malamute_pack.bench"))
        self.assertEqual(
            _BARE_SPAN.findall("run `python -m x.y` or `python3`"), ["`python -m x.y`"]
        )
        self.assertTrue(starts_broker_on_default_data("scripts/broker --http tcp:8180"))
        self.assertFalse(starts_broker_on_default_data("scripts/broker -d other &"))


class ExampleDocstringTests(SynchronousTestCase):
    def test_commands(self) -> None:
        """
        Each example's docstring starts the broker with scripts/broker and
        runs the example with .venv's python, by its own path.
        """
        self.assertTrue(EXAMPLES)
        for path in EXAMPLES:
            docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
            self.assertNotIn("PYTHONPATH", docstring, path.name)
            self.assertIn("``scripts/broker``", docstring, path.name)
            self.assertIn(f".venv/bin/python examples/{path.name}", docstring, path.name)
            for line in docstring.splitlines():
                self.assertIsNone(_BARE_COMMAND.match(line.strip()), f"{path.name}: {line}")
