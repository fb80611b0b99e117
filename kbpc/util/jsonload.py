"""The one bounded JSON reader for everything kbpc reads from elsewhere: blueprints, --config files,
a bundle's manifest.json / signature.json / graph.json / plan.json, key files, keyrings and
safetensors headers.

Bounds, each refused with the caller's error type naming the file and, where it applies, the JSON
path (`$.nodes[3].id`) or line and column:
  - only a regular file is read (a FIFO, /dev/zero, a directory or a socket is refused before any
    read blocks), and at most `max_bytes` of it;
  - nesting at most `max_depth` deep (checked before parsing, so 60,000 `[` costs one linear scan);
  - integers within 64 bits (no 5,000-digit numbers), floats finite (no NaN, Infinity, 1e999);
  - strings and keys valid Unicode (no lone surrogates from `\\ud800` escapes);
  - no key twice in one object (the second would silently win in Python's json).
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np

from kbpc.errors import KbpcError

MAX_DEPTH = 64
MAX_INT = 2**63 - 1
MB = 1 << 20

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET_STEP = np.zeros(256, np.int8)
_BRACKET_STEP[[ord("["), ord("{")]] = 1
_BRACKET_STEP[[ord("]"), ord("}")]] = -1


class _Bad:
    """A value the parser refused; the walk that follows reports it with its JSON path."""

    def __init__(self, why: str):
        self.why = why


def read_regular_file(path: Path | str, max_bytes: int, error: type[KbpcError] = KbpcError,
                      what: str = "file") -> bytes:
    """The bytes of a regular file of at most `max_bytes`; anything else is `error`."""
    where = str(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{what} not found", where) from None
    except IsADirectoryError:
        raise error(f"is a directory, not a {what}", where) from None
    except OSError as exc:
        raise error(f"cannot open {what}: {exc.strerror or exc}", where) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise error(f"is a directory, not a {what}", where)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"not a regular file (a device, pipe or socket); kbpc reads a {what} only "
                        "from a regular file", where)
        if info.st_size > max_bytes:
            raise error(f"{what} is {info.st_size} bytes; at most {max_bytes} are allowed", where)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=True) as fh:
            fd = -1
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror or exc}", where) from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:  # the file grew while we read it
        raise error(f"{what} is over {max_bytes} bytes", where)
    return data


def load_json_file(path: Path | str, *, max_bytes: int, error: type[KbpcError] = KbpcError,
                   what: str = "JSON file", max_depth: int = MAX_DEPTH) -> Any:
    """Read and parse a JSON file with every bound above."""
    data = read_regular_file(path, max_bytes, error, what)
    return parse_json(data, str(path), error=error, what=what, max_depth=max_depth)


def parse_json(data: bytes, where: str | None, *, error: type[KbpcError] = KbpcError, what: str = "JSON",
               max_bytes: int | None = None, max_depth: int = MAX_DEPTH) -> Any:
    """Parse UTF-8 JSON bytes with every bound above; failures are `error(..., where)` (with
    where=None the caller adds the location, e.g. the bundle a member came from)."""
    if max_bytes is not None and len(data) > max_bytes:
        raise error(f"{what} is {len(data)} bytes; at most {max_bytes} are allowed", where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not UTF-8 text (byte {exc.start})", where) from None
    depth = _max_depth(data)
    if depth > max_depth:
        raise error(f"{what} nests {depth} levels deep; at most {max_depth} are allowed", where)
    bad = [False]

    def refuse(why: str) -> _Bad:
        bad[0] = True
        return _Bad(why)

    try:
        doc = json.loads(text, object_pairs_hook=lambda pairs: _object(pairs, refuse),
                         parse_int=lambda s: _int(s, refuse), parse_float=lambda s: _float(s, refuse),
                         parse_constant=lambda s: refuse(f"{s} is not a JSON number"))
    except json.JSONDecodeError as exc:
        raise error(f"{what}: invalid JSON at line {exc.lineno} column {exc.colno}: {_why(exc, data)}",
                    where) from None
    except RecursionError:  # the depth scan makes this unreachable; kept as a bound, not a crash
        raise error(f"{what} nests too deeply", where) from None
    if bad[0]:
        path, why = _find_bad(doc)
        raise error(f"{what}: {path}: {why}", where)
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        path = _find_surrogate(doc)
        raise error(f"{what}: {path}: a string holds a lone UTF-16 surrogate (not valid Unicode)",
                    where) from None
    return doc


def _why(exc: json.JSONDecodeError, data: bytes) -> str:
    # A JSON object or list ends with its closing bracket; a document that doesn't was cut short.
    stripped = data.rstrip()
    if not stripped.endswith((b"}", b"]")) or exc.pos >= len(stripped):
        return f"{exc.msg}; the file ends early (truncated?)"
    return exc.msg


def _max_depth(data: bytes) -> int:
    """Deepest bracket nesting outside strings (linear, C speed: a regex and a cumulative sum)."""
    if b"[" not in data and b"{" not in data:
        return 0
    outside = _STRING.sub(b'""', data)
    steps = _BRACKET_STEP[np.frombuffer(outside, dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def _object(pairs: list[tuple[str, Any]], refuse) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        obj[dup] = refuse(f"key {dup!r} appears twice in one object")
    return obj


def _int(text: str, refuse) -> int | _Bad:
    digits = len(text.lstrip("-"))
    if digits > 19:
        return refuse(f"an integer of {digits} digits; at most 64-bit integers are allowed")
    value = int(text)
    return value if -MAX_INT - 1 <= value <= MAX_INT else refuse(f"integer {value} is outside 64 bits")


def _float(text: str, refuse) -> float | _Bad:
    if len(text) > 64:
        return refuse(f"a number written with {len(text)} characters")
    value = float(text)
    return value if math.isfinite(value) else refuse(f"{text} is not a finite number")


def _children(value: Any):
    if isinstance(value, dict):
        return ((f".{k}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) else f"[{k!r}]", k, v)
                for k, v in value.items())
    if isinstance(value, list):
        return ((f"[{i}]", str(i), v) for i, v in enumerate(value))
    return ()


def _walk(doc: Any):
    """(JSON path, key, value) of every value, depth first (iterative: no recursion limit)."""
    stack = [("$", "", doc)]
    while stack:
        path, key, value = stack.pop()
        yield path, key, value
        stack.extend((path + step, k, v) for step, k, v in reversed(list(_children(value))))


def _find_bad(doc: Any) -> tuple[str, str]:
    for path, _, value in _walk(doc):
        if isinstance(value, _Bad):
            return path, value.why
    return "$", "refused value"


def _find_surrogate(doc: Any) -> str:
    for path, key, value in _walk(doc):
        for text in (key, value if isinstance(value, str) else ""):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return path
    return "$"
