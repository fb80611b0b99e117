"""Reference numerics: the numpy oracle for every kernel family of a kbp-graph blueprint.

One module per family (`kbpc/reference/<family>.py`), each implementing the family's `explain`
math literally and citing it in its docstring. Conventions shared by all modules:

- Values are numpy arrays. A BF16 value is held as a float32 array whose elements are exactly
  BF16-representable (`formats.to_bf16` rounds to nearest even). Stored bytes use the raw forms:
  BF16 as uint16 bits, E4M3 as uint8 codes, NVFP4 as uint8 bytes holding two E2M1 codes (low nibble
  = even element) plus uint8 E4M3 group scales (one per 16 along K) and an FP32 global scale.
- Weights are (N, K) row-major (N outputs, K inputs); activations are (m, K) for m rows.
- FP32 arithmetic is done op by op in float32 (each op correctly rounded, as a CUDA build with
  --fmad=false). Where a family fixes a summation order, the module uses `fp32.seq_sum`,
  `fp32.tree_sum` and `fp32.fma_f32` to follow it, and says which order it chose where the math
  leaves one open. Transcendentals (expf, __expf, rsqrtf) are evaluated in float32 with numpy;
  GPU kernels agree with them within the tolerance each family's GPU test states.
- Functions are pure: every constant (epsilons, limits, scales) is an explicit argument; the
  model config (`kbpc.ir.config.ModelConfig`) supplies them at the call site.
"""
