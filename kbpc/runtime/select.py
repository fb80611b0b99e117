"""Pick and open the backend `kbpc run` uses for a model path. A blueprint JSON that should run on
the GPU is compiled first by the driver (kbpc.compiler.compile_for_run), which the CLI calls
before opening the backend: nothing here builds anything."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from kbpc.bundle.keys import Keyring
from kbpc.bundle.keystore import trusted_keyring
from kbpc.errors import DeviceError, KbpcError

SYNTHETIC_DEFAULT = "synthetic:0"
BUNDLE_SUFFIX = ".kbp"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")   # a zip's first local header, or an empty zip


def is_bundle(path: Path) -> bool:
    """Whether the user names `path` as a bundle: its suffix is .kbp (any case) or it starts like a
    zip file. Such a path must verify as a bundle (a damaged one is reported as a damaged bundle);
    it is never read as a blueprint. Anything else is a blueprint JSON."""
    if Path(path).suffix.lower() == BUNDLE_SUFFIX:
        return True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False   # the blueprint loader reports a missing or unreadable file
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 4) in _ZIP_MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def gpu_present() -> bool:
    from kbpc.runtime.cuda_backend import cuda_driver
    try:
        cuda_driver()
        return True
    except DeviceError:
        return False


def choose_backend(model: Path, backend: str, act_quant: bool = True) -> str:
    """'cuda' or 'reference' for `--backend` auto|cuda|reference and this model on this machine."""
    if not Path(model).exists():
        raise KbpcError("no such file", str(model))
    if backend != "auto":
        if backend == "cuda" and not is_bundle(model) and shutil.which("nvcc") is None:
            raise KbpcError("running a blueprint JSON on the GPU compiles it first, and nvcc is not on "
                            "PATH; compile it elsewhere (kbpc compile) or use --backend reference", "--backend")
        return backend
    can_run = is_bundle(model) or shutil.which("nvcc") is not None
    return "cuda" if can_run and gpu_present() else "reference"


def open_backend(model: Path, backend: str, weights: str, context: int, trust: Keyring | None,
                 config: Path | None, act_quant: bool = True):
    """(StepBackend, vocab) for `backend` as choose_backend picked it. A bundle is verified against
    `trust` (default: the default key's keyring) before anything in it is used. `weights` may be a
    Hugging Face checkpoint folder: a blueprint JSON then takes its model config from the folder's
    config.json. act_quant=False: the debugging variant without activation quantization (the
    reference's, or a bundle compiled with --no-act-quant; a bundle built that way always runs so)."""
    from kbpc.runtime.reference_backend import ReferenceBackend, load_weights
    from kbpc.weights.convert import converted_config

    config = config or converted_config(weights)   # `kbpc convert` output carries its model config
    if is_bundle(model):
        from kbpc.runtime.bundle_model import load_bundle_model

        bm = load_bundle_model(model, trust if trust is not None else trusted_keyring())
        if backend == "cuda" and not act_quant and bm.act_quant:
            raise KbpcError("this bundle quantizes activations; build one without (kbpc compile --no-act-quant) "
                            "or run the blueprint JSON with --no-act-quant", "--no-act-quant")
        act_quant = act_quant and bm.act_quant
        if backend == "cuda":
            from kbpc.runtime.cuda_backend import CudaBackend
            cb = CudaBackend(bm, weights, context)
            return cb, cb.vocab
        ref = ReferenceBackend(bm.blueprint, _bundle_host_weights(bm, weights), context, act_quant,
                               index_cache=bm.index_cache)
        return ref, ref.vocab
    if backend == "cuda":
        raise KbpcError("the GPU runs compiled bundles; compile the blueprint first", str(model))
    from kbpc.frontend.load import load_blueprint
    from kbpc.weights.hf_checkpoint import bind, is_hf_folder

    weights = weights or SYNTHETIC_DEFAULT
    bp = load_blueprint(model, config)
    if is_hf_folder(Path(weights)):
        bp, checkpoint = bind(bp, Path(weights), config)
        ref = ReferenceBackend(bp, checkpoint.weights(), context, act_quant)
        return ref, ref.vocab
    ref = ReferenceBackend(bp, load_weights(bp, weights, context), context, act_quant)
    return ref, ref.vocab


def _bundle_host_weights(bm, weights: str | None):
    """A bundle's weights on the host, checked against the checkpoint it binds."""
    from kbpc.ir.weights import weight_specs
    from kbpc.runtime.bound_weights import check_hf_folder, host_weights, is_checkpoint_folder, resolve_source
    from kbpc.runtime.reference_backend import load_weights

    source = resolve_source(bm, weights)
    if source.startswith("synthetic:"):
        return load_weights(bm.blueprint, source)
    if is_checkpoint_folder(source):
        check_hf_folder(bm, Path(source))
        return load_weights(bm.blueprint, source)
    return host_weights(bm, source, weight_specs(bm.blueprint))
