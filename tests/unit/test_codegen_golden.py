"""Golden test of code generation: the tiny example's generated sources are byte-identical to the
recorded ones (scripts/record_codegen_golden.py), every file opens with the do-not-edit header
naming the blueprint and plan digest, and --dump-dir writes every stage."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kbpc.codegen.emit import generate
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import PIPELINE, run_pipeline

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import record_codegen_golden  # noqa: E402


def test_generated_sources_match_golden():
    want = json.loads(record_codegen_golden.GOLDEN.read_text())
    got = record_codegen_golden.digests()
    changed = sorted(set(want.items()) ^ set(got.items()))
    assert got == want, f"generated code changed ({len(changed)} entries); if intended, re-record: {changed[:4]}"


def test_every_file_names_its_origin(tiny_path):
    plan = run_pipeline(load_blueprint(tiny_path), Options())
    files = generate(plan, "kbpc compile tiny").files
    for path, text in files.items():
        head = "\n".join(text.splitlines()[:3])
        assert "DO NOT EDIT" in head and plan.blueprint.meta.blueprint_id in head and plan.digest in head, path
    assert all("used by group" in t for p, t in files.items() if p.startswith("src/kernels/"))


def test_dump_dir_writes_every_stage(tiny_path, tmp_path):
    run_pipeline(load_blueprint(tiny_path), Options(), dump_dir=tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"{i:02d}-{name}.json" for i, (name, _) in enumerate(PIPELINE)]
    last = json.loads((tmp_path / names[-1]).read_text())
    assert last["buffers"] and last["schedule"] and last["weights"]
