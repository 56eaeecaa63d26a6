"""b12x: generated CuTe DSL kernels for DeepSeek-V3.2-style sparse attention.

Engine flow: prewarm the bundle of each model configuration, freeze(), then serve through
`b12x.attention.sparse_mla` (Caps -> plan -> bind -> run_decode) with no compile and no host sync.
"""
from .errors import (ArtifactMissingError, B12xError, CacheError, InputError,  # noqa: F401
                     KernelResolutionFrozenError)
from .registry import freeze, is_frozen, unfreeze  # noqa: F401

__version__ = "0.1.0"


def __getattr__(name):  # keep `import b12x` light: torch-facing modules load on first use
    import importlib

    if name in ("attention", "prewarm", "reference", "artifact_cache", "registry", "indexer", "dcp", "metadata",
                "integration", "scratch"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(name)
