"""Toolchain pins that are part of every artifact's identity.

The serving process may not have the DSL compiler installed, so cache keys use these pins, not
whatever happens to be importable; the builder refuses to run with other versions."""
from __future__ import annotations

import importlib.metadata

CUTLASS_DSL_VERSION = "4.8.1"
TVM_FFI_VERSION = "0.1.15.post2"
SUPPORTED_ARCHS = ("sm_90a", "sm_120a")


def toolchain_id() -> str:
    return f"nvidia-cutlass-dsl=={CUTLASS_DSL_VERSION};apache-tvm-ffi=={TVM_FFI_VERSION}"


def check_builder_toolchain() -> None:
    """Raise if the installed compiler differs from the pins (it would poison the cache)."""
    for dist, pinned in (("nvidia-cutlass-dsl", CUTLASS_DSL_VERSION), ("apache-tvm-ffi", TVM_FFI_VERSION)):
        try:
            have = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError as e:
            raise RuntimeError(f"{dist}=={pinned} is needed to build kernels, and it is not installed") from e
        if have != pinned:
            raise RuntimeError(f"{dist}: expected version {pinned} (it is part of the cache key), found {have}")
