"""
The one zproto layout engine every message codec of the package uses (MLM,
the pack link, ZRE, zgossip and the pair link): a codec declares its
messages as layouts, field by field in wire order, and the engine compiles
an encoder and a decoder for each once, at import.

Frame 1 of a message is ``signature | id | version | fields`` (or
``signature | version | id``, or no version); the frames after it are the
message's content, a frame of ids, or one nested message each. Field kinds
(L{Kind}) are the zproto ones, named as zproto names them: ``number1``,
``number2``, ``number4``, ``number8`` (big-endian, unsigned), ``string``
(a length byte and UTF-8), ``longstr`` (a 4-byte length), ``strings``
and ``hash`` (a 4-byte count, then items), plus what the pair link needs
(a double, a flags byte with optional fields after it, nested records,
lists and maps, the rest of the frame).

Why compile: a layout interpreted field by field costs three times the
same layout written out as straight-line Python (as C{dataclasses} writes
C{__init__}), and MLM's codec speed is the broker's per-record speed.

Stateless: a L{Codec} holds compiled functions and nothing that changes.

Tests: ``tests/unit/test_protocol_zproto.py``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Final, Generic, NoReturn, TypeVar, cast

from malamute_pack.protocol.errors import Malformed

M = TypeVar("M")

# How a codec's strings are decoded: LENIENT keeps bytes that are not UTF-8
# (with surrogateescape, so they re-encode to the same bytes); STRICT
# refuses them (and strings that do not encode as UTF-8).
LENIENT: Final = "surrogateescape"
STRICT: Final = "strict"

# The names generated functions use for themselves: no field may take one.
_RESERVED: Final = frozenset(
    {"header", "frames", "end", "o", "n", "bad", "cls", "error", "message", "prefix"}
)


@dataclass(frozen=True)
class Wording:
    """
    What a codec's errors say, as C{str.format} templates. Known when the
    codec is compiled: C{name} (the message's), C{id}, C{field}, C{width}
    (a number's kind) and C{expected} (the version). Known when it fails:
    C{size}, C{count}, C{left}, C{hex}, C{value}, C{error}, C{version},
    C{signature} (hex) and, for an unknown message, C{id}.
    """

    no_frames: str = "no frames"
    too_short: str = "frame of {size} bytes is too short for a header"
    signature: str = "bad signature {signature}"
    version: str = "version {version}, expected {expected}"
    unknown_id: str = "unknown message id {id}"
    string_length: str = "{name} truncated: no {field} length"
    string_past: str = "{name} truncated: {field} of {size} bytes runs past the end"
    number_past: str = "{name} truncated: no {field}"
    trailing: str = "{name} has {size} trailing bytes"
    no_content: str = "{name} has {count} unexpected content frames"
    missing_frame: str = "{name} has {count} frames, not its header and {field}"
    not_utf8: str = "{name} {field} is not valid UTF-8 ({hex})"
    overruns: str = "{name} {field} count {count} overruns the {left} bytes left"
    bad_value: str = "{name} {field} cannot be {value}"
    bad_content: str = "{name} {field}: {error}"
    too_long: str = "cannot encode {field}: {size} bytes, at most 255"
    not_encodable: str = "cannot encode a string: not encodable as UTF-8 ({error})"
    out_of_range: str = "cannot encode a number: out of range ({error})"


def _hex(raw: bytes) -> str:
    return raw[:32].hex(" ")


# The length byte of a string, ready made.
_LENGTHS: Final = tuple(bytes((n,)) for n in range(256))
_NUMBERS: Final = {"1": "B", "2": "H", "4": "I", "8": "Q", "d": "d"}


class _Source:
    """The source of one generated function, and what its fields need."""

    def __init__(self, codec: Codec[Any], name: str, message_id: int, mode: str) -> None:
        self.codec = codec
        self.name = name
        self.id = message_id
        self.mode = mode  # LENIENT, STRICT, or "checked" (lenient, noting the first bad field)
        self.lines: list[str] = []
        self.depth = 1
        self.count = 0
        # Objects the generated source names (nested records' classes, ...).
        self.scope: dict[str, object] = {}
        # Of the layout being compiled: its Optional fields, how to get a
        # field's value (encoding), each field's variable (decoding), and a
        # flagged field's flags variable and bit.
        self.optional: set[str] = set()
        self.value_of: Callable[[str], str] = str
        self.names: dict[str, str] = {}
        self.flagged: dict[str, tuple[str, int]] = {}

    def add(self, *lines: str) -> None:
        self.lines += ["    " * self.depth + line for line in lines]

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"_{stem}{self.count}"

    def fail(self, key: str, field: str = "", width: str = "", **runtime: str) -> str:
        """A C{raise} of the codec's error, its text the C{key} template."""
        fixed = {"name": self.name, "id": str(self.id), "field": field, "width": width}
        values = {k: v.replace("{", "{{").replace("}", "}}") for k, v in fixed.items()}
        values["expected"] = str(self.codec.version)
        values.update({k: "{" + expression + "}" for k, expression in runtime.items()})
        text = getattr(self.codec.wording, key).format_map(values)
        return f"raise error(f{text!r})"


class Kind:
    """How one field travels: the source that encodes it and decodes it."""

    # The fewest bytes it takes on the wire (to check a count against).
    size: int = 1

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        """Add statements to C{src}; return the expressions of its bytes."""
        raise NotImplementedError

    def decode(self, src: _Source, target: str, field: str) -> None:
        """Add statements to C{src} that set C{target} from C{header} at C{o}, and advance C{o}."""
        raise NotImplementedError


class Number(Kind):
    """
    An unsigned big-endian integer (zproto's number1, 2, 4 and 8) or a
    double (C{d}); C{allowed} limits what a decoder takes.
    """

    def __init__(self, code: str, allowed: tuple[int, ...] | None = None) -> None:
        self.code = code
        self.size = struct.calcsize(">" + _NUMBERS[code])
        self.allowed = allowed

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        return [f"pack{self.code}({value})"]

    def decode(self, src: _Source, target: str, field: str) -> None:
        src.add(
            f"if o + {self.size} > end:",
            "    " + src.fail("number_past", field, self.code),
            f"{target} = unpack{self.code}(header, o)[0]",
            f"o += {self.size}",
        )
        if self.allowed is not None:
            src.add(
                f"if {target} not in {self.allowed!r}:",
                "    " + src.fail("bad_value", field, value=target),
            )


class Bool(Kind):
    """A flag as a byte, 0 or 1."""

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        return [f"(b'\\x01' if {value} else b'\\x00')"]

    def decode(self, src: _Source, target: str, field: str) -> None:
        src.add(
            "if o >= end:",
            "    " + src.fail("number_past", field, "1"),
            "if header[o] > 1:",
            "    " + src.fail("bad_value", field, value="header[o]"),
            f"{target} = header[o] == 1",
            "o += 1",
        )


class NanIsNone(Kind):
    """A double that may be absent: None travels as NaN."""

    size = 8

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        return [f"packd(nan if {value} is None else {value})"]

    def decode(self, src: _Source, target: str, field: str) -> None:
        Number("d").decode(src, target, field)
        src.add(f"if {target} != {target}:", f"    {target} = None")


class Text(Kind):
    """
    A string: its UTF-8 length in C{width} bytes (zproto's string, 1; its
    longstr, 4), then the bytes; or, not C{text}, bytes (a chunk).
    """

    def __init__(self, width: int, text: bool = True) -> None:
        self.width = width
        self.size = width
        self.text = text

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        if not self.text:
            src.add(f"{temp} = {value}")
        elif src.codec.text == STRICT:
            src.add(f"{temp} = {value}.encode('utf-8')")
        else:
            src.add(f"{temp} = {value}.encode('utf-8', 'surrogateescape')")
        if self.width == 1:
            src.add(f"if len({temp}) > 255: too_long({src.name!r}, {field!r}, {temp})")
            return [f"lengths[len({temp})]", temp]
        return [f"pack4(len({temp}))", temp]

    def decode(self, src: _Source, target: str, field: str) -> None:
        if self.width == 1:
            src.add(
                "if o >= end:",
                "    " + src.fail("string_length", field),
                "n = header[o] + 1",
                "if o + n > end:",
                "    " + src.fail("string_past", field, size="n - 1"),
            )
        else:
            src.add(
                "if o + 4 > end:",
                "    " + src.fail("string_length", field),
                "n = unpack4(header, o)[0] + 4",
                "if o + n > end:",
                "    " + src.fail("string_past", field, size="n - 4"),
            )
        raw = f"header[o + {self.width} : o + n]"
        if not self.text:
            src.add(f"{target} = {raw}")
        elif src.mode == STRICT:
            src.add(
                "try:",
                f"    {target} = {raw}.decode('utf-8')",
                "except UnicodeDecodeError:",
                "    " + src.fail("not_utf8", field, hex=f"hexof({raw})") + " from None",
            )
        elif src.mode == LENIENT:
            src.add(f"{target} = {raw}.decode('utf-8', 'surrogateescape')")
        else:
            src.add(
                "try:",
                f"    {target} = {raw}.decode('utf-8')",
                "except UnicodeDecodeError:",
                f"    {target} = {raw}.decode('utf-8', 'surrogateescape')",
                f"    bad = bad or {field!r}",
            )
        src.add("o += n")


class Tuple(Kind):
    """Fields of the given kinds, one after another, as a tuple."""

    def __init__(self, *kinds: Kind | str) -> None:
        self.kinds = tuple(_kind(kind) for kind in kinds)
        self.size = sum(kind.size for kind in self.kinds)

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        items = [src.fresh("t") for _ in self.kinds]
        src.add(f"{', '.join(items)}, = {value}")
        parts: list[str] = []
        for kind, item in zip(self.kinds, items, strict=True):
            parts += kind.encode(src, item, field, src.fresh("e"))
        return parts

    def decode(self, src: _Source, target: str, field: str) -> None:
        items = [src.fresh("t") for _ in self.kinds]
        for kind, item in zip(self.kinds, items, strict=True):
            kind.decode(src, item, field)
        src.add(f"{target} = ({', '.join(items)},)")


class Record(Kind):
    """A nested record of class C{cls}, its fields laid out as a message's."""

    def __init__(self, cls: type, layout: Sequence[tuple[str, Kind | str]]) -> None:
        self.cls = cls
        self.layout = tuple((name, _kind(kind)) for name, kind in layout)
        self.size = sum(kind.size for _, kind in self.layout)

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        src.add(f"{temp} = {value}")
        return _encode_fields(src, self.layout, lambda name: f"{temp}.{name}", False)

    def decode(self, src: _Source, target: str, field: str) -> None:
        names = {name: src.fresh("f") for name in _attributes(self.layout)}
        _decode_fields(src, self.layout, names)
        make = src.fresh("make")
        src.scope[make] = self.cls
        src.add(f"{target} = {make}({', '.join(names[a] for a in _arguments(self.cls))})")


class ListOf(Kind):
    """
    zproto's strings and hash, generalised: a 4-byte count, then that many
    C{item}s; as a C{tuple}, a C{list}, or a C{dict} (items of two).
    """

    size = 4

    def __init__(self, item: Kind | str, container: type = tuple) -> None:
        self.item = _kind(item)
        self.container = container

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        items = f"{temp}.items()" if self.container is dict else temp
        parts, each = src.fresh("p"), src.fresh("i")
        src.add(f"{temp} = {value}", f"{parts} = [pack4(len({temp}))]", f"for {each} in {items}:")
        src.depth += 1
        item_parts = self.item.encode(src, each, field, src.fresh("e"))
        src.add(f"{parts} += ({', '.join(item_parts)},)")
        src.depth -= 1
        return [f"b''.join({parts})"]

    def decode(self, src: _Source, target: str, field: str) -> None:
        count, items, item = src.fresh("c"), src.fresh("l"), src.fresh("i")
        src.add(
            "if o + 4 > end:",
            "    " + src.fail("number_past", field, "4"),
            f"{count} = unpack4(header, o)[0]",
            "o += 4",
            f"if {count} * {self.item.size} > end - o:",
            "    " + src.fail("overruns", field, count=count, left="end - o"),
            f"{items} = []",
            f"for _ in range({count}):",
        )
        src.depth += 1
        self.item.decode(src, item, field)
        src.add(f"{items}.append({item})")
        src.depth -= 1
        src.add(f"{target} = {self.container.__name__}({items})")


class Flags(Kind):
    """
    A byte whose bits, in order, belong to the C{names}: a bit of a field
    laid out as L{Optional} says the field is there; any other bit is the
    value of a boolean attribute of that name. Laid out under the name "".
    """

    def __init__(self, *names: str) -> None:
        self.names = names

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        bits = [
            f"({src.value_of(name)} is not None) << {bit}"
            if name in src.optional
            else f"bool({src.value_of(name)}) << {bit}"
            for bit, name in enumerate(self.names)
        ]
        return [f"pack1({' | '.join(bits)})"]

    def decode(self, src: _Source, target: str, field: str) -> None:
        src.add(
            "if o >= end:",
            "    " + src.fail("number_past", "flags", "1"),
            f"{target} = header[o]",
            "o += 1",
            f"if {target} >> {len(self.names)}:",
            "    " + src.fail("bad_value", "flags", value=target),
        )
        for bit, name in enumerate(self.names):
            if name in src.optional:
                src.flagged[name] = (target, 1 << bit)
            else:
                src.add(f"{src.names[name]} = bool({target} & {1 << bit})")


class Optional(Kind):
    """
    A field that may be None, as its L{Flags} bit says; absent, it takes
    no bytes, or with an C{absent} value, that value's (a fixed layout).
    """

    def __init__(self, kind: Kind | str, absent: object = None) -> None:
        self.kind = _kind(kind)
        self.absent = absent
        self.size = self.kind.size if absent is not None else 0

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        if self.absent is not None:
            src.add(f"{temp} = {self.absent!r} if {value} is None else {value}")
            return self.kind.encode(src, temp, field, src.fresh("e"))
        src.add(f"if {value} is None:", f"    {temp} = b''", "else:")
        src.depth += 1
        parts = self.kind.encode(src, value, field, src.fresh("e"))
        src.add(f"{temp} = b''.join(({', '.join(parts)},))")
        src.depth -= 1
        return [temp]

    def decode(self, src: _Source, target: str, field: str) -> None:
        flags, bit = src.flagged[field]
        if self.absent is not None:
            self.kind.decode(src, target, field)
            src.add(f"if not {flags} & {bit}:", f"    {target} = None")
            return
        src.add(f"if {flags} & {bit}:")
        src.depth += 1
        self.kind.decode(src, target, field)
        src.depth -= 1
        src.add("else:", f"    {target} = None")


class Embedded(Kind):
    """A message of another codec, of one of the ids C{allowed}, after its 4-byte length."""

    size = 4

    def __init__(self, codec: Codec[Any], allowed: tuple[int, ...]) -> None:
        self.codec = codec
        self.allowed = allowed

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        encode = src.fresh("encode")
        src.scope[encode] = self.codec.encode_header
        src.add(f"{temp} = {encode}({value})")
        return [f"pack4(len({temp}))", temp]

    def decode(self, src: _Source, target: str, field: str) -> None:
        decode = src.fresh("decode")
        src.scope[decode] = self.codec.decode_frame
        src.add(
            "if o + 4 > end:",
            "    " + src.fail("number_past", field, "4"),
            "n = unpack4(header, o)[0]",
            "o += 4",
            f"if o + n > end or n < 1 or header[o] not in {self.allowed!r}:",
            "    " + src.fail("bad_content", field, error="'not a whole message of its kind'"),
            f"{target} = {decode}(header[o : o + n])",
            "o += n",
        )


class Rest(Kind):
    """
    The rest of the frame, as bytes, or converted by C{decode} (raising
    ValueError) and back by C{encode}; with C{size}, its length is that
    field's value.
    """

    size = 0

    def __init__(
        self,
        encode: Callable[[Any], bytes] | None = None,
        decode: Callable[[bytes], object] | None = None,
        size: str | None = None,
    ) -> None:
        self.encoder = encode
        self.decoder = decode
        self.size_field = size

    def encode(self, src: _Source, value: str, field: str, temp: str) -> list[str]:
        if self.encoder is None:
            return [value]
        encode = src.fresh("encode")
        src.scope[encode] = self.encoder
        return [f"{encode}({value})"]

    def decode(self, src: _Source, target: str, field: str) -> None:
        if self.decoder is None:
            src.add(f"{target} = header[o:end]")
        else:
            decode = src.fresh("decode")
            src.scope[decode] = self.decoder
            src.add(
                "try:",
                f"    {target} = {decode}(header[o:end])",
                "except ValueError as e:",
                "    " + src.fail("bad_content", field, error="e") + " from None",
            )
        src.add("o = end")
        if self.size_field is not None:
            size = src.names[self.size_field]
            src.add(
                f"if len({target}) != {size}:",
                "    " + src.fail("bad_content", field, error="'not of its size'"),
            )


# The kinds by the names layouts give them (a layout may also give a Kind).
STRING: Final = "s"
LONGSTR: Final = "S"
NUMBER1: Final = "1"
NUMBER2: Final = "2"
NUMBER4: Final = "4"
NUMBER8: Final = "8"
REAL8: Final = "d"
_KINDS: Final[dict[str, Kind]] = {
    STRING: Text(1),
    LONGSTR: Text(4),
    **{code: Number(code) for code in _NUMBERS},
}


def _kind(kind: Kind | str) -> Kind:
    return kind if isinstance(kind, Kind) else _KINDS[kind]


STRINGS: Final = ListOf(LONGSTR)
HASH: Final = ListOf(Tuple(STRING, LONGSTR))
BOOL: Final = Bool()
OPTIONAL_REAL8: Final = NanIsNone()
CHUNK: Final = Text(4, text=False)


class FrameKind:
    """What travels in the frames after the first."""


@dataclass(frozen=True)
class Content(FrameKind):
    """The frames as they are, in a C{list} or a C{tuple}."""

    container: type = list


@dataclass(frozen=True)
class Ids(FrameKind):
    """Exactly one frame of 8-byte numbers, as a list."""


@dataclass(frozen=True)
class Each(FrameKind):
    """One message of C{codec} per frame, as a list."""

    codec: Codec[Any]


@dataclass(frozen=True)
class Spec:
    """
    One message: its C{id} and C{name}, the class that holds it, its first
    frame's fields (attribute, kind) in wire order, and, if it has frames
    after the first, the attribute that holds them and their kind. A
    class of C{tuple} holds a message as a plain tuple in the order of
    C{arguments}; a dataclass takes its fields in its own order.
    """

    id: int
    name: str
    cls: type
    layout: tuple[tuple[str, Kind | str], ...] = ()
    frames: tuple[str, FrameKind] | None = None
    arguments: tuple[str, ...] | None = None

    @classmethod
    def of(cls, message: type, name: str, frames: FrameKind = Content()) -> Spec:
        """The spec a class declares with C{ID}, C{LAYOUT} and C{HAS_CONTENT}."""
        layout: tuple[tuple[str, str], ...] = message.LAYOUT  # type: ignore[attr-defined]
        content = ("content", frames) if getattr(message, "HAS_CONTENT", False) else None
        return cls(message.ID, name, message, layout, content)  # type: ignore[attr-defined]


def _attributes(layout: Sequence[tuple[str, Kind]]) -> list[str]:
    """The attributes a layout sets (a flags byte's booleans among them)."""
    names: list[str] = []
    optional = {name for name, kind in layout if isinstance(kind, Optional)}
    for name, kind in layout:
        if isinstance(kind, Flags):
            names += [flag for flag in kind.names if flag not in optional]
        else:
            names.append(name)
    return names


def _arguments(cls: type) -> tuple[str, ...]:
    if not is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass: give its spec's arguments")
    return tuple(f.name for f in fields(cls) if f.init)


def _encode_fields(
    src: _Source,
    layout: Sequence[tuple[str, Kind]],
    value_of: Callable[[str], str],
    temps: bool,
) -> list[str]:
    """
    Encode C{layout}'s fields, C{value_of} giving each one's value (into
    variables of the fields' names, if C{temps}: a message's own fields).
    """
    saved = src.optional, src.value_of
    src.optional = {name for name, kind in layout if isinstance(kind, Optional)}
    src.value_of = value_of
    parts: list[str] = []
    for name, kind in layout:
        temp = name if temps and name else src.fresh("e")
        parts += kind.encode(src, "" if isinstance(kind, Flags) else value_of(name), name, temp)
    src.optional, src.value_of = saved
    return parts


def _decode_fields(src: _Source, layout: Sequence[tuple[str, Kind]], names: dict[str, str]) -> None:
    """Decode C{layout}'s fields into the variables C{names} gives."""
    saved = src.optional, src.names, src.flagged
    src.optional = {name for name, kind in layout if isinstance(kind, Optional)}
    src.names, src.flagged = names, {}
    for name, kind in layout:
        kind.decode(src, names[name] if name else src.fresh("flags"), name)
    src.optional, src.names, src.flagged = saved


def _pack_ids(values: Sequence[int]) -> bytes:
    return struct.pack(f">{len(values)}Q", *values)


def _unpack_ids(frame: bytes) -> list[int]:
    return list(struct.unpack(f">{len(frame) // 8}Q", frame))


_PACKERS: Final = {code: struct.Struct(">" + char) for code, char in _NUMBERS.items()}


class Codec(Generic[M]):
    """
    The compiled encoders and decoders of one protocol's messages.

    @ivar decode: the message a list of frames carries; raises C{error}.
    @ivar decode_checked: as C{decode}, but a string that is not UTF-8
        raises C{invalid_text(message, field)} (codecs given one).
    @ivar encode: the frames that carry a message; raises C{error} for a
        value that does not fit, TypeError for an object that is not one.
    @ivar encode_header: as C{encode}, the first frame alone.
    """

    decode: Callable[[Sequence[bytes]], M]
    decode_checked: Callable[[Sequence[bytes]], M]
    encode: Callable[[M], list[bytes]]
    encode_header: Callable[[M], bytes]

    def __init__(
        self,
        messages: Sequence[Spec],
        *,
        signature: bytes,
        error: type[Malformed],
        version: int | None = None,
        version_first: bool = False,
        header_size: int | None = None,
        text: str = LENIENT,
        wording: Wording = Wording(),
        invalid_text: Callable[[Any, str], Exception] | None = None,
    ) -> None:
        """
        @param signature: the bytes every first frame starts with (may be empty).
        @param version: the version byte after the id (before it, if
            C{version_first}); None for none.
        @param header_size: the fewest bytes a first frame has (by
            default, the signature, id and version).
        @param text: L{LENIENT} or L{STRICT}.
        """
        self.signature = signature
        self.error = error
        self.version = version
        self.version_first = version_first
        self.text = text
        self.wording = wording
        self.specs = {spec.cls: spec for spec in messages}
        self._id_at = len(signature) + (1 if version is not None and version_first else 0)
        self._version_at = len(signature) + (0 if version_first else 1)
        self._start = len(signature) + (1 if version is None else 2)
        self._header_size = self._start if header_size is None else header_size
        self._parts: dict[tuple[type, int, bool], Callable[..., bytes]] = {}
        self._header_encoders: dict[type, Callable[..., bytes]] = {}
        self._encode_headers: dict[type, Callable[[Any], bytes]] = {}
        encoders: dict[type, Callable[[Any], list[bytes]]] = {}
        decoders: dict[int, Callable[[bytes, Sequence[bytes]], M]] = {}
        checked: dict[int, Callable[[bytes, Sequence[bytes]], M]] = {}
        for spec in messages:
            scope = self._compile(spec, invalid_text)
            if "header" in scope:
                self._header_encoders[spec.cls] = cast(Callable[..., bytes], scope["header"])
            self._encode_headers[spec.cls] = cast(Callable[[Any], bytes], scope["encode_header"])
            encoders[spec.cls] = cast(Callable[[Any], list[bytes]], scope["encode"])
            decoders[spec.id] = cast(Callable[[bytes, Sequence[bytes]], M], scope["decode"])
            if invalid_text is not None:
                checked[spec.id] = cast(
                    Callable[[bytes, Sequence[bytes]], M], scope["decode_checked"]
                )
        self.decode = self._dispatcher(decoders)
        if invalid_text is not None:
            self.decode_checked = self._dispatcher(checked)
        self.encode = cast(Callable[[M], list[bytes]], self._by_class(encoders))
        self.encode_header = cast(Callable[[M], bytes], self._by_class(self._encode_headers))

    def prefix(self, message_id: int) -> bytes:
        """The bytes a message of id C{message_id} starts with, before its fields."""
        if self.version is None:
            return self.signature + bytes((message_id,))
        if self.version_first:
            return self.signature + bytes((self.version, message_id))
        return self.signature + bytes((message_id, self.version))

    def decode_frame(self, frame: bytes) -> M:
        """The message of one frame alone."""
        return self.decode((frame,))

    def header_encoder(self, cls: type) -> Callable[..., bytes]:
        """
        The function that encodes the first frame of a C{cls} from its
        field values, in wire order: for hot paths that send many of one
        kind without building a message for each. (For the messages whose
        fields are all strings and numbers.)
        """
        return self._header_encoders[cls]

    def header_tail_encoder(self, cls: type, after: int) -> Callable[..., bytes]:
        """
        The function that encodes the fields of a C{cls} from the
        C{after}-th on, given in wire order: the bytes that follow
        C{header_start(cls, *first_after_values)}.
        """
        return self._part_encoder(cls, after, tail=True)

    def header_start(self, cls: type, *values: object) -> bytes:
        """The start of the first frame of a C{cls}: its prefix and first C{len(values)} fields."""
        layout = self.specs[cls].layout
        if len(values) > len(layout):
            raise ValueError(f"{cls.__name__} has {len(layout)} fields, not {len(values)}")
        return self._part_encoder(cls, len(values), tail=False)(*values)

    def _part_encoder(self, cls: type, at: int, tail: bool) -> Callable[..., bytes]:
        encoder = self._parts.get((cls, at, tail))
        if encoder is None:
            spec = self.specs[cls]
            layout = tuple((name, _kind(kind)) for name, kind in spec.layout)
            layout = layout[at:] if tail else layout[:at]
            src = _Source(self, spec.name, spec.id, self.text)
            arguments = ", ".join(name for name, _ in layout)
            lines = self._encoder(src, layout, arguments, str, None if tail else "prefix", None)
            scope = self._run(lines, {"prefix": self.prefix(spec.id), **src.scope})
            encoder = cast(Callable[..., bytes], scope["encoder"])
            self._parts[(cls, at, tail)] = encoder
        return encoder

    def _compile(
        self, spec: Spec, invalid_text: Callable[[Any, str], Exception] | None
    ) -> dict[str, object]:
        """The scope in which C{spec}'s functions were compiled, holding them."""
        layout = tuple((name, _kind(kind)) for name, kind in spec.layout)
        reserved = _RESERVED.intersection(name for name, _ in layout)
        if reserved:
            raise ValueError(f"{spec.name}: field names {sorted(reserved)} are the engine's")
        if spec.cls is tuple:
            assert spec.arguments is not None, "a tuple's spec names its items"
            order = spec.arguments
            value_of = {name: f"message[{i}]" for i, name in enumerate(order)}.__getitem__
        else:
            order = spec.arguments or _arguments(spec.cls)
            value_of = "message.{}".format
        scope: dict[str, object] = {
            "cls": spec.cls,
            "prefix": self.prefix(spec.id),
            "invalid_text": invalid_text,
        }
        frames = ""
        if spec.frames is not None:
            attribute, kind = spec.frames
            if isinstance(kind, Content):
                frames = f", *{value_of(attribute)}"
            elif isinstance(kind, Ids):
                frames = f", pack_ids({value_of(attribute)})"
            else:
                assert isinstance(kind, Each)
                scope["encode_each"] = kind.codec.encode_header
                scope["decode_each"] = kind.codec.decode_frame
                frames = f", *map(encode_each, {value_of(attribute)})"
        sources: list[str] = []
        if all(type(kind) in (Text, Number) for _, kind in layout):
            src = _Source(self, spec.name, spec.id, self.text)
            arguments = ", ".join(name for name, _ in layout)
            sources += self._encoder(src, layout, arguments, str, "prefix", None, "header")
        for fn, end in (("encode_header", None), ("encode", frames)):
            src = _Source(self, spec.name, spec.id, self.text)
            sources += self._encoder(src, layout, "message", value_of, "prefix", end, fn)
            scope.update(src.scope)
        modes = [("decode", self.text)]
        if invalid_text is not None:
            modes.append(("decode_checked", "checked"))
        for fn, mode in modes:
            src = _Source(self, spec.name, spec.id, mode)
            sources += self._decoder(src, spec, layout, order, fn)
            scope.update(src.scope)
        return self._run(sources, scope)

    def _encoder(
        self,
        src: _Source,
        layout: Sequence[tuple[str, Kind]],
        arguments: str,
        value_of: Callable[[str], str],
        prefix: str | None,
        frames: str | None,
        fn: str = "encoder",
    ) -> list[str]:
        """
        Source of an encoder of C{layout}'s fields, after the bytes named
        C{prefix} (if any); it returns the first frame, or with C{frames}
        (the source of the frames after it) the list of frames.
        """
        src.depth = 2
        parts = [prefix] if prefix else []
        parts += _encode_fields(src, layout, value_of, temps=True)
        joined = f"b''.join(({', '.join(parts)},))" if parts else "b''"
        src.add(f"return {joined}" if frames is None else f"return [{joined}{frames}]")
        lines = [f"def {fn}({arguments}):", "    try:", *src.lines]
        lines += [
            "    except struct_error as e:",
            "        " + src.fail("out_of_range", error="e") + " from e",
        ]
        if self.text == STRICT:
            lines += [
                "    except UnicodeEncodeError as e:",
                "        " + src.fail("not_encodable", error="e") + " from e",
            ]
        return lines

    def _decoder(
        self,
        src: _Source,
        spec: Spec,
        layout: Sequence[tuple[str, Kind]],
        order: Sequence[str],
        fn: str,
    ) -> list[str]:
        """
        Source of a decoder of C{spec}'s first frame (C{header}) and the
        frames after it: a checked one (mode "checked") notes the first
        string that is not UTF-8 and raises C{invalid_text} with the
        message, decoded anyway.
        """
        names = {name: name for name in _attributes(layout)}
        src.add("end = len(header)", f"o = {self._start}")
        if src.mode == "checked":
            src.add("bad = None")
        _decode_fields(src, layout, names)
        src.add("if o != end:", "    " + src.fail("trailing", size="end - o"))
        values = dict(names)
        kind = spec.frames and spec.frames[1]
        if spec.frames is None:
            src.add("if len(frames) > 1:", "    " + src.fail("no_content", count="len(frames) - 1"))
        elif isinstance(kind, Content) and kind.container is list:
            values[spec.frames[0]] = "frames[1:] if frames.__class__ is list else list(frames[1:])"
        elif isinstance(kind, Content):
            values[spec.frames[0]] = "tuple(frames[1:])"
        elif isinstance(kind, Ids):
            field = spec.frames[0]
            src.add(
                "if len(frames) != 2:",
                "    " + src.fail("missing_frame", field, count="len(frames)"),
                "if len(frames[1]) % 8:",
                "    " + src.fail("bad_content", field, error="'not a whole number of ids'"),
            )
            values[field] = "unpack_ids(frames[1])"
        else:
            values[spec.frames[0]] = "[decode_each(frame) for frame in frames[1:]]"
        if set(values) != set(order):
            raise ValueError(f"{spec.name}: fields {sorted(values)}, arguments {sorted(order)}")
        arguments = ", ".join(values[name] for name in order)
        build = f"({arguments},)" if spec.cls is tuple else f"cls({arguments})"
        if src.mode == "checked":
            src.add("if bad is not None:", f"    raise invalid_text({build}, bad)")
        src.add(f"return {build}")
        return [f"def {fn}(header, frames):", *src.lines]

    def _dispatcher(
        self, decoders: dict[int, Callable[[bytes, Sequence[bytes]], M]]
    ) -> Callable[[Sequence[bytes]], M]:
        """The decoder of any message: it checks the header and calls the id's decoder."""
        src = _Source(self, "", 0, self.text)
        lines = [
            "def decode(frames):",
            "    if not frames:",
            "        " + src.fail("no_frames"),
            "    header = frames[0]",
            f"    if len(header) < {self._header_size}:",
            "        " + src.fail("too_short", size="len(header)"),
        ]
        if self.signature:
            differs = " or ".join(f"header[{i}] != {b:#04x}" for i, b in enumerate(self.signature))
            signature = f"header[:{len(self.signature)}].hex()"
            lines += [f"    if {differs}:", "        " + src.fail("signature", signature=signature)]
        if self.version is not None:
            at = self._version_at
            lines += [
                f"    if header[{at}] != {self.version}:",
                "        " + src.fail("version", version=f"header[{at}]"),
            ]
        lines += [
            f"    decoder = decoders.get(header[{self._id_at}])",
            "    if decoder is None:",
            "        " + src.fail("unknown_id", id=f"header[{self._id_at}]"),
            "    return decoder(header, frames)",
        ]
        scope = self._run(lines, {"decoders": decoders})
        return cast(Callable[[Sequence[bytes]], M], scope["decode"])

    def _by_class(self, functions: dict[type, Callable[[Any], Any]]) -> Callable[[Any], Any]:
        """A function that calls the one of C{functions} for its argument's class."""
        source = [
            "def by_class(message):",
            "    try:",
            "        function = functions[message.__class__]",
            "    except KeyError:",
            "        raise TypeError(f'cannot encode a {type(message).__name__}') from None",
            "    return function(message)",
        ]
        return cast(Callable[[Any], Any], self._run(source, {"functions": functions})["by_class"])

    def _too_long(self, name: str, field: str, data: bytes) -> NoReturn:
        raise self.error(self.wording.too_long.format(name=name, field=field, size=len(data)))

    def _run(self, source: list[str], scope: dict[str, object]) -> dict[str, object]:
        """Run C{source} (built above from layouts) in C{scope}, with what it uses."""
        scope.update(
            lengths=_LENGTHS,
            struct_error=struct.error,
            error=self.error,
            too_long=self._too_long,
            hexof=_hex,
            nan=math.nan,
            pack_ids=_pack_ids,
            unpack_ids=_unpack_ids,
        )
        for code, packer in _PACKERS.items():
            scope[f"pack{code}"] = packer.pack
            scope[f"unpack{code}"] = packer.unpack_from
        exec("\n".join(source), scope)  # the source is built from layouts, never from input
        return scope
