"""Hugging Face checkpoint folders: what `bind` reads from config.json, what the glm5_next mapping
table produces, and every kind of bad checkpoint refused with one error that names the file, the
tensor and what was expected, before any tensor data is read."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kbpc.errors import ConfigError, WeightsError
from kbpc.frontend.load import load_blueprint
from kbpc.ir.weights import weight_specs
from kbpc.reference.formats import bf16_from_bits
from kbpc.weights.hf_checkpoint import bind
from kbpc.weights.hf_folder import HfFolder

L0 = "model.language_model.layers.0"
L1 = "model.language_model.layers.1"


@pytest.fixture(scope="module")
def bp(glm5next_blueprint):
    return load_blueprint(glm5next_blueprint)


@pytest.fixture
def ckpt(glm5next_checkpoint, tmp_path) -> Path:
    """A private copy to break."""
    return Path(shutil.copytree(glm5next_checkpoint, tmp_path / "ckpt"))


def _tensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    return {name: (e["dtype"], e["shape"], raw[8 + size + e["data_offsets"][0]:8 + size + e["data_offsets"][1]])
            for name, e in header.items() if name != "__metadata__"}


def _write(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header, blobs, at = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def _edit(ckpt: Path, tensor: str, new: tuple | None) -> Path:
    """Replace, add (to the first shard) or with None drop one tensor; the index follows."""
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = ckpt / index["weight_map"].setdefault(tensor, "model-00001-of-00005.safetensors")
    tensors = _tensors(shard)
    if new is None:
        del tensors[tensor]
        del index["weight_map"][tensor]
    else:
        tensors[tensor] = new
    index_path.write_text(json.dumps(index))
    _write(shard, tensors)
    return shard


@pytest.fixture
def no_reads(monkeypatch):
    """Fail the test if any tensor data is read (errors must come before loading)."""
    def refuse(self, name):
        raise AssertionError(f"tensor data read before the checkpoint was checked: {name}")
    monkeypatch.setattr(HfFolder, "read", refuse)


# ---------------------------------------------------------------- what a good checkpoint gives

def test_config_json_sets_the_model_config(bp, glm5next_checkpoint):
    bound, _ = bind(bp, glm5next_checkpoint)
    c = bound.config.constants
    assert (c.rms_eps, c.hc_norm_eps, c.hc_eps, c.layer_norm_eps) == (1e-5, 1e-5, 1e-6, 1e-6)
    sources = dict(bound.config.sources)
    assert sources["hc_norm_eps"].endswith("config.json: rms_norm_eps")
    assert sources["q_heads"].endswith("config.json: num_attention_heads")
    assert sources["shared_inter"].endswith("moe_intermediate_size * n_shared_experts")
    assert bound.config.to_json()["sources"] == sources


def test_mapping_copies_converts_and_stacks(bp, glm5next_checkpoint):
    bound, checkpoint = bind(bp, glm5next_checkpoint)
    folder = HfFolder(glm5next_checkpoint)
    w = checkpoint.weights()
    assert sorted(w) == sorted(s.name for s in weight_specs(bound))
    # NVFP4 projections are copied byte for byte
    assert np.array_equal(w["l0.kda.q.weight"], folder.read(f"{L0}.self_attn.q_proj.weight"))
    assert np.array_equal(w["l0.kda.q.weight_scale"], folder.read(f"{L0}.self_attn.q_proj.weight_scale"))
    # gate | up fused by rows under their shared tensor scale
    gate, up = folder.read(f"{L0}.mlp.gate_proj.weight"), folder.read(f"{L0}.mlp.up_proj.weight")
    assert np.array_equal(w["l0.mlp.gate_up.weight"], np.concatenate([gate, up]))
    # routed experts stacked in expert order, one static input scale
    e3 = f"{L1}.mlp.experts.3"
    assert np.array_equal(w["l1.moe.experts_gate_up.weight"][3],
                          np.concatenate([folder.read(f"{e3}.gate_proj.weight"), folder.read(f"{e3}.up_proj.weight")]))
    assert w["l1.moe.experts_down.weight_scale_2"][3] == folder.read(f"{e3}.down_proj.weight_scale_2")
    assert w["l1.moe.experts_gate_up.input_scale"] == folder.read(f"{e3}.gate_proj.input_scale")
    # the head's one_plus norm gets gamma - 1; the site norms keep gamma
    gamma = bf16_from_bits(folder.read("model.language_model.norm.weight"))
    assert np.array_equal(bf16_from_bits(w["head.final_norm.weight"]) + 1, gamma)
    assert np.array_equal(w["l0.kda.input_norm.weight"], folder.read(f"{L0}.input_layernorm.weight"))
    # F32 conv taps rounded to BF16 with a zero bias
    taps = folder.read(f"{L0}.self_attn.conv1d.weight")[:, 0, :]
    assert np.abs(bf16_from_bits(w["l0.kda.short_conv.conv_weight"]) - taps).max() <= np.abs(taps).max() * 2 ** -8
    assert not w["l0.kda.short_conv.conv_bias"].any()


# ---------------------------------------------------------------- bad checkpoints

def test_missing_tensor(bp, ckpt, no_reads):
    _edit(ckpt, f"{L0}.self_attn.k_proj.weight_scale", None)
    with pytest.raises(WeightsError, match=r"k_proj\.weight_scale' is missing \(W4A16_NVFP4 weight_scale "
                                           r"for node l0\.kda\.k\)"):
        bind(bp, ckpt)


def test_wrong_shape_names_file_tensor_and_expected(bp, ckpt, no_reads):
    name = f"{L0}.self_attn.q_proj.weight"
    dtype, shape, data = _tensors(ckpt / "model-00001-of-00005.safetensors")[name]
    shard = _edit(ckpt, name, (dtype, shape[::-1], data))
    with pytest.raises(WeightsError) as err:
        bind(bp, ckpt)
    assert str(err.value) == (f"{shard}: {name}: shape [128, 256], expected [256, 128] "
                              "(W4A16_NVFP4 weight for node l0.kda.q)")


def test_wrong_dtype(bp, ckpt, no_reads):
    name = f"{L1}.mlp.experts.5.down_proj.weight_scale_2"
    _edit(ckpt, name, ("BF16", [], b"\x80\x3f"))
    with pytest.raises(WeightsError, match=r"experts\.5\.down_proj\.weight_scale_2: dtype BF16, expected F32"):
        bind(bp, ckpt)


def _quantization(ckpt: Path, **changes) -> None:
    """Edit hf_quant_config.json's quantization record (`layers` updates quantized_layers)."""
    doc = json.loads((ckpt / "hf_quant_config.json").read_text())
    doc["quantization"]["quantized_layers"].update(changes.pop("layers", {}))
    doc["quantization"].update(changes)
    (ckpt / "hf_quant_config.json").write_text(json.dumps(doc))


def test_another_quantization_format(bp, ckpt, no_reads):
    _quantization(ckpt, layers={f"{L0}.self_attn.v_proj": {"quant_algo": "W4A8_AWQ", "group_size": 128}})
    with pytest.raises(WeightsError, match=r"hf_quant_config.json: .*v_proj is quantized as W4A8_AWQ; kbpc reads "
                                           r"ModelOpt NVFP4, .* \(node l0\.kda\.v\)"):
        bind(bp, ckpt)


def test_nvfp4_where_the_blueprint_needs_fp8(bp, ckpt, no_reads):
    _quantization(ckpt, layers={f"{L1}.self_attn.q_a_proj": {"quant_algo": "NVFP4", "group_size": 16}})
    with pytest.raises(WeightsError, match=r"q_a_proj is stored NVFP4 \(nvfp4/g16\), but node l1\.dsa\.q_a needs "
                                           r"fp8/channel weights"):
        bind(bp, ckpt)


def test_non_modelopt_quantization(bp, ckpt, no_reads):
    (ckpt / "hf_quant_config.json").unlink()
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match=r"config.json: quantization_config: quantization method 'awq' is not a "
                                           r"ModelOpt export"):
        bind(bp, ckpt)


@pytest.mark.parametrize("fields, message", [
    ({"hidden_size": 512}, r"hidden_size = 512 gives hidden = 512, but the blueprint's edges fix hidden = 256"),
    ({"num_attention_heads": 4, "num_key_value_heads": 4},
     r"num_attention_heads \(q_heads = 4\).* contradict the blueprint: .*q_heads\*mla_qk"),
    ({"layer_types": ["linear_attention"] * 4}, r"layer 1 is kda\+moe in the checkpoint but dsa\+moe"),
    ({"qk_rope_head_dim": 64}, r"qk_rope_head_dim = 64: kbpc implements only 0 \(GLM-5 latent attention is NoPE\)"),
    ({"indexer_types": ["full", "shared", "full", "full"]}, r"indexer_types = 'shared'"),
    ({"linear_lower_bound": None}, r"softplus decay gate"),
])
def test_config_that_contradicts_the_blueprint(bp, ckpt, no_reads, fields, message):
    config = json.loads((ckpt / "config.json").read_text())
    config["text_config"].update(fields)
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message) as err:
        bind(bp, ckpt)
    assert str(ckpt / "config.json") in str(err.value)


def test_truncated_shard(bp, ckpt, no_reads):
    shard = ckpt / "model-00003-of-00005.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    with pytest.raises(WeightsError, match=r"model-00003-of-00005.safetensors: not a valid safetensors file: .*"
                                           r"incomplete metadata, file not fully covered"):
        bind(bp, ckpt)


def test_malformed_shard(bp, ckpt, no_reads):
    (ckpt / "model-00002-of-00005.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(WeightsError, match=r"model-00002-of-00005.safetensors: not a valid safetensors file"):
        bind(bp, ckpt)


def test_index_that_disagrees_with_the_shards(bp, ckpt, no_reads):
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    index["weight_map"][f"{L0}.self_attn.q_proj.weight"] = "model-00004-of-00005.safetensors"
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match=r"the index puts tensor .*q_proj.weight' in 'model-00004"):
        bind(bp, ckpt)


def test_tensor_no_rule_reads(bp, ckpt, no_reads):
    _edit(ckpt, "model.language_model.layers.4.eh_proj.weight", ("BF16", [2, 2], bytes(8)))   # an MTP layer
    bind(bp, ckpt)
    _edit(ckpt, f"{L0}.self_attn.o_proj.bias", ("BF16", [256], bytes(512)))
    with pytest.raises(WeightsError, match=r"model-00001-of-00005.safetensors: .*o_proj.bias: no mapping rule reads "
                                           r"this tensor"):
        bind(bp, ckpt)


def test_kv_cache_quantization_is_refused(bp, ckpt, no_reads):
    _quantization(ckpt, kv_cache_quant_algo="FP8")
    with pytest.raises(WeightsError, match="kv_cache_quant_algo 'FP8'"):
        bind(bp, ckpt)


def test_cli_refuses_a_bad_checkpoint_with_one_line(glm5next_blueprint, ckpt, tmp_path):
    shard = _edit(ckpt, f"{L1}.self_attn.kv_b_proj.weight_scale", ("F32", [319], bytes(319 * 4)))
    out = tmp_path / "logits.npy"
    done = subprocess.run([sys.executable, "-m", "kbpc.cli", "run", str(glm5next_blueprint), "--backend", "reference",
                           "--weights", str(ckpt), "--logits", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"kbpc: error: {shard}: {L1}.self_attn.kv_b_proj.weight_scale: shape [319], "
                                   "expected [320] (FP8_PER_CHANNEL_PER_TOKEN weight_scale for node l1.dsa.q_b (absorbed))")
    assert not out.exists()


def test_a_model_built_for_other_constants_is_refused(bp, glm5next_checkpoint, no_reads):
    """A compiled bundle's model config is fixed: a checkpoint whose config.json gives other
    constants (here the stream RMS epsilon, 1e-5 from rms_norm_eps, against the default 1e-6)
    is refused before anything is loaded."""
    from kbpc.weights.hf_checkpoint import check_config

    with pytest.raises(WeightsError, match=r"built with hc_norm_eps = 1e-06, this checkpoint's rms_norm_eps gives "
                                           r"1e-05 \(compile or run it with --weights"):
        check_config(bp, glm5next_checkpoint)
    bound, _ = bind(bp, glm5next_checkpoint)
    assert check_config(bound, glm5next_checkpoint).jobs


def test_quant_config_forms(tmp_path):
    """A uniform algorithm with exclusions (ModelOpt's single-format export) and the
    config.json form of the record."""
    from kbpc.weights.hf_folder import ModuleFormat, QuantConfig

    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {
        "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head", "*.mlp.gate"]}}))
    q = QuantConfig.read(tmp_path, {})
    assert q.format_of("model.layers.3.mlp.experts.7.up_proj") == ModuleFormat("NVFP4", 16)
    assert q.format_of("model.layers.3.mlp.gate") == ModuleFormat(None)
    assert q.format_of("lm_head") == ModuleFormat(None)
    (tmp_path / "hf_quant_config.json").unlink()
    q = QuantConfig.read(tmp_path, {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}})
    assert q.format_of("model.layers.0.self_attn.q_a_proj") == ModuleFormat("FP8", 0)
    assert QuantConfig.read(tmp_path, {}).format_of("anything") == ModuleFormat(None)
    with pytest.raises(WeightsError, match="group_size an integer"):
        QuantConfig.read(tmp_path, {"quantization_config": {"quant_method": "modelopt", "group_size": "16"}})
