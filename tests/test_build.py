"""Ahead-of-time build with no GPU: the decode family for sm_90a and sm_120a (a representative
subset; `b12x-codegen build --preset sparse-mla-all --arch sm_90a,sm_120a` builds all)."""
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from b12x.artifact_cache import ArtifactCache, artifact_key
from codegen.build import build_specs
from codegen.specs import DcpSpec, SparseMLASpec

REPO = Path(__file__).resolve().parent.parent

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


V4 = dict(q_head_dim=512, kv_lora_rank=448, rope_dim=64, v_head_dim=512, kv_format="model1_fp8", topk=512,
          page_size=256)
# DeepSeek-V4 over two lists, one spec per gather form: registers (8 heads as N), the producer
# warpgroup (64 heads, P beside the K stages), the raw shared-memory form (sm_120a)
V4_FORMS = [
    SparseMLASpec(**V4, num_heads=8, extra_topk=8192, extra_page_size=2, arch="sm_90a"),
    SparseMLASpec(**V4, num_heads=64, extra_topk=512, extra_page_size=64, mode="extend", arch="sm_90a"),
    SparseMLASpec(**V4, num_heads=16, extra_topk=1024, extra_page_size=64, arch="sm_120a"),
]


def test_aot_build_of_every_deepseek_v4_form(tmp_cache):
    for r in build_specs(V4_FORMS, ArtifactCache(), jobs=2):
        assert r.built and r.so_path.exists() and r.size > 0
        want = {"extend"} if r.spec.mode == "extend" else {"split", "combine", "combine_many_splits"}
        assert set(r.kernels) == want, r.spec.name
        for name, rep in r.kernels.items():
            assert rep["spill_bytes"] == 0, f"{r.spec.name}/{name} spills {rep['spill_bytes']} bytes"


def test_cli_bad_preset_exits_2(capsys):
    from codegen.cli import main

    assert main(["build", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown preset 'nope'" in err
    assert main(["build", "--arch", "sm_70"]) == 2


def test_builds_are_byte_reproducible(tmp_path, monkeypatch):
    """Two builds of one spec, in separate processes and cache dirs, give the same kernel.so."""
    spec = DcpSpec(arch="sm_90a")
    sos = []
    for name in ("first", "second-with-a-longer-path"):
        monkeypatch.setenv("B12X_CACHE_DIR", str(tmp_path / name))
        (r,) = build_specs([spec], ArtifactCache(), jobs=1)
        assert r.built
        sos.append(r.so_path.read_bytes())
    assert sos[0] == sos[1]


def test_first_use_build_from_a_script_without_main_guard(tmp_cache, tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(
        "from b12x import registry\n"
        "from codegen.specs import DcpSpec\n"
        "k = registry.resolve(DcpSpec(arch='sm_90a'))\n"
        "print('resolved', sorted(k.functions))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resolved ['convert_pack', 'filter_local', 'finalize', 'gather_scores']" in p.stdout
    assert ArtifactCache().check(artifact_key(DcpSpec(arch="sm_90a")), "sm_90a")[1] == "ok"


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] != "Z":
                    out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def test_sigkill_of_the_build_leaves_no_orphan_workers(tmp_cache):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cli = subprocess.Popen([sys.executable, "-m", "codegen.cli", "build", "--preset", "dcp-topk", "--jobs", "2"],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60  # both workers are building once both keys are locked
        while len(list(tmp_cache.glob("locks/*.lock"))) < 2 and time.monotonic() < deadline and cli.poll() is None:
            time.sleep(0.05)
        workers = _children(cli.pid)
        assert len(workers) >= 2, "the build never started two workers"
        cli.send_signal(signal.SIGKILL)
        cli.wait(10)
        deadline = time.monotonic() + 3
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [w for w in workers if _alive(w)], "build workers outlived the killed parent"
    finally:
        for w in workers:  # leave nothing behind if the assertion failed
            with contextlib.suppress(OSError):
                os.kill(w, signal.SIGKILL)
        if cli.poll() is None:
            cli.kill()
