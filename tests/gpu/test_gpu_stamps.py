"""A profiling build on the GPU (`kbpc compile --stamps`, kernels/kbp_stamps.cuh): its logits are the
product build's bit for bit over several positions (stamps never touch the math), every
instrumented kernel instance logs one record per CTA of each of its launches, and each record's
stamps run forward in time in the order they are numbered (begin, wait in, wait out, the kernel's
own phases, end): a check of where each kernel's stamps were placed. Both numerics modes, the
tiny blueprint at a context long enough for the index select to rank pools."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from kbpc.bundle.keys import Keyring, Signer
from kbpc.bundle.keystore import generate_keys
from kbpc.compiler import CompileRequest, compile_bundle
from kbpc.ir.plan import Options

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["fast", "exact"])
def pair(request, tmp_path_factory, tiny_path):
    root = tmp_path_factory.mktemp(f"stamps-{request.param}")
    keys = generate_keys(root / "keys")
    paths = {}
    for stamps in (False, True):
        path = root / f"tiny-{int(stamps)}.kbp"
        compile_bundle(CompileRequest(blueprint=Path(tiny_path), output=path,
                                      options=Options(max_context=128, numerics=request.param),
                                      signer=Signer.load(keys.private), cache_dir=root / "cache", stamps=stamps))
        paths[stamps] = path
    return paths, Keyring.load(keys.public), keys.public


def _backend(path, trust):
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.runtime.cuda_backend import CudaBackend
    return CudaBackend(load_bundle_model(path, trust), "synthetic:3")


def test_stamped_logits_are_the_product_builds(pair):
    paths, trust, _ = pair
    logits = {}
    for stamps, path in paths.items():
        backend = _backend(path, trust)
        try:
            logits[stamps] = np.stack([backend.step(t)[0] for t in (1, 5, 9, 2, 7, 3)])
        finally:
            backend.close()
    assert np.array_equal(logits[False].view(np.uint32), logits[True].view(np.uint32))


def test_every_instrumented_launch_logs_its_ctas(pair):
    sys.path.insert(0, str(REPO / "bench"))
    from replay_timeline import bundle_launches
    from stamp_phases import match_launches

    from kbpc.errors import BundleError

    paths, trust, _ = pair
    plain = _backend(paths[False], trust)
    try:
        with pytest.raises(BundleError, match="--stamps"):
            plain.stamp_logs()
    finally:
        plain.close()
    backend = _backend(paths[True], trust)
    try:
        launches = bundle_launches(backend.model)
        logs = backend.stamp_logs()
        for _ in range(90):       # past the index select's every-pool shortcut
            backend.next_token(1)
        logs.clear()
        backend.next_token(1)
        read = {log.instance: log for log in logs.read()}
    finally:
        backend.close()
    stamped = {name for name, log in read.items() if log.records.size}
    headers = {row.instance: row.kernel for row in launches}
    assert stamped, "no instrumented kernel logged a record"
    assert any("dsa_index_select" in headers[n] for n in stamped)
    matched, notes = match_launches({n: read[n].records for n in stamped}, launches)
    assert notes == []
    per_instance = {}
    for s in matched:
        per_instance.setdefault(s.instance, []).append(s)
        row = launches[s.launch]
        assert s.ctas == row.grid[0] * row.grid[1] * row.grid[2], (row.kernel, s.ctas, row.grid)
        assert np.all(s.t[:, 0] > 0) and np.all(s.t[:, 7] > 0)
        for rec in s.t:
            ticks = rec[rec != 0]
            assert np.all(np.diff(ticks) >= 0), (row.kernel, rec.tolist())
    for name in stamped:
        assert read[name].began == read[name].records.size
        assert len(per_instance[name]) == sum(1 for row in launches if row.instance == name)


def test_replay_stamps_script(pair, tmp_path, capsys):
    """bench/replay_stamps.py end to end on the stamp build: the per-launch summary, the sublayer
    chains and the per-SM trace, with every instrumented launch matched (no notes)."""
    import json

    sys.path.insert(0, str(REPO / "bench"))
    import replay_stamps

    paths, _, keyring = pair
    out, trace = tmp_path / "stamps.json", tmp_path / "trace.json"
    rc = replay_stamps.main([str(paths[True]), "--trust", str(keyring), "--context", "100", "--replays", "2",
                             "--warmup", "1", "--chain", "-o", str(out), "--trace", str(trace)])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads(out.read_text())
    assert summary["schema"] == "kbpc-replay-stamps/v1" and summary["notes"] == [] and summary["replays"] == 2
    assert any("dsa_index_select" in l["kernel"] for l in summary["launches"])
    assert {"kda attention", "dsa attention", "moe"} <= set(summary["chains"])
    assert any(e.get("ph") == "X" for e in json.loads(trace.read_text())["traceEvents"])
