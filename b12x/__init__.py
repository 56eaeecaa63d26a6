"""b12x: generated CuTe DSL kernels for DeepSeek-V3.2-style sparse attention.

Engine flow: prewarm the bundle of each model configuration, freeze(), then serve through
`b12x.attention.sparse_mla` (Caps -> plan -> bind -> run_decode) with no compile and no host sync.
"""
from .errors import (ArtifactMissingError, B12xError, CacheError, InputError,  # noqa: F401
                     KernelResolutionFrozenError)
from .registry import freeze, is_frozen, unfreeze  # noqa: F401
# upstream b12x's names for the same switch (the vLLM B12X backend imports them from here)
from .cute.runtime_control import (freeze_kernel_resolution, kernel_resolution_frozen,  # noqa: F401
                                   unfreeze_kernel_resolution)

__version__ = "0.1.0"


def __getattr__(name):  # keep `import b12x` light: torch-facing modules load on first use
    import importlib

    if name in ("attention", "prewarm", "reference", "artifact_cache", "registry", "indexer", "dcp", "metadata",
                "integration", "scratch", "cute"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(name)
