"""Record the tiny example's reference run (ids + logits checksum) that tests/unit/test_reference_run.py
guards. Re-record only when a numerics change is intended, and say so in the commit.

    python3 scripts/record_golden.py
"""
from __future__ import annotations

import json
from pathlib import Path

from kbpc.frontend.load import load_blueprint
from kbpc.runtime.generate import generate
from kbpc.runtime.reference_backend import ReferenceBackend, load_weights

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "tiny_reference_run.json"
PROMPT, NEW_TOKENS, WEIGHTS = [1, 2, 3], 32, "synthetic:0"


def record() -> dict:
    bp = load_blueprint(REPO / "examples" / "tiny.graph.json")
    result = generate(ReferenceBackend(bp, load_weights(bp, WEIGHTS), len(PROMPT) + NEW_TOKENS),
                      PROMPT, NEW_TOKENS)
    return {"blueprint_id": bp.meta.blueprint_id, "weights": WEIGHTS, "prompt_ids": PROMPT,
            "generated_ids": result.generated_ids, "logits_sha256": result.logits_sha256}


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
