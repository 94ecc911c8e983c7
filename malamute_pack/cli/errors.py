"""
The one error the C{malamute} command reports itself: L{CommandError}, whose
message is the whole line printed after C{malamute: error: } (what went
wrong and what to do about it). Everything the command catches from the
client library, the file system or the user's input becomes one.

Tests: ``tests/system/test_cli.py``.
"""

from __future__ import annotations


class CommandError(Exception):
    """
    A failure the command explains in one line and exits with C{status}
    (1 by default).
    """

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status
