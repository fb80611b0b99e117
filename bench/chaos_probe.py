"""How far rounding flips travel: the reference interpreter run twice on the same blueprint,
weights and teacher-forced tokens, the second time with a small share of the BF16 values that
projections output moved by one BF16 ulp (random sign, each value with probability --flip-rate, at
every projection and position): what a different summation order does to values that lie near a
rounding boundary, which is all a `fast` projection changes. Reported per position: the relative
L2 of the logits between the two runs and whether their greedy tokens agree, with activation
quantization on (as the blueprint says) and off (kbpc/reference/no_act_quant.py).

If such flips grow to O(1) with activation quantization on and stay small without it, no
implementation that is not bit-exact can meet a teacher-forced logits criterion on that model:
a property of the model (random weights, 4- and 8-bit activation quantization at every
projection), not of the kernels.

    python3 bench/chaos_probe.py out/deep.json --positions 32 --flip-rate 1e-3 [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kbpc.frontend.load import load_blueprint  # noqa: E402
from kbpc.reference import no_act_quant, ops  # noqa: E402
from kbpc.reference.formats import bf16_bits, bf16_from_bits  # noqa: E402
from kbpc.reference.interpreter import Interpreter  # noqa: E402
from kbpc.runtime.reference_backend import load_weights  # noqa: E402


def _flipping(handler, rate: float, rng: np.random.Generator):
    """`handler` whose BF16 projection outputs have each value moved by one BF16 ulp (random
    sign) with probability `rate`; other ops and FP32 outputs are untouched."""
    def run(s, node, ins):
        out = handler(s, node, ins)
        if node.op_base != "linear" or isinstance(out, dict):
            return out
        x = np.array(out, np.float32, copy=True)
        if not np.array_equal(x, bf16_from_bits(bf16_bits(x))):
            return out   # an FP32 output (router logits, mixes): not a BF16 rounding point
        flat = x.reshape(-1)
        hit = np.flatnonzero(rng.random(flat.size) < rate)
        if hit.size:
            step = np.where(rng.random(hit.size) < 0.5, -1, 1).astype(np.int64)
            bits = bf16_bits(flat[hit]).astype(np.int64) + step
            flat[hit] = bf16_from_bits(np.clip(bits, 0, 0xFFFF).astype(np.uint16))
        return x
    return run


def trace(bp, weights, tokens, act_quant: bool, rate: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    table = {op: _flipping(handler, rate, rng)
             for op, handler in (ops.HANDLERS if act_quant else no_act_quant.HANDLERS).items()}
    interp = Interpreter(bp, weights, len(tokens) + 1, table)
    return [interp.step(t)[0].astype(np.float64) for t in tokens]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("blueprint", type=Path)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--weights", default="synthetic:0")
    ap.add_argument("--flip-rate", type=float, default=1e-3, help="share of BF16 projection outputs moved by one ulp")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    bp = load_blueprint(args.blueprint)
    weights = load_weights(bp, args.weights, args.positions + 1)
    result = {"blueprint": str(args.blueprint), "layers": len(bp.layers), "positions": args.positions,
              "flip_rate": args.flip_rate, "seed": args.seed, "modes": {}}
    for act_quant in (True, False):
        t0 = time.perf_counter()
        base_interp = Interpreter(bp, weights, args.positions + 1, None if act_quant else no_act_quant.HANDLERS)
        tokens, base, token = [], [], 1
        for _ in range(args.positions):   # the unperturbed run's greedy tokens feed both runs
            logits, nxt = base_interp.step(token)
            tokens.append(token)
            base.append(logits.astype(np.float64))
            token = nxt
        nudged = trace(bp, weights, tokens, act_quant, args.flip_rate, args.seed)
        rel = [float(np.linalg.norm(b - n) / (np.linalg.norm(b) or 1.0)) for b, n in zip(base, nudged)]
        same = [int(np.argmax(b)) == int(np.argmax(n)) for b, n in zip(base, nudged)]
        mode = "act_quant" if act_quant else "no_act_quant"
        result["modes"][mode] = {"rel_l2": rel, "same_greedy": sum(same) / len(same),
                                 "seconds": time.perf_counter() - t0}
        print(f"{mode:>13}: rel L2 at positions 0/1/4/16/last: "
              + " ".join(f"{rel[i]:.2e}" for i in sorted({0, 1, 4, 16, len(rel) - 1} & set(range(len(rel)))))
              + f"; max {max(rel):.2e}; same greedy {100 * sum(same) / len(same):.0f}%"
              f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
