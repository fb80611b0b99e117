"""A verified bundle as a runnable model: its blueprint (rebuilt from graph.json with the recorded
model config), weight specs and state sizes. Nothing is read from a bundle before it verifies."""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kbpc.bundle.container import Bundle, open_bundle
from kbpc.bundle.keys import Keyring, trusted_keyring
from kbpc.frontend.load import blueprint_from_doc
from kbpc.ir.graph import Blueprint


@dataclass
class BundleModel:
    bundle: Bundle
    blueprint: Blueprint

    @property
    def manifest(self) -> dict:
        return self.bundle.manifest

    @property
    def index_cache(self) -> str:
        """The dsa_indexer pool-key cache the bundle was compiled with (f32 | fp8); the reference
        interpreter follows it so numerics checks compare like with like."""
        return (self.manifest.get("options") or {}).get("index_cache", "f32")


def load_bundle_model(path: Path, trust: Keyring | None = None) -> BundleModel:
    bundle = open_bundle(path, trust if trust is not None else trusted_keyring())
    doc = json.loads(bundle.read("graph.json"))
    cfg = bundle.manifest.get("model_config") or {}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"symbols": cfg.get("symbols", {}), "constants": cfg.get("constants", {})}, fh)
        cfg_path = Path(fh.name)
    try:
        bp = blueprint_from_doc(doc, f"{path}:graph.json", cfg_path)
    finally:
        cfg_path.unlink(missing_ok=True)
    return BundleModel(bundle, bp)
