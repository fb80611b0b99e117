"""kbpc.runtime.numerics' intermediate comparison: which arena buffers it compares as sets."""
from __future__ import annotations

from kbpc.frontend.load import load_blueprint
from kbpc.ir.buffers import buffer_name
from kbpc.runtime.numerics import set_valued


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
