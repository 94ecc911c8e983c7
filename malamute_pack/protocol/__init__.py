"""
Codecs: bytes to message objects and back, with no state. The only place
that knows a frame layout; nothing here imports the rest of the package.

- C{mlm}: the Malamute client protocol (MLM v1, as libmlm, and our version 2
  extension, ``docs/protocol.md``).
- C{packlink}: the pack's inter-broker link.
- C{zre}: ZRE, Zyre's beacons and peer messages.
- C{zgossip}: zgossip, Zyre's discovery where there is no broadcast.
- C{pair}: the pair link.
- C{multicast}: the multicast bridge's record header.
- C{chunks}: the packed records of version 2's bulk messages.
- C{zproto}: the one layout engine the message codecs are compiled with.
- C{errors}: L{Malformed}, the error every codec's own error derives from.
- C{records}: the plain records the codecs carry and the journal stores.

Tests: ``tests/unit/test_protocol_mlm.py``.
"""
