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
