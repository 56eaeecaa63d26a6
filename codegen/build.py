"""Ahead-of-time build: rendered module -> cute.compile on fake tensors -> export_to_c -> .so.

No GPU is needed. Each arch builds in its own spawned worker processes with CUTE_DSL_ARCH set
before the DSL is imported (the DSL reads it at import, and silently targets sm_100a without it).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import importlib.util
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from b12x.artifact_cache import ArtifactCache, artifact_key

from .render import render
from .specs import KernelSpec
from .toolchain import check_builder_toolchain, toolchain_id

_REG_RE = re.compile(r"Used (\d+) registers")
_SPILL_RE = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


@dataclass
class BuildResult:
    spec: KernelSpec
    key: str
    so_path: Path
    built: bool  # False: it was already in the cache
    seconds: float
    size: int
    kernels: dict = field(default_factory=dict)  # entry point -> {"registers": n, "spill_bytes": n}


@contextlib.contextmanager
def _capture_fds() -> Iterator[list[str]]:
    """Capture what the compiler prints (ptxas remarks come from native code, so redirect fds)."""
    out: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield out
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            f.seek(0)
            out.append(f.read().decode(errors="replace"))


def _ptxas_report(text: str) -> dict:
    regs = [int(m) for m in _REG_RE.findall(text)]
    spills = [int(a) + int(b) for a, b in _SPILL_RE.findall(text)]
    return {"registers": max(regs) if regs else None, "spill_bytes": max(spills) if spills else None}


def _import_from_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the DSL resolves source through the module
    spec.loader.exec_module(module)
    return module


def compile_module(spec: KernelSpec, workdir: Path) -> tuple[Path, dict, str]:
    """Compile every entry point of the spec's module and link them into one .so in workdir."""
    import cutlass.cute as cute

    arch = os.environ.get("CUTE_DSL_ARCH")
    if arch != spec.arch:
        raise RuntimeError(f"CUTE_DSL_ARCH: expected {spec.arch} for {spec.name}, got {arch!r}")
    source = render(spec)
    src_path = workdir / f"{spec.name}.py"
    src_path.write_text(source)
    module = _import_from_file(src_path, f"b12x_gen_{spec.name}_{os.getpid()}")
    objects, kernels = [], {}
    for name, (obj, make_fakes) in module.ENTRY_POINTS.items():
        with _capture_fds() as log:
            compiled = cute.compile(obj, *make_fakes(), options="--enable-tvm-ffi remarks{ptx}")
        kernels[name] = _ptxas_report(log[0])
        o = workdir / f"{name}.o"
        compiled.export_to_c(str(o), function_name=name)
        objects.append(str(o))
    so = workdir / "kernel.so"
    libs = cute.runtime.find_runtime_libraries(enable_tvm_ffi=True)
    subprocess.run(["gcc", "-shared", "-o", str(so), *objects, *libs], check=True)
    fields = {"spec": spec.canonical_json(), "name": spec.name, "toolchain": toolchain_id(),
              "entry_points": list(module.ENTRY_POINTS), "kernels": kernels}
    return so, fields, source


def _worker_init(arch: str) -> None:
    os.environ["CUTE_DSL_ARCH"] = arch


def _build_in_worker(spec_json: str, key: str, cache_root: str) -> dict:
    spec = KernelSpec.from_json(spec_json)
    t0 = time.perf_counter()
    art, built = ArtifactCache(cache_root).get_or_build(key, spec.arch, lambda d: compile_module(spec, d))
    return {"so": str(art.so_path), "built": built, "seconds": time.perf_counter() - t0,
            "size": art.manifest["so"]["size"], "kernels": art.manifest.get("kernels", {})}


ProgressFn = Callable[[int, int, KernelSpec, str], None]


def build_specs(specs: list[KernelSpec], cache: ArtifactCache | None = None, jobs: int = 1,
                progress: ProgressFn | None = None) -> list[BuildResult]:
    """Build (or find in the cache) every spec. Returns results in the order of `specs`."""
    cache = cache or ArtifactCache()
    cache.ensure_root()
    keys = {s: artifact_key(s) for s in specs}
    results: dict[KernelSpec, BuildResult] = {}
    todo: dict[str, list[KernelSpec]] = {}
    for s in specs:
        art = cache.lookup(keys[s], s.arch)
        if art is not None:
            results[s] = BuildResult(s, keys[s], art.so_path, False, 0.0, art.manifest["so"]["size"],
                                     art.manifest.get("kernels", {}))
            if progress:
                progress(len(results), len(specs), s, "cached")
        else:
            todo.setdefault(s.arch, []).append(s)
    if todo:
        check_builder_toolchain()
    ctx = multiprocessing.get_context("spawn")
    for arch, arch_specs in todo.items():
        workers = max(1, min(jobs, len(arch_specs)))
        with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=(arch,)) as pool:
            futs = {pool.submit(_build_in_worker, s.canonical_json(), keys[s], str(cache.root)): s for s in arch_specs}
            if progress:
                for s in arch_specs:
                    progress(len(results), len(specs), s, "queued")
            for fut in cf.as_completed(futs):
                s = futs[fut]
                r = fut.result()
                results[s] = BuildResult(s, keys[s], Path(r["so"]), r["built"], r["seconds"], r["size"], r["kernels"])
                if progress:
                    progress(len(results), len(specs), s, f"built in {r['seconds']:.1f}s")
    return [results[s] for s in specs]


def build_one(spec: KernelSpec, cache: ArtifactCache | None = None) -> BuildResult:
    return build_specs([spec], cache, jobs=1)[0]
