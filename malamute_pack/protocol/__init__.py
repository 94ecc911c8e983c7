"""
Codecs: bytes to message objects and back, with no state. C{mlm} is the
Malamute client protocol (MLM v1, as libmlm, and our version 2 extension,
``docs/protocol.md``). The only place that knows a frame layout.

Tests: ``tests/unit/test_protocol_mlm.py``.
"""
