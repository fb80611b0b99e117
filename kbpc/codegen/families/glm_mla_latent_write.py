"""glm_mla_latent_write: kv_norm + kv_write as one kernel (kernels/glm_mla_latent_write.cuh, the
paged form): RMSNorm of the BF16 kv_a row with the plain weight, times 1/s_k, E4M3 store at the
token's slot, looked up on the device from POS through the `<kv_write>.block_table` state. The
normalised row (kv_norm's output edge) stays on chip."""
from __future__ import annotations

from kbpc.codegen.args import StepInput, lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families.dsa_state import state_buffer
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup

BF = "__nv_bfloat16"
PARAMS = (f"const {BF}*", f"const {BF}*", "const int32_t*", "int", "const int32_t*", "float", "float",
          "uint8_t*")


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    norm, write = ctx.node(group, "rms_norm"), ctx.node(group, "kv_write")
    x = ctx.input(norm)
    e = x.dim_value
    cache = state_buffer(ctx, f"{write.id}.latent_cache")
    if cache.shape[-1] != e:
        raise LoweringError(f"latent cache rows are {cache.shape[-1]} wide, kv_a rows {e}", f"group {group.id}")
    page = ctx.c.latent_page_tokens
    inst = KernelInstance("glm_mla_latent_write", "glm_mla_latent_write.cuh",
                          f"kbp::glm_mla_latent_write_fp8_paged<{e}>", PARAMS)
    args = (ctx.buf(x), ctx.weight(norm, ctype=BF), ctx.state(f"{write.id}.block_table", "int32_t"), lit(page),
            StepInput("POS"), ctx.weight_value(write, "k_scale"), flt(ctx.c.rms_eps),
            ctx.state(f"{write.id}.latent_cache", "uint8_t"))
    return [Launch(inst, grid=(ctx.rows(x), 1, 1), block=(e, 1, 1), smem=0, args=args, group=group.id,
                   nodes=(norm.id, write.id))]


def lower_unquantized(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    """Without activation quantization (Options.act_quant off): the normalised row is stored as FP32
    (glm_mla_latent_write_f32_paged; kbpc.ir.state sizes the cache for it), no static scale."""
    norm, write = ctx.node(group, "rms_norm"), ctx.node(group, "kv_write")
    x = ctx.input(norm)
    e = x.dim_value
    cache = state_buffer(ctx, f"{write.id}.latent_cache")
    if cache.shape[-1] != e or cache.storage != "f32":
        raise LoweringError(f"latent cache rows are {cache.shape[-1]} wide {cache.storage}, want {e} FP32 values",
                            f"group {group.id}")
    inst = KernelInstance("glm_mla_latent_write", "glm_mla_latent_write.cuh",
                          f"kbp::glm_mla_latent_write_f32_paged<{e}>",
                          (f"const {BF}*", f"const {BF}*", "const int32_t*", "int", "const int32_t*", "float", "float*"))
    args = (ctx.buf(x), ctx.weight(norm, ctype=BF), ctx.state(f"{write.id}.block_table", "int32_t"),
            lit(ctx.c.latent_page_tokens), StepInput("POS"), flt(ctx.c.rms_eps),
            ctx.state(f"{write.id}.latent_cache", "float"))
    return [Launch(inst, grid=(ctx.rows(x), 1, 1), block=(e, 1, 1), smem=0, args=args, group=group.id,
                   nodes=(norm.id, write.id))]
