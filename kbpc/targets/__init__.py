"""GPU targets: one frozen record per target, naming its nvcc code generation and which
instructions exist there. Passes ask the table, never a compute capability number."""
from __future__ import annotations

from dataclasses import dataclass

from kbpc.errors import KbpcError


@dataclass(frozen=True)
class Target:
    name: str                 # the --target value
    gpus: str                 # what it is, for people
    gencode: tuple[str, ...]  # nvcc code-generation flags
    fp8_mma: bool             # mma.sync ... e4m3 (sm_89+)
    fp4_block_mma: bool       # mma.sync ... kind::mxf4nvf4.block_scale (sm_120a/121a/121f)
    capability: tuple[int, int]  # the compute capability that runs its code (an `a` target runs
                                 # on exactly that capability, not on later ones)
    sms: int                     # streaming multiprocessors of the largest part (grids that fill the GPU)
    l2_prefetch_bytes: int       # most weight bytes one projection launch prefetches into L2 before
                                 # pdl_wait (kbpc.codegen.families._projection.prefetch_row_bytes);
                                 # 0: none (the W4A16 fast forms' PF = 0)
    max_cluster: int = 8         # most CTAs a thread-block cluster may hold (8 is portable; Hopper's
                                 # launches may opt into 16)


# None on Hopper, measured: with a third of the L2 (16 MB a launch) the H200 step of the 128-expert
# seed shrink ran 0.5-0.8% slower than without (six interleaved pairs, 24th session), and
# bench/l2_prefetch_probe.cu finds that even behind a 20 us hold, `prefetch.global.L2` or
# `cp.async.bulk.prefetch.L2` of a 67 MB stream's first half saves it 0.9 of 20 us (19 MB: 0.3 of 7.8).
L2_PREFETCH_HOPPER = 0
# Targets kbpc has not run on: a smaller, unmeasured budget (GB10's L2 is the smallest of them).
L2_PREFETCH_UNMEASURED = 4 << 20

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_90", "H100 / H200 (Hopper)",
               ("-gencode=arch=compute_90a,code=sm_90a",), fp8_mma=True, fp4_block_mma=False, capability=(9, 0),
               sms=132, l2_prefetch_bytes=L2_PREFETCH_HOPPER, max_cluster=16),
        Target("sm_100", "B200 / GB200 (Blackwell datacenter)",
               ("-gencode=arch=compute_100a,code=sm_100a",), fp8_mma=True, fp4_block_mma=False, capability=(10, 0),
               sms=148, l2_prefetch_bytes=L2_PREFETCH_UNMEASURED),
        Target("sm_120", "RTX Blackwell (consumer)",
               ("-gencode=arch=compute_120a,code=sm_120a",), fp8_mma=True, fp4_block_mma=True, capability=(12, 0),
               sms=170, l2_prefetch_bytes=L2_PREFETCH_UNMEASURED),
        Target("sm_121", "GB10 (DGX Spark)",
               ("-gencode=arch=compute_121a,code=sm_121a",), fp8_mma=True, fp4_block_mma=True, capability=(12, 1),
               sms=48, l2_prefetch_bytes=L2_PREFETCH_UNMEASURED),
    )
}

DEFAULT_TARGET = "sm_90"

# Families whose planned kernels use an instruction some targets lack, and the variant kbpc runs
# there instead (same group boundary, same quantization semantics; only the product differs).
FP4_MMA_FAMILIES = frozenset({"w4a4_mx", "w4a4_mx_static", "glm_moe_layer", "moe_experts"})  # the fused MoE layer too


# Families that quantize activations, read quantized ones or keep the FP8 MLA latent cache. A build
# without activation quantization (Options.act_quant off, a debugging aid) runs their `unquantized`
# variant (kbpc/codegen/families/unquantized.py), where one exists.
ACT_QUANT_FAMILIES = frozenset({"w8a8_act_quant", "wxay", "w4a4_mx", "w4a4_mx_static", "kda_gates_w8a8",
                                "glm_mla_latent_write", "glm_mla_decode", "glm_moe_layer", "moe_experts", "kda_fused",
                                "kda_conv_gates"})


def variant_for(target: Target, family: str, act_quant: bool = True) -> str:
    """kbpc's implementation of a family on a target."""
    if not act_quant and family in ACT_QUANT_FAMILIES:
        return "unquantized"
    if family in FP4_MMA_FAMILIES:
        # Every target runs the exact integer path: E2M1 codes as small integers in DP4A dot
        # products per 16-value group, scaled exactly (kernels/w4a4_mx.cuh). sm_90 has no FP4 MMA;
        # on sm_120/121 the block-scaled MMA path exists in the header but is not used until it has
        # been validated on such hardware.
        return "e2m1_dp4a_exact"
    if family in ("wxay", "kda_gates_w8a8", "kda_fused", "kda_conv_gates"):
        return "fp8_mma" if target.fp8_mma else "fp8_dequant_fma"
    return "cuda_core"


def target_for_capability(capability: tuple[int, int]) -> Target:
    """The target whose code runs on a GPU of this compute capability."""
    for target in TARGETS.values():
        if target.capability == tuple(capability):
            return target
    known = ", ".join(f"{t.name} ({t.capability[0]}.{t.capability[1]})" for t in TARGETS.values())
    raise KbpcError(f"kbpc has no target for compute capability {capability[0]}.{capability[1]} "
                    f"(it builds for {known})", "GPU")


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        known = ", ".join(sorted(TARGETS))
        raise KbpcError(f"unknown target {name!r}; known targets: {known}", "--target") from None
