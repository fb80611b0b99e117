"""The hostile-input fuzz test of issue 11: a few hundred mutated bundles, signatures, manifests,
blueprints, configs, keys and keyrings fed to the commands that read them, in a process limited to
2 GiB of address space; every case must end in a clean refusal (exit 2, one bounded error line) or
a clean success, each within 20 s. A fresh seed each run (printed on failure: rerun it with
`python -m kbpc.testing.hostile --cases N --seed S`); scripts/fuzz-hostile.py runs a larger one."""
from __future__ import annotations

import json
import random
import resource
import subprocess
import sys

from conftest import REPO

CASES = 280
MEMORY_BYTES = 2 << 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def test_hostile_inputs_are_refused_cleanly_within_bounds():
    seed = random.randrange(1 << 32)
    proc = subprocess.run([sys.executable, "-m", "kbpc.testing.hostile", "--cases", str(CASES), "--seed",
                           str(seed), "--per-case-seconds", "20"], capture_output=True, text=True,
                          preexec_fn=_limit_memory, cwd=REPO, timeout=300)
    assert proc.returncode == 0, f"seed {seed}: {proc.stderr[-2000:]}"
    tally = json.loads(proc.stdout)
    assert tally["tried"] == CASES
    assert (tally["crashed"], tally["hung"]) == (0, 0), f"seed {seed}: {tally['failures']}"
    assert tally["refused"] + tally["accepted"] == CASES
    assert tally["refused"] >= CASES * 0.8, tally   # the mutations do damage what they mutate
    assert set(tally["by_kind"]) == {"bundle", "signature", "manifest", "blueprint", "config", "key", "keyring"}
