"""A verified bundle as a runnable model: its blueprint (rebuilt from graph.json with the recorded
model config), weight specs and state sizes. Nothing is read from a bundle before it verifies."""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kbpc.bundle.container import Bundle, open_bundle
from kbpc.bundle.keys import Keyring
from kbpc.bundle.keystore import trusted_keyring
from kbpc.errors import BundleError
from kbpc.frontend.load import blueprint_from_doc
from kbpc.ir.graph import Blueprint
from kbpc.runtime.run_manifest import RunManifest


@dataclass
class BundleModel:
    bundle: Bundle
    blueprint: Blueprint
    run: RunManifest          # what the runner reads from the manifest, typed
    trust_sources: tuple[str, ...] = ()     # the keyring files it was verified with (rank processes)

    @property
    def manifest(self) -> dict:
        return self.bundle.manifest

    @property
    def index_cache(self) -> str:
        """The dsa_indexer pool-key cache the bundle was compiled with (f32 | fp8); the reference
        interpreter follows it so numerics checks compare like with like."""
        return self.run.index_cache

    @property
    def act_quant(self) -> bool:
        """False for a build without activation quantization (kbpc compile --no-act-quant): its
        reference is kbpc/reference/no_act_quant.py."""
        return self.run.act_quant


def load_bundle_model(path: Path, trust: Keyring | None = None) -> BundleModel:
    trust = trust if trust is not None else trusted_keyring()
    bundle = open_bundle(path, trust)
    try:
        return BundleModel(bundle, _blueprint(bundle, path), RunManifest.from_json(bundle.manifest),
                           tuple(trust.sources))
    except BaseException:
        bundle.close()
        raise


def _blueprint(bundle: Bundle, path: Path) -> Blueprint:
    doc = bundle.read_json("graph.json")
    cfg = bundle.manifest.get("model_config") or {}
    if not isinstance(cfg, dict):
        raise BundleError("manifest.json: model_config must be an object", str(path))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"symbols": cfg.get("symbols", {}), "constants": cfg.get("constants", {})}, fh)
        cfg_path = Path(fh.name)
    try:
        return blueprint_from_doc(doc, f"{path}:graph.json", cfg_path)
    finally:
        cfg_path.unlink(missing_ok=True)
