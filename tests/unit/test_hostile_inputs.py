"""Regression tests for issue 11 (security and robustness), one or more per case: names outside the
safe set (11.1), paths named as bundles (11.2), parsers on hostile JSON (11.3), bounded solver work
and special files (11.4), huge dims and host memory (11.5), and the small ones (11.9). Keys (11.6)
are in test_bundle_keys_cli.py, escaping in test_codegen_escape.py, the fuzz test in
test_fuzz_hostile.py and the compiled injection attempt in tests/nvcc/test_hostile_compile.py."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbpc.bundle.keys import Signer
from kbpc.bundle.keystore import default_key_paths, ensure_default_key, generate_keys
from kbpc.bundle.manifest import canonical_json
from kbpc.cli import main
from kbpc.errors import BlueprintError, ConfigError, KbpcError
from kbpc.frontend.dims import DimFact, solve_symbols
from kbpc.frontend.load import blueprint_from_doc, load_blueprint
from kbpc.testing.hostile_inputs import Fixture, forge_bundle
from kbpc.util.jsonload import load_json_file, parse_json

from conftest import REPO, SEED_BLUEPRINT, TINY_BLUEPRINT

TINY = json.loads(TINY_BLUEPRINT.read_text())


@pytest.fixture(autouse=True)
def homes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Fixture:
    return Fixture.build(tmp_path_factory.mktemp("fixture"))


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.output


def refused(*args, code_wanted: int = 2) -> str:
    code, out = cli(*args)
    last = out.strip().splitlines()[-1]
    assert code == code_wanted and last.startswith("kbpc: error: "), out
    return last


def refused_bundle(*args) -> str:
    """A path named as a bundle that does not verify: exit code 3 (verification failed)."""
    return refused(*args, code_wanted=3)


def cli_subprocess(*args, timeout: float = 60) -> subprocess.CompletedProcess:
    """For inputs that could block a process (FIFOs): a child with a deadline."""
    return subprocess.run([sys.executable, "-m", "kbpc.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env={**os.environ, "CI": "1"})


def mutated(edit) -> dict:
    doc = copy.deepcopy(TINY)
    edit(doc)
    return doc


# -- 11.1: names outside the safe character set ---------------------------------------------------

HOSTILE_NAMES = ['x"; system("id"); //', "a\nb", "a*/b", "a b", "", "x" * 129, "caf\u00e9", "../x", "a\\",
                 "-leading", 7]
NAME_FIELDS = {
    "blueprint_id": lambda d, v: d.__setitem__("blueprint_id", v),
    "lineage": lambda d, v: d.__setitem__("lineage", v),
    "nodes[3].id": lambda d, v: d["nodes"][3].__setitem__("id", v),
    "nodes[3].kernel": lambda d, v: d["nodes"][3].__setitem__("kernel", v),
    "edges[2].id": lambda d, v: d["edges"][2].__setitem__("id", v),
    "groups[1].rule": lambda d, v: d["groups"][1].__setitem__("rule", v),
    "groups[1].kernels[0]": lambda d, v: d["groups"][1]["kernels"].__setitem__(0, v),
    "layers[0].template": lambda d, v: d["layers"][0].__setitem__("template", v),
}


@pytest.mark.parametrize("field", sorted(NAME_FIELDS))
@pytest.mark.parametrize("value", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_names_outside_the_safe_set_are_refused(field, value):
    doc = mutated(lambda d: NAME_FIELDS[field](d, value))
    with pytest.raises(BlueprintError) as info:
        blueprint_from_doc(doc, "t.json")
    if isinstance(value, str) and field.split("[")[0] in ("blueprint_id", "lineage", "groups"):
        assert f"t.json: {field}" in str(info.value) and "is not a valid name" in str(info.value)


def test_the_safe_set_covers_real_blueprints():
    for path in (SEED_BLUEPRINT, TINY_BLUEPRINT, Path("/work/shared/blueprints") / SEED_BLUEPRINT.name):
        if path.exists():
            load_blueprint(path)
    doc = mutated(lambda d: d.update(blueprint_id="shrink:ab.c+d-e_F:9"))
    assert blueprint_from_doc(doc, "t.json").meta.blueprint_id == "shrink:ab.c+d-e_F:9"


# -- 11.2: a path named as a bundle must verify as one ----------------------------------------------

def test_json_named_kbp_is_refused_as_a_bundle(tmp_path, fx):
    fake = tmp_path / "model.kbp"
    fake.write_bytes(TINY_BLUEPRINT.read_bytes())
    for command in (["run", fake, "--backend", "reference"], ["inspect", fake], ["verify", fake],
                    ["bench", fake]):
        line = refused_bundle(*command, "--trust", fx.keys.public)
        assert "not a zip file" in line, line
    assert not default_key_paths().private.exists()   # nothing was compiled or signed


def test_damaged_bundles_are_reported_as_bundles(tmp_path, fx):
    data = fx.bundle_path.read_bytes()
    for name in ("cut.kbp", "cut.bin", "cut"):   # by suffix, or by the zip magic
        path = tmp_path / name
        path.write_bytes(data[: len(data) - 40])
        for command in ("run", "inspect"):
            line = refused_bundle(command, path, "--trust", fx.keys.public)
            assert "JSON" not in line and "blueprint" not in line, line


def test_special_files_named_as_bundles_do_not_block(tmp_path, fx):
    fifo = tmp_path / "model.kbp"
    os.mkfifo(fifo)
    for command in ("run", "inspect", "verify"):
        proc = cli_subprocess(command, fifo, "--trust", fx.keys.public, timeout=60)
        assert proc.returncode == 3 and "not a regular file" in proc.stderr, proc.stderr


# -- 11.3: every parser bounded -----------------------------------------------------------------

@pytest.mark.parametrize("text, match", [
    (b"[" * 60000, "nests 60000 levels"), (b"[" + b"7" * 5000 + b"]", "5000 digits"),
    (b'{"a": NaN}', "NaN is not a JSON number"), (b"[1e999]", "not a finite number"),
    (b'["\\ud800"]', "lone UTF-16 surrogate"), (b'{"k": 1, "k": 2}', "appears twice"),
    (b"\xff", "not UTF-8"), (b'{"a": [1, 2', "truncated"),
])
def test_bounded_json(text, match):
    with pytest.raises(KbpcError, match=match):
        parse_json(text, "f.json")


def test_special_and_huge_files_are_refused(tmp_path):
    for path, match in ((Path("/dev/zero"), "not a regular file"), (tmp_path, "is a directory")):
        with pytest.raises(KbpcError, match=match):
            load_json_file(path, max_bytes=1 << 20)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(KbpcError, match="at most 1024"):
        load_json_file(big, max_bytes=1024)


@pytest.mark.parametrize("member", ["signature", "manifest"])
@pytest.mark.parametrize("text", [b"[" * 60000, b"1" * 5000, b'{"a": 1, "a": 1}'], ids=["deep", "int", "dup"])
def test_hostile_signature_and_manifest_json(tmp_path, fx, member, text):
    path = tmp_path / "x.kbp"
    forge_bundle(path, fx, **{member: text}, sign=member == "manifest")
    for command in ("verify", "inspect", "run"):
        refused_bundle(command, path, "--trust", fx.keys.public)


def test_signed_hostile_graph_and_manifest_values(tmp_path, fx):
    path = tmp_path / "x.kbp"
    forge_bundle(path, fx, members={"graph.json": b"[" * 60000}, sign=True)
    assert "nests 60000 levels" in refused_bundle("run", path, "--trust", fx.keys.public, "--backend", "reference")
    manifest = {**fx.manifest_doc, "blueprint_id": "[/]\x1b[31m", "toolchain": {"x": "[bold]"}}
    forge_bundle(path, fx, manifest=canonical_json(manifest), sign=True)
    code, out = cli("inspect", path, "--trust", fx.keys.public)   # shown as text, not rich markup
    assert code == 0 and "[/]" in out and "\x1b" not in out, out


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["edges"][0].update(rows="n/2"), "not a whole number of rows"),
    (lambda d: d["edges"][0].update(rows="n-1"), "0 rows per token"),
    (lambda d: d["edges"][1].update(dim="+".join(["hidden"] * 300)), "at most 256 are allowed"),
    (lambda d: d["edges"][1].update(dim="*".join(["h"] * 60)), "at most 32 are allowed"),
    (lambda d: d.update(nodes=[], edges=[], groups=[], layers=[]), "no nodes"),
    (lambda d: d.update(blueprint_id=5), "must be a string"),
    (lambda d: d["explain"].update(families=["x"]), "explain.families"),
    (lambda d: d.update(provenance=[1]), "provenance: must be an object"),
    (lambda d: next(iter(d["collapsed"]["templates"].values())).update(ports={"out": "x"}), "list of node"),
])
def test_structural_refusals(edit, match):
    with pytest.raises(BlueprintError, match=match):
        blueprint_from_doc(mutated(edit), "t.json")


@pytest.mark.parametrize("content, match", [
    ("[" * 5000, "nests 5000 levels"), ('{"symbols": []}', '"symbols" must be an object'),
    ('{"symbols": {"hidden": 1099511627776}}', "from 1 to 2147483647"),
    ('{"symbols": {"a b": 1}}', "not a symbol name"),
    ('{"constants": {"sinkhorn_iters": 1000000000}}', "from 1 to 65536"),
    ('{"constants": {"swiglu_limit": NaN}}', "NaN"),
])
def test_hostile_config_files(tmp_path, content, match):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(content)
    with pytest.raises(ConfigError, match=match):
        load_blueprint(TINY_BLUEPRINT, cfg)


# -- 11.4: bounded time ---------------------------------------------------------------------------

def test_chained_symbols_solve_in_linear_time():
    """3,000 symbols each defined by the previous one, listed last-first: the old fixpoint loop
    took 68 s; the worklist visits each expression once."""
    n = 3000
    facts = [DimFact(f"s{i}-s{i - 1}", 1, f"e{i}") for i in range(n - 1, 0, -1)] + [DimFact("s0", 5, "e0")]
    t0 = time.perf_counter()
    env, open_symbols = solve_symbols(facts, {})
    assert time.perf_counter() - t0 < 10
    assert env[f"s{n - 1}"] == 5 + n - 1 and not open_symbols


def test_huge_dim_expressions_and_values_stop_early():
    t0 = time.perf_counter()
    for expr, value in (("*".join(["a"] * 300), 2**31 - 1), ("a*b", 2**31 - 1), ("a/1000000000", 2**31 - 1)):
        with pytest.raises(BlueprintError):
            solve_symbols([DimFact(expr, value, "e")], {"b": 2})
    assert time.perf_counter() - t0 < 10


def test_fifo_and_dev_zero_as_blueprints_do_not_block(tmp_path):
    fifo = tmp_path / "bp.json"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        proc = cli_subprocess("inspect", path, timeout=60)
        assert proc.returncode == 2 and "not a regular file" in proc.stderr, proc.stderr


# -- 11.5: huge dims and host memory ---------------------------------------------------------------

def test_shrink_refuses_dims_over_32_bits(tmp_path):
    out = tmp_path / "big.json"
    for value in ("1099511627776", "2**40", "9" * 5000):
        refused("shrink", TINY_BLUEPRINT, "-o", out, "--set", f"vocab={value}")
    assert not out.exists()
    doc = mutated(lambda d: d["edges"][0].update(dim_value=2**40))
    with pytest.raises(BlueprintError, match="2147483647"):
        blueprint_from_doc(doc, "t.json")


def test_reference_backend_refuses_what_host_memory_cannot_hold(tmp_path, monkeypatch):
    big = tmp_path / "big.json"
    assert cli("shrink", TINY_BLUEPRINT, "-o", big, "--set", "vocab=2147483647")[0] == 0
    line = refused("run", big, "--backend", "reference", "--max-new-tokens", "1")
    assert "host memory" in line and "TB of weights" in line
    monkeypatch.setattr("kbpc.runtime.reference_backend.available_host_bytes", lambda: 16 * 10**9)
    line = refused("run", SEED_BLUEPRINT, "--backend", "reference", "--max-new-tokens", "1")
    assert "178.73 GB of weights" in line and "16.00 GB is available" in line
    line = refused("run", TINY_BLUEPRINT, "--backend", "reference", "--context", "1000000000")
    assert "GB of state for 1,000,000,000 tokens" in line


# -- 11.9: small ones -----------------------------------------------------------------------------

def test_unwritable_folders_fail_before_the_build(tmp_path, fx):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for extra, what in ((["-o", blocker / "out.kbp"], "output folder"),
                        (["-o", tmp_path / "out.kbp", "--cache-dir", blocker / "c"], "cache folder"),
                        (["-o", tmp_path / "out.kbp", "--dump-dir", blocker / "d"], "--dump-dir folder")):
        t0 = time.perf_counter()
        line = refused("compile", TINY_BLUEPRINT, "--key", fx.keys.private, *extra)
        assert f"cannot write to the {what}" in line and time.perf_counter() - t0 < 10
    if os.geteuid() != 0:   # root writes anywhere: a mode says nothing to it
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        assert "output folder" in refused("compile", TINY_BLUEPRINT, "--key", fx.keys.private, "-o", locked / "o.kbp")


def test_unwritable_config_folder_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "cfg-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(blocker))
    with pytest.raises(KbpcError, match="cannot use the key folder"):
        ensure_default_key(allow_create=True)


def test_compile_creates_no_key_for_a_bad_input(tmp_path, monkeypatch):
    monkeypatch.setattr("kbpc.bundle.keystore.interactive", lambda: True)
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "kbp-graph/v2"}')
    refused("compile", bad, "-o", tmp_path / "out.kbp")
    assert not default_key_paths().private.exists() and not (tmp_path / "out.kbp").exists()
    monkeypatch.setattr("kbpc.bundle.keystore.interactive", lambda: False)   # CI: refused, nothing made
    assert "no signing key" in refused("compile", TINY_BLUEPRINT, "-o", tmp_path / "out.kbp")
    assert not default_key_paths().private.exists()


def test_error_lines_are_bounded(tmp_path):
    doc = mutated(lambda d: d.update(lineage="x" * 100000))
    path = tmp_path / ("a\nb\x1b[31m" + "n" * 200 + ".json")
    path.write_text(json.dumps(doc))
    line = refused("inspect", path)
    assert len(line) < 1600 and "\x1b" not in line and "more characters" not in line
    doc = mutated(lambda d: d["groups"][0].update(kernels=["k" * 100000]))
    path.write_text(json.dumps(doc))
    assert len(refused("inspect", path)) < 1600


def test_keys_written_by_signers_are_usable_from_pem_text(tmp_path):
    keys = generate_keys(tmp_path / "k")
    assert Signer.from_bytes(keys.private.read_bytes(), "text").key_ids == Signer.load(keys.private).key_ids
