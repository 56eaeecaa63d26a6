import json
import multiprocessing
import os
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
