"""Pick and open the backend `kbpc run` uses for a model path."""
from __future__ import annotations

from pathlib import Path

from kbpc.errors import DeviceError, KbpcError


def is_bundle(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def gpu_present() -> bool:
    from kbpc.runtime.cuda_backend import cuda_driver
    try:
        cuda_driver()
        return True
    except DeviceError:
        return False


def open_backend(model: Path, backend: str, weights: str, context: int, trust: Path | None,
                 config: Path | None):
    """(backend name, StepBackend, vocab)."""
    from kbpc.runtime.reference_backend import ReferenceBackend, load_weights

    if not Path(model).exists():
        raise KbpcError("no such file", str(model))
    if is_bundle(model):
        from kbpc.bundle.keys import Keyring
        from kbpc.runtime.bundle_model import load_bundle_model

        bm = load_bundle_model(model, Keyring.load(trust) if trust else None)
        if backend == "cuda" or (backend == "auto" and gpu_present()):
            from kbpc.runtime.cuda_backend import CudaBackend
            cb = CudaBackend(bm, weights, context)
            return "cuda", cb, cb.vocab
        bp = bm.blueprint
    else:
        if backend == "cuda":
            raise KbpcError("the CUDA backend runs compiled .kbp bundles (kbpc compile); a blueprint "
                            "JSON runs on --backend reference", "--backend")
        from kbpc.frontend.load import load_blueprint
        bp = load_blueprint(model, config)
    ref = ReferenceBackend(bp, load_weights(bp, weights), context)
    return "reference", ref, ref.vocab
