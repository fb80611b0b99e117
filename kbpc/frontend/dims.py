"""Dim expressions (`lin_k_heads*lin_k_dim*2+lin_v_heads*lin_v_dim`, `index_topk/index_kpool`):
a lark grammar, an evaluator, and a solver that derives the symbol table from every edge's
(expression, value) pair and reports contradictions with the edges that disagree."""
from __future__ import annotations

import functools
import re
from collections import defaultdict, deque
from dataclasses import dataclass

from lark import Lark, Token, Tree
from lark.exceptions import LarkError

from kbpc.errors import BlueprintError
from kbpc.ir.limits import MAX_DIM, MAX_DIM_EXPR_CHARS, MAX_DIM_EXPR_TERMS

GRAMMAR = r"""
?expr: term | expr "+" term -> add | expr "-" term -> sub
?term: atom | term "*" atom -> mul | term "/" atom -> div
?atom: NAME -> sym | INT -> num | "(" expr ")"
NAME: /[a-z_][a-z0-9_]*/i
%import common.INT
%import common.WS
%ignore WS
"""

_PARSER = Lark(GRAMMAR, start="expr", parser="lalr")


_TERM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")


@functools.lru_cache(maxsize=1 << 16)
def parse_dim(text: str) -> Tree | Token:
    """The parse tree of a dim expression within the size limits of kbpc/ir/limits.py."""
    if len(text) > MAX_DIM_EXPR_CHARS:
        raise BlueprintError(f"dim expression of {len(text)} characters; at most {MAX_DIM_EXPR_CHARS} "
                             f"are allowed: {text[:40]!r}...")
    terms = _TERM.findall(text)
    if len(terms) > MAX_DIM_EXPR_TERMS:
        raise BlueprintError(f"dim expression with {len(terms)} numbers and symbols; at most "
                             f"{MAX_DIM_EXPR_TERMS} are allowed: {text[:40]!r}...")
    big = next((t for t in terms if t.isdigit() and int(t) > MAX_DIM), None)
    if big is not None:
        raise BlueprintError(f"the number {big[:20]} in dim expression {text[:40]!r} is over {MAX_DIM}")
    try:
        return _PARSER.parse(text)
    except LarkError as exc:
        raise BlueprintError(f"cannot parse dim expression {text!r}: {str(exc).splitlines()[0]}") from None


def symbols_of(tree) -> set[str]:
    if isinstance(tree, Tree):
        if tree.data == "sym":
            return {str(tree.children[0])}
        return set().union(*(symbols_of(c) for c in tree.children)) if tree.children else set()
    return set()


@functools.lru_cache(maxsize=1 << 16)
def expr_symbols(text: str) -> frozenset[str]:
    """The symbols a dim expression names (parsed and collected once per text)."""
    return frozenset(symbols_of(parse_dim(text)))


def check_dim_values(symbols: dict[str, int], where: str | None = None) -> None:
    """Every symbol is a size the kernels can take: 1 <= value <= MAX_DIM."""
    for name, value in symbols.items():
        if not 1 <= value <= MAX_DIM:
            raise BlueprintError(f"symbol {name} = {value} is outside 1..{MAX_DIM} (kernels take sizes "
                                 "as 32-bit ints)", where)


def _compile(tree):
    """A closure env -> int for a parsed expression (parsed once, evaluated many times)."""
    if isinstance(tree, Token):
        value = int(tree)
        return lambda env: value
    kind = tree.data
    if kind == "sym":
        name = str(tree.children[0])
        return lambda env: env[name]
    if kind == "num":
        value = int(tree.children[0])
        return lambda env: value
    left, right = (_compile(c) for c in tree.children)
    if kind == "add":
        return lambda env: left(env) + right(env)
    if kind == "sub":
        return lambda env: left(env) - right(env)
    if kind == "mul":
        return lambda env: left(env) * right(env)
    return lambda env: _exact_div(left(env), right(env))


def _exact_div(a: int, b: int) -> int:
    if b == 0 or a % b:
        raise ZeroDivisionError(f"{a}/{b} is not a whole number")
    return a // b


@functools.lru_cache(maxsize=1 << 16)
def _compiled(text: str):
    return _compile(parse_dim(text))


def eval_dim(text: str, env: dict[str, int]) -> int:
    """Value of a dim expression; KeyError for an unknown symbol, ZeroDivisionError when a
    division is not exact (dims are whole numbers)."""
    return _compiled(text)(env)


@dataclass(frozen=True)
class DimFact:
    expr: str
    value: int
    source: str      # where the fact comes from (an edge id, or "config")


def _solve_for(expr: str, unknown: str, target: int, env: dict[str, int]) -> int | None:
    """Whole-number value of `unknown` making expr == target, or None."""
    tree = parse_dim(expr)
    try:
        value = _invert(tree, unknown, target, env)
    except (ZeroDivisionError, _NoSolution):
        return None
    if value is None:  # the unknown occurs more than once: search (monotone, no divisor)
        value = _bisect(expr, unknown, target, env)
    if value is None or value < 1:
        return None
    try:
        return value if eval_dim(expr, {**env, unknown: value}) == target else None
    except ZeroDivisionError:
        return None


class _NoSolution(Exception):
    pass


def _invert(tree, unknown: str, target: int, env: dict[str, int]) -> int | None:
    """Walk down the single path to `unknown`, undoing each operation; None if it occurs twice."""
    if isinstance(tree, Token) or tree.data == "num":
        raise _NoSolution
    if tree.data == "sym":
        return target
    left, right = tree.children
    in_left, in_right = unknown in symbols_of(left), unknown in symbols_of(right)
    if in_left and in_right:
        return None
    side, other = (left, right) if in_left else (right, left)
    o = _compile(other)(env)
    op = tree.data
    if op == "add":
        return _invert(side, unknown, target - o, env)
    if op == "sub":
        return _invert(side, unknown, target + o if in_left else o - target, env)
    if op == "mul":
        if o == 0 or target % o:
            raise _NoSolution
        return _invert(side, unknown, target // o, env)
    if in_left:  # side / o == target
        return _invert(side, unknown, target * o, env)
    if target == 0 or o % target:  # o / side == target
        raise _NoSolution
    return _invert(side, unknown, o // target, env)


def _bisect(expr: str, unknown: str, target: int, env: dict[str, int]) -> int | None:
    lo, hi = 1, max(1, target)
    while lo < hi:
        mid = (lo + hi) // 2
        if eval_dim(expr, {**env, unknown: mid}) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def solve_symbols(facts: list[DimFact], given: dict[str, int]) -> tuple[dict[str, int], set[str]]:
    """Derive every symbol the facts determine, starting from `given`. Returns (symbols,
    undetermined). Raises BlueprintError naming the disagreeing sources on a contradiction.

    A worklist: each expression counts its unknown symbols; solving a symbol visits only the
    expressions that name it, and an expression is solved or checked once its count reaches one
    or zero. Linear in the total size of the expressions (a chain of 3,000 symbols is instant)."""
    env = dict(given)
    origin = {sym: "config" for sym in given}   # where each symbol's value came from
    # Distinct expressions, each with every value any source claims.
    claims: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for fact in facts:
        claims[fact.expr][fact.value].append(fact.source)
    for expr, values in claims.items():
        if len(values) > 1:
            parts = "; ".join(f"{v} (from {', '.join(srcs[:3])}{' ...' if len(srcs) > 3 else ''})"
                              for v, srcs in sorted(values.items()))
            raise BlueprintError(f"inconsistent dims: `{expr}` has different values: {parts}")
    pending = {expr: next(iter(vals)) for expr, vals in claims.items()}
    sources = {expr: next(iter(vals.values())) for expr, vals in claims.items()}
    unknown = {expr: set(expr_symbols(expr) - env.keys()) for expr in pending}
    users: dict[str, list[str]] = defaultdict(list)
    for expr, syms in unknown.items():
        for sym in syms:
            users[sym].append(expr)
    ready = deque(expr for expr in pending if len(unknown[expr]) <= 1)
    while ready:
        expr = ready.popleft()
        if expr not in pending:
            continue
        value = pending.pop(expr)
        if unknown[expr]:
            (sym,) = unknown[expr]
            env[sym] = _solve_one(expr, sym, value, env, sources[expr], origin)
            origin[sym] = f"edge {sources[expr][0]}: {expr} = {value}"
            for other in users.pop(sym):
                unknown[other].discard(sym)
                if len(unknown[other]) <= 1 and other in pending:
                    ready.append(other)
        _check(expr, value, env, sources[expr], origin)
    undetermined = set().union(*(expr_symbols(e) for e in pending)) - env.keys()
    return env, undetermined


def _solve_one(expr: str, sym: str, value: int, env: dict[str, int], srcs: list[str],
               origin: dict[str, str]) -> int:
    solved = _solve_for(expr, sym, value, env)
    if solved is None:
        raise BlueprintError(
            f"inconsistent dims: no whole value of `{sym}` gives `{expr}` = {value} "
            f"(edge {srcs[0]}; known: {_known(expr, env, origin)})")
    if solved > MAX_DIM:
        raise BlueprintError(f"`{expr}` = {value} (edge {srcs[0]}) gives {sym} = {solved}, over "
                             f"{MAX_DIM} (kernels take sizes as 32-bit ints)")
    return solved


def _known(expr: str, env: dict[str, int], origin: dict[str, str]) -> str:
    syms = sorted(expr_symbols(expr) & env.keys())
    return ", ".join(f"{s}={env[s]} from {origin[s]}" for s in syms) or "nothing"


def _check(expr: str, value: int, env: dict[str, int], srcs: list[str], origin: dict[str, str]) -> None:
    try:
        got = eval_dim(expr, env)
    except ZeroDivisionError:
        got = None
    if got != value:
        raise BlueprintError(
            f"inconsistent dims: `{expr}` is {value} on edge {srcs[0]} but the symbols give "
            f"{got} ({_known(expr, env, origin)})")
