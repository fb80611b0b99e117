"""Limits on what a blueprint may hold: the one home for the bounds the front end enforces.

Identifiers. Every name a blueprint gives (blueprint_id, lineage, node, edge, block and layer
ids, group rules, kernel and family names, ops, formats, compute tags, roles, template names,
state names) must match `IDENTIFIER`: 1 to 128 characters from

    A-Z a-z 0-9 _ . : + -

and start with a letter, digit or `_`. That covers every name the seed blueprint uses
(`l3.moe.experts_gate_up`, `glm5next_dsa::index_score`, `kda+ffn`, `preview:6a8a...`) and
excludes everything that means something to C++, a shell or a file system: quotes, backslashes,
`/`, `*`, `#`, whitespace, control characters and non-ASCII. Names are still escaped wherever
generated code renders them (kbpc/codegen/escape.py); the character set is the first of two
fences, not the only one.

Dims. Kernels take sizes as 32-bit `int` arguments and template parameters (row counts, widths,
head dims), so every symbol and every edge's `dim_value` is at most `MAX_DIM` = 2**31 - 1; a
dim expression is at most `MAX_DIM_EXPR_CHARS` characters with at most `MAX_DIM_EXPR_TERMS`
numbers and symbols, which bounds the solver's work per expression.
"""
from __future__ import annotations

import re

IDENTIFIER_CHARS = "A-Za-z0-9_.:+-"
MAX_IDENTIFIER_CHARS = 128
IDENTIFIER = re.compile(rf"[A-Za-z0-9_][{IDENTIFIER_CHARS}]{{0,{MAX_IDENTIFIER_CHARS - 1}}}")
SYMBOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

MAX_DIM = 2**31 - 1
MAX_DIM_EXPR_CHARS = 256
MAX_DIM_EXPR_TERMS = 32
