"""Builds without activation quantization (Options.act_quant off, `kbpc compile --no-act-quant`):
every group that quantizes activations, reads quantized ones or keeps the FP8 latent cache runs its
`unquantized` variant; the act_quant edges carry BF16 rows; the latent cache holds FP32 rows; the
fusions that quantize are left apart with the reason; the default build is untouched."""
from __future__ import annotations

import pytest

from kbpc.codegen.emit import build_step
from kbpc.errors import KbpcError
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.runtime.run_manifest import RunManifest
from kbpc.targets import ACT_QUANT_FAMILIES

QUANTIZED = {"fp8/token", "nvfp4/g16"}


@pytest.fixture(scope="module", params=["tiny", "glm5next"])
def plans(request, tiny_path, glm5next_blueprint):
    bp = load_blueprint(tiny_path if request.param == "tiny" else glm5next_blueprint)
    return run_pipeline(bp, Options(act_quant=False)), run_pipeline(bp, Options())


def _act_quant_groups(plan):
    return {g.id for g in plan.groups if any(n.op_base == "act_quant" for n in plan.grouping.nodes(g.id))}


def test_every_quantizing_group_runs_unquantized(plans):
    plain, default = plans
    holds_quant = _act_quant_groups(plain)
    assert holds_quant
    for g in plain.groups:
        want = "unquantized" if g.id in holds_quant or g.family in ACT_QUANT_FAMILIES else None
        if want:
            assert g.variant == want, (g.id, g.family, g.variant)
        else:
            assert g.variant != "unquantized"
    assert not any(g.variant == "unquantized" for g in default.groups)


def test_quantized_edges_carry_bf16_rows(plans):
    plain, default = plans
    bp = plain.blueprint
    by_name = {b.name: b for b in default.buffers}
    carried = 0
    for b in plain.buffers:
        assert b.format not in QUANTIZED
        old = by_name.get(b.name)
        if old is not None and old.format in QUANTIZED:
            assert b.format == "bf16" and b.nbytes == 2 * b.elements
            carried += 1
    assert carried, "no quantized activation buffer in the plan"


def test_latent_cache_is_fp32_and_quantizer_scratch_is_gone(plans):
    plain, default = plans
    state, old = {s.name: s for s in plain.state}, {s.name: s for s in default.state}
    caches = [n for n in old if n.endswith(".latent_cache")]
    assert caches
    for name in caches:
        assert state[name].storage == "f32" and state[name].nbytes == 4 * old[name].nbytes
        assert state[name].shape == old[name].shape
    assert not any(n.endswith((".codes", ".merge")) for n in state)


def test_quantizing_fusions_are_left_apart_with_the_reason(plans):
    plain, _ = plans
    off = [f for f in plain.fusions if not f.applied and "activation quantization is off" in f.reason]
    assert off and all(f.rule in ("rms_norm_fp8_quant", "moe_layer", "kda_chain", "moe_swiglu_down",
                                  "moe_gate_up_swiglu", "router_expert_quant", "kda_conv_gates") for f in off)
    assert any(f.rule == "router_expert_quant" for f in off)
    assert not any(f.applied and f.rule in ("rms_norm_fp8_quant", "router_expert_quant") for f in plain.fusions)
    # the router's own fusion, which does not quantize, still serves the MoE blocks
    assert any(f.applied and f.rule == "router_gemv_topk" for f in plain.fusions)


def test_lowering_uses_the_dequantizing_kernels(plans):
    plain, _ = plans
    step = build_step(plain, "test")
    kernels = {launch.instance.kernel for g in step.groups for launch in g.launches}
    assert any(k.startswith("kbp::dq_gemv_nvfp4<") for k in kernels)
    assert any(k.startswith("kbp::dq_gemv_fp8<") for k in kernels)
    assert any(k.startswith("kbp::glm_mla_decode_f32<") for k in kernels)
    assert any(k.startswith("kbp::glm_mla_latent_write_f32_paged<") for k in kernels)
    quantizers = ("w8a8_act_quant_row", "w4a4_quant_rows", "wxay_rowscale", "w4a4_gemv", "_fp8_paged",
                  "glm_mla_decode_split", "kda_gates_w8a8_k128")
    assert not [k for k in kernels if any(q in k for q in quantizers)]
    # every routed expert launch reads its ids (a dense slot has none)
    experts = [launch for g in step.groups for launch in g.launches
               if any(n.endswith(("gate_up", "down")) and "experts" in n for n in launch.nodes)]
    assert experts and all(launch.instance.kernel.startswith("kbp::dq_gemv_nvfp4<") for launch in experts)


def test_options_and_manifest_guard_the_flag():
    with pytest.raises(KbpcError, match="--no-act-quant"):
        Options(act_quant=False, tp=2)
    with pytest.raises(Exception, match="act_quant must be true or false"):
        RunManifest.from_json({"kind": "lite", "blueprint_id": "b", "plan_digest": "0", "target": "sm_90",
                               "options": {"max_context": 8, "act_quant": 1}, "step": {"launches": 1, "groups": 1},
                               "library": {}, "weights": [], "state": []})
