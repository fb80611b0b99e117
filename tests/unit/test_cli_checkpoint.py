"""The command-line pieces of checkpoint support: shrink --like, run --logits, --no-act-quant,
convert's refusals, compile's refusal to embed a checkpoint folder."""
from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from kbpc.cli import main
from kbpc.frontend.load import load_blueprint


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_shrink_like_follows_the_config(tmp_path, seed_path, glm5next_checkpoint, glm5next_blueprint):
    out = tmp_path / "like.json"
    result = run("shrink", seed_path, "--like", glm5next_checkpoint / "config.json", "-o", out)
    assert result.exit_code == 0, result.output
    bp = load_blueprint(out)
    text = json.loads((glm5next_checkpoint / "config.json").read_text())["text_config"]
    assert [layer.template for layer in bp.layers] == ["kda+mlp", "dsa+moe", "kda+moe", "dsa+moe"]
    assert (bp.symbols["hidden"], bp.symbols["experts"], bp.symbols["q_heads"], bp.symbols["index_kpool"]) == \
        (text["hidden_size"], text["n_routed_experts"], text["num_attention_heads"], text["index_kpool"])
    assert json.loads(out.read_text()) == json.loads(glm5next_blueprint.read_text())


def test_shrink_like_refuses_layers_the_seed_lacks(tmp_path, seed_path, glm5next_checkpoint):
    config = json.loads((glm5next_checkpoint / "config.json").read_text())
    config["text_config"]["mlp_layer_types"] = ["dense", "dense", "sparse", "sparse"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run("shrink", seed_path, "--like", tmp_path / "config.json", "-o", tmp_path / "x.json")
    assert result.exit_code == 2
    assert "layer 1 is dsa+mlp, and the seed has no such layer" in result.output
    assert not (tmp_path / "x.json").exists()
    result = run("shrink", seed_path, "--like", glm5next_checkpoint / "config.json", "--preset", "tiny",
                 "-o", tmp_path / "x.json")
    assert result.exit_code == 2 and "drop --preset and --layers" in result.output


def test_run_logits_every_position(tmp_path, tiny_path):
    out = tmp_path / "logits.npy"
    result = run("run", tiny_path, "--backend", "reference", "--prompt-ids", "1,2,3", "--max-new-tokens", "4",
                 "--logits", out, "--json")
    assert result.exit_code == 0, result.output
    logits = np.load(out)
    summary = json.loads(result.output)
    assert logits.dtype == np.float32 and logits.shape == (3 + 4 - 1, load_blueprint(tiny_path).symbols["vocab"])
    assert summary["generated_ids"] == [int(np.argmax(row)) for row in logits[2:]]


def test_no_act_quant_on_the_reference(tmp_path, tiny_path):
    plain = tmp_path / "plain.npy"
    raw = tmp_path / "raw.npy"
    for path, extra in ((plain, ()), (raw, ("--no-act-quant",))):
        result = run("run", tiny_path, "--backend", "reference", "--prompt-ids", "5,6", "--max-new-tokens", "2",
                     "--logits", path, *extra)
        assert result.exit_code == 0, result.output
    a, b = np.load(plain), np.load(raw)
    assert a.shape == b.shape and not np.array_equal(a, b)
    # quantizing activations to 4 bits moves a random model's logits, but not beyond recognition
    assert np.sqrt(((a - b) ** 2).mean()) < a.std()


def test_convert_refuses_an_existing_output(tmp_path, glm5next_checkpoint, glm5next_blueprint):
    (tmp_path / "out").mkdir()
    result = run("convert", glm5next_checkpoint, "-o", tmp_path / "out", "--blueprint", glm5next_blueprint)
    assert result.exit_code == 2 and "already exists" in result.output


def test_convert_leaves_nothing_on_failure(tmp_path, tiny_path, glm5next_checkpoint):
    result = run("convert", glm5next_checkpoint, "-o", tmp_path / "out", "--blueprint", tiny_path)
    assert result.exit_code == 2 and "the blueprint 3" in result.output
    assert list(tmp_path.iterdir()) == []


def test_compile_does_not_embed_a_checkpoint_folder(tmp_path, glm5next_checkpoint, glm5next_blueprint):
    result = run("keygen", "-o", tmp_path / "keys")
    assert result.exit_code == 0, result.output
    key = tmp_path / "keys" / "signing-key.pem"
    result = run("compile", glm5next_blueprint, "-o", tmp_path / "m.kbp", "--weights", glm5next_checkpoint,
                 "--embed-weights", "--key", key)
    assert result.exit_code == 2 and "run kbpc convert first" in result.output
    assert not (tmp_path / "m.kbp").exists()
