"""Where kbpc's hand-written sources live: `kernels/` (device code), `runtime_stub/` (the C ABI)
and `templates/` (Jinja). This module is the only place that locates them.

A wheel ships them as package data inside the package (`kbpc/kernels/`, ...: pyproject/setup.py
map the repository folders to those packages); a source checkout or an editable install keeps them
at the repository root, beside the `kbpc/` folder. Each folder is recognised by a file it must
hold, so an unrelated `kernels/` folder elsewhere on the path is never taken for ours."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from kbpc.errors import BuildError

# folder -> a file it always holds
_MARKERS = {"kernels": "kbp_common.cuh", "runtime_stub": "kbp_runtime.h", "templates": "step.cu.j2"}


def _locate(name: str) -> Path:
    packaged = Path(str(resources.files("kbpc"))) / name   # installed from a wheel
    checkout = Path(__file__).resolve().parents[2] / name  # source checkout / editable install
    for candidate in (packaged, checkout):
        if (candidate / _MARKERS[name]).is_file():
            return candidate
    raise BuildError(f"kbpc's {name}/ folder is missing (looked in {packaged} and {checkout}); "
                     "reinstall kbpc")


KERNELS_DIR = _locate("kernels")
RUNTIME_STUB_DIR = _locate("runtime_stub")
TEMPLATES_DIR = _locate("templates")
