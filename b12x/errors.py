"""Exceptions engines may want to catch by type."""


class B12xError(Exception):
    """Base class of b12x errors."""


class InputError(B12xError, ValueError):
    """A tensor passed to plan/bind/run does not match the contract (raised before any launch)."""


class KernelResolutionFrozenError(B12xError, RuntimeError):
    """freeze() was called and a kernel that was not prewarmed was asked for."""


class ArtifactMissingError(B12xError, RuntimeError):
    """No usable artifact in the cache, and the DSL compiler is not installed to build one."""


class CacheError(B12xError, RuntimeError):
    """The artifact cache is unusable (unsafe permissions, corrupt artifact while frozen, ...)."""
