"""The canonical zip layout of a .kbp bundle: STORED entries only, written in one fixed byte form.

Every header field but an entry's name, CRC-32, size and offset is a constant (date 1980-01-01
00:00, mode 0644, UTF-8 flag, no comments, no extra fields except the ZIP64 field where a size or
offset needs it). The reader parses those four values, rebuilds every header from them and demands
the file's bytes be exactly the rebuilt ones, with entries packed back to back from byte 0 to the
end record. Headers are not covered by the manifest signature, so this is what makes a single
flipped byte anywhere in the file an error: either a header differs from its canonical form, or a
member's data no longer matches the SHA-256 the signed manifest records.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterable

from kbpc.errors import BundleError

# Sizes/offsets and entry counts at or above these need the ZIP64 extensions (tests lower them to
# exercise ZIP64 without writing 4 GiB); the marks are what a 32/16-bit field holds instead.
ZIP64_LIMIT = 0xFFFFFFFF
ZIP64_COUNT_LIMIT = 0xFFFF
_MARK32, _MARK16 = 0xFFFFFFFF, 0xFFFF

_LFH = struct.Struct("<IHHHHHIIIHH")              # local file header, 30 bytes
_CDH = struct.Struct("<IHHHHHHIIIHHHHHII")        # central directory header, 46 bytes
_EOCD = struct.Struct("<IHHHHIIH")                # end of central directory, 22 bytes
_EOCD64 = struct.Struct("<IQHHIIQQQQ")            # ZIP64 end of central directory, 56 bytes
_LOC64 = struct.Struct("<IIQI")                   # ZIP64 end of central directory locator, 20 bytes
_SIG_LFH, _SIG_CDH, _SIG_EOCD = 0x04034B50, 0x02014B50, 0x06054B50
_SIG_EOCD64, _SIG_LOC64 = 0x06064B50, 0x07064B50

_VERSION_PLAIN, _VERSION_ZIP64 = 10, 45
_MADE_BY = (3 << 8) | _VERSION_ZIP64              # Unix, so external attributes are a file mode
_FLAGS = 0x0800                                   # names are UTF-8
_DOS_TIME, _DOS_DATE = 0, (0 << 9) | (1 << 5) | 1  # 1980-01-01 00:00:00, the earliest DOS date
_EXTERNAL_ATTR = 0o100644 << 16                   # regular file, rw-r--r--
_STORED = 0

_LFH_FIELDS = ("signature", "version needed", "flags", "compression method", "time", "date", "CRC-32",
               "compressed size", "size", "name length", "extra length")
_CDH_FIELDS = ("signature", "version made by", "version needed", "flags", "compression method", "time",
               "date", "CRC-32", "compressed size", "size", "name length", "extra length",
               "comment length", "disk number", "internal attributes", "external attributes",
               "local header offset")


@dataclass(frozen=True)
class Entry:
    """One zip entry as the central directory records it; `data_offset` is where its bytes start."""

    name: str
    crc: int
    size: int
    offset: int
    data_offset: int


def _zip64_sizes(size: int) -> bool:
    return size >= ZIP64_LIMIT


def _version(size: int, offset: int) -> int:
    return _VERSION_ZIP64 if _zip64_sizes(size) or offset >= ZIP64_LIMIT else _VERSION_PLAIN


def local_header(name: str, crc: int, size: int, offset: int) -> bytes:
    raw = name.encode("utf-8")
    extra = b""
    field = size
    if _zip64_sizes(size):  # the local header carries both sizes in the ZIP64 field when it is used
        extra, field = struct.pack("<HHQQ", 1, 16, size, size), _MARK32
    return _LFH.pack(_SIG_LFH, _version(size, offset), _FLAGS, _STORED, _DOS_TIME, _DOS_DATE, crc,
                     field, field, len(raw), len(extra)) + raw + extra


def central_header(name: str, crc: int, size: int, offset: int) -> bytes:
    raw = name.encode("utf-8")
    values = []
    size_field = offset_field = None
    if _zip64_sizes(size):
        values += [size, size]
        size_field = _MARK32
    if offset >= ZIP64_LIMIT:
        values.append(offset)
        offset_field = _MARK32
    extra = struct.pack(f"<HH{len(values)}Q", 1, 8 * len(values), *values) if values else b""
    size_field = size if size_field is None else size_field
    offset_field = offset if offset_field is None else offset_field
    return _CDH.pack(_SIG_CDH, _MADE_BY, _version(size, offset), _FLAGS, _STORED, _DOS_TIME, _DOS_DATE,
                     crc, size_field, size_field, len(raw), len(extra), 0, 0, 0, _EXTERNAL_ATTR,
                     offset_field) + raw + extra


def end_records(count: int, cd_offset: int, cd_size: int) -> bytes:
    """The end of central directory record, preceded by the ZIP64 record and locator when needed."""
    zip64 = count >= ZIP64_COUNT_LIMIT or cd_offset >= ZIP64_LIMIT or cd_size >= ZIP64_LIMIT
    if not zip64:
        return _EOCD.pack(_SIG_EOCD, 0, 0, count, count, cd_size, cd_offset, 0)
    eocd64_offset = cd_offset + cd_size
    return (_EOCD64.pack(_SIG_EOCD64, _EOCD64.size - 12, _MADE_BY, _VERSION_ZIP64, 0, 0, count, count,
                         cd_size, cd_offset)
            + _LOC64.pack(_SIG_LOC64, 0, eocd64_offset, 1)
            + _EOCD.pack(_SIG_EOCD, 0, 0, _MARK16, _MARK16, _MARK32, _MARK32, 0))


class ZipWriter:
    """Writes canonical STORED entries to a seekable binary file, in the order they are added."""

    def __init__(self, fh: BinaryIO):
        self._fh = fh
        self._entries: list[Entry] = []
        self._pos = fh.tell()
        if self._pos != 0:
            raise ValueError("a bundle zip starts at byte 0 of its file")

    def add(self, name: str, chunks: Iterable[bytes], size: int,
            on_chunk: Callable[[bytes], object] | None = None) -> Entry:
        """Stream `size` bytes from `chunks`; `on_chunk(chunk)` sees every chunk (for hashing).
        The CRC-32 is patched into the local header afterwards; the size must be known up front
        because it decides the header's length (ZIP64 or not)."""
        offset = self._pos
        header = local_header(name, 0, size, offset)
        self._fh.write(header)
        crc, written = 0, 0
        for chunk in chunks:
            crc = zlib.crc32(chunk, crc)
            written += len(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
            self._fh.write(chunk)
        if written != size:
            raise BundleError(f"entry {name!r}: expected {size} bytes, got {written} "
                              "(did the source file change while it was written?)")
        end = offset + len(header) + size
        self._fh.seek(offset)
        self._fh.write(local_header(name, crc, size, offset))
        self._fh.seek(end)
        self._pos = end
        entry = Entry(name, crc, size, offset, offset + len(header))
        self._entries.append(entry)
        return entry

    def add_bytes(self, name: str, data: bytes) -> Entry:
        return self.add(name, [data], len(data))

    def finish(self) -> list[Entry]:
        cd_offset = self._pos
        directory = b"".join(central_header(e.name, e.crc, e.size, e.offset) for e in self._entries)
        self._fh.write(directory)
        self._fh.write(end_records(len(self._entries), cd_offset, len(directory)))
        return list(self._entries)


def _read_at(fh: BinaryIO, offset: int, n: int) -> bytes:
    """Exactly `n` bytes at `offset` (the handle may be unbuffered, so short reads are retried)."""
    fh.seek(offset)
    parts, got = [], 0
    while got < n:
        part = fh.read(n - got)
        if not part:
            raise BundleError(f"unexpected end of file reading {n} bytes at byte {offset}")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _first_difference(actual: bytes, expected: bytes) -> int:
    differing = (i for i, (a, b) in enumerate(zip(actual, expected)) if a != b)
    return next(differing, min(len(actual), len(expected)))


def _field_at(index: int, layout: struct.Struct, names: tuple[str, ...]) -> str:
    if index >= layout.size:
        return "name or extra field"
    fmt = layout.format.lstrip("<")
    pos = 0
    for code, name in zip(fmt, names):
        pos += struct.calcsize("<" + code)
        if index < pos:
            return name
    return "extra field"


def _check_canonical(actual: bytes, expected: bytes, what: str, layout: struct.Struct,
                     names: tuple[str, ...]) -> None:
    if actual != expected:
        i = _first_difference(actual, expected)
        raise BundleError(f"{what} is not in canonical form: field '{_field_at(i, layout, names)}' "
                          f"(header byte {i}) differs from what a .kbp writer writes")


def _parse_tail(fh: BinaryIO, file_size: int) -> tuple[int, int, int, int]:
    """-> (entry count, central directory offset, central directory size, tail length)."""
    if file_size < _EOCD.size:
        raise BundleError(f"not a .kbp zip: the file is only {file_size} bytes")
    eocd = _EOCD.unpack(_read_at(fh, file_size - _EOCD.size, _EOCD.size))
    if eocd[0] != _SIG_EOCD:
        if _read_at(fh, 0, 4) != struct.pack("<I", _SIG_LFH):
            raise BundleError("not a zip file (no zip signature at its start or end)")
        raise BundleError("no end-of-central-directory record at the end of the file "
                          "(truncated, or trailing bytes or a zip comment were added)")
    _, _, _, _, count, cd_size, cd_offset, _ = eocd
    if count == _MARK16 or cd_size == _MARK32 or cd_offset == _MARK32:
        start = file_size - _EOCD.size - _LOC64.size - _EOCD64.size
        if start < 0:
            raise BundleError("the end record asks for ZIP64 records the file is too short to hold")
        eocd64 = _EOCD64.unpack(_read_at(fh, start, _EOCD64.size))
        if eocd64[0] != _SIG_EOCD64:
            raise BundleError("the end record asks for a ZIP64 end record that is not there")
        count, cd_size, cd_offset = eocd64[7], eocd64[8], eocd64[9]
    tail = end_records(count, cd_offset, cd_size)
    if cd_offset + cd_size + len(tail) != file_size:
        raise BundleError(f"the central directory ({cd_size} bytes at byte {cd_offset}) does not end where "
                          "the end records begin (truncated, or bytes inserted or appended)")
    actual = _read_at(fh, file_size - len(tail), len(tail))
    if actual != tail:
        raise BundleError(f"the zip end records are not in canonical form (byte "
                          f"{file_size - len(tail) + _first_difference(actual, tail)} of the file differs)")
    return count, cd_offset, cd_size, len(tail)


def _zip64_values(extra: bytes, wanted: int) -> list[int]:
    if len(extra) < 4 + 8 * wanted or struct.unpack_from("<HH", extra) != (1, 8 * wanted):
        raise BundleError("a central directory entry has a malformed ZIP64 extra field")
    return list(struct.unpack_from(f"<{wanted}Q", extra, 4))


def _parse_central(directory: bytes, count: int) -> list[tuple[str, int, int, int]]:
    """-> [(name, crc, size, offset)], each header checked against its canonical bytes."""
    out, pos = [], 0
    for i in range(count):
        if pos + _CDH.size > len(directory):
            raise BundleError(f"the central directory ends inside entry {i}")
        fields = _CDH.unpack_from(directory, pos)
        if fields[0] != _SIG_CDH:
            raise BundleError(f"central directory entry {i} has no entry signature")
        name_len, extra_len, comment_len = fields[10], fields[11], fields[12]
        end = pos + _CDH.size + name_len + extra_len + comment_len
        if end > len(directory):
            raise BundleError(f"central directory entry {i} runs past the end of the directory")
        raw_name = directory[pos + _CDH.size: pos + _CDH.size + name_len]
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            raise BundleError(f"central directory entry {i} has a name that is not UTF-8: "
                              f"{raw_name!r}") from None
        if fields[4] != _STORED:
            raise BundleError(f"zip entry {name!r} is compressed (method {fields[4]}); every .kbp entry "
                              "must be STORED")
        extra = directory[pos + _CDH.size + name_len: pos + _CDH.size + name_len + extra_len]
        size, offset = fields[9], fields[16]
        wanted = 2 * (size == _MARK32) + (offset == _MARK32)
        if wanted:
            values = _zip64_values(extra, wanted)
            size = values[0] if fields[9] == _MARK32 else size
            offset = values[-1] if offset == _MARK32 else offset
        _check_canonical(directory[pos:end], central_header(name, fields[7], size, offset),
                         f"the central directory entry of {name!r}", _CDH, _CDH_FIELDS)
        out.append((name, fields[7], size, offset))
        pos = end
    if pos != len(directory):
        raise BundleError(f"the central directory holds {len(directory) - pos} bytes after its "
                          f"{count} entries")
    return out


def read_entries(fh: BinaryIO, file_size: int) -> list[Entry]:
    """Parse and check the whole layout (not the data): every header canonical, entries packed
    from byte 0 to the central directory with no gap, overlap or unclaimed byte."""
    count, cd_offset, cd_size, _ = _parse_tail(fh, file_size)
    if cd_size > file_size:
        raise BundleError("the central directory is larger than the file")
    entries, expected_offset = [], 0
    for name, crc, size, offset in _parse_central(_read_at(fh, cd_offset, cd_size), count):
        if offset != expected_offset:
            raise BundleError(f"zip entry {name!r} starts at byte {offset}, expected {expected_offset} "
                              "(entries must be packed back to back)")
        header = local_header(name, crc, size, offset)
        if offset + len(header) > cd_offset:
            raise BundleError(f"the local header of zip entry {name!r} runs into the central directory")
        _check_canonical(_read_at(fh, offset, len(header)), header,
                         f"the local header of {name!r}", _LFH, _LFH_FIELDS)
        entries.append(Entry(name, crc, size, offset, offset + len(header)))
        expected_offset = offset + len(header) + size
    if expected_offset != cd_offset:
        raise BundleError(f"the zip entries end at byte {expected_offset} but the central directory "
                          f"starts at byte {cd_offset}")
    return entries


def iter_data(fh: BinaryIO, entry: Entry, chunk_size: int = 1 << 20) -> Iterable[bytes]:
    """The entry's bytes in chunks, read from `fh` by offset (so the file need not fit in memory)."""
    remaining, pos = entry.size, entry.data_offset
    while remaining:
        n = min(chunk_size, remaining)
        chunk = _read_at(fh, pos, n)
        pos += n
        remaining -= n
        yield chunk
