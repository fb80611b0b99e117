"""Weights bound to a bundle: a lite bundle accepts only the checkpoint it records (each file
streamed once, its hash checked as it loads), a full bundle runs on its embedded weights, a
checkpoint that lacks the blueprint's tensors is refused at compile time before nvcc, and the
streaming reader hands every needed byte to the loader exactly once whatever the chunking."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kbpc.bundle.container import Member, write_bundle
from kbpc.bundle.keys import Signer
from kbpc.bundle.keystore import generate_keys
from kbpc.cli import main
from kbpc.frontend.load import load_blueprint
from kbpc.ir.weights import weight_specs
from kbpc.weights.binding import stream_file
from kbpc.weights.checkpoint import write_checkpoint
from kbpc.weights.synthetic import synthetic_weights


@pytest.fixture(scope="module")
def tiny(tiny_path):
    bp = load_blueprint(tiny_path)
    return bp, weight_specs(bp)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny) -> Path:
    bp, specs = tiny
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    write_checkpoint(path, synthetic_weights(bp, 7), specs)
    return path


@pytest.fixture
def keys(tmp_path):
    return generate_keys(tmp_path / "keys")


def _bundle(out: Path, tiny_path: Path, specs, keys, checkpoint: Path | None, embed: bool) -> Path:
    manifest = {"kind": "full" if embed else "lite", "blueprint_id": "tiny", "plan_digest": "0" * 64,
                "target": "sm_90", "tp_size": 1, "options": {"max_context": 64, "numerics": "exact"},
                "library": {"rank0": "lib/rank0/libkbp.so"}, "state": [],
                "weights": [{"name": s.name, "storage": s.storage, "shape": list(s.shape), "bytes": s.nbytes,
                             "experts": s.experts} for s in specs],
                "step": {"launches": 1, "groups": 1}}
    members = [Member("graph.json", data=tiny_path.read_bytes()), Member("lib/rank0/libkbp.so", data=b"\x7fELF")]
    if checkpoint is not None:
        data = checkpoint.read_bytes()
        manifest["checkpoint"] = [{"name": checkpoint.name, "bytes": len(data),
                                   "sha256": hashlib.sha256(data).hexdigest()}]
        if embed:
            members.append(Member(f"weights/{checkpoint.name}", source=checkpoint))
    write_bundle(out, manifest, members, Signer.load(keys.private))
    return out


def _run(bundle: Path, keys, *extra) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", str(bundle), "--trust", str(keys.public), "--backend", "reference",
                                       "--max-new-tokens", "2", "--json", *map(str, extra)])
    return result.exit_code, result.output


def _ids(output: str) -> list[int]:
    return json.loads(output)["generated_ids"]


def test_lite_bundle_checks_its_checkpoint(tmp_path, tiny_path, tiny, checkpoint, keys):
    bundle = _bundle(tmp_path / "lite.kbp", tiny_path, tiny[1], keys, checkpoint, embed=False)
    code, out = _run(bundle, keys, "--weights", checkpoint)
    assert code == 0, out
    code, synthetic = _run(bundle, keys, "--weights", "synthetic:7")   # the same values, generated
    assert code == 0 and _ids(out) == _ids(synthetic)
    flipped = tmp_path / "other" / checkpoint.name
    flipped.parent.mkdir()
    data = bytearray(checkpoint.read_bytes())
    data[-3] ^= 0x01
    flipped.write_bytes(bytes(data))
    code, out = _run(bundle, keys, "--weights", flipped)
    assert code == 3 and "not the checkpoint file the bundle was compiled for" in out
    renamed = tmp_path / "renamed.safetensors"
    renamed.write_bytes(checkpoint.read_bytes())
    code, out = _run(bundle, keys, "--weights", renamed)
    assert code == 3 and "not here" in out


def test_full_bundle_runs_on_its_embedded_weights(tmp_path, tiny_path, tiny, checkpoint, keys):
    bundle = _bundle(tmp_path / "full.kbp", tiny_path, tiny[1], keys, checkpoint, embed=True)
    code, embedded = _run(bundle, keys)
    assert code == 0, embedded
    _, seed7 = _run(bundle, keys, "--weights", "synthetic:7")
    _, seed0 = _run(bundle, keys, "--weights", "synthetic:0")
    assert _ids(embedded) == _ids(seed7) != _ids(seed0)
    lite = _bundle(tmp_path / "lite.kbp", tiny_path, tiny[1], keys, checkpoint, embed=False)
    code, out = _run(lite, keys, "--weights", "embedded")
    assert code == 2 and "embeds no weights" in out


def test_compile_refuses_a_checkpoint_without_the_tensors_before_nvcc(tmp_path, tiny_path, tiny, keys,
                                                                      monkeypatch):
    bp, specs = tiny
    def no_build(*_args, **_kwargs):
        raise AssertionError("nvcc ran before the checkpoint was checked")
    monkeypatch.setattr("kbpc.compiler.build_library", no_build)
    empty = tmp_path / "other.safetensors"
    write_checkpoint(empty, {}, [])
    partial = tmp_path / "partial.safetensors"
    write_checkpoint(partial, synthetic_weights(bp, 1), specs[:3])
    for path, words in ((empty, "holds none"), (partial, f"holds only 3 of {len(specs)}")):
        for extra in ((), ("--embed-weights",)):
            result = CliRunner().invoke(main, ["compile", str(tiny_path), "-o", str(tmp_path / "x.kbp"), "--key",
                                               str(keys.private), "--weights", str(path), *extra])
            assert result.exit_code == 2 and words in result.output, result.output
    assert not (tmp_path / "x.kbp").exists()


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_streaming_reads_each_byte_once(checkpoint, tiny, chunk):
    bp, specs = tiny
    data = checkpoint.read_bytes()
    served = []

    def chunks():
        for i in range(0, len(data), chunk):
            served.append(min(chunk, len(data) - i))
            yield data[i:i + chunk]
    got = {s.name: bytearray(s.nbytes) for s in specs}
    seen = {s.name: 0 for s in specs}

    def sink(spec, offset, view):
        got[spec.name][offset:offset + len(view)] = view
        seen[spec.name] += len(view)

    sha, size, held = stream_file("model.safetensors", chunks(), specs, sink)
    assert sum(served) == size == len(data) and sha == hashlib.sha256(data).hexdigest()
    assert held == {s.name for s in specs} and all(seen[s.name] == s.nbytes for s in specs)
    weights = synthetic_weights(bp, 7)
    for s in specs[:: max(1, len(specs) // 10)]:
        assert bytes(got[s.name]) == np.ascontiguousarray(weights[s.name]).tobytes()
