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
    trust_sources: tuple[str, ...] = ()     # the keyring files it was verified with (rank processes)

    @property
    def manifest(self) -> dict:
        return self.bundle.manifest


def load_bundle_model(path: Path, trust: Keyring | None = None) -> BundleModel:
    trust = trust if trust is not None else trusted_keyring()
    bundle = open_bundle(path, trust)
    doc = json.loads(bundle.read("graph.json"))
    cfg = bundle.manifest.get("model_config") or {}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"symbols": cfg.get("symbols", {}), "constants": cfg.get("constants", {})}, fh)
        cfg_path = Path(fh.name)
    try:
        bp = blueprint_from_doc(doc, f"{path}:graph.json", cfg_path)
    finally:
        cfg_path.unlink(missing_ok=True)
    return BundleModel(bundle, bp, tuple(trust.sources))
