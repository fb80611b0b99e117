"""The local GPU (needs an NVIDIA GPU and PyCUDA): it maps to a kbpc target, its copy bandwidth
measures as a plausible number, a bundle built for another target is refused before its library
is loaded, and `kbpc run BLUEPRINT.json` compiles for this GPU's target."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbpc.bundle.keys import Keyring, Signer
from kbpc.bundle.keystore import generate_keys
from kbpc.cli import main
from kbpc.compiler import CompileRequest, compile_bundle
from kbpc.errors import DeviceError
from kbpc.ir.plan import Options

pytestmark = pytest.mark.gpu


def test_local_gpu_has_a_target_and_bandwidth():
    from kbpc.runtime.cuda_backend import cuda_driver
    from kbpc.runtime.device import local_device, measure_copy_bandwidth

    cuda = cuda_driver()
    device = local_device(cuda)
    assert device.target is not None, device.describe()
    bandwidth = measure_copy_bandwidth(cuda)
    assert 1e11 < bandwidth < 2e13, bandwidth    # 0.1 to 20 TB/s


def test_bundle_for_another_target_is_refused_before_loading(tmp_path, tiny_path):
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.runtime.cuda_backend import CudaBackend, cuda_driver
    from kbpc.runtime.device import local_device

    here = local_device(cuda_driver()).target
    other = "sm_121" if here != "sm_121" else "sm_90"
    keys = generate_keys(tmp_path / "keys")
    path = tmp_path / "other.kbp"
    compile_bundle(CompileRequest(blueprint=Path(tiny_path), output=path, options=Options(target=other, max_context=32),
                                  signer=Signer.load(keys.private), cache_dir=tmp_path / "cache"))
    model = load_bundle_model(path, Keyring.load(keys.public))
    with pytest.raises(DeviceError, match=f"built for {other} .*this GPU is {here}"):
        CudaBackend(model, "synthetic:0", 8)


def test_run_blueprint_compiles_for_this_gpu(tmp_path, tiny_path, monkeypatch):
    from kbpc.runtime.cuda_backend import cuda_driver
    from kbpc.runtime.device import local_device

    monkeypatch.setenv("KBPC_CACHE_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(main, ["run", str(tiny_path), "--max-new-tokens", "4", "--json"])
    assert result.exit_code == 0, result.output
    report = result.stdout[result.stdout.index("{"):]   # (older click mixes stderr notes into stdout)
    assert json.loads(report)["backend"] == "cuda"
    built = list((tmp_path / "cache" / "run").glob("*.kbp"))
    assert len(built) == 1 and f"-{local_device(cuda_driver()).target}-" in built[0].name
