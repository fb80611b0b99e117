"""Programmatic dependent launch changes when kernels start, never what they compute: a build of the
seed's architecture at full width and depth (16 experts) gives the same logits, bit for bit, with
PDL and without, over 24 positions of the same tokens.

This is the regression test for a stale-read hazard seen on the H200: under PDL a kernel's lifetime
overlaps the writes of the kernels before it, and reads through the non-coherent path (__ldg,
const __restrict__ pointers) served lines cached before those writes (the routed expert GEMVs saw
an earlier kernel's decay gates as expert ids and skipped 13 to 32 of 42 MoE layers of the
128-expert shrink). The tiny example did not show it; the full-width arena does
(kernels/kbp_common.cuh, ld_step)."""
from __future__ import annotations

import json

import pytest

from kbpc.bundle.keys import Keyring, Signer
from kbpc.bundle.keystore import generate_keys
from kbpc.compiler import CompileRequest, compile_bundle
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.testing.decode import decode_logits, differing_positions
from kbpc.tools.shrink import shrink

pytestmark = pytest.mark.gpu

POSITIONS = 24


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, seed_path):
    root = tmp_path_factory.mktemp("pdl")
    seed = load_blueprint(seed_path)
    blueprint = root / "seed-e16.json"
    blueprint.write_text(json.dumps(shrink(seed, {"experts": 16}, list(range(len(seed.layers))))))
    keys = generate_keys(root / "keys")
    out = {}
    for pdl in (True, False):
        path = root / f"seed-e16-{'pdl' if pdl else 'nopdl'}.kbp"
        compile_bundle(CompileRequest(blueprint=blueprint, output=path,
                                      options=Options(max_context=POSITIONS + 8, numerics="fast", pdl=pdl),
                                      signer=Signer.load(keys.private), cache_dir=root / "cache"))
        out[pdl] = path
    return out, Keyring.load(keys.public)


def test_pdl_gives_the_same_bits(bundles):
    paths, trust = bundles
    with_pdl, without = decode_logits(paths[True], trust, POSITIONS), decode_logits(paths[False], trust, POSITIONS)
    assert not differing_positions(with_pdl, without), "positions that differ"
