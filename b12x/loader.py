"""Loading artifacts: libcute_dsl_runtime.so preloaded with RTLD_GLOBAL, then tvm_ffi's .so loader.

The serving process needs neither the DSL compiler nor any GPU-side compile."""
from __future__ import annotations

import atexit
import ctypes
import fcntl
import glob
import importlib.util
import os
import shutil
import tempfile
import threading
from pathlib import Path

from .errors import ArtifactMissingError

_lock = threading.Lock()
_runtime_handle: ctypes.CDLL | None = None
# The memfds (or private copies) of loaded libraries stay open for the life of the process, as the
# libraries do (tvm_ffi keeps loaded modules alive). glibc's dlopen first matches a new path by
# its name against loaded libraries, so a closed fd's number reused for another artifact would
# return the old library.
_images: list[int] = []
_private_dir: str | None = None


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
    """Load one .so by path; returns the tvm_ffi module (index it by entry-point name). Cached
    artifacts go through load_module_bytes, which loads what was verified."""
    preload_runtime()
    import tvm_ffi

    return tvm_ffi.load_module(str(Path(so_path).resolve()))


def _image_path(data: bytes, name: str) -> str:
    """A path that names exactly `data` and that nobody else can change: a sealed anonymous
    memfd, or, where memfds are missing, a copy in a private 0700 directory of this process."""
    global _private_dir
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
        except BaseException:
            os.close(fd)
            raise
        _images.append(fd)
        return f"/proc/self/fd/{fd}"
    if _private_dir is None:
        _private_dir = tempfile.mkdtemp(prefix="b12x-load-")
        atexit.register(shutil.rmtree, _private_dir, True)
    fd, path = tempfile.mkstemp(dir=_private_dir, prefix=f"{len(_images)}-", suffix=".so")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o500)
    _images.append(-1)
    return path


def load_module_bytes(data: bytes, name: str = "kernel.so"):
    """Load a shared library from its bytes (already verified by the caller); returns the tvm_ffi
    module. Nothing on disk is read again, so a file swapped after the check is never loaded."""
    preload_runtime()
    import tvm_ffi

    with _lock:
        path = _image_path(data, name)
    # tvm_ffi.load_module picks its loader from the path's suffix, which /proc/self/fd/N lacks;
    # this is the loader it picks for a .so (a dlopen), and the keep-alive it applies.
    mod = tvm_ffi.get_global_func("ffi.Module.load_from_file.so")(path, "so")
    tvm_ffi.get_global_func("ffi.ModuleGlobalsAdd")(mod)
    return mod
