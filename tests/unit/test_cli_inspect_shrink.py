"""`kbpc inspect` and `kbpc shrink` through the command line."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kbpc.cli import main
from kbpc.frontend.load import load_blueprint

REQUIRED_KEYS = {"schema", "blueprint_id", "layers", "nodes", "edges", "groups", "families", "symbols",
                 "weight_bytes", "bytes_per_token", "roofline_tokens_per_s"}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_inspect_json_seed(seed_path):
    result = run("inspect", seed_path, "--json", "--bandwidth", "1000")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert REQUIRED_KEYS <= data.keys()
    assert (data["layers"], data["nodes"], data["edges"], data["groups"]) == (45, 1740, 2504, 909)
    assert data["roofline_tokens_per_s"] == pytest.approx(1000e9 / data["bytes_per_token"])


def test_inspect_context_adds_state_traffic(tiny_path):
    small = json.loads(run("inspect", tiny_path, "--json", "--context", "16").output)
    large = json.loads(run("inspect", tiny_path, "--json", "--context", "4000").output)
    assert small["step_bytes_at_context"] > small["bytes_per_token"]
    assert large["step_bytes_at_context"] > small["step_bytes_at_context"]


def test_inspect_table(tiny_path):
    result = run("inspect", tiny_path)
    assert result.exit_code == 0, result.output
    assert "read per decode token" in result.output and "glm_mhc" in result.output


def test_inspect_bad_input_exit_2_no_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "kbp-graph/v9"}')
    result = run("inspect", bad)
    assert result.exit_code == 2
    assert "unsupported schema 'kbp-graph/v9'" in result.output
    assert "Traceback" not in result.output


def test_tiny_example_is_reproducible(tmp_path, seed_path, tiny_path):
    out = tmp_path / "tiny.json"
    result = run("shrink", seed_path, "-o", out, "--preset", "tiny")
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == tiny_path.read_bytes()
    bp = load_blueprint(out)
    assert sorted({l.template for l in bp.layers}) == ["dsa+moe", "kda+mlp", "kda+moe"]


@pytest.mark.parametrize("sets,layers", [
    (["experts=128"], None),
    (["hidden=512", "experts=16", "top_k=4"], "per-template"),
    (["hidden=384", "inter=768", "vocab=1000", "lin_k_heads=4", "lin_v_heads=4"], "0,3-4"),
    (["q_heads=4", "index_topk=32", "index_heads=8", "q_lora=256"], "3"),
])
def test_shrink_combinations_load_and_inspect(tmp_path, seed_path, sets, layers):
    out = tmp_path / "s.json"
    args = ["shrink", seed_path, "-o", out] + [a for s in sets for a in ("--set", s)]
    if layers:
        args += ["--layers", layers]
    result = run(*args)
    assert result.exit_code == 0, result.output
    bp = load_blueprint(out)
    for s in sets:
        name, value = s.split("=")
        assert bp.symbols[name] == int(value)
    inspected = run("inspect", out, "--json")
    assert inspected.exit_code == 0, inspected.output


@pytest.mark.parametrize("sets,pattern", [
    (["hidden=100"], "divisible by 128|not a whole number|multiple"),
    (["nonsense=3"], "unknown symbol"),
    (["hidden=abc"], "expected symbol=positive-integer"),
])
def test_shrink_refuses_bad_sizes_without_output(tmp_path, tiny_path, sets, pattern):
    out = tmp_path / "never.json"
    result = run("shrink", tiny_path, "-o", out, *[a for s in sets for a in ("--set", s)])
    assert result.exit_code == 2
    assert __import__("re").search(pattern, result.output), result.output
    assert not out.exists() and not list(tmp_path.iterdir())


def test_shrink_layers_out_of_range(tmp_path, tiny_path):
    result = run("shrink", tiny_path, "-o", tmp_path / "x.json", "--layers", "0-9")
    assert result.exit_code == 2 and "outside 0..2" in result.output
