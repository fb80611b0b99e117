"""Pick and open the backend `kbpc run` uses for a model path."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from kbpc.errors import DeviceError, KbpcError


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
        bp = bm.blueprint
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
        bp = load_blueprint(model, config)
        if is_hf_folder(Path(weights)):
            bp, checkpoint = bind(bp, Path(weights), config)
            ref = ReferenceBackend(bp, checkpoint.weights(), context, act_quant)
            return "reference", ref, ref.vocab
    ref = ReferenceBackend(bp, load_weights(bp, weights, context), context, act_quant)
    return "reference", ref, ref.vocab


def compile_for_gpu(blueprint: Path, config: Path | None, context: int, weights: str | None = None):
    """Compile a blueprint for the local GPU into the user cache (reused while the blueprint,
    config, context and kbpc are unchanged), signed with the local default key (created, with a
    note, once the blueprint has been checked: this bundle never leaves the machine). A Hugging
    Face checkpoint folder as `weights` sets the model config (its config.json is part of the key)."""
    from kbpc.weights.hf_checkpoint import is_hf_folder
    import hashlib
    import re
    import warnings

    import platformdirs

    from kbpc import __version__
    from kbpc.bundle.keys import Keyring
    from kbpc.bundle.keystore import default_key_paths, ensure_default_key
    from kbpc.compiler import CompileRequest, compile_bundle
    from kbpc.errors import BlueprintError, ConfigError, KbpcWarning
    from kbpc.frontend.load import MAX_BLUEPRINT_BYTES
    from kbpc.ir.config import MAX_CONFIG_BYTES
    from kbpc.ir.plan import Options
    from kbpc.util.jsonload import read_regular_file

    def default_signer():
        key = ensure_default_key(allow_create=True)
        for note in key.notes:
            warnings.warn(KbpcWarning(note), stacklevel=2)
        return key.signer

    digest = hashlib.sha256()
    checkpoint = Path(weights) if weights and is_hf_folder(Path(weights)) else None
    for part in (read_regular_file(blueprint, MAX_BLUEPRINT_BYTES, BlueprintError, "blueprint file"),
                 read_regular_file(config, MAX_CONFIG_BYTES, ConfigError, "config file") if config else b"",
                 str(context).encode(), __version__.encode(),
                 read_regular_file(checkpoint / "config.json", MAX_CONFIG_BYTES, ConfigError, "config file")
                 if checkpoint else b""):
        digest.update(part)
    stem = re.sub(r"[^A-Za-z0-9_.+-]", "_", blueprint.stem)[:64]
    out = Path(platformdirs.user_cache_dir("kbpc")) / "run" / f"{stem}-{digest.hexdigest()[:16]}.kbp"
    if not out.exists():
        compile_bundle(CompileRequest(blueprint=blueprint, output=out, options=Options(max_context=max(context, 16)),
                                      signer=default_signer, config=config, weights=checkpoint))
    return out, Keyring.load(default_key_paths().public)
