"""Every kernel family has its four homes: a kernels/<family>.cuh header, a lowering in the
(family, variant) table, a kbpc/reference/<family>.py module, and GPU tests that name it; every
fusion rule's family is one of them. Host-only families (the final argmax) have a reference only."""
from __future__ import annotations

import json
from pathlib import Path

from kbpc.toolchain.nvcc import KERNELS_DIR
from kbpc.codegen.families import LOWERINGS
from kbpc.passes.fusion_rules import FUSION_RULES

REPO = Path(__file__).resolve().parents[2]
HOST_ONLY = {"argmax_host"}


def _families(tiny_path) -> set[str]:
    explained = set(json.loads(Path(tiny_path).read_text())["explain"]["families"])
    return explained | {f for f, _ in LOWERINGS} | {r.family for r in FUSION_RULES}


def test_every_family_has_four_homes(tiny_path):
    gpu_tests = "\n".join(p.read_text() for p in (REPO / "tests" / "gpu").glob("test_*.py"))
    lowered = {f for f, _ in LOWERINGS}
    for family in sorted(_families(tiny_path)):
        assert (REPO / "kbpc" / "reference" / f"{family}.py").is_file(), f"{family}: no reference module"
        if family in HOST_ONLY:
            continue
        assert (KERNELS_DIR / f"{family}.cuh").is_file(), f"{family}: no kernels/{family}.cuh"
        assert family in lowered, f"{family}: no lowering"
        assert family in gpu_tests or f"{family}.cuh" in gpu_tests, f"{family}: no GPU test names it"
