"""The one facade shape every op shares: `Caps -> plan(caps) -> plan.scratch_specs() ->
plan.bind(scratch=..., **tensors) -> run_*(binding, ...)`, and `b12x.prewarm.prewarm(plan)`.

- **Caps** (one frozen dataclass per op, the plan's key) use the same names for the same things:
  `num_heads` (query heads), `topk` (the largest K asked), `max_rows` (most query rows per call:
  it sizes the scratch and bounds the row counts prewarm launches), `arch` and `num_sms` (None:
  the current CUDA device's). An op's own fields come after those (`kv_format`, `compress_ratio`,
  `world`, ...). `SHARED_CAPS_FIELDS` lists them; tests/test_facade.py checks every op.
- **Plan** (this module's base; frozen, built only by the op's `plan(caps)`, which may allocate host
  state) holds the caps and the scratch layout; `specs()` names every artifact its runs can
  launch, `scratch_specs()` the regions of the caller's scratch, `scratch_bytes()` their total,
  and `bind(scratch, **tensors)` checks the per-call tensors and carves views: it never allocates.
  The op modules keep a module-level `bind(plan, ...)`, a thin alias of the method.
- Renamed fields stay accepted under their old names (`renamed_fields`): a DeprecationWarning, and
  errors name the field as the caller spelled it.
"""
from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import scratch as _scratch
from .validate import require

# Caps fields every op that has the notion uses under this name (DcpCaps has no heads).
SHARED_CAPS_FIELDS = ("num_heads", "topk", "max_rows", "arch", "num_sms")


def _deprecated(old: str, new: str, where: str, stacklevel: int = 3) -> None:
    warnings.warn(f"{where}.{old} is deprecated: use {new}", DeprecationWarning, stacklevel=stacklevel)


def renamed_fields(**old_to_new: str):
    """Class decorator for a frozen Caps dataclass whose fields were renamed: the constructor still
    takes each old name (keyword only; a DeprecationWarning; an error when both are given) and the
    old name reads the new field (a DeprecationWarning). The old names are not fields, so equality,
    hashing and the artifact keys see only the new ones."""

    def deco(cls):
        init = cls.__init__
        sig = inspect.signature(init)

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            used = []
            for old, new in old_to_new.items():
                if old in kwargs:
                    _deprecated(old, new, cls.__name__)
                    value = kwargs.pop(old)
                    require(new not in kwargs, f"{cls.__name__}.{old}: expected None when {new} is given "
                                               f"({old} is its old name), got {value!r}")
                    kwargs[new] = value
                    used.append(old)
            init(self, *args, **kwargs)
            if used:
                object.__setattr__(self, "_spelled", {old_to_new[o]: o for o in used})

        extra = [inspect.Parameter(old, inspect.Parameter.KEYWORD_ONLY, default=None) for old in old_to_new]
        __init__.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])
        cls.__init__ = __init__
        for old, new in old_to_new.items():
            def getter(self, _old=old, _new=new):
                _deprecated(_old, _new, cls.__name__)
                return getattr(self, _new)
            setattr(cls, old, property(getter, doc=f"Deprecated name of {new}."))
        cls.RENAMED_FIELDS = dict(old_to_new)
        return cls

    return deco


def renamed_kw(new_val, old_val, old: str, new: str, where: str):
    """A function argument renamed `old` -> `new`: the value to use. The old spelling still works,
    with a DeprecationWarning; both at once is an InputError."""
    if old_val is None:
        return new_val
    warnings.warn(f"{where}({old}=...) is deprecated: use {new}", DeprecationWarning, stacklevel=3)
    require(new_val is None, f"{old}: expected None when {new} is given ({old} is its old name), got {old_val!r}")
    return old_val


def spelled(caps, name: str) -> str:
    """`name` as the caller spelled it when building `caps` (an old name of a renamed field), so an
    error names what the caller wrote."""
    return getattr(caps, "_spelled", {}).get(name, name)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What every op's plan is: its caps, the artifacts it launches, the caller's scratch layout,
    and `bind`. Frozen: built once by the op's `plan(caps)`; bind and run only read it."""

    caps: Any
    regions: Mapping[str, _scratch.ScratchRegion] = field(default_factory=dict)

    def specs(self) -> list:
        """Every kernel spec (artifact) a run of this plan can launch; prewarm resolves them all."""
        raise NotImplementedError

    def scratch_specs(self) -> list[_scratch.ScratchRegion]:
        """The named, aligned regions of the caller's uint8 scratch, in offset order."""
        return list(self.regions.values())

    def scratch_bytes(self) -> int:
        """Bytes of caller scratch `bind` needs (`torch.empty(n, dtype=torch.uint8, device=...)`)."""
        return _scratch.total_bytes(self.regions)

    def bind(self, scratch, **tensors):
        """Check the per-call tensors and carve views of `scratch`; never allocates."""
        raise NotImplementedError


def module_bind(plan_cls: type, binding_cls: type, module: str):
    """The op module's `bind(plan, *, scratch, ...)`: a thin alias of `plan_cls.bind`, with its
    signature (for the README's static check and for help())."""

    def bind(plan, *, scratch, **tensors):
        require(isinstance(plan, plan_cls), f"plan: expected a {plan_cls.__name__} (from {module}.plan), "
                                            f"got {type(plan).__name__}")
        return plan.bind(scratch, **tensors)

    sig = inspect.signature(plan_cls.bind)
    params = list(sig.parameters.values())
    params = [params[0].replace(name="plan")] + [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else p
        for p in params[1:]]
    bind.__signature__ = sig.replace(parameters=params, return_annotation=binding_cls)
    bind.__annotations__ = {"return": binding_cls}
    bind.__module__ = module
    bind.__qualname__ = bind.__name__ = "bind"
    bind.__doc__ = f"Alias of `{plan_cls.__name__}.bind` (plan.bind(scratch=..., ...)):\n\n{plan_cls.bind.__doc__}"
    return bind
