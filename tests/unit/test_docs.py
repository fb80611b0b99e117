"""The documentation stays true: docs/cli.md is what the commands' --help say now, the exit codes
and report schemas it lists are the ones kbpc has, the README and docs link only to files inside
the repository, the example workflow calls kbpc with options that exist, and the example script
verifies a real bundle with plain `cryptography` (and OpenSSL agrees on the Ed25519 signature)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import click
import pytest
import yaml

from kbpc.bundle.container import Member, write_bundle
from kbpc.bundle.keys import Signer
from kbpc.bundle.keystore import generate_keys
from kbpc.cli import main
from kbpc.errors import EXIT_CODES

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def test_cli_reference_is_current():
    # a fresh interpreter: click caches each command's help option from the first context it saw
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_cli_docs.py"), "--stdout"], capture_output=True,
                          text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (DOCS / "cli.md").read_text() == proc.stdout, "re-run python3 scripts/gen_cli_docs.py"


def test_exit_codes_and_schemas_are_documented():
    table = (DOCS / "exit-codes.md").read_text()
    assert {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.M)} == set(EXIT_CODES)
    reports = (DOCS / "json-reports.md").read_text()
    for schema in (DOCS / "schemas").glob("kbpc-*.schema.json"):
        name = schema.name[:-len(".schema.json")].replace(".v", "/v")
        assert f"`{name}`" in reports, name


def test_links_stay_inside_the_repository():
    for doc in [REPO / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#]+)\)", doc.read_text()):
            if "://" in target:
                continue
            path = (doc.parent / target).resolve()
            assert path.is_relative_to(REPO) and path.exists(), f"{doc.name}: {target}"
    assert "../shared" not in (REPO / "README.md").read_text()


def test_numerics_table_names_real_bounds_tests_and_limits():
    """docs/numerics.md names each fast form's bound (a function of a kbpc.reference module) and its
    GPU test (a file in tests/gpu); both must exist, and its end-to-end limits must be the ones
    `verify --numerics` applies."""
    import importlib  # noqa: PLC0415
    from kbpc.runtime.numerics import LIMITS  # noqa: PLC0415
    text = (DOCS / "numerics.md").read_text()
    bounds = re.findall(r"`([a-z_0-9]+)\.([a-z_0-9]+_bound)`", text)
    assert len(bounds) >= 6
    for module, name in bounds:
        assert callable(getattr(importlib.import_module(f"kbpc.reference.{module}"), name)), f"{module}.{name}"
    tests = re.findall(r"`(test_gpu_[a-z_0-9]+\.py)`", text)
    assert len(set(tests)) >= 6
    for name in tests:
        assert (REPO / "tests" / "gpu" / name).is_file(), name
    assert LIMITS["exact"] == (0.0, 1.0) and LIMITS["fast"] == (1e-2, 0.95)
    assert "| `fast` | at most 1e-2 | at least 95% of positions |" in text


def _options(command: click.Command) -> set[str]:
    return {opt for p in command.params for opt in getattr(p, "opts", [])}


def test_example_workflow_uses_real_commands():
    flow = yaml.safe_load((DOCS / "examples" / "github-workflow.yml").read_text())
    runs = [step["run"] for job in flow["jobs"].values() for step in job["steps"] if "run" in step]
    calls = [shlex.split(line.replace("\n", " ")) for run in runs for line in run.split("\n")
             if line.strip().startswith("kbpc ")]
    calls += [shlex.split(run.replace("\n", " ")) for run in runs if run.startswith("kbpc ")]
    assert {c[1] for c in calls} >= {"compile", "verify"}
    for call in calls:
        command = main.commands[call[1]]
        for word in call[2:]:
            if word.startswith("-"):
                assert word in _options(command), (call[1], word)


@pytest.fixture
def signed(tmp_path):
    keys = generate_keys(tmp_path / "keys")
    bundle = tmp_path / "m.kbp"
    write_bundle(bundle, {"blueprint_id": "b", "kind": "lite"}, [Member("graph.json", data=b"{}"),
                 Member("lib/rank0/libkbp.so", data=b"\x7fELF" * 100)], Signer.load(keys.private))
    return bundle, keys


def _verify(bundle: Path, keyring: Path, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DOCS / "examples" / "verify_bundle.py"), str(bundle), str(keyring),
                           *map(str, extra)], capture_output=True, text=True, check=False)


def test_example_script_verifies_and_refuses(signed, tmp_path):
    bundle, keys = signed
    ok = _verify(bundle, keys.public, "--export", tmp_path / "sig")
    assert ok.returncode == 0, ok.stderr
    other = generate_keys(tmp_path / "other")
    assert _verify(bundle, other.public).returncode == 1
    data = bytearray(bundle.read_bytes())
    with zipfile.ZipFile(bundle) as zf:
        offset = zf.getinfo("lib/rank0/libkbp.so").header_offset + 60
    data[offset] ^= 1
    bad = tmp_path / "bad.kbp"
    bad.write_bytes(bytes(data))
    refused = _verify(bad, keys.public)
    assert refused.returncode == 1 and "refused" in refused.stderr
    if shutil.which("openssl"):
        sig = tmp_path / "sig"
        pem = next(sig.glob("ed25519-*.pem"))
        proc = subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(pem), "-rawin", "-in",
                               str(sig / "manifest.json"), "-sigfile", str(sig / "ed25519.sig")],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0 and "Verified Successfully" in proc.stdout, proc.stderr
