"""Sequence state for the CPU decode interpreter: per layer, what the blueprint's `state` fields
name (conv window, recurrent state, paged latent cache, indexer cache). Layouts are the reference
families' own (see causal_conv1d_l2norm, kda_recurrent, glm_mla_latent_write, dsa_indexer)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kbpc.reference.dsa_indexer import IndexerCache, IndexerGeometry
from kbpc.reference.glm_mla_latent_write import LatentCacheLayout


@dataclass
class LatentCache:
    layout: LatentCacheLayout
    codes: np.ndarray
    block_table: np.ndarray

    @classmethod
    def for_context(cls, max_context: int, page_size: int, latent_dim: int) -> "LatentCache":
        pages = -(-max_context // page_size)
        layout = LatentCacheLayout(pages, page_size, latent_dim)
        # Identity block table: a real server maps logical pages to any free physical page.
        return cls(layout, layout.empty(), np.arange(pages, dtype=np.int32))

    def rows(self, tokens) -> np.ndarray:
        return self.layout.rows(self.codes, self.block_table, tokens)

    def slot(self, token: int) -> int:
        return self.layout.slot(self.block_table, token)


@dataclass
class SequenceState:
    """Everything that persists between decode steps, keyed by node id of its owner."""
    max_context: int
    index_cache: str = "f32"                                        # dsa_indexer pool keys: f32 | fp8
    conv: dict[str, np.ndarray] = field(default_factory=dict)       # conv1d_update node -> window
    recurrent: dict[str, np.ndarray] = field(default_factory=dict)  # gdn_recurrence node -> S
    latent: dict[str, LatentCache] = field(default_factory=dict)    # kv_write node -> cache
    indexer: dict[str, tuple[IndexerGeometry, IndexerCache]] = field(default_factory=dict)
    position: int = 0                                               # tokens already in the caches
