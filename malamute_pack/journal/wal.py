"""
The journal's write-ahead log (``journal.sqlite-wal``) checked before
SQLite opens it, because SQLite never says when it is damaged: it replays
the log up to the first frame whose checksum or salt does not match and
silently drops everything after, so one flipped bit, or a log cut short,
loses writes the broker acknowledged.

L{check} reads the log's header and frames (SQLite's file format, section
4: a 32-byte header; frames of a 24-byte header and a page, each with a
running checksum seeded by the one before) and, if it is there and agrees
with the log, the index file's header (``-shm``: how many frames the
writer had committed):

- the log is whole: nothing to do;
- frames of this log (its salts) come after the first bad one: a frame or
  the header was damaged in place. L{repair} writes the header and every
  frame's salts and checksums again, so that SQLite replays them all; what
  the damaged page held is then found by the journal's own checks (SQLite's
  ``quick_check`` and each record's CRC-32, L{malamute_pack.journal.checking})
  and salvaged, readers told of a gap, instead of lost without a word;
- the log holds fewer frames than the index says were committed: it was
  cut short, and what was cut is gone (L{WalCut}, the journal refuses to
  open: restore the files, or remove the index file to go on with what is
  left, on purpose).

Tests: ``tests/unit/test_journal_wal.py``.
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from malamute_pack.journal.errors import JournalError

WAL_HEADER: Final = 32
FRAME_HEADER: Final = 24
# The magic number's last bit says the checksums' byte order (1: big-endian).
MAGIC_LITTLE: Final = 0x377F0682
MAGIC_BIG: Final = 0x377F0683
VERSION: Final = 3007000
# The index file (-shm) begins with two copies of a 48-byte header, in the
# writing machine's byte order: iVersion, unused, iChange, isInit (u8),
# bigEndCksum (u8), szPage (u16), mxFrame, nPage, aFrameCksum[2], aSalt[2]
# (as the log's header holds them), aCksum[2].
_SHM_HEADER: Final = 48
_SHM: Final = struct.Struct("=IIIBBHII2I8s2I")


class WalCut(JournalError):
    """The write-ahead log holds fewer frames than were committed to it."""


@dataclass(frozen=True, slots=True)
class WalState:
    """
    What L{check} found: C{frames} whole frames in the file, the first
    C{valid} of them replayable as they are; C{ours}, frames that carry the
    log's salts (its own, not a stale earlier log's); C{committed}, how many
    frames the index says were committed (None: no index that agrees with
    this log); C{page_size} (0: no log, or no readable header).
    """

    frames: int = 0
    valid: int = 0
    ours: int = 0
    committed: int | None = None
    page_size: int = 0
    header_ok: bool = True

    @property
    def damaged(self) -> bool:
        """Frames of this log lie after one SQLite would stop at: repairable."""
        return self.page_size > 0 and (not self.header_ok or self.ours > self.valid)

    @property
    def cut(self) -> bool:
        """The index says more frames were committed than the log holds."""
        return self.committed is not None and self.committed > max(self.ours, self.valid)


def wal_path(journal: Path) -> Path:
    return Path(f"{journal}-wal")


def shm_path(journal: Path) -> Path:
    return Path(f"{journal}-shm")


def _checksum(data: bytes, big: bool, s0: int, s1: int) -> tuple[int, int]:
    """SQLite's WAL checksum of C{data} (a multiple of 8 bytes), seeded with C{s0}, C{s1}."""
    words = struct.unpack(f"{'>' if big else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def _database_page_size(journal: Path) -> int:
    """The page size the database file's header records (0 if unreadable)."""
    try:
        with journal.open("rb") as f:
            header = f.read(100)
    except OSError:
        return 0
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        return 0
    (size,) = struct.unpack(">H", header[16:18])
    return 65536 if size == 1 else size


def check(journal: Path) -> WalState:
    """What the write-ahead log of the journal at C{journal} holds (see the module)."""
    try:
        data = wal_path(journal).read_bytes()
    except FileNotFoundError:
        return WalState()
    if len(data) < WAL_HEADER:
        return WalState()
    magic, version, page_size, _, salt1, salt2, c0, c1 = struct.unpack(">8I", data[:WAL_HEADER])
    header_ok = magic in (MAGIC_LITTLE, MAGIC_BIG) and version == VERSION
    big = magic == MAGIC_BIG
    if header_ok:
        header_ok = _checksum(data[:24], big, 0, 0) == (c0, c1)
    expected = _database_page_size(journal)
    if not header_ok or page_size != expected:
        # The header is damaged: the page size and salts are taken from the
        # database and the first frame.
        header_ok = False
        page_size = expected
        big = sys.byteorder == "big"
        if page_size == 0 or len(data) < WAL_HEADER + FRAME_HEADER:
            return WalState(header_ok=False)
        salt1, salt2 = struct.unpack(">2I", data[WAL_HEADER + 8 : WAL_HEADER + 16])
    frame_size = FRAME_HEADER + page_size
    frames = (len(data) - WAL_HEADER) // frame_size
    s0, s1 = (c0, c1) if header_ok else (0, 0)
    valid = ours = 0
    chained = header_ok
    for i in range(frames):
        at = WAL_HEADER + i * frame_size
        head = data[at : at + FRAME_HEADER]
        f_salt1, f_salt2, f0, f1 = struct.unpack(">4I", head[8:24])
        if (f_salt1, f_salt2) != (salt1, salt2):
            continue
        ours = i + 1
        if chained:
            s0, s1 = _checksum(head[:8], big, s0, s1)
            s0, s1 = _checksum(data[at + FRAME_HEADER : at + frame_size], big, s0, s1)
            if (s0, s1) == (f0, f1) and valid == i:
                valid = i + 1
            else:
                chained = False
    return WalState(frames, valid, ours, _committed(journal, salt1, salt2), page_size, header_ok)


def _committed(journal: Path, salt1: int, salt2: int) -> int | None:
    """The frames the index file says were committed to the log with these salts, or None."""
    try:
        with shm_path(journal).open("rb") as f:
            data = f.read(2 * _SHM_HEADER)
    except OSError:
        return None
    if len(data) < 2 * _SHM_HEADER or data[:_SHM_HEADER] != data[_SHM_HEADER:]:
        return None  # a writer was changing it, or it is not an index
    fields = _SHM.unpack(data[: _SHM.size])
    is_init, mx_frame, salts = fields[3], fields[6], fields[10]
    if not is_init or salts != struct.pack(">2I", salt1, salt2):
        return None
    return int(mx_frame)


def repair(journal: Path, state: WalState) -> None:
    """
    Write the log's header and the salts and checksums of every frame of
    this log again (see the module), in place, and flush it to the disk.
    """
    path = wal_path(journal)
    data = bytearray(path.read_bytes())
    page_size = state.page_size
    frame_size = FRAME_HEADER + page_size
    magic, _, _, checkpoint, salt1, salt2 = struct.unpack(">6I", data[:24])
    if not state.header_ok:
        salt1, salt2 = struct.unpack(">2I", data[WAL_HEADER + 8 : WAL_HEADER + 16])
        magic = MAGIC_BIG if sys.byteorder == "big" else MAGIC_LITTLE
    big = magic == MAGIC_BIG
    data[:24] = struct.pack(">6I", magic, VERSION, page_size, checkpoint, salt1, salt2)
    s0, s1 = _checksum(bytes(data[:24]), big, 0, 0)
    data[24:32] = struct.pack(">2I", s0, s1)
    for i in range(state.ours):
        at = WAL_HEADER + i * frame_size
        data[at + 8 : at + 16] = struct.pack(">2I", salt1, salt2)
        s0, s1 = _checksum(bytes(data[at : at + 8]), big, s0, s1)
        s0, s1 = _checksum(bytes(data[at + FRAME_HEADER : at + frame_size]), big, s0, s1)
        data[at + 16 : at + 24] = struct.pack(">2I", s0, s1)
    with path.open("r+b") as f:
        f.write(data[: WAL_HEADER + state.ours * frame_size])
        f.truncate()  # stale frames of earlier logs go too
        f.flush()
        os.fsync(f.fileno())
    # The index was built from the log as it was: SQLite builds it again.
    shm_path(journal).unlink(missing_ok=True)
