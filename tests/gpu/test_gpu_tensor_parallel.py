"""Tensor-parallel bundles on the GPU (exact numerics: bit for bit against the split math of
kbpc.reference.tensor_parallel, partial outputs summed in rank order).

One GPU: each rank's library runs alone, without NCCL (loopback: the test writes the other ranks'
partial outputs, as the reference computes them, into the collective region before every step);
its own partial at every post-mix and its logits slice must equal the reference's, position after
position. Two GPUs (skipped with fewer): `kbpc run --tp 2` decodes the reference's greedy tokens
and `kbpc verify --numerics` passes over both GPUs, on the tiny example and a full-depth shrink."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from kbpc.bundle.keys import Keyring, Signer
from kbpc.bundle.keystore import generate_keys
from kbpc.compiler import CompileRequest, compile_bundle
from kbpc.frontend.load import blueprint_from_doc, load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.reference.formats import bf16_bits
from kbpc.reference.tensor_parallel import RankedReference
from kbpc.tools.shrink import shrink
from kbpc.weights.synthetic import synthetic_weights

pytestmark = pytest.mark.gpu
DEEP_SIZES = {"hidden": 256, "lin_k_heads": 2, "lin_v_heads": 2, "inter": 512, "moe_inter": 256,
              "shared_inter": 128, "experts": 8, "top_k": 2, "q_lora": 128, "q_heads": 2,
              "index_heads": 4, "index_topk": 16, "vocab": 512}


def _gpus() -> int:
    import pycuda.driver as cuda
    cuda.init()
    return cuda.Device.count()


def _compile(blueprint: Path, root: Path, keys) -> Path:
    out = root / f"{blueprint.stem}-tp2.kbp"
    compile_bundle(CompileRequest(blueprint=blueprint, output=out,
                                  options=Options(tp=2, numerics="exact", max_context=64),
                                  signer=Signer.load(keys.private), cache_dir=root / "cache"))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_path, seed_path):
    root = tmp_path_factory.mktemp("tp")
    keys = generate_keys(root / "keys")
    deep = root / "deep.json"
    seed = load_blueprint(seed_path)
    deep.write_text(json.dumps(shrink(seed, DEEP_SIZES, list(range(len(seed.layers))))))
    return {"tiny": _compile(Path(tiny_path), root, keys), "deep": _compile(deep, root, keys)}, keys, root


def _reference(bundle_blueprint, positions: int):
    plan = run_pipeline(bundle_blueprint, Options(tp=2, numerics="exact", max_context=64))
    ref = RankedReference(plan, synthetic_weights(bundle_blueprint, 0), positions)
    steps, token = [], 1
    for _ in range(positions):
        logits, nxt = ref.step(token)
        parts = [[bf16_bits(np.asarray(p, np.float32)) for p in site] for site in ref.partials]
        steps.append((token, np.asarray(logits, np.float32).ravel(), parts))
        token = nxt
    return plan, steps


@pytest.mark.parametrize("slots,base,count", [(2, 4, 4), (8, 0, 96), (77, 144, 144), (300, 5, 3)])
def test_own_experts_through_the_product_launcher(tiny_path, slots, base, count):
    """tp_collective.cuh's id rewrite, taken from rank 1's step of the tiny example (expert
    parallel), on fresh random ids (empty slots included) against the reference's rule."""
    from kbpc.codegen.emit import build_step
    from kbpc.codegen.records import Launch
    from kbpc.passes.split_tensor_parallel import rank_plan
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher

    plan = run_pipeline(load_blueprint(tiny_path), Options(tp=2))
    step = build_step(rank_plan(plan, 1), "x")
    own = next(l for g in step.groups for l in g.launches if isinstance(l, Launch) and l.instance.family == "tp")
    rng = np.random.default_rng()
    ids = rng.integers(-1, base + 2 * count + 3, slots).astype(np.int32)
    want = np.where((ids >= base) & (ids < base + count), ids - base, -1)
    buf = gpu.to_gpu(ids)
    run = launcher(own.instance)
    run((-(-slots // 64), 1, 1), (64, 1, 1), buf, slots, base, count)
    assert np.array_equal(gpu.fetch(buf, "ids"), want)


@pytest.mark.parametrize("name,positions", [("tiny", 12), ("deep", 3)])
def test_each_rank_alone_matches_the_split_reference(built, name, positions):
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.runtime.tp_backend import TpRankBackend, open_rank_library

    paths, keys, _ = built
    model = load_bundle_model(paths[name], Keyring.load(keys.public))
    plan, steps = _reference(model.blueprint, positions)
    for shard in plan.parallel.shards:
        first, count = shard.vocab
        with tempfile.TemporaryDirectory() as tmp:
            lib = open_rank_library(model, shard.rank, Path(tmp))
            rank = TpRankBackend(model, lib, shard.rank, None, "synthetic:0")
            try:
                for pos, (token, logits, parts) in enumerate(steps):
                    others = [{q: p for q, p in enumerate(site)} for site in parts]
                    got, own = rank.step_alone(token, others)
                    for i, site in enumerate(parts):
                        assert np.array_equal(own[i].ravel(), site[shard.rank].ravel()), \
                            f"rank {shard.rank} position {pos}: partial {plan.parallel.shards[0].partials[i]}"
                    assert np.array_equal(got, logits[first:first + count]), f"rank {shard.rank} position {pos}"
            finally:
                rank.close()


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    return subprocess.run([sys.executable, "-m", "kbpc.cli", *args], capture_output=True, text=True, env=env,
                          timeout=900)


@pytest.mark.parametrize("name", ["tiny", "deep"])
def test_two_gpus_decode_and_verify(built, name):
    if _gpus() < 2:
        pytest.skip("needs two GPUs")
    from kbpc.runtime.bundle_model import load_bundle_model

    paths, keys, _ = built
    model = load_bundle_model(paths[name], Keyring.load(keys.public))
    _, steps = _reference(model.blueprint, 8)
    run = _cli("run", str(paths[name]), "--tp", "2", "--max-new-tokens", "8", "--prompt-ids", "1",
               "--json", "--trust", str(keys.public))
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    # greedy from token 1: the reference's own tokens after the prompt
    assert got["generated_ids"] == [t for t, _, _ in steps[1:]] + [got["generated_ids"][-1]]
    verify = _cli("verify", str(paths[name]), "--numerics", "--positions", "16", "--trust", str(keys.public))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "max rel L2 0.000e+00" in verify.stdout
