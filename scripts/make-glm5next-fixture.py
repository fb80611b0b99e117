#!/usr/bin/env python3
"""Regenerate tests/data/glm5next-tiny (a tiny GLM-5-next checkpoint quantized and exported by NVIDIA
ModelOpt) and tests/data/glm5next-tiny-oracle (transformers' logits on it), so CI needs no PyTorch.

Run it with the oracle tools in their own environment, never the project's:

    python3 -m venv /tmp/venv-oracle
    /tmp/venv-oracle/bin/pip install torch==2.13.0 'transformers>=5.24' nvidia-modelopt requests
    /tmp/venv-oracle/bin/python scripts/make-glm5next-fixture.py

What it does, all on the CPU, from fixed seeds:
1. builds a random GLM-5-next (transformers `glm5_next`, text layers only used) with every layer
   kind: KDA + dense MLP, DSA + MoE, KDA + MoE, DSA + MoE; every parameter drawn so that it matters
   (norm weights away from 1, biases and gates non-zero, projections with RMS ~ 1/sqrt(fan-in));
2. quantizes it with ModelOpt (max calibration on random tokens): routed experts and the dense MLP
   NVFP4 W4A4, the KDA projections and the shared expert NVFP4 weight-only, the MLA projections,
   the indexer key and the KDA gate up-projections FP8 per channel with dynamic per-token
   activations; router, indexer query/weights/gate, hyper-connections, embedding and LM head stay
   unquantized, as the blueprint's precisions say;
3. exports it with `export_hf_checkpoint` in small shards (so the index and streaming are used);
4. loads the exported tensors back, dequantizes them (ModelOpt's NVFP4QTensor for NVFP4, code times
   per-channel scale for FP8) into an FP32 transformers model;
5. picks the teacher-forced tokens position by position among seeded random candidates so that
   no discrete decision of that model (top-k experts, top-k indexer pools) is near a tie (see
   `conditioned_tokens`; the criterion uses transformers alone, never kbpc);
6. runs transformers teacher forced over them: without activation quantization (FP32 and BF16),
   and with it as exported (static NVFP4 input scales, dynamic per-token FP8), quantizing each
   projection's input with ModelOpt's own NVFP4 encoder.

Measured with this script's output: transformers' own BF16 and FP32 runs differ by 0.011-0.020 of
the logit standard deviation per position without activation quantization and by 0.36 (RMS over
all positions) with it.
"""
from __future__ import annotations

import contextlib
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file
from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration
from transformers.models.glm5_next import modeling_glm5_next as M

import modelopt
import modelopt.torch.quantization as mtq
from modelopt.torch.export import export_hf_checkpoint
from modelopt.torch.quantization.qtensor import NVFP4QTensor

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "glm5next-tiny"
ORACLE = ROOT / "tests" / "data" / "glm5next-tiny-oracle"
SEED = 20260501
POSITIONS = 32
SHARD = "1MB"
ROUTE_MARGIN = 0.025      # routed-expert choice scores (sigmoid + correction bias)
POOL_MARGIN = 0.05        # indexer pool scores, relative to the largest |score|
MAX_CANDIDATES = 500

TEXT = dict(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
            num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=8,
            num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=512, q_lora_rank=128,
            qk_rope_head_dim=0, qk_nope_head_dim=96, v_head_dim=64, index_topk=16, index_head_dim=128,
            index_n_heads=4, index_kpool=4, linear_head_dim=128, linear_num_heads=2,
            linear_conv_kernel_dim=4, pad_token_id=None, rms_norm_eps=1e-5,
            layer_types=["linear_attention", "indexed_attention", "linear_attention", "indexed_attention"],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=256,
              projection_intermediate_size=64)

NVFP4 = {"num_bits": (2, 1), "block_sizes": {-1: 16, "type": "dynamic", "scale_bits": (4, 3)}}
FP8_W = {"num_bits": (4, 3), "axis": 0}
FP8_A = {"num_bits": (4, 3), "axis": None, "type": "dynamic", "block_sizes": {-1: None}}


def build_model() -> Glm5NextForConditionalGeneration:
    cfg = Glm5NextConfig(text_config=TEXT, vision_config=VISION)
    cfg.architectures = ["Glm5NextForConditionalGeneration"]
    torch.manual_seed(SEED)
    model = Glm5NextForConditionalGeneration._from_config(cfg, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(SEED)

    def randn(shape, std=1.0, mean=0.0):
        return torch.randn(shape, generator=gen) * std + mean

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" in name:
                continue
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("embed_tokens.weight"):
                v = randn(p.shape)
            elif "norm" in name and leaf == "bias":
                v = randn(p.shape, 0.1)
            elif "norm" in name:                      # every RMSNorm / LayerNorm weight
                v = randn(p.shape, 0.1, 1.0)
            elif name.endswith("_hc.fn"):
                v = randn(p.shape, 1.0 / math.sqrt(p.shape[1]))
            elif name.endswith("_hc.base"):
                v = randn(p.shape, 0.5)
            elif name.endswith("_hc.scale"):
                v = torch.rand(p.shape, generator=gen) + 0.5
            elif leaf == "A_log":
                v = randn(p.shape, 0.5)
            elif leaf == "dt_bias":
                v = randn(p.shape, 0.5)
            elif name.endswith("conv1d.weight"):
                v = randn(p.shape, 0.5)
            elif leaf == "index_kpool_compress_ape":
                v = randn(p.shape, 0.5)
            elif leaf == "gate_up_proj" or leaf == "down_proj" and p.ndim == 3:
                v = randn(p.shape, 1.0 / math.sqrt(p.shape[-1]))
            else:                                      # projections: RMS ~ 1/sqrt(fan-in)
                v = randn(p.shape, 1.0 / math.sqrt(p.shape[-1]))
            p.copy_(v.to(p.dtype))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(randn(b.shape, 0.05))
    return model


def quant_config(model) -> dict:
    """Per-module formats, written out by module name (the blueprint's precision per node)."""
    cfg = [{"quantizer_name": "*", "enable": False}]

    def add(name, weight, act=None):
        cfg.append({"quantizer_name": f"{name}.weight_quantizer", "cfg": weight})
        if act is not None:
            cfg.append({"quantizer_name": f"{name}.input_quantizer", "cfg": act})

    for name, mod in model.named_modules():
        if isinstance(mod, M.Glm5NextTextLinearAttention):
            for proj in ("q_proj", "k_proj", "v_proj", "forget_gate.f_a_proj", "b_proj", "g_a_proj", "o_proj"):
                add(f"{name}.{proj}", NVFP4)
            for proj in ("forget_gate.f_b_proj", "g_b_proj"):
                add(f"{name}.{proj}", FP8_W, FP8_A)
        elif isinstance(mod, M.Glm5NextTextAttention):
            for proj in ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj", "indexer.wk"):
                add(f"{name}.{proj}", FP8_W, FP8_A)
        elif isinstance(mod, M.Glm5NextTextMoE):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                add(f"{name}.shared_experts.{proj}", NVFP4)
            cfg.append({"quantizer_name": f"{name}.experts.*weight_quantizer", "cfg": NVFP4})
            cfg.append({"quantizer_name": f"{name}.experts.*input_quantizer", "cfg": NVFP4})
        elif isinstance(mod, M.Glm5NextTextMLP) and ".layers." in name and "shared" not in name:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                add(f"{name}.{proj}", NVFP4, NVFP4)
    return {"quant_cfg": cfg, "algorithm": "max"}


def calibrate(model) -> None:
    gen = torch.Generator().manual_seed(SEED + 1)
    for _ in range(4):
        model(input_ids=torch.randint(0, TEXT["vocab_size"], (1, POSITIONS), generator=gen))


def export(model, where: Path) -> None:
    model = mtq.quantize(model, quant_config(model), calibrate)
    export_hf_checkpoint(model, export_dir=where, max_shard_size=SHARD)


# ---------------------------------------------------------------- oracle: dequantized transformers

def read_export(where: Path) -> tuple[dict, dict]:
    tensors = {}
    for f in sorted(where.glob("*.safetensors")):
        tensors.update(load_file(f))
    layers = json.loads((where / "hf_quant_config.json").read_text())["quantization"]["quantized_layers"]
    return tensors, layers


def dequantize(tensors: dict, module: str, algo: str) -> torch.Tensor:
    w = tensors[f"{module}.weight"]
    if algo in ("NVFP4", "W4A16_NVFP4"):
        n, half = w.shape
        q = NVFP4QTensor((n, 2 * half), torch.float32, w)
        return q.dequantize(dtype=torch.float32, scale=tensors[f"{module}.weight_scale"],
                            double_scale=tensors[f"{module}.weight_scale_2"], block_sizes={-1: 16})
    if algo == "FP8_PER_CHANNEL_PER_TOKEN":
        return w.to(torch.float32) * tensors[f"{module}.weight_scale"].to(torch.float32)[:, None]
    raise ValueError(f"{module}: unexpected quant_algo {algo}")


def oracle_state(tensors: dict, layers: dict) -> dict:
    """State dict of dequantized FP32 weights in transformers' own layout (experts fused again)."""
    state, used = {}, set()
    for module, info in layers.items():
        if module.endswith(".experts"):
            continue
        state[f"{module}.weight"] = dequantize(tensors, module, info["quant_algo"])
        used.update(k for k in tensors if k.startswith(module + "."))
    for module, info in layers.items():
        if not module.endswith(".experts"):
            continue
        n = sum(1 for k in tensors if k.startswith(f"{module}.") and k.endswith(".gate_proj.weight"))
        gu, down = [], []
        for e in range(n):
            g = dequantize(tensors, f"{module}.{e}.gate_proj", info["quant_algo"])
            u = dequantize(tensors, f"{module}.{e}.up_proj", info["quant_algo"])
            gu.append(torch.cat([g, u], 0))
            down.append(dequantize(tensors, f"{module}.{e}.down_proj", info["quant_algo"]))
        state[f"{module}.gate_up_proj"] = torch.stack(gu)
        state[f"{module}.down_proj"] = torch.stack(down)
        used.update(k for k in tensors if k.startswith(module + "."))
    for k, v in tensors.items():
        if k not in used:
            state[k] = v.to(torch.float32)
    return state


def oracle_model(state: dict, dtype: torch.dtype):
    cfg = Glm5NextConfig(text_config=TEXT, vision_config=VISION)
    torch.manual_seed(0)
    model = Glm5NextForConditionalGeneration._from_config(cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "visual" not in k and "rotary" not in k]
    if missing or unexpected:
        raise SystemExit(f"oracle state does not fit the model: missing {missing}, unexpected {unexpected}")
    model.eval()
    if dtype != torch.float32:
        keep = M.Glm5NextPreTrainedModel._keep_in_fp32_modules_strict
        for name, p in model.named_parameters():
            if not any(k in name for k in keep):
                p.data = p.data.to(dtype)
    return model


def fake_nvfp4(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """ModelOpt's NVFP4 encode with the static activation scale, decoded back."""
    shape, dtype = x.shape, x.dtype
    flat = x.reshape(-1, shape[-1]).to(torch.float32)
    q, s, s2 = NVFP4QTensor.quantize(flat, 16, weights_scaling_factor_2=input_scale.to(torch.float32))
    out = q.dequantize(dtype=torch.float32, scale=s, double_scale=s2, block_sizes={-1: 16})
    return out.reshape(shape).to(dtype)


def fake_fp8_token(x: torch.Tensor) -> torch.Tensor:
    """Dynamic per-token FP8 E4M3: s = max(amax/448, 1e-12), q = e4m3(x / s)."""
    xf = x.to(torch.float32)
    s = (xf.abs().amax(-1, keepdim=True) / 448.0).clamp_min(1e-12)
    q = (xf / s).clamp(-448, 448).to(torch.float8_e4m3fn).to(torch.float32)
    return (q * s).to(x.dtype)


def add_act_quant(model, tensors: dict, layers: dict) -> None:
    """Quantize every projection's input as the export says (hooks; experts patched)."""
    modules = dict(model.named_modules())
    for module, info in layers.items():
        algo = info["quant_algo"]
        if module.endswith(".experts"):
            gu_scale = tensors[f"{module}.0.gate_proj.input_scale"]
            down_scale = tensors[f"{module}.0.down_proj.input_scale"]
            _quantize_experts(modules[module], gu_scale, down_scale)
        elif algo == "NVFP4":
            scale = tensors[f"{module}.input_scale"]
            modules[module].register_forward_pre_hook(lambda m, a, s=scale: (fake_nvfp4(a[0], s),))
        elif algo == "FP8_PER_CHANNEL_PER_TOKEN":
            modules[module].register_forward_pre_hook(lambda m, a: (fake_fp8_token(a[0]),))


def _quantize_experts(experts, gu_scale, down_scale) -> None:
    def forward(hidden_states, top_k_index, top_k_weights):
        final = torch.zeros_like(hidden_states)
        for e in range(experts.num_experts):
            tok, pos = torch.where(top_k_index == e)
            if tok.numel() == 0:
                continue
            x = fake_nvfp4(hidden_states[tok], gu_scale)
            h = experts._apply_gate(F.linear(x, experts.gate_up_proj[e]))
            y = F.linear(fake_nvfp4(h, down_scale), experts.down_proj[e]) * top_k_weights[tok, pos, None]
            final.index_add_(0, tok, y.to(final.dtype))
        return final
    experts.forward = forward


@torch.no_grad()
def logits(model, ids: torch.Tensor) -> np.ndarray:
    out = model(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None], use_cache=False)
    return out.logits[0].to(torch.float32).numpy()


# ---------------------------------------------------------------- a well-conditioned token sequence

@contextlib.contextmanager
def decision_margins(model):
    """Collect, for the last position of a forward pass, the margin of every discrete decision:
    routed experts (choice score of the k-th minus the (k+1)-th expert) and indexer pools (k-th
    minus (k+1)-th pool score over the largest |score|, where more pools are valid than chosen)."""
    found: list[tuple[str, float]] = []
    topk = torch.Tensor.topk

    def router_hook(mod, args, out):
        choice = (out[0][-1].sigmoid() + mod.e_score_correction_bias).sort(descending=True).values
        found.append(("route", float(choice[mod.top_k - 1] - choice[mod.top_k])))

    def pool_topk(self, k, *args, **kwargs):        # index_scores.topk inside the indexer
        row = self.detach()[0, -1]
        row = row[row > torch.finfo(row.dtype).min]
        if row.numel() > k:
            srt = row.sort(descending=True).values
            found.append(("pools", float((srt[k - 1] - srt[k]) / srt.abs().max())))
        return topk(self, k, *args, **kwargs)

    def swap(fn):
        return lambda *a, **kw: setattr(torch.Tensor, "topk", fn)

    hooks = []
    for mod in model.modules():
        if isinstance(mod, M.Glm5NextTextTopkRouter):
            hooks.append(mod.register_forward_hook(router_hook))
        if isinstance(mod, M.Glm5NextTextIndexer):
            hooks += [mod.register_forward_pre_hook(swap(pool_topk)), mod.register_forward_hook(swap(topk))]
    try:
        yield found
    finally:
        for h in hooks:
            h.remove()
        torch.Tensor.topk = topk


def conditioned_tokens(model) -> tuple[torch.Tensor, list[float]]:
    """Teacher-forced tokens, chosen position by position among seeded random candidates so that
    no discrete decision of the oracle lies within ROUTE_MARGIN (choice-score units) or
    POOL_MARGIN (relative) of a tie. The model is causal, so earlier decisions never change.
    Without this, a near-tie flips between any two implementations that round differently
    (transformers' own BF16 and FP32 runs disagree at such positions by ~0.4 logit std)."""
    gen = torch.Generator().manual_seed(SEED + 2)
    ids: list[int] = []
    worst: list[float] = []
    while len(ids) < POSITIONS:
        for _ in range(MAX_CANDIDATES):
            cand = int(torch.randint(0, TEXT["vocab_size"], (1,), generator=gen))
            with decision_margins(model) as found:
                logits(model, torch.tensor(ids + [cand]))
            ok = [m / (ROUTE_MARGIN if kind == "route" else POOL_MARGIN) for kind, m in found]
            if min(ok, default=2.0) >= 1.0:
                ids.append(cand)
                worst.append(min(ok, default=float("inf")))
                break
        else:
            raise SystemExit(f"no well-conditioned token at position {len(ids)} in {MAX_CANDIDATES} candidates")
    return torch.tensor(ids), worst


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        export(build_model(), Path(tmp))
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir(parents=True)
        for f in sorted(Path(tmp).iterdir()):
            if f.suffix in (".json", ".safetensors"):
                shutil.copy(f, OUT / f.name)
    tensors, layers = read_export(OUT)
    state = oracle_state(tensors, layers)
    fp32 = oracle_model(state, torch.float32)
    ids, worst = conditioned_tokens(fp32)
    ORACLE.mkdir(parents=True, exist_ok=True)
    results = {
        "logits_noquant_fp32": logits(fp32, ids),
        "logits_noquant_bf16": logits(oracle_model(state, torch.bfloat16), ids),
    }
    model = oracle_model(state, torch.float32)
    add_act_quant(model, tensors, layers)
    results["logits_actquant_fp32"] = logits(model, ids)
    model = oracle_model(state, torch.bfloat16)
    add_act_quant(model, tensors, layers)
    results["logits_actquant_bf16"] = logits(model, ids)
    for name, arr in results.items():
        np.save(ORACLE / f"{name}.npy", arr.astype(np.float32))
    meta = {"token_ids": ids.tolist(), "seed": SEED, "positions": POSITIONS,
            "margins": {"route": ROUTE_MARGIN, "pools": POOL_MARGIN,
                        "worst_per_position_in_units_of_the_margin": [round(w, 3) for w in worst]},
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "modelopt": modelopt.__version__, "python": sys.version.split()[0]},
            "logits": {k: "positions x vocab float32, transformers Glm5NextForConditionalGeneration "
                          "teacher forced on token_ids" for k in results}}
    (ORACLE / "oracle.json").write_text(json.dumps(meta, indent=1) + "\n")
    std = results["logits_noquant_fp32"].std(axis=-1)
    for name, arr in results.items():
        rms = np.sqrt(((arr - results["logits_noquant_fp32"]) ** 2).mean(-1)) / std
        print(f"{name}: RMS difference to FP32 without activation quantization / logit std: "
              f"median {np.median(rms):.4f}, max {rms.max():.4f}")


if __name__ == "__main__":
    main()
