"""Ahead-of-time build with no GPU: the decode family for sm_90a and sm_120a (a representative
subset; `b12x-codegen build --preset sparse-mla-all --arch sm_90a,sm_120a` builds all)."""
import subprocess

import pytest

from b12x.artifact_cache import ArtifactCache
from codegen.build import build_specs
from codegen.specs import SparseMLASpec

pytestmark = pytest.mark.slow

SUBSET = [
    SparseMLASpec(num_heads=16, kv_format="fp8_ds_mla", arch="sm_90a"),
    SparseMLASpec(num_heads=128, kv_format="bf16", arch="sm_90a"),
    SparseMLASpec(num_heads=32, kv_format="fp8_ds_mla", arch="sm_120a"),
]


def test_aot_build_without_gpu(tmp_cache):
    cache = ArtifactCache()
    results = build_specs(SUBSET, cache, jobs=2)
    for r in results:
        assert r.built and r.so_path.exists() and r.size > 0
        art, why = cache.check(r.key, r.spec.arch)
        assert why == "ok", why
        assert art.manifest["entry_points"] == ["split", "combine", "combine_many_splits"]
        for name, rep in r.kernels.items():
            assert rep["registers"] and rep["registers"] <= 255, (name, rep)
            assert rep["spill_bytes"] == 0, f"{r.spec.name}/{name} spills {rep['spill_bytes']} bytes"
        symbols = subprocess.run(["nm", "-D", str(r.so_path)], capture_output=True, text=True, check=True).stdout
        assert "__tvm_ffi_split" in symbols and "__tvm_ffi_combine" in symbols
        assert "__tvm_ffi_combine_many_splits" in symbols
    again = build_specs(SUBSET, cache, jobs=2)  # second build is served from the cache
    assert not any(r.built for r in again)
    assert [r.key for r in again] == [r.key for r in results]


def test_cli_bad_preset_exits_2(capsys):
    from codegen.cli import main

    assert main(["build", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown preset 'nope'" in err
    assert main(["build", "--arch", "sm_70"]) == 2
