import json
import multiprocessing
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from b12x.artifact_cache import ArtifactCache, artifact_key
from b12x.errors import CacheError
from codegen.specs import SparseMLASpec

KEY = "ab" + "0" * 62
ARCH = "sm_90a"


def _fake_build(payload: bytes, marker_dir: Path | None = None, delay: float = 0.0):
    def build(workdir: Path):
        if marker_dir is not None:
            (marker_dir / f"built-{os.getpid()}-{time.monotonic_ns()}").touch()
        time.sleep(delay)
        so = workdir / "kernel.so"
        so.write_bytes(payload)
        return so, {"entry_points": ["split"], "name": "fake"}, "# source\n"
    return build


def test_store_and_verify(tmp_cache):
    c = ArtifactCache()
    art, built = c.get_or_build(KEY, ARCH, _fake_build(b"x" * 1000))
    assert built and art.so_path.read_bytes() == b"x" * 1000
    art2, built2 = c.get_or_build(KEY, ARCH, _fake_build(b"never"))
    assert not built2 and art2.manifest["so"]["sha256"] == art.manifest["so"]["sha256"]
    assert c.check(KEY, ARCH)[1] == "ok"


@pytest.mark.parametrize("damage,reason", [
    (lambda d: (d / "kernel.so").write_bytes(b"x" * 500), "truncated"),
    (lambda d: (d / "kernel.so").write_bytes(b"y" * 1000), "corrupt"),
    (lambda d: (d / "manifest.json").write_text("{not json"), "corrupt manifest"),
    (lambda d: (d / "manifest.json").write_text(json.dumps({"format": 1, "key": "f" * 64})), "foreign"),
    (lambda d: (d / "kernel.so").unlink(), "missing"),
])
def test_damaged_artifact_is_detected_and_rebuilt(tmp_cache, damage, reason):
    c = ArtifactCache()
    art, _ = c.get_or_build(KEY, ARCH, _fake_build(b"x" * 1000))
    damage(art.dir)
    got, why = c.check(KEY, ARCH)
    assert got is None and reason in why
    art, built = c.get_or_build(KEY, ARCH, _fake_build(b"z" * 1000))
    assert built and c.check(KEY, ARCH)[1] == "ok"


def _race(root: str, marker: str, q):
    art, built = ArtifactCache(root).get_or_build(KEY, ARCH, _fake_build(b"r" * 4096, Path(marker), delay=0.5))
    q.put((built, art.manifest["so"]["sha256"]))


def test_concurrent_builders_leave_one_good_artifact(tmp_cache, tmp_path):
    marker = tmp_path / "markers"
    marker.mkdir()
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_cache), str(marker), q)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    results = [q.get(timeout=5) for _ in procs]
    assert sorted(b for b, _ in results) == [False, True]  # exactly one built, the other waited
    assert len({h for _, h in results}) == 1
    assert len(list(marker.iterdir())) == 1
    assert ArtifactCache(tmp_cache).check(KEY, ARCH)[1] == "ok"


@pytest.mark.parametrize("mode", [0o775, 0o777, 0o757])
def test_group_or_world_writable_cache_dir_refused(tmp_path, monkeypatch, mode):
    d = tmp_path / "shared-cache"
    d.mkdir()
    os.chmod(d, mode)
    monkeypatch.setenv("B12X_CACHE_DIR", str(d))
    with pytest.raises(CacheError, match=r"not writable by group or others.*got mode"):
        ArtifactCache().ensure_root()


def test_key_covers_spec_and_arch():
    a = artifact_key(SparseMLASpec(num_heads=16))
    assert a == artifact_key(SparseMLASpec(num_heads=16))
    assert a != artifact_key(SparseMLASpec(num_heads=16, arch="sm_120a"))
    assert a != artifact_key(SparseMLASpec(num_heads=32))


# -- hardening: loading a .so runs its code ---------------------------------------------------------

def _entry(tmp_cache) -> Path:
    art, _ = ArtifactCache().get_or_build(KEY, ARCH, _fake_build(b"x" * 1000))
    return art.dir


def _symlink_to_world_writable_copy(d: Path) -> None:
    copy = d.parent.parent.parent.parent / "planted.so"  # the same bytes, so the sha256 still matches
    copy.write_bytes((d / "kernel.so").read_bytes())
    os.chmod(copy, 0o666)
    (d / "kernel.so").unlink()
    (d / "kernel.so").symlink_to(copy)


def _symlinked_arch_dir(d: Path) -> None:
    arch = d.parents[1]
    moved = arch.parent.parent / "elsewhere"
    arch.rename(moved)
    arch.symlink_to(moved)


def _hard_link(d: Path) -> None:
    os.link(d / "kernel.so", d.parent / "second-name.so")


def _chmod_gw(rel: str):
    def damage(d: Path) -> None:
        p = {"root": d.parents[3], "v1": d.parents[2], "arch": d.parents[1], "fan": d.parent, "key": d,
             "kernel.so": d / "kernel.so", "manifest.json": d / "manifest.json"}[rel]
        os.chmod(p, stat.S_IMODE(p.stat().st_mode) | stat.S_IWGRP | stat.S_IWOTH)
    return damage


UNSAFE = [
    pytest.param(_symlink_to_world_writable_copy, "kernel.so is a symlink", id="so-symlink"),
    pytest.param(_hard_link, "kernel.so has 2 hard links", id="so-hardlink"),
    pytest.param(_symlinked_arch_dir, "v1/sm_90a is a symlink", id="arch-dir-symlink"),
    *[pytest.param(_chmod_gw(rel), "writable by group or others", id=f"{rel}-go+w")
      for rel in ("v1", "arch", "fan", "key", "kernel.so", "manifest.json")],
]


@pytest.mark.parametrize("damage,reason", UNSAFE)
def test_unsafe_entry_is_refused_and_rebuilt(tmp_cache, damage, reason):
    c = ArtifactCache()
    d = _entry(tmp_cache)
    damage(d)
    got, why = c.check(KEY, ARCH)
    assert got is None and reason in why, why
    assert "\n" not in why
    art, built = c.get_or_build(KEY, ARCH, _fake_build(b"z" * 1000))
    assert built and c.check(KEY, ARCH)[1] == "ok"
    so = art.so_path
    assert not so.is_symlink() and so.stat().st_nlink == 1 and so.read_bytes() == b"z" * 1000
    for p in (so, d, d.parent, d.parent.parent, d.parents[2]):
        assert not stat.S_IMODE(p.lstat().st_mode) & 0o022, p


def test_world_writable_root_is_refused_by_check(tmp_cache):
    d = _entry(tmp_cache)
    _chmod_gw("root")(d)
    got, why = ArtifactCache(tmp_cache).check(KEY, ARCH)
    assert got is None and "writable by group or others" in why


def test_verify_reports_unsafe_entries(tmp_cache, capsys):
    from codegen.cli import main

    _symlink_to_world_writable_copy(_entry(tmp_cache))
    assert main(["verify"]) == 1
    out = capsys.readouterr().out
    assert "kernel.so is a symlink" in out and "1 bad" in out


def test_frozen_resolve_of_an_unsafe_entry_names_the_reason(tmp_cache, monkeypatch):
    from b12x import registry
    from b12x.errors import KernelResolutionFrozenError

    monkeypatch.setattr(registry, "artifact_key", lambda spec: KEY)
    monkeypatch.setattr(registry, "_loaded", {})
    _symlink_to_world_writable_copy(_entry(tmp_cache))
    registry.freeze()
    try:
        with pytest.raises(KernelResolutionFrozenError, match="kernel.so is a symlink"):
            registry.resolve(SparseMLASpec(num_heads=16))
    finally:
        registry.unfreeze()


@pytest.mark.parametrize("drop", ["so", "entry_points", "so.sha256", "so.size"])
def test_manifest_missing_a_field_is_corrupt_and_rebuilt(tmp_cache, drop):
    c = ArtifactCache()
    d = _entry(tmp_cache)
    m = json.loads((d / "manifest.json").read_text())
    outer, _, inner = drop.partition(".")
    del (m[outer] if inner else m)[inner or outer]
    (d / "manifest.json").write_text(json.dumps(m))
    got, why = c.check(KEY, ARCH)
    assert got is None and why.startswith("corrupt manifest") and repr(inner or outer) in why, why
    art, built = c.get_or_build(KEY, ARCH, _fake_build(b"z" * 1000))
    assert built and c.check(KEY, ARCH)[1] == "ok"


def _killed_mid_build(root: str, record: str):
    def build(workdir: Path):
        (workdir / "half.o").write_bytes(b"partial")
        Path(record).write_text(str(workdir))
        os.kill(os.getpid(), 9)
    ArtifactCache(root).get_or_build(KEY, ARCH, build)


def test_leftovers_of_a_killed_build_are_cleaned(tmp_cache, tmp_path):
    record = tmp_path / "workdir.txt"
    p = multiprocessing.get_context("spawn").Process(target=_killed_mid_build, args=(str(tmp_cache), str(record)))
    p.start()
    p.join(60)
    assert p.exitcode == -9
    stale_build = Path(record.read_text())
    assert stale_build.is_dir()
    d = ArtifactCache().entry_dir(KEY, ARCH)
    d.mkdir(parents=True, exist_ok=True)
    temps = [d / ".kernel.so.k1ll3d", d / ".manifest.json.k1ll3d"]  # what a store() killed mid-write leaves
    for t in temps:
        t.write_bytes(b"partial")
    art, built = ArtifactCache().get_or_build(KEY, ARCH, _fake_build(b"x" * 1000))
    assert built and not stale_build.exists()
    assert not any(t.exists() for t in temps)
    assert sorted(p.name for p in art.dir.iterdir()) == ["kernel.so", "manifest.json", "source.py"]


def _cache_dir_cases(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("")
    ro = tmp_path / "read-only"
    ro.mkdir()
    os.chmod(ro, 0o500)
    if os.access(ro, os.W_OK):  # root ignores modes; /proc/1 refuses new files to anyone
        ro = Path("/proc/1")
    return {"file": (f, "is a file"), "under-a-file": (f / "cache", f"{f} is a file"),
            "unwritable": (ro, "cannot write")}


@pytest.mark.parametrize("case", ["file", "under-a-file", "unwritable"])
def test_bad_cache_dir_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, case):
    from codegen.cli import main

    path, what = _cache_dir_cases(tmp_path)[case]
    monkeypatch.setenv("B12X_CACHE_DIR", str(path))
    assert main(["build", "--preset", "dcp-topk", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and what in err, err
    if case != "unwritable":
        assert main(["verify"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err and what in err, err
        with pytest.raises(CacheError, match=what):
            ArtifactCache().lookup(KEY, ARCH)


@pytest.mark.parametrize("jobs", ["0", "-1", "two"])
def test_jobs_must_be_positive(tmp_cache, capsys, jobs):
    from codegen.cli import main

    with pytest.raises(SystemExit) as e:
        main(["build", "--jobs", jobs])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --jobs: expected a positive integer" in err, err


# -- what is loaded is what was verified ------------------------------------------------------------

def _tiny_so(path: Path, marker: Path, text: str) -> Path:
    c = path.with_suffix(".c")
    c.write_text(
        "#include <stdio.h>\n"
        f"__attribute__((constructor)) static void mark(void) {{ FILE *f = fopen(\"{marker}\", \"a\"); "
        f"if (f) {{ fputs(\"{text}\\n\", f); fclose(f); }} }}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(c)], check=True)
    return path


def test_swapping_kernel_so_after_verification_does_not_change_what_is_loaded(tmp_cache, tmp_path, monkeypatch):
    from b12x import registry

    marker = tmp_path / "loaded.txt"
    good = _tiny_so(tmp_path / "good.so", marker, "good")
    evil = _tiny_so(tmp_path / "evil.so", marker, "evil")

    def build(workdir: Path):
        return good, {"entry_points": [], "name": "tiny"}, None

    ArtifactCache().get_or_build(KEY, ARCH, build)

    class SwapAfterVerify(ArtifactCache):
        """Another user (or a racing process) replaces kernel.so right after it was verified."""

        def _swap(self, result):
            so = self.entry_dir(KEY, ARCH) / "kernel.so"
            so.write_bytes(evil.read_bytes())
            return result

        def check(self, key, arch):
            return self._swap(super().check(key, arch))

        def read_verified(self, key, arch):
            return self._swap(super().read_verified(key, arch))

    monkeypatch.setattr(registry, "artifact_key", lambda spec: KEY)
    monkeypatch.setattr(registry, "_loaded", {})
    loaded = registry.resolve(SparseMLASpec(num_heads=16), SwapAfterVerify())
    assert marker.read_text() == "good\n"
    assert loaded.functions == {}


def test_prune_cleans_leftovers_except_of_a_build_in_progress(tmp_cache):
    c = ArtifactCache()
    other = "cd" + "1" * 62
    for key in (KEY, other):
        c.get_or_build(key, ARCH, _fake_build(b"x" * 100))
        d = c.entry_dir(key, ARCH)
        (d / ".kernel.so.k1ll3d").write_bytes(b"partial")
        (d.parent / f".{key}.build-k1ll3d").mkdir()
    with c.lock(other):  # someone is building `other` right now
        assert c.clean_leftovers() == 2
    assert not (c.entry_dir(KEY, ARCH) / ".kernel.so.k1ll3d").exists()
    assert (c.entry_dir(other, ARCH) / ".kernel.so.k1ll3d").exists()
    assert c.check(KEY, ARCH)[1] == "ok" and c.check(other, ARCH)[1] == "ok"


def test_export_copies_a_presets_artifacts_verified(tmp_cache, tmp_path, capsys):
    """`b12x-codegen export` copies exactly the presets' artifacts, each as the destination's own
    verified entry, and refuses, naming the spec, when one is not built."""
    from codegen.catalog import get_preset
    from codegen.cli import main

    specs = get_preset("dcp-topk").specs(("sm_90a",))
    src = ArtifactCache()
    keys = [artifact_key(s) for s in specs]
    for i, (spec, key) in enumerate(zip(specs, keys)):
        src.get_or_build(key, spec.arch, _fake_build(bytes([65 + i]) * 777))
    src.get_or_build(KEY, ARCH, _fake_build(b"other"))            # not in the preset: stays behind
    dst = tmp_path / "serving"
    assert main(["export", "--preset", "dcp-topk", "--to", str(dst)]) == 0
    out = ArtifactCache(dst)
    assert sorted(k for _, k, _ in out.entries()) == sorted(keys)
    for i, (spec, key) in enumerate(zip(specs, keys)):
        art, why = out.check(key, spec.arch)
        assert why == "ok" and art.so_path.read_bytes() == bytes([65 + i]) * 777 and art.manifest["name"] == "fake"
    assert main(["export", "--preset", "dcp-topk,deepseek-v3.2-tp8", "--to", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert "sparse_mla_decode_h16_k2048_fp8_ds_mla_sm_90a (sm_90a): missing" in err and "dcp_topk_sm_90a" not in err
    assert not (tmp_path / "x").exists()
