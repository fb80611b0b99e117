"""The tiny GLM-5-next checkpoint (transformers + NVIDIA ModelOpt NVFP4 export) on the GPU, through
exactly the user's command: `kbpc run BLUEPRINT --weights DIR --backend cuda --logits FILE.npy`
(compiled for the local GPU with the checkpoint's model config, weights converted node by node
and streamed to the device).

(b) as exported: RMS difference to transformers' logits over all positions <= 0.5 of the logit
standard deviation (the issue's bound; CPU reference measured ~0.36). (a) needs activations
without quantization, which only the reference backend offers (`--no-act-quant`); on the GPU the
step is instead held bit for bit to the reference backend on the same weights and tokens in exact
mode (`kbpc run --numerics exact`); the default fast mode is held to (b)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kbpc.testing.compare import logit_rms_over_std, same_greedy

pytestmark = pytest.mark.gpu


def _run(blueprint, checkpoint, tokens, out, backend: str, numerics: str = "fast") -> np.ndarray:
    cmd = [sys.executable, "-m", "kbpc.cli", "run", str(blueprint), "--weights", str(checkpoint),
           "--backend", backend, "--prompt-ids", ",".join(map(str, tokens)), "--max-new-tokens", "1",
           "--logits", str(out), "--json", "--numerics", numerics]
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
