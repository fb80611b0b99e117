"""`kbpc compile` end to end on a machine without a GPU: the tiny example and the seed build for
sm_90 and sm_121, the result verifies, a second compile is byte-identical (signatures aside) and
comes from the object cache, and a tampered bundle is refused by verify, inspect and run."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbpc.bundle.keystore import generate_keys
from kbpc.cli import main
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline

pytestmark = pytest.mark.nvcc


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return generate_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def cache(build_cache):
    return build_cache


def compile_(blueprint: Path, out: Path, keys, cache, *extra) -> None:
    result = CliRunner().invoke(main, ["compile", str(blueprint), "-o", str(out), "--key", str(keys.private),
                                       "--cache-dir", str(cache), "--verify", *extra])
    assert result.exit_code == 0, result.output
    assert out.exists()


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist() if n != "signature.json"}


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory, tiny_path, keys, cache):
    out = tmp_path_factory.mktemp("out") / "tiny.kbp"
    compile_(tiny_path, out, keys, cache)
    return out


def test_tiny_compiles_verifies_and_reproduces(tiny_bundle, tiny_path, keys, cache, tmp_path):
    result = CliRunner().invoke(main, ["verify", str(tiny_bundle), "--trust", str(keys.public)])
    assert result.exit_code == 0, result.output
    again = tmp_path / "again.kbp"
    compile_(tiny_path, again, keys, cache)
    assert members(again) == members(tiny_bundle)
    manifest = json.loads(members(again)["manifest.json"])
    assert manifest["target"] == "sm_90" and manifest["kind"] == "lite"
    assert any(m["path"] == "lib/rank0/libkbp.so" for m in manifest["members"])


def test_bundle_sources_hold_every_header_they_include(tiny_bundle):
    """src/ rebuilds on its own: every quoted #include of a shipped source or header names a shipped
    header, also two levels down (glm_mhc_boundary.cuh -> glm_mhc.cuh -> glm_moe_combine.cuh)."""
    files = members(tiny_bundle)
    shipped = {Path(n).name for n in files if n.startswith("src/")}
    included = {line.split('"')[1] for n, data in files.items() if n.startswith("src/")
                for line in data.decode().splitlines() if line.startswith('#include "')}
    assert "glm_moe_combine.cuh" in included
    assert included <= shipped, sorted(included - shipped)


def test_tiny_for_sm121(tiny_path, keys, cache, tmp_path):
    out = tmp_path / "tiny121.kbp"
    compile_(tiny_path, out, keys, cache, "--target", "sm_121")
    assert json.loads(members(out)["manifest.json"])["target"] == "sm_121"


def test_tampered_bundle_is_refused_everywhere(tiny_bundle, keys, tmp_path):
    data = bytearray(tiny_bundle.read_bytes())
    data[len(data) // 3] ^= 0x01
    bad = tmp_path / "bad.kbp"
    bad.write_bytes(bytes(data))
    for args in (["verify", str(bad)], ["inspect", str(bad)], ["run", str(bad), "--max-new-tokens", "1"]):
        result = CliRunner().invoke(main, [*args, "--trust", str(keys.public)])
        assert result.exit_code == 3, (args, result.output)   # verification failed
        assert "Traceback" not in result.output


def test_failed_compile_leaves_nothing(tiny_path, keys, cache, tmp_path):
    out = tmp_path / "never.kbp"
    result = CliRunner().invoke(main, ["compile", str(tiny_path), "-o", str(out), "--key", str(keys.private),
                                       "--cache-dir", str(cache), "--tp", "3"])
    assert result.exit_code == 2 and "does not split over 3 ranks" in result.output
    assert not out.exists() and not list(tmp_path.glob("*.kbp*"))


def test_bundle_runs_on_reference_backend(tiny_bundle, keys):
    result = CliRunner().invoke(main, ["run", str(tiny_bundle), "--trust", str(keys.public), "--backend",
                                       "reference", "--max-new-tokens", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["backend"] == "reference"


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_90", "sm_121"])
def test_seed_compiles(seed_path, keys, cache, tmp_path, target):
    out = tmp_path / f"seed-{target}.kbp"
    compile_(seed_path, out, keys, cache, "--target", target)
    manifest = json.loads(members(out)["manifest.json"])
    # the blueprint's 908 groups, less one for each group the fusion pass merged into another, plus
    # one for each pre-mix whose gates + Sinkhorn the step issues aside (glm_mhc.GATES_ASIDE)
    from kbpc.codegen.families.glm_mhc import GATES_ASIDE
    plan = run_pipeline(load_blueprint(seed_path), Options(target=target))
    merged = sum(len(f.groups) - 1 for f in plan.fusions if f.applied)
    aside = sum(any(plan.blueprint.node_by_id[n].op == "hc_pre" for n in g.nodes) for g in plan.groups)
    assert merged and aside == 90
    assert manifest["step"]["groups"] == 908 - merged + aside * GATES_ASIDE and manifest["target"] == target


def test_build_report_and_manifest_follow_their_schemas(tiny_path, keys, cache, tmp_path):
    import jsonschema

    schemas = Path(__file__).resolve().parents[2] / "docs" / "schemas"
    out, report_file = tmp_path / "tiny.kbp", tmp_path / "build.json"
    result = CliRunner().invoke(main, ["compile", str(tiny_path), "-o", str(out), "--key", str(keys.private),
                                       "--cache-dir", str(cache), "--json", "--json-out", str(report_file)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report == json.loads(report_file.read_text())
    jsonschema.validate(report, json.loads((schemas / "kbpc-compile.v1.schema.json").read_text()))
    from kbpc.toolchain.library import runtime_sources
    assert report["objects"]["total"] == len(report["units"]) == report["kernel_instances"] + len(runtime_sources()) + 1
    assert [s["name"] for s in report["stages"]] == ["front end", "passes", "code generation", "nvcc", "bundle"]
    manifest = json.loads(members(out)["manifest.json"])
    jsonschema.validate(manifest, json.loads((schemas / "kbp-bundle.v1.schema.json").read_text()))
    import hashlib
    assert report["manifest_sha256"] == hashlib.sha256(members(out)["manifest.json"]).hexdigest()


def test_fp8_index_cache_at_512k_is_recorded_and_followed(tiny_path, keys, cache, tmp_path):
    """--index-cache fp8 with the blueprint's full context: recorded in the signed manifest, state
    sized for 512k tokens, and the reference backend runs the bundle with the FP8 cache."""
    out = tmp_path / "tiny-fp8.kbp"
    compile_(tiny_path, out, keys, cache, "--index-cache", "fp8", "--max-context", "524288")
    manifest = json.loads(members(out)["manifest.json"])
    assert manifest["options"]["index_cache"] == "fp8" and manifest["options"]["max_context"] == 524288
    state = {s["name"]: s for s in manifest["state"]}
    codes = [s for n, s in state.items() if n.endswith(".pool_codes")]
    assert codes and all(s["bytes"] == 524288 // 4 * 128 for s in codes)
    assert not any(n.endswith(".pool_keys") for n in state)
    result = CliRunner().invoke(main, ["run", str(out), "--trust", str(keys.public), "--backend", "reference",
                                       "--max-new-tokens", "2", "--json"])
    assert result.exit_code == 0, result.output


def test_no_act_quant_build_is_recorded_and_refused_where_it_does_not_apply(tiny_path, tiny_bundle, keys, cache,
                                                                          tmp_path):
    """--no-act-quant (a debugging build): the dequantizing kernels compile for sm_90, the signed
    manifest records it, inspect says so, the reference backend runs the bundle unquantized, and a
    bundle that quantizes activations is refused for a --no-act-quant GPU run (before any GPU is
    touched)."""
    out = tmp_path / "tiny-noquant.kbp"
    compile_(tiny_path, out, keys, cache, "--no-act-quant")
    manifest = json.loads(members(out)["manifest.json"])
    assert manifest["options"]["act_quant"] is False
    assert any(s["storage"] == "f32" for s in manifest["state"] if s["name"].endswith(".latent_cache"))
    shown = CliRunner().invoke(main, ["inspect", str(out), "--trust", str(keys.public)])
    assert shown.exit_code == 0 and "activations unquantized" in shown.output, shown.output
    ran = CliRunner().invoke(main, ["run", str(out), "--trust", str(keys.public), "--backend", "reference",
                                    "--max-new-tokens", "2", "--json"])
    assert ran.exit_code == 0, ran.output
    refused = CliRunner().invoke(main, ["run", str(tiny_bundle), "--trust", str(keys.public), "--backend", "cuda",
                                        "--no-act-quant", "--max-new-tokens", "2"])
    assert refused.exit_code == 2 and "quantizes activations" in refused.output, refused.output
