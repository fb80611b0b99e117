"""kbpc.runtime.numerics' intermediate comparison: which arena buffers it compares as sets."""
from __future__ import annotations

from kbpc.frontend.load import load_blueprint
from kbpc.ir.buffers import buffer_name
from kbpc.runtime.numerics import left_unwritten, set_valued


def test_only_fast_selection_lists_compare_as_sets(tiny_path):
    """A fast bundle's select lists every valid pool unranked (ORDER_FREE), so its token list is
    compared as a set; in exact mode the rank order is part of the contract, and no other buffer is
    a set in either mode."""
    bp = load_blueprint(tiny_path)
    names = {buffer_name(bp, t): bp.node(t.src).op for t in bp.tensors()}
    selections = {n for n, op in names.items() if op == "index_select"}
    assert selections
    for name, op in names.items():
        assert set_valued(bp, name, "fast") == (op == "index_select")
        assert not set_valued(bp, name, "exact")
    assert not set_valued(bp, "no_such_node.out", "fast")


def test_only_idle_score_inputs_are_left_unwritten(tiny_path):
    """The index queries and head weights of a fast bundle are not computed while the select lists
    every pool (the tiny example's top k is 16 tokens: 4 pools of 4), so the comparison skips them
    there and only there; nothing else, and nothing in exact mode, is ever skipped."""
    bp = load_blueprint(tiny_path)
    names = {buffer_name(bp, t): bp.node(t.src).op for t in bp.tensors()}
    idle_ops = {"linear:index_q", "linear:index_weights"}
    assert idle_ops <= set(names.values())
    topk = bp.symbols["index_topk"]
    kp = bp.symbols["index_kpool"]
    last_idle = topk + kp - 1     # floor(S / K_P) <= top-k pools
    for name, op in names.items():
        for seq_len in (1, 2, last_idle, last_idle + 1, 5 * topk):
            idle = op in idle_ops and seq_len <= last_idle
            assert left_unwritten(bp, name, "fast", seq_len) == idle, (name, seq_len)
            assert not left_unwritten(bp, name, "exact", seq_len)
