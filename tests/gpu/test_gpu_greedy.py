"""The greedy token on the GPU (runtime_stub/kbp_greedy.cu) against argmax_host's math.

Every row is written into a compiled tiny bundle's logits buffer and picked by `kbp_greedy`, the
path `kbpc run --no-digest` and `kbpc bench` take each step; the answer must be the host scan's
index exactly (argmax_scan, the literal loop), and the non-finite count numpy's. Rows: fresh random
BF16 values (seed in the failure message) at the tiny vocabulary, and through the library's
`kbp_greedy_enqueue` at lengths around the kernel's CTA size and its grid cap (160 CTAs of 1024
logits, beyond which threads stride), then the cases the scan's strict > decides: repeated maxima,
-0 before +0, NaN and infinities, all -inf, all NaN. A decode over several positions then holds
the step's token to the host argmax of the logits it returns, and `next_token` to `step`."""
from __future__ import annotations

from pathlib import Path

import ctypes

import numpy as np
import pytest

from kbpc.bundle.keys import Keyring, Signer
from kbpc.bundle.keystore import generate_keys
from kbpc.compiler import CompileRequest, compile_bundle
from kbpc.ir.plan import Options
from kbpc.reference.argmax_host import argmax_host, argmax_scan
from kbpc.reference.formats import bf16_bits, bf16_from_bits

pytestmark = pytest.mark.gpu

NAN, INF, NEG_ZERO, POS_ZERO = 0x7FC0, 0x7F80, 0x8000, 0x0000
NEG_INF = 0xFF80


@pytest.fixture(scope="module")
def backend(tmp_path_factory, tiny_path):
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.runtime.cuda_backend import CudaBackend

    root = tmp_path_factory.mktemp("greedy")
    keys = generate_keys(root / "keys")
    path = root / "tiny.kbp"
    compile_bundle(CompileRequest(blueprint=Path(tiny_path), output=path, options=Options(max_context=16),
                                  signer=Signer.load(keys.private), cache_dir=root / "cache"))
    b = CudaBackend(load_bundle_model(path, Keyring.load(keys.public)), "synthetic:0")
    yield b
    b.close()


def _pick(backend, bits: np.ndarray) -> tuple[int, int]:
    """kbp_greedy (the runner's path) over `bits` written into the step's logits buffer."""
    assert len(bits) == backend.vocab
    backend.cuda.memcpy_htod(backend.lib.kbp_logits(backend.handle), np.ascontiguousarray(bits, np.uint16))
    return backend.greedy()


def _pick_any_length(backend, bits: np.ndarray) -> tuple[int, int]:
    """The library's kbp_greedy_enqueue over a row of any length, on its own scratch."""
    cuda, lib = backend.cuda, backend.lib
    lib.kbp_greedy_enqueue.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.kbp_greedy_enqueue.restype = ctypes.c_int
    lib.kbp_greedy_result_offset.restype = ctypes.c_size_t
    row = cuda.to_device(np.ascontiguousarray(bits, np.uint16))
    scratch = cuda.mem_alloc(2048)
    cuda.memset_d8(scratch, 0, 2048)
    out = np.zeros(2, np.int32)
    for _ in range(2):   # the second launch starts from the counter the first left
        assert lib.kbp_greedy_enqueue(int(row), len(bits), int(scratch), None) == 0
        cuda.Context.synchronize()
        cuda.memcpy_dtoh(out, int(scratch) + lib.kbp_greedy_result_offset())
    return int(out[0]), int(out[1])


def _expect(bits: np.ndarray) -> tuple[int, int]:
    z = bf16_from_bits(bits)
    return argmax_scan(bits), int((~np.isfinite(z)).sum())


def _row(rng, vocab: int) -> np.ndarray:
    return bf16_bits(rng.standard_normal(vocab).astype(np.float32) * 4)


def test_random_rows(backend):
    seed = int(np.random.SeedSequence().entropy % 2**63)
    rng = np.random.default_rng(seed)
    for _ in range(20):
        bits = _row(rng, backend.vocab)
        assert _pick(backend, bits) == _expect(bits), f"seed {seed}"


@pytest.mark.parametrize("vocab", [1, 31, 1023, 1024, 1025, 154880, 163840, 163841, 300007])
def test_any_length(backend, vocab):
    seed = int(np.random.SeedSequence().entropy % 2**63)
    rng = np.random.default_rng(seed)
    bits = _row(rng, vocab)
    assert _pick_any_length(backend, bits) == _expect(bits), f"seed {seed}"
    bits[rng.integers(0, vocab, 3)] = NAN   # and a maximum repeated at both ends
    bits[[0, vocab - 1]] = bf16_bits(np.float32(1e5))
    assert _pick_any_length(backend, bits) == _expect(bits), f"seed {seed}"


def test_cases_the_strict_scan_decides(backend):
    v = backend.vocab
    rng = np.random.default_rng(11)
    cases = {}
    base = _row(rng, v)
    top = base.copy()
    top[[3, v // 2, v - 1]] = bf16_bits(np.float32(1e4))
    cases["repeated maximum: the first wins"] = top
    zeros = np.full(v, bf16_bits(np.float32(-1.0)), np.uint16)
    zeros[5], zeros[9] = NEG_ZERO, POS_ZERO
    cases["-0 then +0: they tie, -0 first"] = zeros
    nan = base.copy()
    nan[::3] = NAN
    cases["NaN never chosen"] = nan
    cases["all NaN: index 0"] = np.full(v, NAN, np.uint16)
    cases["all -inf: index 0"] = np.full(v, NEG_INF, np.uint16)
    mixed = np.where(np.arange(v) % 2 == 0, NAN, NEG_INF).astype(np.uint16)
    cases["NaN and -inf only: index 0"] = mixed
    inf = base.copy()
    inf[[7, 8]] = INF
    inf[2] = NAN
    cases["+inf twice: the first"] = inf
    last = np.full(v, NEG_INF, np.uint16)
    last[-1] = bf16_bits(np.float32(-3e38))
    cases["only the last index is finite"] = last
    for what, bits in cases.items():
        got = _pick(backend, bits)
        assert got == _expect(bits), what
        assert got[0] == int(argmax_host(bits)), what


def test_decode_tokens_are_the_host_argmax(backend):
    backend.reset()
    tokens, token = [], 1
    for _ in range(6):
        logits, token = backend.step(token)
        assert token == int(argmax_host(logits))
        tokens.append(token)
    backend.reset()
    token, again = 1, []
    for _ in range(6):
        token, bad = backend.next_token(token)
        assert bad == 0
        again.append(token)
    assert again == tokens
