"""A hostile-input campaign (issue 11): mutated bundles, signatures, manifests, blueprints, configs,
private keys and keyrings, each fed to the CLI command that reads it. Every outcome must be a clean
refusal (exit 2, last line `kbpc: error: ...` of bounded length) or, for a mutation that left the
input valid, a clean success; anything else is a crash, and a case over the time bound is hung.
Run it in a process under a memory limit (RLIMIT_AS): a memory blow-up then shows as a crash.

    python -m kbpc.testing.hostile --cases 300 --seed 1      # prints the tally as JSON

tests/unit/test_fuzz_hostile.py runs a few hundred cases; scripts/fuzz-hostile.py a larger campaign.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from kbpc.testing.hostile_inputs import (Fixture, forge_bundle, hostile_value, mutate_bytes, mutate_doc, payload,
                                         special_file)

KINDS = ("bundle", "signature", "manifest", "blueprint", "config", "key", "keyring")
MAX_ERROR_LINE = 1600    # bounded error rendering: where (300) + message line (1000) + suffixes


class _Hung(BaseException):
    """Raised by the alarm: not an Exception, so no handler in kbpc can swallow it."""


@dataclass
class Tally:
    tried: int = 0
    refused: int = 0          # exit 2, last line `kbpc: error: ...` (or click's usage `Error: ...`), bounded
    accepted: int = 0         # the mutation left the input valid: exit 0
    crashed: int = 0
    hung: int = 0
    worst_seconds: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)   # the first few crashes and hangs

    def note_failure(self, text: str) -> None:
        if len(self.failures) < 20:
            self.failures.append(text[:600])


def _bundle_case(fx: Fixture, rng: random.Random, out: Path) -> list[str]:
    if special_file(out, rng):
        pass
    elif rng.random() < 0.3:   # signed, so it verifies: hostile content a trusted signer put there
        graph = mutate_doc(fx.graph_doc, rng)
        forge_bundle(out, fx, members={"graph.json": payload(graph, rng)}, sign=True)
    else:
        out.write_bytes(mutate_bytes(fx.bundle_bytes, rng))
    return _bundle_command(rng, out, fx)


def _bundle_command(rng: random.Random, path: Path, fx: Fixture) -> list[str]:
    trust = ["--trust", str(fx.keys.public)]
    return rng.choice([["verify", str(path), *trust], ["inspect", str(path), *trust],
                       ["run", str(path), *trust, "--backend", "reference", "--max-new-tokens", "1"]])


def _signature_case(fx: Fixture, rng: random.Random, out: Path) -> list[str]:
    doc = fx.signature_doc if rng.random() < 0.6 else hostile_value(rng)
    forge_bundle(out, fx, signature=payload(mutate_doc(doc, rng) if isinstance(doc, (dict, list)) else doc, rng))
    return _bundle_command(rng, out, fx)


def _manifest_case(fx: Fixture, rng: random.Random, out: Path) -> list[str]:
    doc = mutate_doc(fx.manifest_doc, rng) if rng.random() < 0.8 else hostile_value(rng)
    forge_bundle(out, fx, manifest=payload(doc, rng), sign=rng.random() < 0.8)
    return _bundle_command(rng, out, fx)


def _write_mutated(out: Path, rng: random.Random, doc: object, raw: bytes, doc_share: float) -> None:
    """`out` made a special file (sometimes), else `doc` mutated as JSON (share `doc_share`), else
    `raw` mutated byte by byte."""
    if special_file(out, rng):
        return
    if rng.random() < doc_share:
        out.write_bytes(payload(mutate_doc(doc, rng), rng))
    else:
        out.write_bytes(mutate_bytes(raw, rng))


def _blueprint_case(fx: Fixture, rng: random.Random, out: Path) -> list[str]:
    _write_mutated(out, rng, fx.graph_doc, fx.graph_bytes, 0.7)
    return rng.choice([["inspect", str(out)], ["inspect", str(out), "--context", "64"],
                       ["shrink", str(out), "-o", str(out.with_suffix(".small.json")), "--preset", "tiny"],
                       ["run", str(out), "--backend", "reference", "--max-new-tokens", "1"]])


def _config_case(fx: Fixture, rng: random.Random, out: Path) -> list[str]:
    doc = mutate_doc(fx.config_doc, rng) if rng.random() < 0.7 else hostile_value(rng)
    if not special_file(out, rng):
        out.write_bytes(payload(doc, rng))
    return ["inspect", str(fx.graph_path), "--config", str(out)]


def _key_case(fx: Fixture, rng: random.Random, out: Path) -> list[str]:
    _write_mutated(out, rng, fx.legacy_key_doc, fx.key_bytes, 0.4)   # the PEM, or the legacy JSON form
    if out.is_file() and not out.is_symlink():
        os.chmod(out, 0o600)
    return ["sign", str(fx.bundle_path), "--key", str(out), "-o", str(out.with_suffix(".kbp"))]


def _keyring_case(fx: Fixture, rng: random.Random, out: Path) -> list[str]:
    _write_mutated(out, rng, fx.keyring_doc, fx.keyring_bytes, 0.6)
    return ["verify", str(fx.bundle_path), "--trust", str(out)]


MAKERS: dict[str, Callable[[Fixture, random.Random, Path], list[str]]] = {
    "bundle": _bundle_case, "signature": _signature_case, "manifest": _manifest_case,
    "blueprint": _blueprint_case, "config": _config_case, "key": _key_case, "keyring": _keyring_case}


# Exit codes of a clean refusal (kbpc.errors.EXIT_CODES): bad input, a bundle that does not verify.
CLEAN_REFUSALS = (2, 3)


def _classify(tally: Tally, label: str, result, seconds: float) -> None:
    lines = [ln for ln in (result.output or "").splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if result.exit_code == 0 and result.exception is None:
        tally.accepted += 1
    elif (result.exit_code in CLEAN_REFUSALS and last.startswith(("kbpc: error: ", "Error: "))
          and len(last) <= MAX_ERROR_LINE):
        tally.refused += 1
    else:
        tally.crashed += 1
        why = repr(result.exception) if result.exception is not None else f"exit {result.exit_code}"
        tally.note_failure(f"{label}: {why}: {last[:300]}")


def run_campaign(cases: int, seed: int, per_case_seconds: int = 20) -> Tally:
    """`cases` mutated inputs, round robin over KINDS, from `seed`; the tally of outcomes."""
    from click.testing import CliRunner

    from kbpc.cli import main

    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="kbpc-hostile-") as tmp:
        work = Path(tmp)
        # every invocation sees a private config and cache dir, and CI set (no key is ever made)
        runner = CliRunner(env={"XDG_CONFIG_HOME": str(work / "config"), "XDG_CACHE_HOME": str(work / "cache"),
                                "CI": "1"})
        fx = Fixture.build(work / "fixture")
        previous = signal.signal(signal.SIGALRM, _alarm)
        try:
            for i in range(cases):
                kind = KINDS[i % len(KINDS)]
                rng = random.Random(f"{seed}:{i}")
                case_dir = work / f"case{i}"
                case_dir.mkdir()
                label = f"case {i} ({kind}, seed {seed})"
                t0 = time.perf_counter()
                signal.alarm(per_case_seconds)
                try:
                    args = MAKERS[kind](fx, rng, case_dir / "input")
                    result = runner.invoke(main, args)
                except _Hung:
                    tally.hung += 1
                    tally.note_failure(f"{label}: over {per_case_seconds} s")
                else:
                    _classify(tally, f"{label}: kbpc {' '.join(a[:40] for a in args)}", result,
                              time.perf_counter() - t0)
                finally:
                    signal.alarm(0)
                tally.tried += 1
                tally.by_kind[kind] = tally.by_kind.get(kind, 0) + 1
                tally.worst_seconds = max(tally.worst_seconds, time.perf_counter() - t0)
                shutil.rmtree(case_dir)
        finally:
            signal.signal(signal.SIGALRM, previous)
    return tally


def _alarm(signum, frame) -> None:
    raise _Hung()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-case-seconds", type=int, default=20)
    args = parser.parse_args(argv)
    tally = run_campaign(args.cases, args.seed, args.per_case_seconds)
    print(json.dumps(asdict(tally)))


if __name__ == "__main__":
    main()
