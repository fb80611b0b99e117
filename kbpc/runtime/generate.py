"""The generation loop shared by every backend: feed the prompt one position at a time, then pick
greedy tokens, timing prefill and decode separately and refusing non-finite logits. Without the
logits digest and without a logits callback, a backend with `next_token` (the GPU) keeps the logits
on the device: the token and a count of non-finite logits are all that come back."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from kbpc.errors import KbpcError


class StepBackend(Protocol):
    vocab: int

    def step(self, token: int) -> tuple[np.ndarray, int]:
        """Feed one token; return (logits as float32, greedy next token)."""


class TokenBackend(StepBackend, Protocol):
    def next_token(self, token: int) -> tuple[int, int]:
        """Feed one token; return (greedy next token, how many logits are infinite or NaN)."""


@dataclass
class Generation:
    prompt_ids: list[int]
    generated_ids: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    logits_sha256: str = ""

    def to_json(self) -> dict:
        decode_n = len(self.generated_ids)
        return {
            "prompt_ids": self.prompt_ids, "generated_ids": self.generated_ids,
            "prefill_tokens_per_s": len(self.prompt_ids) / self.prefill_s if self.prefill_s else None,
            "decode_tokens_per_s": decode_n / self.decode_s if self.decode_s and decode_n else None,
            "ms_per_token": 1e3 * (self.prefill_s + self.decode_s) / max(1, len(self.prompt_ids) + decode_n - 1),
            "logits_sha256": self.logits_sha256 or None,
        }


def check_prompt(prompt: list[int], vocab: int) -> None:
    if not prompt:
        raise KbpcError("the prompt is empty: give at least one token id", "--prompt-ids")
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise KbpcError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "--prompt-ids")


def generate(backend: StepBackend, prompt: list[int], max_new_tokens: int,
             on_token: Callable[[int], None] | None = None,
             on_logits: Callable[[np.ndarray], None] | None = None, digest: bool = True) -> Generation:
    """Greedy decode. With `digest`, the logits of every step feed one running SHA-256 (a checksum
    of the run); `on_logits` gets them (float32, one call per position, prompt positions included)."""
    check_prompt(prompt, backend.vocab)
    out = Generation(prompt_ids=list(prompt))
    sha = hashlib.sha256() if digest else None
    if sha is None and on_logits is None and hasattr(backend, "next_token"):
        step = lambda token, position: _token_step(backend, token, position)   # noqa: E731
    else:
        step = lambda token, position: _checked_step(backend, token, position, sha, on_logits)   # noqa: E731
    next_token = prompt[0]
    t0 = time.perf_counter()
    for i, token in enumerate(prompt):
        next_token = step(token, i)
        if on_token:
            on_token(i)
    out.prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for j in range(max_new_tokens):
        out.generated_ids.append(next_token)
        if j == max_new_tokens - 1:
            break
        next_token = step(next_token, len(prompt) + j)
        if on_token:
            on_token(len(prompt) + j)
    out.decode_s = time.perf_counter() - t0
    out.logits_sha256 = sha.hexdigest() if sha is not None else ""
    return out


def _refuse_non_finite(bad: int, position: int) -> None:
    if bad:
        raise KbpcError(f"{bad} non-finite logits at position {position}; stopping the run")


def _checked_step(backend: StepBackend, token: int, position: int, sha, on_logits) -> int:
    logits, nxt = backend.step(token)
    logits = np.asarray(logits, np.float32)
    _refuse_non_finite(int((~np.isfinite(logits)).sum()), position)
    if sha is not None:
        sha.update(logits.tobytes())
    if on_logits:
        on_logits(logits)
    return nxt


def _token_step(backend: TokenBackend, token: int, position: int) -> int:
    nxt, bad = backend.next_token(token)
    _refuse_non_finite(bad, position)
    return nxt
