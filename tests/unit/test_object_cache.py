"""The object cache (kbpc/toolchain/cache.py) and private build folders (workdir.py): entries are
whole or absent, a damaged entry is evicted instead of reused, least recently used entries go past
the size limit, concurrent writers and readers never see a partial entry, the environment
overrides the folder and the limit, and what a killed compile leaves behind is swept."""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbpc.cli import main
from kbpc.settings import environment, parse_size
from kbpc.errors import KbpcError
from kbpc.toolchain.cache import ObjectCache, default_object_dir
from kbpc.toolchain.workdir import STALE_SECONDS, build_folder, remove_if_unused, sweep

REPO = Path(__file__).resolve().parents[2]


def test_store_and_load(tmp_path):
    cache = ObjectCache(tmp_path, limit=1 << 20)
    assert cache.load("k1") is None
    cache.store("k1", b"\x7fELF object bytes")
    assert cache.load("k1") == b"\x7fELF object bytes"
    assert not [p for p in cache.objects.iterdir() if p.name.startswith(".")]  # no temporary left


@pytest.mark.parametrize("damage", ["empty", "flip", "truncate", "garbage"])
def test_damaged_entry_is_evicted_not_used(tmp_path, damage):
    cache = ObjectCache(tmp_path, limit=1 << 20)
    cache.store("k", bytes(range(256)) * 8)
    entry = next(cache.objects.iterdir())
    raw = bytearray(entry.read_bytes())
    if damage == "empty":
        raw = bytearray()
    elif damage == "flip":
        raw[-100] ^= 0x10
    elif damage == "truncate":
        raw = raw[:-1]
    else:
        raw = bytearray(b"not an entry at all")
    entry.write_bytes(bytes(raw))
    assert cache.load("k") is None
    assert not entry.exists()


def test_lru_trim_keeps_recently_used(tmp_path):
    cache = ObjectCache(tmp_path, limit=1 << 20)
    for i, key in enumerate(["old", "mid", "new"]):
        cache.store(key, bytes(1000))
        os.utime(cache.objects / f"{key}.kbo", (1000 + i, 1000 + i))
    assert cache.load("old") is not None          # a hit makes "old" the most recent
    size = (cache.objects / "new.kbo").stat().st_size
    freed = cache.trim(2 * size)
    assert freed == size
    assert cache.load("mid") is None and cache.load("old") is not None and cache.load("new") is not None


def _hammer(root: str, worker: int, rounds: int) -> int:
    cache = ObjectCache(Path(root), limit=1 << 30)
    bad = 0
    for i in range(rounds):
        data = bytes([worker]) * (1000 + 37 * i)   # every writer writes different bytes to one key
        cache.store("shared", data)
        got = cache.load("shared")
        if got is not None and (len(set(got)) != 1 or (len(got) - 1000) % 37):
            bad += 1
    return bad


def test_concurrent_writers_and_readers_see_whole_entries(tmp_path):
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        bad = pool.starmap(_hammer, [(str(tmp_path), w, 150) for w in range(4)])
    assert bad == [0, 0, 0, 0]
    assert ObjectCache(tmp_path).load("shared") is not None


def test_environment_sets_folder_and_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("KBPC_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("KBPC_CACHE_LIMIT", "3M")
    assert default_object_dir() == tmp_path / "c" / "build"
    assert ObjectCache().limit == 3 << 20
    monkeypatch.setenv("KBPC_CACHE_LIMIT", "lots")
    with pytest.raises(KbpcError, match="KBPC_CACHE_LIMIT"):
        environment()
    assert parse_size("1.5K", "x") == 1536 and parse_size("123", "x") == 123


def test_unwritable_cache_is_a_clean_error(tmp_path):
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "build").write_text("a file where the folder should be")
    with pytest.raises(KbpcError, match="object cache"):
        ObjectCache(tmp_path / "ro" / "build")


def test_build_folder_is_locked_while_used_and_removed_after(tmp_path):
    with build_folder(tmp_path) as work:
        (work / "x.o").write_bytes(b"x")
        assert remove_if_unused(work) == 0 and work.exists()
    assert not work.exists()


def test_sweep_removes_what_a_killed_compile_left(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from kbpc.toolchain.workdir import build_folder\n"
        "with build_folder(Path(sys.argv[1])) as w:\n"
        "    (w / 'big.o').write_bytes(bytes(4096)); print(w, flush=True); time.sleep(60)\n"),
        str(tmp_path)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    work = Path(holder.stdout.readline().strip())
    assert sweep(tmp_path) == 0 and work.exists()           # its compile is running
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert work.exists()                                     # kill -9: nothing ran to clean up
    stale = tmp_path / ".entry.123.tmp"
    stale.write_bytes(b"half")
    fresh = tmp_path / ".other.456.tmp"
    fresh.write_bytes(b"being written")
    os.utime(stale, (time.time() - STALE_SECONDS - 5,) * 2)
    assert sweep(tmp_path) >= 4096
    assert not work.exists() and not stale.exists() and fresh.exists()


def test_cache_cli_info_and_clean(tmp_path, monkeypatch):
    monkeypatch.setenv("KBPC_CACHE_DIR", str(tmp_path))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tiny-0123.kbp").write_bytes(bytes(100))
    cache = ObjectCache(tmp_path / "c", limit=1 << 20)
    for key in ("a", "b"):
        cache.store(key, bytes(5000))
    runner = CliRunner()
    result = runner.invoke(main, ["cache", "info", "--cache-dir", str(tmp_path / "c"), "--json"])
    assert result.exit_code == 0, result.output
    assert '"entries": 2' in result.output
    result = runner.invoke(main, ["cache", "clean", "--cache-dir", str(tmp_path / "c"), "--keep", "6K"])
    assert result.exit_code == 0 and len(list(cache.objects.iterdir())) == 1
    result = runner.invoke(main, ["cache", "clean", "--cache-dir", str(tmp_path / "c"), "--keep", "six"])
    assert result.exit_code == 2 and "--keep" in result.output
    result = runner.invoke(main, ["cache", "clean", "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert not list(cache.objects.iterdir()) and not list((tmp_path / "run").iterdir())
