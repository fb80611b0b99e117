"""Front end: the seed and tiny blueprints load with the expected figures; the dim grammar and
solver; every kind of bad input gives one precise KbpcError (never another exception)."""
from __future__ import annotations

import copy
import json

import pytest

from kbpc.errors import BlueprintError, ConfigError
from kbpc.frontend.dims import DimFact, eval_dim, parse_dim, solve_symbols
from kbpc.frontend.load import blueprint_from_doc, load_blueprint
from kbpc.report.inspect_blueprint import summarize


@pytest.fixture(scope="module")
def seed(seed_path):
    return load_blueprint(seed_path)


@pytest.fixture(scope="module")
def tiny_doc(tiny_path):
    return json.loads(tiny_path.read_text())


def test_seed_figures(seed):
    s = summarize(seed)
    assert (s["layers"], s["nodes"], s["edges"], s["groups"]) == (45, 1740, 2504, 909)
    assert len(s["families"]) == 22
    assert 177e9 < s["weight_bytes"] < 180e9
    assert 10.9e9 < s["bytes_per_token"] < 11.1e9
    assert s["symbols"]["hidden"] == 4096 and s["symbols"]["lin_k_heads"] == 64
    assert s["symbols"]["q_heads"] == 32 and s["symbols"]["index_topk"] == 2048
    assert s["roofline_tokens_per_s"] == pytest.approx(4300e9 / s["bytes_per_token"])


def test_dim_grammar():
    env = {"a": 3, "b": 4, "c": 2}
    assert eval_dim("a*b*2+c", env) == 26
    assert eval_dim("(a+b)*c", env) == 14
    assert eval_dim("b/c", env) == 2
    with pytest.raises(ZeroDivisionError):
        eval_dim("a/c", env)
    with pytest.raises(BlueprintError, match="cannot parse"):
        parse_dim("a**b")


def test_solver_derives_and_reports_contradictions():
    facts = [DimFact("h", 64, "e1"), DimFact("k*h", 256, "e2"), DimFact("k*k+k*2", 24, "e3"),
             DimFact("t/p", 8, "e4")]
    symbols, open_ = solve_symbols(facts, {"p": 4})
    assert symbols == {"p": 4, "h": 64, "k": 4, "t": 32} and not open_
    _, open_ = solve_symbols(facts, {})
    assert open_ == {"t", "p"}
    with pytest.raises(BlueprintError, match=r"`k\*h` is 256 on edge e2.*k=5 from config"):
        solve_symbols(facts, {"k": 5, "p": 4})
    with pytest.raises(BlueprintError, match="e1.*e9|e9.*e1"):
        solve_symbols(facts + [DimFact("h", 65, "e9")], {"p": 4})


def _load(doc):
    return blueprint_from_doc(doc, "test.json")


def _mutated(doc, fn):
    new = copy.deepcopy(doc)
    fn(new)
    return new


BAD_CASES = {
    "wrong schema": (lambda d: d.update(schema="kbp-graph/v1"), r"schema.*unsupported schema 'kbp-graph/v1'"),
    "missing field": (lambda d: d["nodes"][3].pop("op"), r"nodes\[3\].*missing field 'op'"),
    "wrong type": (lambda d: d["edges"][2].update(fused="yes"), r"edges\[2\].*'fused' must be true/false"),
    "unknown format": (lambda d: d["edges"][5].update(format="fp6"), r"edge .*unknown format 'fp6'"),
    "unknown op": (lambda d: d["nodes"][4].update(op="teleport"), r"node .*unknown op 'teleport'"),
    "unknown family": (lambda d: d["nodes"][4].update(family="magic"), r"unknown kernel family 'magic'"),
    "dangling edge": (lambda d: d["edges"][0].update(to=99999), r"'to' names node order 99999"),
    "cycle": (lambda d: d["edges"].append({**d["edges"][6], "from": d["edges"][6]["to"],
                                          "to": d["edges"][6]["from"]}), r"cycle|backward"),
    "inconsistent dims": (lambda d: d["edges"][0].update(dim_value=d["edges"][0]["dim_value"] + 16),
                          r"inconsistent dims|dim `"),
    "bytes disagree": (lambda d: d["edges"][0].update(bytes_per_token=d["edges"][0]["bytes_per_token"] + 2),
                       r"bytes_per_token is"),
    "group disagreement": (lambda d: d["nodes"][5].update(group=d["nodes"][5]["group"] + 1),
                           r"node .*(group|template)"),
    "duplicate order": (lambda d: d["nodes"][6].update(order=d["nodes"][5]["order"]), r"order .* used by several"),
    "layout mismatch": (lambda d: d["collapsed"]["layout"].reverse(), r"template"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_blueprints_give_precise_errors(tiny_doc, case):
    mutate, pattern = BAD_CASES[case]
    with pytest.raises(BlueprintError, match=pattern) as info:
        _load(_mutated(tiny_doc, mutate))
    assert str(info.value).startswith("test.json")


def test_bad_files(tmp_path, tiny_path):
    text = tiny_path.read_text()
    cases = {"truncated.json": (text[: len(text) // 2], "ends early"),
             "garbage.json": ("{not json", "invalid JSON at line 1"),
             "list.json": ("[1, 2]", "top level must be a JSON object")}
    for name, (content, pattern) in cases.items():
        path = tmp_path / name
        path.write_text(content)
        with pytest.raises(BlueprintError, match=pattern):
            load_blueprint(path)
    with pytest.raises(BlueprintError, match="file not found"):
        load_blueprint(tmp_path / "missing.json")


def test_config_overrides_and_errors(tmp_path, tiny_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"constants": {"swiglu_limit": 7.0}}))
    bp = load_blueprint(tiny_path, cfg)
    assert bp.config.constants.swiglu_limit == 7.0
    cfg.write_text(json.dumps({"constants": {"nope": 1}}))
    with pytest.raises(ConfigError, match="unknown constant 'nope'"):
        load_blueprint(tiny_path, cfg)
    cfg.write_text(json.dumps({"symbols": {"q_heads": 3}}))
    with pytest.raises(BlueprintError, match="inconsistent dims"):
        load_blueprint(tiny_path, cfg)
