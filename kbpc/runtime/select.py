"""Pick and open the backend `kbpc run` uses for a model path."""
from __future__ import annotations

import shutil
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
                 config: Path | None, act_quant: bool = True):
    """(backend name, StepBackend, vocab). `weights` may be a Hugging Face checkpoint folder: a
    blueprint JSON then takes its model config from the folder's config.json. act_quant=False:
    the reference backend's debugging variant without activation quantization."""
    from kbpc.runtime.reference_backend import ReferenceBackend, load_weights

    if not Path(model).exists():
        raise KbpcError("no such file", str(model))
    if not act_quant and backend != "reference":
        raise KbpcError("--no-act-quant is a reference-backend debugging aid; add --backend reference",
                        "--no-act-quant")
    from kbpc.weights.convert import converted_config
    config = config or converted_config(weights)   # `kbpc convert` output carries its model config
    if is_bundle(model):
        from kbpc.bundle.keys import Keyring
        from kbpc.runtime.bundle_model import load_bundle_model

        bm = load_bundle_model(model, Keyring.load(trust) if trust else None)
        if backend == "cuda" or (backend == "auto" and gpu_present()):
            from kbpc.runtime.cuda_backend import CudaBackend
            cb = CudaBackend(bm, weights, context)
            return "cuda", cb, cb.vocab
        bp, index_cache = bm.blueprint, bm.index_cache
    else:
        can_build = shutil.which("nvcc") is not None
        if backend == "cuda" and not can_build:
            raise KbpcError("running a blueprint JSON on the GPU compiles it first, and nvcc is not on "
                            "PATH; compile it elsewhere (kbpc compile) or use --backend reference", "--backend")
        if backend == "cuda" or (backend == "auto" and can_build and gpu_present()):
            from kbpc.runtime.bundle_model import load_bundle_model
            from kbpc.runtime.cuda_backend import CudaBackend
            path, trust_ring = compile_for_gpu(Path(model), config, context, weights)
            cb = CudaBackend(load_bundle_model(path, trust_ring), weights, context)
            return "cuda", cb, cb.vocab
        from kbpc.frontend.load import load_blueprint
        from kbpc.weights.hf_checkpoint import bind, is_hf_folder
        bp, index_cache = load_blueprint(model, config), "f32"
        if is_hf_folder(Path(weights)):
            bp, checkpoint = bind(bp, Path(weights), config)
            ref = ReferenceBackend(bp, checkpoint.weights(), context, act_quant)
            return "reference", ref, ref.vocab
    ref = ReferenceBackend(bp, load_weights(bp, weights), context, act_quant, index_cache)
    return "reference", ref, ref.vocab


def compile_for_gpu(blueprint: Path, config: Path | None, context: int, weights: str | None = None):
    """Compile a blueprint for the local GPU into the user cache (reused while the blueprint,
    config, context and kbpc are unchanged), signed with the local default key. A Hugging Face
    checkpoint folder as `weights` sets the model config (its config.json is part of the key)."""
    from kbpc.weights.hf_checkpoint import is_hf_folder
    import hashlib

    import platformdirs

    from kbpc import __version__
    from kbpc.bundle.keys import Keyring, Signer, default_key_paths, ensure_default_key
    from kbpc.compiler import CompileRequest, compile_bundle
    from kbpc.ir.plan import Options

    key_path, _ = ensure_default_key()
    digest = hashlib.sha256()
    checkpoint = Path(weights) if weights and is_hf_folder(Path(weights)) else None
    for part in (blueprint.read_bytes(), config.read_bytes() if config else b"", str(context).encode(),
                 __version__.encode(), (checkpoint / "config.json").read_bytes() if checkpoint else b""):
        digest.update(part)
    out = Path(platformdirs.user_cache_dir("kbpc")) / "run" / f"{blueprint.stem}-{digest.hexdigest()[:16]}.kbp"
    if not out.exists():
        compile_bundle(CompileRequest(blueprint=blueprint, output=out, options=Options(max_context=max(context, 16)),
                                      signer=Signer.load(key_path), config=config, weights=checkpoint))
    return out, Keyring.load(default_key_paths().public)
