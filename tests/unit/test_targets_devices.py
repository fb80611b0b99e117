"""Targets and GPUs: the compute capability -> target table, the check that refuses a bundle built
for another GPU (before its code is loaded), which backend `kbpc run` picks, the cache key of
compile-on-run (blueprint, target, signing key, kbpc's sources), and the copy-bandwidth
arithmetic of `kbpc bench` (on a fake driver; the GPU test runs it for real)."""
from __future__ import annotations

import pytest

import kbpc.compiler as compiler
from kbpc.bundle.keys import Signer
from kbpc.bundle.keystore import generate_keys
from kbpc.errors import DeviceError, KbpcError
from kbpc.runtime import device as devmod
from kbpc.runtime import select
from kbpc.targets import TARGETS, target_for_capability


def test_every_target_has_its_capability():
    for name, target in TARGETS.items():
        assert target_for_capability(target.capability).name == name
    with pytest.raises(KbpcError, match="compute capability 8.9"):
        target_for_capability((8, 9))


def test_bundle_for_another_gpu_is_refused_with_both_names():
    h200 = devmod.device_from("NVIDIA H200", (9, 0))
    devmod.check_bundle_target("sm_90", h200)
    with pytest.raises(DeviceError) as info:
        devmod.check_bundle_target("sm_121", h200)
    text = str(info.value)
    assert "built for sm_121 (GB10" in text and "this GPU is sm_90 (NVIDIA H200, compute capability 9.0)" in text
    assert "--target sm_90" in text
    old = devmod.device_from("Tesla V100", (7, 0))
    with pytest.raises(DeviceError, match="cannot build for this GPU"):
        devmod.check_bundle_target("sm_90", old)


def test_backend_choice(tmp_path, tiny_path, monkeypatch):
    bundle = tmp_path / "m.kbp"
    bundle.write_bytes(b"PK\x03\x04rest")
    monkeypatch.setattr(select, "gpu_present", lambda: True)
    monkeypatch.setattr(select.shutil, "which", lambda name: None)    # no nvcc
    assert select.choose_backend(bundle, "auto") == "cuda"
    assert select.choose_backend(tiny_path, "auto") == "reference"
    with pytest.raises(KbpcError, match="nvcc"):
        select.choose_backend(tiny_path, "cuda")
    monkeypatch.setattr(select.shutil, "which", lambda name: "/usr/bin/nvcc")
    assert select.choose_backend(tiny_path, "auto") == "cuda"
    monkeypatch.setattr(select, "gpu_present", lambda: False)
    assert select.choose_backend(tiny_path, "auto") == "reference"
    with pytest.raises(KbpcError, match="no such file"):
        select.choose_backend(tmp_path / "missing.json", "auto")


def test_compile_for_run_key(tmp_path, tiny_path, monkeypatch):
    monkeypatch.setenv("KBPC_CACHE_DIR", str(tmp_path / "cache"))
    keys = [generate_keys(tmp_path / "k1").private, generate_keys(tmp_path / "k2").private]
    current = {"key": keys[0], "sources": "v1"}
    built = []
    monkeypatch.setattr(compiler, "signing_key", lambda *a: Signer.load(current["key"]))
    monkeypatch.setattr(compiler, "sources_digest", lambda: current["sources"])

    def fake_compile(req):
        built.append(req)
        req.output.parent.mkdir(parents=True, exist_ok=True)
        req.output.write_bytes(b"bundle")
    monkeypatch.setattr(compiler, "compile_bundle", fake_compile)

    first, ring = compiler.compile_for_run(tiny_path, None, 32, "sm_90")
    assert built[-1].options.target == "sm_90" and set(ring._keys) == set(Signer.load(keys[0]).key_ids)
    assert compiler.compile_for_run(tiny_path, None, 32, "sm_90")[0] == first and len(built) == 1  # reused
    paths = {first}
    for change in ("target", "key", "sources", "context"):
        if change == "key":
            current["key"] = keys[1]
        if change == "sources":
            current["sources"] = "v2"
        out, _ = compiler.compile_for_run(tiny_path, None, 64 if change == "context" else 32,
                                          "sm_121" if change == "target" else "sm_90")
        paths.add(out)
    assert len(paths) == 5 and len(built) == 5
    assert built[1].options.target == "sm_121"


class _FakeEvent:
    clock = 0.0

    def record(self):
        _FakeEvent.clock += 0.5          # each record: half a millisecond later
        self.t = _FakeEvent.clock

    def synchronize(self):
        pass

    def time_since(self, other):
        return self.t - other.t


class _FakeBuffer:
    def free(self):
        pass


class _FakeCuda:
    Event = _FakeEvent
    copies = 0

    def mem_alloc(self, n):
        return _FakeBuffer()

    def memcpy_dtod(self, dst, src, n):
        _FakeCuda.copies += 1


def test_copy_bandwidth_counts_read_and_write():
    cuda = _FakeCuda()
    bw = devmod.measure_copy_bandwidth(cuda, nbytes=1 << 20, repeats=4)
    assert bw == pytest.approx(2 * (1 << 20) / 0.5e-3)
    assert _FakeCuda.copies == 5      # one warm-up, four timed
