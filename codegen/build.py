"""Ahead-of-time build: rendered module -> cute.compile on fake tensors -> export_to_c -> .so.

No GPU is needed. Each arch builds in its own worker processes (codegen/build_worker.py) with
CUTE_DSL_ARCH set in their environment before the DSL is imported (the DSL reads it at import,
and silently targets sm_100a without it).

Builds are byte-reproducible: the same spec and toolchain give the same kernel.so, whatever the
process, build directory or cache location. The generated module's name (which the DSL puts in
every symbol) is the spec's name only, and the workers get a fixed hash seed and none of the
CUTE_DSL_* debugging knobs of the caller's environment (line info, assertions, optimisation
level), which would change the code under the same cache key.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from b12x.artifact_cache import ArtifactCache, artifact_key
from b12x.errors import CacheError

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
    from .render import render  # jinja2: only where a module is compiled, never on a serving box

    source = render(spec)
    src_path = workdir / f"{spec.name}.py"
    src_path.write_text(source)
    module = _import_from_file(src_path, f"b12x_gen_{spec.name}")  # in every symbol name: nothing per-process
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


def build_task(spec_json: str, key: str, cache_root: str) -> dict:
    """What one worker does for one spec (codegen/build_worker.py calls it)."""
    spec = KernelSpec.from_json(spec_json)
    t0 = time.perf_counter()
    art, built = ArtifactCache(cache_root).get_or_build(key, spec.arch, lambda d: compile_module(spec, d))
    return {"so": str(art.so_path), "built": built, "seconds": time.perf_counter() - t0,
            "size": art.manifest["so"]["size"], "kernels": art.manifest.get("kernels", {})}


_WORKER_MAIN = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
                "from codegen.build_worker import main; main(int(sys.argv[2]))")
_KEPT_DSL_ENV = {"CUTE_DSL_LIBS"}  # which runtime flavour to link; no effect on the generated code


def _worker_env(arch: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_DSL_") or k in _KEPT_DSL_ENV}
    env["CUTE_DSL_ARCH"] = arch
    env["PYTHONHASHSEED"] = "0"
    return env


class _Worker:
    """A build worker process; one task at a time over its stdin/stdout."""

    def __init__(self, arch: str):
        # The child imports what this process imports, from the same places (sys.path mirrored,
        # so an uninstalled checkout or a script's directory works as it does here).
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER_MAIN, json.dumps(sys.path), str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_worker_env(arch), text=True)

    def run(self, task: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(task) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, ValueError):
            line = ""
        if not line:
            raise RuntimeError(f"build worker {self.proc.pid} died (exit code {self.proc.wait()})")
        return json.loads(line)

    def close(self, kill: bool) -> None:
        if kill:
            self.proc.kill()
        else:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=None if kill else 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()


def _raise_remote(spec: KernelSpec, answer: dict) -> None:
    if answer["error"] == "CacheError":
        raise CacheError(answer["message"])
    raise RuntimeError(f"building {spec.name} failed in a build worker:\n{answer['traceback']}")


def _build_arch(arch: str, specs: list[KernelSpec], keys: dict, cache_root: str, jobs: int,
                done: Callable[[KernelSpec, dict], None]) -> None:
    tasks: queue.Queue = queue.Queue()
    for s in specs:
        tasks.put(s)
    answers: queue.Queue = queue.Queue()
    workers: list[_Worker] = []

    def serve(w: _Worker) -> None:
        while True:
            try:
                s = tasks.get_nowait()
            except queue.Empty:
                return
            try:
                answers.put((s, w.run({"spec_json": s.canonical_json(), "key": keys[s], "cache_root": cache_root})))
            except BaseException as e:
                answers.put((s, e))
                return

    failed = True
    try:
        for _ in range(min(jobs, len(specs))):  # forked from this thread, which their death signal follows
            workers.append(_Worker(arch))
        for w in workers:
            threading.Thread(target=serve, args=(w,), name="b12x-build", daemon=True).start()
        for _ in specs:
            s, answer = answers.get()
            if isinstance(answer, BaseException):
                raise RuntimeError(f"building {s.name}: {answer}") from answer
            if "error" in answer:
                _raise_remote(s, answer)
            done(s, answer["result"])
        failed = False
    finally:
        for w in workers:
            w.close(kill=failed)


ProgressFn = Callable[[int, int, KernelSpec, str], None]


def build_specs(specs: list[KernelSpec], cache: ArtifactCache | None = None, jobs: int = 1,
                progress: ProgressFn | None = None) -> list[BuildResult]:
    """Build (or find in the cache) every spec. Returns results in the order of `specs`."""
    if jobs < 1:
        raise ValueError(f"jobs: expected a positive integer, got {jobs}")
    cache = cache or ArtifactCache()
    cache.ensure_root()
    keys = {s: artifact_key(s) for s in specs}
    results: dict[KernelSpec, BuildResult] = {}
    todo: dict[str, list[KernelSpec]] = {}
    for s in specs:
        art, why = cache.check(keys[s], s.arch)
        if art is not None:
            results[s] = BuildResult(s, keys[s], art.so_path, False, 0.0, art.manifest["so"]["size"],
                                     art.manifest.get("kernels", {}))
            if progress:
                progress(len(results), len(specs), s, "cached")
        else:
            if progress and why != "missing":
                progress(len(results), len(specs), s, f"cache entry refused ({why}), rebuilding")
            todo.setdefault(s.arch, []).append(s)
    if todo:
        cache.ensure_writable()
        check_builder_toolchain()

    def done(s: KernelSpec, r: dict) -> None:
        results[s] = BuildResult(s, keys[s], Path(r["so"]), r["built"], r["seconds"], r["size"], r["kernels"])
        if progress:
            progress(len(results), len(specs), s, f"built in {r['seconds']:.1f}s")

    for arch, arch_specs in todo.items():
        if progress:
            for s in arch_specs:
                progress(len(results), len(specs), s, "queued")
        _build_arch(arch, arch_specs, keys, str(cache.root.absolute()), jobs, done)
    return [results[s] for s in specs]


def build_one(spec: KernelSpec, cache: ArtifactCache | None = None) -> BuildResult:
    return build_specs([spec], cache, jobs=1)[0]
