"""
The one error every codec of L{malamute_pack.protocol} raises for bytes
that are not one of its messages, or a value that cannot be encoded: each
codec's own error (C{MalformedMessage}, C{MalformedLink}, ...) derives from
L{Malformed}, so a caller that takes input from anywhere catches this one.

Tests: ``tests/unit/test_protocol_errors.py``.
"""

from __future__ import annotations


class Malformed(ValueError):
    """
    Input that is not a well-formed message of a codec, or a message a codec
    cannot encode; the text says why. A C{ValueError}, for callers that catch
    those.
    """
