"""
Frames for fuzzing the broker: random bytes, messages of every kind with
random fields (strings that are not UTF-8, empty, at the length limits,
patterns that make backtracking engines explode), and valid messages with
bytes flipped, inserted, cut or frames added. Deterministic for a seed.

Names used by well-behaved clients start with C{good}; no fuzz name does,
so fuzzers never take over their addresses or serve their services.

Tests: used by ``tests/system/test_system_fuzz.py``; ``tests/unit/test_fuzz_frames.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from malamute_pack.protocol import mlm

GOOD_PREFIX = b"good"

# Patterns that blow up a backtracking regular-expression engine, and
# subjects that make them.
EXPLOSIVE_PATTERNS = (b"(a+)+$", b"(a|aa)+$", b"(a*)*b", b"^(\\w+\\s?)*$", b"(.*a){20}")
EXPLOSIVE_SUBJECTS = (b"a" * 30 + b"b", b"a" * 200, b"word " * 40 + b"!")


class FrameFuzzer:
    """Makes fuzz messages (lists of frames) from a seeded random source."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self._makers: list[Callable[[], list[bytes]]] = [
            self.random_bytes,
            self.random_message,
            self.random_message,
            self.mutated_message,
            self.mutated_message,
            self.explosive_message,
        ]

    def next(self) -> list[bytes]:
        """One fuzz message."""
        return self.random.choice(self._makers)()

    # Strings and numbers

    def name(self) -> bytes:
        """A string field's bytes: any of the awkward kinds, never a good name."""
        r = self.random
        kind = r.randrange(8)
        if kind == 0:
            value = b""
        elif kind == 1:
            value = bytes(r.randrange(256) for _ in range(r.randrange(1, 40)))  # likely not UTF-8
        elif kind == 2:
            value = b"x" * r.choice((254, 255))
        elif kind == 3:
            value = "é€😀".encode() * r.randrange(1, 20)
        elif kind == 4:
            value = r.choice(EXPLOSIVE_PATTERNS + EXPLOSIVE_SUBJECTS)
        elif kind == 5:
            value = r.choice((b"prefix:", b"topic:#", b"mqtt:+/#", b"nats:>", b"fields:a=1", b"["))
        else:
            value = b"fuzz-%d" % r.randrange(64)
        if value.startswith(GOOD_PREFIX):
            value = b"fuzz" + value
        return value[:255]

    def number(self, size: int) -> bytes:
        r = self.random
        value = r.choice((0, 1, (1 << (8 * size)) - 1, r.randrange(1 << (8 * size))))
        return value.to_bytes(size, "big")

    def content(self) -> list[bytes]:
        r = self.random
        frames = []
        for _ in range(r.choice((0, 1, 1, 2, 5))):
            size = r.choice((0, 10, 100, 4096, r.randrange(1 << 16)))
            frames.append(r.randbytes(size))
        return frames

    # Messages

    def random_bytes(self) -> list[bytes]:
        r = self.random
        return [r.randbytes(r.randrange(0, 300)) for _ in range(r.randrange(1, 4))]

    def random_message(self) -> list[bytes]:
        """A message of any kind, fields filled at random, well formed or nearly."""
        cls = self.random.choice(list(mlm.MESSAGE_TYPES.values()))
        # Fields by hand past the header's start: the codec would refuse to
        # encode the strings that are not UTF-8, which is the point.
        header = mlm.header_start(cls)
        for _name, kind in cls.LAYOUT:
            if kind == "s":
                value = self.name()
                header += bytes((len(value),)) + value
            else:
                header += self.number(int(kind))
        return [header, *(self.content() if cls.HAS_CONTENT else [])]

    def valid_message(self) -> mlm.Message:
        """A valid message a client might send, with fuzz names."""
        r = self.random
        text = f"fuzz-{r.randrange(64)}"
        choices: list[mlm.Message] = [
            mlm.ConnectionOpen(version=r.choice((1, 2)), address=text),
            mlm.ConnectionPing(),
            mlm.StreamWrite(text),
            mlm.StreamRead(text, r.choice(("", "^a", "topic:#"))),
            mlm.StreamReadFrom(text, "", r.randrange(4), r.randrange(10)),
            mlm.StreamSend(text, [r.randbytes(r.randrange(100))]),
            mlm.MailboxSend(text, text, r.choice(("", "t")), r.randrange(2000), [b"m"]),
            mlm.ServiceSend(text, text, "", 0, [b"s"]),
            mlm.ServiceOffer(text, ""),
            mlm.Credit(r.randrange(1, 100)),
            mlm.Confirm(text, 200, ""),
            mlm.Done(r.randrange(1 << 20)),
            mlm.StreamCancel(text),
            mlm.ConnectionClose(),
        ]
        return r.choice(choices)

    def mutated_message(self) -> list[bytes]:
        """A valid message with a byte flipped, inserted or cut, or a frame added or lost."""
        r = self.random
        frames = mlm.encode(self.valid_message())
        header = bytearray(frames[0])
        action = r.randrange(5)
        at = r.randrange(len(header) + 1)
        if action == 0 and len(header) > 0:
            header[min(at, len(header) - 1)] ^= 1 << r.randrange(8)
        elif action == 1:
            header[at:at] = r.randbytes(r.randrange(1, 4))
        elif action == 2:
            del header[at : at + r.randrange(1, 4)]
        elif action == 3:
            frames.append(r.randbytes(r.randrange(50)))
        else:
            frames = frames[:1] if len(frames) > 1 else [bytes(header), b"extra"]
        frames[0] = bytes(header)
        return frames

    def explosive_message(self) -> list[bytes]:
        """A reader or worker with an explosive pattern, or a subject that sets one off."""
        r = self.random
        pattern = r.choice(EXPLOSIVE_PATTERNS).decode()
        subject = r.choice(EXPLOSIVE_SUBJECTS).decode()
        stream = "fuzz-boom"
        message = r.choice(
            [
                mlm.StreamRead(stream, pattern),
                mlm.ServiceOffer(stream, pattern),
                mlm.StreamSend(subject, [b"x"]),
                mlm.ServiceSend(stream, subject, "", 0, [b"x"]),
            ]
        )
        return mlm.encode(message)
