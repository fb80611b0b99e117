"""Text from a blueprint is data, never code: the Jinja filters every template applies where it
renders a string (registered in kbpc/codegen/emit.py).

  c_string   the body of a C/C++ string literal ("..."): printable ASCII stays, `"` `\\` `?` are
             escaped (`\\?` stops `??/`-style trigraphs), everything else becomes a three-digit
             octal escape of its UTF-8 bytes (octal, not \\x: a hex escape would swallow a
             following hex digit). The literal's bytes are exactly the value's UTF-8 bytes.
  c_comment  text inside a `//` or `/* */` comment: printable ASCII stays, except that `%`, `\\`
             and `?` and every other character (newlines, carriage returns, control characters,
             non-ASCII) are percent-encoded, and `*/` becomes `*%2F`. So the text can neither end
             the comment (no newline, no `*/`), nor continue it onto the next line (no backslash
             before a line end), nor form a trigraph. Values over `COMMENT_CHARS` are cut.
  c_include  a header name inside `#include "..."`, where no escape exists: refused (ValueError)
             unless it is a plain file name.
"""
from __future__ import annotations

import re
from typing import Any

COMMENT_CHARS = 200
_PRINTABLE = {chr(c) for c in range(0x20, 0x7F)}
_STRING_ESCAPES = {'"': '\\"', "\\": "\\\\", "?": "\\?"}
_COMMENT_ENCODED = {"%", "\\", "?"}
_HEADER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def _text(value: Any) -> str:
    text = str(value)
    # A lone surrogate has no UTF-8 form; show its code point instead of failing to render.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def c_string(value: Any) -> str:
    """`value` as the inside of a C string literal."""
    out = []
    for ch in _text(value):
        if ch in _STRING_ESCAPES:
            out.append(_STRING_ESCAPES[ch])
        elif ch in _PRINTABLE:
            out.append(ch)
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode("utf-8"))
    return "".join(out)


def c_comment(value: Any) -> str:
    """`value` as text that is safe inside any C/C++ comment, on one line."""
    text = _text(value)
    if len(text) > COMMENT_CHARS:
        text = text[:COMMENT_CHARS] + f"...({len(text) - COMMENT_CHARS} more)"
    out = []
    for ch in text:
        if ch in _PRINTABLE and ch not in _COMMENT_ENCODED:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out).replace("*/", "*%2F")


def c_include(value: Any) -> str:
    """A kernels/ header name for `#include "..."` (no escaping exists there: refuse the rest)."""
    text = str(value)
    if not _HEADER_NAME.fullmatch(text) or ".." in text:
        raise ValueError(f"not a plain header file name: {text[:60]!r}")
    return text


FILTERS = {"c_string": c_string, "c_comment": c_comment, "c_include": c_include}
