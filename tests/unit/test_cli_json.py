"""Machine-readable output and exit codes: every reporting command's --json report (and the same
report through --json-out FILE) validates against its published schema in docs/schemas/, failures
exit with the documented codes (one line, and a kbpc-error/v1 object with --json), an internal
error shows no traceback unless KBPC_TRACEBACK=1, --trust options add up, and `inspect` shows a
bundle by an untrusted signer under an UNTRUSTED warning."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from kbpc.bundle.container import Member, write_bundle
from kbpc.bundle.keys import Signer
from kbpc.bundle.keystore import generate_keys
from kbpc.cli import main
from kbpc.errors import EXIT_CODES
from kbpc.frontend.load import load_blueprint
from kbpc.ir.weights import weight_specs
from kbpc.runtime.select import gpu_present

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"
MANIFEST = {"blueprint_id": "tiny-bp", "plan_digest": "ab" * 32, "target": "sm_90", "tp_size": 1,
            "toolchain": {"nvcc": "13.0"}, "kind": "lite"}


def check_report(text: str) -> dict:
    """Parse one report and validate it against the schema its `schema` field names."""
    report = json.loads(text)
    path = SCHEMAS / (report["schema"].replace("/", ".") + ".schema.json")
    schema = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(report, schema)
    return report


def cli(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("KBPC_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def keys(tmp_path):
    return generate_keys(tmp_path / "keys")


@pytest.fixture
def bundle(tmp_path, keys) -> Path:
    out = tmp_path / "model.kbp"
    write_bundle(out, MANIFEST, [Member("lib/rank0.so", b"\x7fELF" * 64), Member("graph.json", b"{}")],
                 Signer.load(keys.private))
    return out


def test_every_schema_is_a_valid_json_schema():
    names = sorted(p.name for p in SCHEMAS.glob("*.schema.json"))
    assert "kbp-bundle.v1.schema.json" in names and len(names) >= 13
    for path in SCHEMAS.glob("*.schema.json"):
        jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text()))


def test_blueprint_reports(tmp_path, tiny_path):
    check_report(cli("inspect", tiny_path, "--json", "--context", "8").output)
    out = tmp_path / "r.json"
    shrink = cli("shrink", tiny_path, "-o", tmp_path / "t.json", "--json", "--json-out", out)
    assert shrink.exit_code == 0, shrink.output
    assert check_report(shrink.output) == check_report(out.read_text())
    run = cli("run", tiny_path, "--backend", "reference", "--max-new-tokens", "2", "--json-out", out)
    assert run.exit_code == 0 and "generated ids" in run.output   # text on stdout, JSON in the file
    assert check_report(out.read_text())["backend"] == "reference"


def test_key_and_bundle_reports(tmp_path, keys, bundle):
    check_report(cli("keygen", "-o", tmp_path / "k2", "--json").output)
    verified = check_report(cli("verify", bundle, "--trust", keys.public, "--json").output)
    assert verified["verified"] and verified["checks"]
    signed = cli("sign", bundle, "--key", keys.private, "--trust", keys.public, "--json")
    assert signed.exit_code == 0, signed.output
    check_report(signed.output)
    shown = check_report(cli("inspect", bundle, "--trust", keys.public, "--json").output)
    assert shown["trusted"] and shown["member_count"] == 2
    check_report(cli("cache", "info", "--json").output)
    check_report(cli("cache", "clean", "--json").output)


def test_trust_options_add_up(tmp_path, keys, bundle):
    other = generate_keys(tmp_path / "other")
    assert cli("verify", bundle, "--trust", other.public).exit_code == 3
    assert cli("verify", bundle, "--trust", other.public, "--trust", keys.public).exit_code == 0
    both = cli("inspect", bundle, "--trust", other.public, "--trust", keys.public, "--json")
    assert json.loads(both.output)["trusted"] is True


def test_untrusted_bundle_is_shown_under_a_warning(tmp_path, keys, bundle):
    other = generate_keys(tmp_path / "other")
    text = cli("inspect", bundle, "--trust", other.public)
    assert text.exit_code == 0, text.output
    assert "UNTRUSTED" in text.output and "lib/rank0.so" in text.output
    report = check_report(cli("inspect", bundle, "--trust", other.public, "--json").output)
    assert report["trusted"] is False and "not in the trusted keyring" in report["untrusted_reason"]
    assert report["signers"] == Signer.load(keys.private).key_ids
    no_keyring = check_report(cli("inspect", bundle, "--json").output)   # no default keyring at all
    assert no_keyring["trusted"] is False
    data = bytearray(bundle.read_bytes())
    data[40] ^= 1                        # a member no longer matches: refused, trusted or not
    bundle.write_bytes(bytes(data))
    refused = cli("inspect", bundle, "--trust", other.public)
    assert refused.exit_code == 3 and "does not match the signed manifest" in refused.output


def test_exit_codes(tmp_path, tiny_path, keys, bundle, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "kbp-graph/v9"}')
    failed = cli("inspect", bad, "--json")
    assert failed.exit_code == 2
    error = check_report(failed.stdout)
    assert error["exit_code"] == 2 and "kbp-graph/v9" in error["error"]
    other = generate_keys(tmp_path / "other")
    assert cli("run", bundle, "--trust", other.public).exit_code == 3
    runnable = tmp_path / "tiny.kbp"
    specs = weight_specs(load_blueprint(tiny_path))
    runnable_manifest = {**MANIFEST, "options": {"max_context": 64}, "library": {"rank0": "lib/rank0/libkbp.so"},
                         "state": [], "step": {"launches": 1, "groups": 1},
                         "weights": [{"name": w.name, "storage": w.storage, "shape": list(w.shape),
                                      "bytes": w.nbytes} for w in specs]}
    write_bundle(runnable, runnable_manifest, [Member("graph.json", tiny_path.read_bytes()),
                                               Member("lib/rank0/libkbp.so", b"\x7fELF")], Signer.load(keys.private))
    if not gpu_present():   # no PyCUDA or no GPU: a device error
        device = cli("run", runnable, "--trust", keys.public, "--backend", "cuda")
        assert device.exit_code == 4, device.output

    def no_nvcc():
        from kbpc.errors import BuildError
        raise BuildError("nvcc not found on PATH")
    monkeypatch.setattr("kbpc.toolchain.library.nvcc_version", no_nvcc)
    built = cli("compile", tiny_path, "-o", tmp_path / "x.kbp", "--key", keys.private, "--cache-dir", tmp_path / "c")
    assert built.exit_code == 5 and not (tmp_path / "x.kbp").exists()


def test_internal_error_is_one_line_unless_asked(tiny_path, monkeypatch):
    def broken(*_args, **_kwargs):
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr("kbpc.report.inspect_blueprint.summarize", broken)
    result = cli("inspect", tiny_path)
    assert result.exit_code == 70
    assert "internal error: ZeroDivisionError: a bug" in result.output and "KBPC_TRACEBACK=1" in result.output
    assert "Traceback" not in result.output
    shown = cli("inspect", tiny_path, env={"KBPC_TRACEBACK": "1"})
    assert shown.exit_code == 70 and "Traceback" in shown.output


def test_help_lists_exit_codes():
    text = cli("--help").output
    for code in EXIT_CODES:
        assert f"  {code} " in text
