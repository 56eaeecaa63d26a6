"""Loading artifacts: libcute_dsl_runtime.so preloaded with RTLD_GLOBAL, then tvm_ffi.load_module.

The serving process needs neither the DSL compiler nor any GPU-side compile."""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import threading
from pathlib import Path

from .errors import ArtifactMissingError

_lock = threading.Lock()
_runtime_handle: ctypes.CDLL | None = None


def runtime_library_path() -> str:
    """$B12X_CUTE_RUNTIME, else the newest CUDA flavour in the installed nvidia-cutlass-dsl wheel."""
    env = os.environ.get("B12X_CUTE_RUNTIME")
    if env:
        if not os.path.isfile(env):
            raise ArtifactMissingError(f"B12X_CUTE_RUNTIME: expected a file, got {env!r} (not found)")
        return env
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            libs = sorted(glob.glob(os.path.join(base, "cu*", "lib", "libcute_dsl_runtime.so")))
            if libs:
                return libs[-1]
    raise ArtifactMissingError(
        "libcute_dsl_runtime.so: not found; install nvidia-cutlass-dsl==4.8.1 or set B12X_CUTE_RUNTIME to its path")


def preload_runtime() -> None:
    global _runtime_handle
    with _lock:
        if _runtime_handle is None:
            _runtime_handle = ctypes.CDLL(runtime_library_path(), mode=ctypes.RTLD_GLOBAL)


def load_module(so_path: Path | str):
    """Load one artifact; returns the tvm_ffi module (index it by entry-point name)."""
    preload_runtime()
    import tvm_ffi

    return tvm_ffi.load_module(str(Path(so_path).resolve()))
