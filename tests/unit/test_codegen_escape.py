"""Blueprint text is data, never code (issue 11.1). The escaping filters keep any string inside its
comment or string literal, and a render of the real templates with hostile strings in every text
field of the records they receive has the same C++ tokens, line by line, as a benign render; the
string literals decode back to exactly the values given."""
from __future__ import annotations

import functools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbpc.codegen.emit import build_step, render
from kbpc.codegen.escape import COMMENT_CHARS, c_comment, c_include, c_string
from kbpc.codegen.records import StepProgram
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.testing.hostile_inputs import step_with_text

from conftest import TINY_BLUEPRINT

# What an attacker reaches for: literal and comment terminators, line splices, trigraphs, newlines
# of every kind, NUL, a load-time constructor, preprocessor lines.
SNIPPETS = ['"', "\\", "\n", "\r", "\r\n", "*/", "/*", "//", "??/", "??=", "\\\n", "\x00", "\u2028",
            "\u0085", "%", "'", "#define X 1\n", '"; __attribute__((constructor)) static void pwn() '
            '{ system("id"); } static const char* q = "', "\n#include </etc/passwd>\n", "\ud800", "é"]
HOSTILE = st.lists(st.one_of(st.sampled_from(SNIPPETS),
                             st.text(st.characters(blacklist_categories=()), max_size=8)),
                   max_size=6).map("".join)


_LEXEME = re.compile(r'(?P<comment>//[^\n]*|/\*.*?\*/)|"(?P<string>(?:[^"\\\n]|\\.)*)"|(?P<newline>\n)'
                    r"|(?P<space>[^\S\n]+)|(?P<token>[A-Za-z0-9_]+|\S)", re.DOTALL)


def lex_lines(source: str) -> list[tuple[list[str], list[str]]]:
    """A lexer-level view of C++ text: for each non-empty logical line, its tokens (every comment
    dropped, every string literal reduced to `""`) and the escaped bodies of its literals. Line
    splices are joined first, as the compiler does; a stray quote stays a token of its own."""
    lines, tokens, literals = [], [], []
    for m in _LEXEME.finditer(source.replace("\\\n", "")):
        if m["string"] is not None:
            tokens.append('""')
            literals.append(m["string"])
        elif m["token"]:
            tokens.append(m["token"])
        elif m["newline"] and tokens:
            lines.append((tokens, literals))
            tokens, literals = [], []
    if tokens:
        lines.append((tokens, literals))
    return lines


def decode_c_string(body: str) -> bytes:
    out = bytearray()
    for m in re.finditer(r"\\([0-7]{3})|\\(.)|(.)", body, re.DOTALL):
        if m[1]:
            out.append(int(m[1], 8))
        elif m[2]:
            assert m[2] in '"\\?', f"unexpected escape \\{m[2]}"
            out.extend(m[2].encode())
        else:
            assert 0x20 <= ord(m[3]) < 0x7F
            out.extend(m[3].encode())
    return bytes(out)


@functools.cache
def tiny_step() -> StepProgram:
    plan = run_pipeline(load_blueprint(TINY_BLUEPRINT), Options())
    return build_step(plan, "kbpc compile tiny.graph.json --target sm_90")


def test_c_string_round_trips_and_stays_one_literal():
    for value in SNIPPETS + ["plain", "x" * 500]:
        body = c_string(value)
        assert "\n" not in body and "??" not in body and all(0x20 <= ord(c) < 0x7F for c in body)
        assert decode_c_string(body) == value.encode("utf-8", "backslashreplace")
        assert lex_lines(f'const char* s = "{body}";') == [(["const", "char", "*", "s", "=", '""', ";"], [body])]
    assert c_string("abc1") == "abc1" and c_string("\x001") == "\\0001"   # octal stops at 3 digits


def test_c_comment_stays_one_comment_line():
    for value in SNIPPETS + ["a\\", "*" * 3 + "/", "x" * 5000]:
        body = c_comment(value)
        assert all(0x20 <= ord(c) < 0x7F for c in body) and "*/" not in body and "\\" not in body
        assert "??" not in body and len(body) < 4 * COMMENT_CHARS + 40
        for form in (f"// {body}\nint x;", f"/* {body} */ int x;"):
            assert lex_lines(form) == [(["int", "x", ";"], [])], form
    assert c_comment("l3.moe.experts_gate_up") == "l3.moe.experts_gate_up"   # names stay readable


def test_c_include_refuses_anything_but_a_header_name():
    assert c_include("w4a16_gemv.cuh") == "w4a16_gemv.cuh"
    for bad in ('a"b.cuh', "../x.cuh", "a/b.cuh", "a\n.cuh", "", "a b.cuh"):
        with pytest.raises(ValueError):
            c_include(bad)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["bid", "digest", "command", "target", "rule", "family", "node",
                                        "lnode", "ifam"]), HOSTILE, min_size=9))
def test_hostile_strings_leave_the_cpp_tokens_unchanged(values):
    benign = render(step_with_text(tiny_step(), lambda field: "x"))
    hostile = render(step_with_text(tiny_step(), lambda field: values[field]))
    assert benign.files.keys() == hostile.files.keys()
    for path, text in hostile.files.items():
        got, want = lex_lines(text), lex_lines(benign.files[path])
        assert [t for t, _ in got] == [t for t, _ in want], path
        got_lits = [decode_c_string(b) for _, lits in got for b in lits]
        want_lits = [decode_c_string(b) for _, lits in want for b in lits]
        rendered = [i for i, b in enumerate(want_lits) if b == b"x"]   # the fields' literals
        assert [b for i, b in enumerate(got_lits) if i not in rendered] == \
            [b for i, b in enumerate(want_lits) if i not in rendered]
        if path == "src/step.cu":   # kbp_step_info: plan digest, blueprint id, target
            assert [got_lits[i] for i in rendered] == [
                values[f].encode("utf-8", "backslashreplace") for f in ("digest", "bid", "target")]
