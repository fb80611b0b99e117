"""Test layers: pure unit tests run everywhere; `nvcc` tests need the CUDA compiler (CI has it);
`gpu` tests need an NVIDIA GPU and PyCUDA and are skipped without them."""
from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SEED_BLUEPRINT = REPO / "examples" / "glm-5.3-flash-nvfp4-tp3-512k.decode1.graph.json"
TINY_BLUEPRINT = REPO / "examples" / "tiny.graph.json"
# A tiny GLM-5-next quantized and exported by NVIDIA ModelOpt, and transformers' logits on it
# (scripts/make-glm5next-fixture.py regenerates both).
GLM5NEXT_CHECKPOINT = REPO / "tests" / "data" / "glm5next-tiny"
GLM5NEXT_ORACLE = REPO / "tests" / "data" / "glm5next-tiny-oracle"


@functools.cache
def gpu_available() -> bool:
    try:
        import pycuda.driver as cuda  # noqa: PLC0415  (optional extra)

        cuda.init()
        return cuda.Device.count() > 0
    except Exception:  # any failure to reach a GPU means: no GPU here
        return False


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU and PyCUDA")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc on PATH")
    has_nvcc = shutil.which("nvcc") is not None
    for item in items:
        # get_closest_marker, not `in item.keywords`: the tests/gpu directory name is a keyword too.
        if item.get_closest_marker("gpu") and not gpu_available():
            item.add_marker(skip_gpu)
        if item.get_closest_marker("nvcc") and not has_nvcc:
            item.add_marker(skip_nvcc)


@pytest.fixture(scope="session")
def seed_path() -> Path:
    return SEED_BLUEPRINT


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    return TINY_BLUEPRINT


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory) -> Path:
    """One nvcc object cache for the whole session, so each kernel instance is built once."""
    return tmp_path_factory.mktemp("build-cache")


@pytest.fixture(scope="session")
def glm5next_checkpoint() -> Path:
    return GLM5NEXT_CHECKPOINT


@pytest.fixture(scope="session")
def glm5next_oracle() -> dict:
    """Token ids and transformers' logits (name -> positions x vocab float32)."""
    import json

    import numpy as np

    meta = json.loads((GLM5NEXT_ORACLE / "oracle.json").read_text())
    return {"token_ids": meta["token_ids"],
            **{p.stem[len("logits_"):]: np.load(p) for p in sorted(GLM5NEXT_ORACLE.glob("logits_*.npy"))}}


@pytest.fixture(scope="session")
def glm5next_blueprint(tmp_path_factory) -> Path:
    """The seed's architecture at the tiny checkpoint's sizes (kbpc shrink SEED --like config.json)."""
    import json

    from kbpc.frontend.load import load_blueprint
    from kbpc.tools.shrink import shrink
    from kbpc.tools.shrink_like import like_layers, like_symbols, read_like

    seed = load_blueprint(SEED_BLUEPRINT)
    like = read_like(seed, GLM5NEXT_CHECKPOINT / "config.json")
    path = tmp_path_factory.mktemp("glm5next") / "glm5next-tiny.graph.json"
    path.write_text(json.dumps(shrink(seed, like_symbols(seed, like), like_layers(seed, like))))
    return path
