"""The CPU decode interpreter: executes a blueprint's nodes in order for one token at a time with
the reference families, real sequence state, and the greedy pick of `argmax_host`.

Each op has one handler `(step, node, inputs) -> {output name: value}`; an output name is the last
component of the edge id (`l0.kda.u` -> "u"). Values are numpy arrays in the families' own forms
(BF16 values as float32, quantized activations as code/scale tuples). Fused groups need no special
casing: the reference computes every node's math, and fused nodes whose math the family does in one
step (e.g. the conv's L2 norm) pass their producer's result through."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from kbpc.errors import KbpcError, WeightsError
from kbpc.ir.graph import Blueprint
from kbpc.ir.records import Node, Tensor
from kbpc.reference.formats import bf16_from_bits
from kbpc.reference.state import SequenceState


@dataclass
class Inputs:
    """A node's inputs: (edge, producer node, value) in edge order."""
    items: list[tuple[Tensor, Node, Any]]

    def named(self, name: str) -> Any:
        for t, _, v in self.items:
            if t.id.rsplit(".", 1)[-1] == name:
                return v
        raise KeyError(name)

    def from_op(self, *ops: str) -> Any:
        for t, n, v in self.items:
            if n.op in ops or n.op_base in ops:
                return v
        raise KeyError(ops)

    def activation(self) -> Any:
        """The single non-index input."""
        vals = [v for t, _, v in self.items if t.format != "i32"]
        if len(vals) != 1:
            raise KeyError(f"expected one activation input, found {len(vals)}")
        return vals[0]

    def edge(self, name: str) -> tuple[Tensor, Node, Any]:
        for item in self.items:
            if item[0].id.rsplit(".", 1)[-1] == name:
                return item
        raise KeyError(name)


class Step:
    """Context a handler sees: the blueprint, its weights, the sequence state, this position."""

    def __init__(self, bp: Blueprint, weights: dict[str, np.ndarray], state: SequenceState,
                 token: int, position: int):
        self.bp, self.weights, self.state = bp, weights, state
        self.token, self.position = token, position
        self.c = bp.config.constants
        self.sym = bp.symbols

    def w(self, node: Node | str, suffix: str = "weight") -> np.ndarray:
        name = f"{node if isinstance(node, str) else node.id}.{suffix}"
        try:
            return self.weights[name]
        except KeyError:
            raise WeightsError(f"weight {name!r} is missing") from None

    def bf16(self, node: Node | str, suffix: str = "weight") -> np.ndarray:
        return bf16_from_bits(self.w(node, suffix))

    def nvfp4(self, node: Node) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.w(node), self.w(node, "weight_scale"), self.w(node, "weight_scale_2")

    def fp8(self, node: Node) -> tuple[np.ndarray, np.ndarray]:
        return self.w(node), self.w(node, "weight_scale")

    def producer(self, node: Node, op: str) -> Node:
        for t in self.bp.inputs(node.order):
            src = self.bp.node(t.src)
            if src.op == op:
                return src
        raise KbpcError(f"needs an input from a {op} node", f"node {node.id}")


Handler = Callable[[Step, Node, Inputs], dict[str, Any]]


class Interpreter:
    """Runs decode steps of one sequence."""

    def __init__(self, bp: Blueprint, weights: dict[str, np.ndarray], max_context: int,
                 handlers: dict[str, Handler] | None = None, index_cache: str = "f32"):
        from kbpc.reference.ops import HANDLERS  # the op table

        self.bp, self.weights = bp, weights
        self.handlers = handlers or HANDLERS
        self.state = SequenceState(max_context=max_context, index_cache=index_cache)
        self.order = list(bp.node_orders)
        for node in bp.nodes():
            if node.op_base not in self.handlers and node.op not in self.handlers:
                raise KbpcError(f"the reference backend has no handler for op {node.op!r}", f"node {node.id}")
        self.inputs = {o: bp.inputs(o) for o in self.order}
        self.keep_values = False       # keep every edge value of the last step (diagnostics)
        self.last_values: dict[tuple[int, str], Any] = {}
        self.outputs = {o: bp.outputs(o) for o in self.order}

    def step(self, token: int) -> tuple[np.ndarray, int]:
        """Feed `token` at the next position; return (BF16 logits as float32, greedy next token)."""
        run = self.begin(token)
        for order in self.order:
            self.run_node(run, order)
        return self.finish(run)

    def begin(self, token: int) -> "StepRun":
        """Start a step (the nodes then run one at a time, e.g. in lockstep with other ranks)."""
        position = self.state.position
        if position >= self.state.max_context:
            raise KbpcError(f"context is full ({self.state.max_context} tokens)")
        vocab = self.bp.symbols.get("vocab")
        if vocab is not None and not 0 <= token < vocab:
            raise KbpcError(f"token id {token} is outside the vocabulary [0, {vocab})")
        return StepRun(Step(self.bp, self.weights, self.state, token, position), {}, {})

    def run_node(self, run: "StepRun", order: int) -> None:
        node = self.bp.node(order)
        values = run.values
        ins = Inputs([(t, self.bp.node(t.src), values[(t.src, _name(t))]) for t in self.inputs[order]])
        handler = self.handlers.get(node.op) or self.handlers[node.op_base]
        try:
            out = handler(run.ctx, node, ins)
        except (KbpcError, KeyError, ValueError) as exc:
            if isinstance(exc, KbpcError):
                raise
            raise KbpcError(f"reference op {node.op} failed: {exc}", f"node {node.id}") from exc
        if not isinstance(out, dict):
            out = {_name(t): out for t in self.outputs[order]}
        for t in self.outputs[order]:
            key = _name(t)
            if key not in out:
                raise KbpcError(f"handler produced no output {key!r}", f"node {node.id}")
            values[(order, key)] = out[key]
        run.results.update({k: v for k, v in out.items() if k.startswith("__")})

    def finish(self, run: "StepRun") -> tuple[np.ndarray, int]:
        self.state.position = run.ctx.position + 1
        if self.keep_values:
            self.last_values = run.values
        return run.results["__logits"], int(run.results["__token"])


@dataclass
class StepRun:
    """One step in progress: the handlers' context, every edge value so far (keyed by producer
    order and output name) and the step's results (`__logits`, `__token`)."""
    ctx: Step
    values: dict[tuple[int, str], Any]
    results: dict[str, Any]


def value_key(t: Tensor) -> tuple[int, str]:
    """The key of an edge's value in StepRun.values."""
    return t.src, _name(t)


def _name(t: Tensor) -> str:
    return t.id.rsplit(".", 1)[-1]
