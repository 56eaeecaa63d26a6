"""Kernel resolution: spec -> loaded artifact, with freeze().

Before freeze(), a spec that is not loaded yet is looked up in the cache and, when missing or
corrupt, built on the spot if the DSL compiler is installed (the JIT fallback). After freeze(),
only kernels loaded by then resolve; anything else raises KernelResolutionFrozenError, so a
serving process never compiles or lazily loads code behind an engine's back."""
from __future__ import annotations

import importlib.util
import logging
import threading
from dataclasses import dataclass

from codegen.specs import KernelSpec

from .artifact_cache import Artifact, ArtifactCache, artifact_key
from .errors import ArtifactMissingError, KernelResolutionFrozenError
from .loader import load_module_bytes

log = logging.getLogger("b12x")

_lock = threading.RLock()
_loaded: dict[KernelSpec, "LoadedKernels"] = {}
_frozen = False
_frozen_reason: str | None = None


@dataclass(frozen=True)
class LoadedKernels:
    spec: KernelSpec
    artifact: Artifact
    module: object  # keeps the library mapped
    functions: dict  # entry point -> tvm_ffi function (positional arguments only)

    def __getitem__(self, name: str):
        return self.functions[name]


def freeze(*, reason: str | None = None) -> None:
    """From now on, resolve() serves only kernels already loaded; `reason` is named in the error
    a missing kernel raises."""
    global _frozen, _frozen_reason
    with _lock:
        _frozen, _frozen_reason = True, reason


def unfreeze() -> None:
    global _frozen, _frozen_reason
    with _lock:
        _frozen, _frozen_reason = False, None


def is_frozen() -> bool:
    return _frozen


def loaded_specs() -> list[KernelSpec]:
    with _lock:
        return list(_loaded)


def dsl_available() -> bool:
    """Whether this process could build a missing artifact: the DSL compiler, jinja2 and the templates."""
    from codegen.identity import can_render

    return importlib.util.find_spec("cutlass") is not None and can_render()


def _cache_state(spec: KernelSpec, cache: ArtifactCache) -> str:
    """What the cache holds for a spec, for the frozen error (reading only, never building)."""
    try:
        art, why = cache.check(artifact_key(spec), spec.arch)
    except Exception as e:  # the message must still name the spec
        return f"its cache entry could not be checked: {e}"
    if art is not None:
        return f"its cache entry in {cache.root} is intact but was not loaded"
    if why == "missing":
        return f"no cache entry in {cache.root}"
    return f"its cache entry in {cache.root} is refused: {why}"


def resolve(spec: KernelSpec, cache: ArtifactCache | None = None) -> LoadedKernels:
    with _lock:
        hit = _loaded.get(spec)
        if hit is not None:
            return hit
        cache = cache or ArtifactCache()
        if _frozen:
            raise KernelResolutionFrozenError(
                f"kernel {spec.name} is not loaded and b12x is frozen"
                f"{f' ({_frozen_reason})' if _frozen_reason else ''}; prewarm it before freeze() "
                f"({_cache_state(spec, cache)}). Missing spec: {spec.canonical_json()}")
        key = artifact_key(spec)
        cache.ensure_root()
        art, data, why = cache.read_verified(key, spec.arch)
        if art is None:
            if not dsl_available():
                raise ArtifactMissingError(
                    f"kernel {spec.name}: no usable artifact in {cache.root} ({why}) and nvidia-cutlass-dsl (with "
                    f"jinja2) is not installed to build it; build it ahead of time with `b12x-codegen build` "
                    f"(key {key[:16]}, spec {spec.canonical_json()})")
            log.warning("b12x: building %s on first use (artifact %s); prebuild with b12x-codegen", spec.name, why)
            from codegen.build import build_one

            art, data, why = cache.read_verified(build_one(spec, cache).key, spec.arch)
            if art is None:
                raise ArtifactMissingError(f"kernel {spec.name}: build finished but the artifact is {why}")
        module = load_module_bytes(data, f"{spec.name}.so")
        loaded = LoadedKernels(spec, art, module, {n: module[n] for n in art.entry_points})
        _loaded[spec] = loaded
        return loaded
