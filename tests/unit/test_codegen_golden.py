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
    """The step program names the blueprint, plan digest and each launch's group; a kernel instance
    TU names only what decides its code (so a plan change that keeps the kernel keeps its bytes)."""
    plan = run_pipeline(load_blueprint(tiny_path), Options())
    files = generate(plan, "kbpc compile tiny").files
    step = files["src/step.cu"]
    head = "\n".join(step.splitlines()[:3])
    assert "DO NOT EDIT" in head and plan.blueprint.meta.blueprint_id in head and plan.digest in head
    assert all(f"// group {g.id} " in step for g in plan.groups if g.where == "device")
    kernels = {p: t for p, t in files.items() if p.startswith("src/kernels/")}
    assert kernels
    for path, text in kernels.items():
        head = "\n".join(text.splitlines()[:3])
        assert "DO NOT EDIT" in head and path.rsplit("/", 1)[-1][:-3] in head, path
        assert plan.digest not in text and plan.blueprint.meta.blueprint_id not in text, path


def test_kernel_sources_do_not_depend_on_the_plan(tiny_path):
    """Changing an option that only changes the plan (max context) rebuilds no kernel."""
    small = generate(run_pipeline(load_blueprint(tiny_path), Options(max_context=256)), "a").files
    large = generate(run_pipeline(load_blueprint(tiny_path), Options(max_context=8192)), "b").files
    assert small["src/step.cu"] != large["src/step.cu"]
    assert {p: t for p, t in small.items() if p.startswith("src/kernels/")} == \
        {p: t for p, t in large.items() if p.startswith("src/kernels/")}


def test_dump_dir_writes_every_stage(tiny_path, tmp_path):
    run_pipeline(load_blueprint(tiny_path), Options(), dump_dir=tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"{i:02d}-{name}.json" for i, (name, _) in enumerate(PIPELINE)]
    last = json.loads((tmp_path / names[-1]).read_text())
    assert last["buffers"] and last["schedule"] and last["weights"]
