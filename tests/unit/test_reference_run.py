"""The CPU reference backend end to end on the tiny example: a deterministic, finite 32-token
greedy run matching the recorded golden run, checkpoints, and clear errors on bad input."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kbpc.cli import main
from kbpc.errors import KbpcError, WeightsError
from kbpc.frontend.load import load_blueprint
from kbpc.ir.weights import weight_specs
from kbpc.runtime.generate import generate
from kbpc.runtime.reference_backend import ReferenceBackend, load_weights
from kbpc.weights.checkpoint import write_checkpoint
from kbpc.weights.synthetic import synthetic_weights

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import record_golden  # noqa: E402

GOLDEN = json.loads((REPO / "tests" / "golden" / "tiny_reference_run.json").read_text())


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return load_blueprint(tiny_path)


def test_golden_run_is_reproduced():
    """32 tokens, deterministic, finite (generate refuses non-finite logits), same as recorded."""
    got = record_golden.record()
    assert len(got["generated_ids"]) == 32
    assert got == GOLDEN, "the tiny reference run changed: if intended, re-run scripts/record_golden.py"


def test_checkpoint_round_trip_matches_synthetic(tiny, tmp_path):
    weights = synthetic_weights(tiny, 5)
    path = tmp_path / "tiny.safetensors"
    write_checkpoint(path, weights, weight_specs(tiny))
    a = generate(ReferenceBackend(tiny, weights, 8), [4, 5], 3)
    b = generate(ReferenceBackend(tiny, load_weights(tiny, str(path)), 8), [4, 5], 3)
    assert a.generated_ids == b.generated_ids and a.logits_sha256 == b.logits_sha256


def test_nan_weight_is_refused(tiny, tmp_path):
    weights = synthetic_weights(tiny, 5)
    name = next(s.name for s in weight_specs(tiny) if s.storage == "f32" and s.shape)
    weights[name] = weights[name].copy()
    weights[name].reshape(-1)[0] = np.nan
    path = tmp_path / "nan.safetensors"
    write_checkpoint(path, weights, weight_specs(tiny))
    with pytest.raises(WeightsError, match=rf"{name}.*non-finite"):
        load_weights(tiny, str(path))


def test_wrong_shape_is_refused(tiny, tmp_path):
    specs = weight_specs(tiny)
    weights = synthetic_weights(tiny, 5)
    victim = next(s for s in specs if s.storage == "bf16" and len(s.shape) == 2)
    weights[victim.name] = weights[victim.name][:, :-8].copy()
    bad_specs = [s if s is not victim else type(s)(**{**s.__dict__, "shape": weights[victim.name].shape})
                 for s in specs]
    path = tmp_path / "shape.safetensors"
    write_checkpoint(path, weights, bad_specs)
    with pytest.raises(WeightsError, match=rf"{victim.name}.*shape"):
        load_weights(tiny, str(path))


def test_cli_bad_inputs_exit_2(tiny_path, tmp_path):
    runner = CliRunner()
    cases = [(["--prompt-ids", "1,99999"], "outside the vocabulary"),
             (["--prompt-ids", "1,x"], "comma-separated token ids"),
             (["--weights", str(tmp_path / "missing")], "no such checkpoint"),
             (["--weights", "synthetic:abc"], "synthetic:SEED")]
    for args, pattern in cases:
        result = runner.invoke(main, ["run", str(tiny_path), "--max-new-tokens", "1", *args])
        assert result.exit_code == 2, (args, result.output)
        assert pattern in result.output and "Traceback" not in result.output


def test_cli_json_output(tiny_path):
    result = CliRunner().invoke(main, ["run", str(tiny_path), "--prompt-ids", "1,2", "--max-new-tokens", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["backend"] == "reference" and len(data["generated_ids"]) == 2


def test_context_overflow_is_an_error(tiny):
    backend = ReferenceBackend(tiny, synthetic_weights(tiny, 1), 2)
    backend.step(1)
    backend.step(2)
    with pytest.raises(KbpcError, match="context is full"):
        backend.step(3)


class _TokenOnly:
    """A backend with both paths: `next_token` (the GPU's, logits left on the device) and `step`."""
    vocab = 16

    def __init__(self, bad_at: int | None = None):
        self.calls: list[str] = []
        self.position, self.bad_at = 0, bad_at

    def _logits(self) -> np.ndarray:
        z = np.zeros(self.vocab, np.float32)
        z[(3 * self.position + 1) % self.vocab] = 1.0
        if self.position == self.bad_at:
            z[0] = np.nan
        return z

    def step(self, token):
        self.calls.append("step")
        z = self._logits()
        self.position += 1
        return z, int(np.nanargmax(z))

    def next_token(self, token):
        self.calls.append("next_token")
        z = self._logits()
        self.position += 1
        return int(np.nanargmax(z)), int((~np.isfinite(z)).sum())


def test_without_digest_the_logits_stay_on_the_device():
    fast, full = _TokenOnly(), _TokenOnly()
    a = generate(fast, [1, 2], 4, digest=False)
    b = generate(full, [1, 2], 4)
    assert set(fast.calls) == {"next_token"} and set(full.calls) == {"step"}
    assert a.generated_ids == b.generated_ids
    assert a.to_json()["logits_sha256"] is None and len(b.to_json()["logits_sha256"]) == 64
    rows = []
    generate(_TokenOnly(), [1], 2, on_logits=rows.append, digest=False)   # a logits callback needs the row
    assert len(rows) == 2


@pytest.mark.parametrize("digest", [True, False])
def test_non_finite_logits_stop_the_run_on_either_path(digest):
    with pytest.raises(KbpcError, match="1 non-finite logits at position 2"):
        generate(_TokenOnly(bad_at=2), [1, 2], 4, digest=digest)


def test_run_without_digest_reports_null(tiny_path):
    result = CliRunner().invoke(main, ["run", str(tiny_path), "--backend", "reference", "--prompt-ids", "4,5",
                                       "--max-new-tokens", "2", "--no-digest", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["logits_sha256"] is None and len(report["generated_ids"]) == 2
