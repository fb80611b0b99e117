"""Record the SHA-256 of every source generated for the tiny example (sm_90), which
tests/unit/test_codegen_golden.py guards: a refactor that changes no behaviour changes no byte.
Re-record only for an intended change to generated code, and say so in the commit.

    python3 scripts/record_codegen_golden.py
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kbpc.codegen.emit import generate
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "tiny_sources_sm90.json"
COMMAND = "kbpc compile tiny.graph.json --target sm_90 --max-context 4096"


def digests() -> dict[str, str]:
    plan = run_pipeline(load_blueprint(REPO / "examples" / "tiny.graph.json"), Options())
    files = generate(plan, COMMAND).files
    return {path: hashlib.sha256(text.encode()).hexdigest() for path, text in sorted(files.items())}


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(digests(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
