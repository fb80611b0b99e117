"""The tiny GLM-5-next checkpoint (transformers + NVIDIA ModelOpt NVFP4 export) on the GPU, through
exactly the user's command: `kbpc run BLUEPRINT --weights DIR --backend cuda --logits FILE.npy`
(compiled for the local GPU with the checkpoint's model config, weights converted node by node
and streamed to the device).

(a) activation quantization off on both sides (`kbpc run ... --backend cuda --no-act-quant`: the
blueprint is compiled without activation quantization, dequantizing GEMVs and an FP32 latent
cache; transformers in FP32): RMS difference <= 0.05 of the logit standard deviation at every
position and the same greedy token at >= 90% of them.
(b) as exported: RMS difference to transformers' logits over all positions <= 0.5 of the logit
standard deviation (the issue's bound; CPU reference measured ~0.36). Besides, the step is held
bit for bit to the reference backend on the same weights and tokens in exact mode
(`kbpc run --numerics exact`); the default fast mode is held to (b)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kbpc.testing.compare import logit_rms_over_std, same_greedy

pytestmark = pytest.mark.gpu


def _run(blueprint, checkpoint, tokens, out, backend: str, numerics: str = "fast", *extra: str) -> np.ndarray:
    cmd = [sys.executable, "-m", "kbpc.cli", "run", str(blueprint), "--weights", str(checkpoint),
           "--backend", backend, "--prompt-ids", ",".join(map(str, tokens)), "--max-new-tokens", "1",
           "--logits", str(out), "--json", "--numerics", numerics, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr
    return np.load(out)


def test_checkpoint_on_the_gpu(glm5next_blueprint, glm5next_checkpoint, glm5next_oracle, tmp_path):
    tokens = glm5next_oracle["token_ids"]
    gpu = _run(glm5next_blueprint, glm5next_checkpoint, tokens, tmp_path / "gpu.npy", "cuda")
    exact = _run(glm5next_blueprint, glm5next_checkpoint, tokens, tmp_path / "exact.npy", "cuda", "exact")
    ref = _run(glm5next_blueprint, glm5next_checkpoint, tokens, tmp_path / "ref.npy", "reference")
    per_position, overall = logit_rms_over_std(gpu, glm5next_oracle["actquant_fp32"])
    rel_fast = float(np.linalg.norm(gpu - ref) / np.linalg.norm(ref))
    rel_exact = float(np.linalg.norm(exact - ref) / np.linalg.norm(ref))
    print(f"(b) GPU (fast) vs transformers: overall {overall:.4f}, per position median "
          f"{np.median(per_position):.4f} max {per_position.max():.4f}; GPU vs reference: relative L2 "
          f"{rel_exact:.2e} exact mode, {rel_fast:.2e} fast mode (same greedy {same_greedy(gpu, ref):.3f})")
    assert gpu.shape == glm5next_oracle["actquant_fp32"].shape
    assert overall <= 0.5
    # exact mode is the reference's arithmetic; fast mode's projection rounding, amplified by 4-bit
    # activation quantization of a tiny random model, is held to the (b) bound above
    assert rel_exact == 0.0 and same_greedy(exact, ref) == 1.0


def test_a_on_the_gpu_without_activation_quantization(glm5next_blueprint, glm5next_checkpoint, glm5next_oracle,
                                                       tmp_path):
    tokens = glm5next_oracle["token_ids"]
    gpu = _run(glm5next_blueprint, glm5next_checkpoint, tokens, tmp_path / "gpu.npy", "cuda", "fast",
               "--no-act-quant")
    ref = _run(glm5next_blueprint, glm5next_checkpoint, tokens, tmp_path / "ref.npy", "reference", "fast",
               "--no-act-quant")
    oracle = glm5next_oracle["noquant_fp32"]
    per_position, overall = logit_rms_over_std(gpu, oracle)
    rel = float(np.linalg.norm(gpu - ref) / np.linalg.norm(ref))
    print(f"(a) GPU (no activation quantization) vs transformers FP32: per position max {per_position.max():.4f}, "
          f"median {np.median(per_position):.4f}, overall {overall:.4f}, same greedy "
          f"{same_greedy(gpu, oracle):.3f}; GPU vs the unquantized reference: relative L2 {rel:.2e}")
    assert gpu.shape == oracle.shape
    assert per_position.max() <= 0.05, per_position.round(4).tolist()
    assert same_greedy(gpu, oracle) >= 0.9
    assert rel <= 1e-2
