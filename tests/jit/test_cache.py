"""The module cache as a whole: stamps, eviction, clearing, the CLI, doctor, fallback."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
import torch

import flashinfer
from flashinfer.__main__ import main as cli
from flashinfer.jit import cache
from flashinfer.jit import env as jit_env
from flashinfer.jit.manifest import LibraryRecord, Manifest
from flashinfer.jit.norm import gen_norm_module
from tests.jit.tiny_module import tiny_spec, write_tiny_sources


def _fake_variant(root: Path, uri: str, digest: str, size: int, last_used: float) -> Path:
    variant = root / uri / digest
    variant.mkdir(parents=True)
    library = variant / f"{uri}.so"
    library.write_bytes(b"\0" * size)
    Manifest({"archs": ["9.0a"]}, library.name, {}, {}, LibraryRecord.of(library)).save(variant)
    (variant / cache.STAMP).touch()
    os.utime(variant / cache.STAMP, (last_used, last_used))
    return variant


def test_entries_report_size_last_use_and_archs(tmp_path: Path) -> None:
    _fake_variant(tmp_path, "mod_a", "aaaa", 1000, 1_000_000)
    (entry,) = cache.entries(tmp_path)
    assert (entry.uri, entry.digest, entry.archs) == ("mod_a", "aaaa", ("9.0a",))
    assert entry.size_bytes >= 1000 and entry.last_used == 1_000_000


def test_eviction_removes_least_recently_used_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    old = _fake_variant(tmp_path, "mod_a", "old", 10_000, now - 300)
    middle = _fake_variant(tmp_path, "mod_b", "mid", 10_000, now - 200)
    in_use = _fake_variant(tmp_path, "mod_c", "use", 10_000, now - 400)
    recent = _fake_variant(tmp_path, "mod_d", "new", 10_000, now - 100)
    just_built = _fake_variant(tmp_path, "mod_e", "built", 10_000, now - 500)
    monkeypatch.setattr(cache, "mapped_libraries", lambda: {str(in_use / "mod_c.so")})
    # five variants of ~10 kB each (plus manifest and stamp); two evictions fit 31 kB
    evicted = cache.evict(31_000, keep={just_built}, root=tmp_path)
    assert [e.digest for e in evicted] == ["old", "mid"]
    assert not old.exists() and not middle.exists()
    assert in_use.exists() and recent.exists() and just_built.exists()
    assert not list(tmp_path.glob("*/.trash-*"))
    assert cache.evict(10**9, root=tmp_path) == []


def test_loaded_modules_are_seen_as_mapped() -> None:
    flashinfer.get_norm_module(torch.float16)
    library = gen_norm_module(torch.float16).library_path
    assert str(library) in cache.mapped_libraries()


def test_loading_stamps_the_variant(built_tiny_spec) -> None:
    stamp = built_tiny_spec.build_dir / cache.STAMP
    os.utime(stamp, (1, 1))
    built_tiny_spec.build_and_load()
    assert stamp.stat().st_mtime > time.time() - 60


@pytest.fixture
def built_tiny_spec(workspace: Path, tmp_path: Path):  # noqa: ANN201
    spec = tiny_spec(write_tiny_sources(tmp_path / "src"))
    spec.build_and_load()
    return spec


def test_max_size_evicts_after_a_build(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tiny_spec(write_tiny_sources(tmp_path / "a"), name="tiny_first")
    first.build()  # built, never loaded here: evictable
    os.utime(first.build_dir / cache.STAMP, (1, 1))
    monkeypatch.setenv(
        "FLASHINFER_CACHE_MAX_GB", str(first_size_gb := (cache.entries()[0].size_bytes * 1.5 / 1e9))
    )
    second = tiny_spec(write_tiny_sources(tmp_path / "b"), name="tiny_second")
    second.build()
    assert not first.build_dir.exists(), f"limit {first_size_gb} GB did not evict"
    assert second.library_path.is_file()


def test_clear_by_pattern_and_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "ws"))
    root = jit_env.cached_ops_dir()
    now = time.time()
    _fake_variant(root, "norm_dtype_f16", "a1", 2_000_000, now - 10)
    _fake_variant(root, "norm_dtype_bf16", "b1", 1_000_000, now - 20)
    _fake_variant(root, "rope_x", "c1", 1_000_000, now - 30)

    assert cli(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "norm_dtype_f16" in out and "rope_x" in out and "3 variant(s)" in out

    assert cli(["cache", "gc", "--max-gb", "0.0035"]) == 0
    assert "evicted 1 variant(s)" in capsys.readouterr().out
    assert not (root / "rope_x" / "c1").exists()

    assert cli(["cache", "clear", "--module", "norm_*_f16"]) == 0
    assert "removed 1 variant(s)" in capsys.readouterr().out
    assert [e.uri for e in cache.entries()] == ["norm_dtype_bf16"]
    assert cli(["cache", "clear"]) == 0
    assert cache.entries() == []


def test_unusable_workspace_falls_back_to_a_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jit_log
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(blocker / "ws"))
    workspace = jit_env.workspace_dir()
    assert workspace.parent.name == f"flashinfer-{os.getuid()}"
    warnings = jit_log.messages(logging.WARNING)
    assert len(warnings) == 1 and "is unusable" in warnings[0]
    jit_env.workspace_dir()
    assert len(jit_log.messages(logging.WARNING)) == 1  # said once


def test_doctor_reports_and_fails_clearly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in ("nvcc", "host compiler", "ninja", "GPU", "workspace", "versions"):
        assert f"[ok] {name}:" in out
    monkeypatch.setenv("FLASHINFER_NVCC", "no-such-nvcc")
    monkeypatch.setenv("FLASHINFER_NVCC_THREADS", "zero")
    assert cli(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] nvcc: 'no-such-nvcc' not found on PATH" in out
    assert "[FAIL] configuration: invalid value 'zero' for FLASHINFER_NVCC_THREADS" in out
    assert "2 check(s) failed" in out or "3 check(s) failed" in out
