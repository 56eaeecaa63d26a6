"""Sparse MLA forwards under upstream b12x's names (local-inference-lab/b12x 5af873a7,
`b12x.integration.mla`): the calls the vLLM B12X backend makes, run by this package's kernels
(b12x.attention.sparse_mla). Bindings come from b12x.integration.sparse_mla_scratch.

Conventions kept from upstream: `out` is bf16 [rows, heads, 512], a view into the caller's scratch,
valid until the next call on it; with return_lse the pair (out, lse), lse fp32 [rows, heads], also
in the scratch, in base 2 (default) or natural log (lse_scale="natural"); a row with no valid
entry has out 0 and lse -inf; attn_sink ([heads] fp32, natural-log units, decode only) scales out
by exp(lse) / (exp(lse) + exp(sink)) and the returned lse is logaddexp(lse, sink).
forced_num_splits is honoured as upstream defines it (decode): every row runs min(forced, its
64-entry chunks, max_chunks_per_row) splits; above 32 (what the combine merges) it is refused. Not supported here, with an error:
identity_page_table=True, backend other than None / "sm120" (the name upstream gives its only
backend), q_all / page_table_1 / cache_seqlens / nsa given beside a binding (as upstream).
"""
from __future__ import annotations

import math
from typing import Literal

import torch

from ..attention import sparse_mla as _sm
from ..validate import check_tensor, require
from .sparse_mla_scratch import (B12XSparseMLABinding, B12XSparseMLAScratchCaps, B12XSparseMLAScratchPlan,
                                 plan_sparse_mla_scratch)

__all__ = ["sparse_mla_decode_forward", "sparse_mla_extend_forward", "B12XSparseMLABinding",
           "B12XSparseMLAScratchCaps", "B12XSparseMLAScratchPlan", "plan_sparse_mla_scratch"]

_INV_LN2 = 1.0 / math.log(2.0)


def _check_call(binding, direct: dict, kv_cache, v_head_dim, lse_scale, identity_page_table, want: str):
    if binding is None:
        raise TypeError("sparse MLA forward requires binding")
    given = [k for k, v in direct.items() if v is not None]
    if given:
        raise ValueError(f"sparse MLA forward: pass either binding or {', '.join(given)}, not both")
    require(isinstance(binding, B12XSparseMLABinding),
            f"binding: expected the B12XSparseMLABinding of plan.bind(...), got {type(binding).__name__}")
    plan = binding.plan
    require(plan.mode == want, f"binding: expected a plan of mode {'decode' if want == 'decode' else 'extend'} for "
                               f"sparse_mla_{want}_forward, got mode={plan.caps.mode!r}")
    require(v_head_dim is None or v_head_dim == plan.caps.v_head_dim,
            f"v_head_dim: expected None or {plan.caps.v_head_dim}, got {v_head_dim!r}")
    require(lse_scale in ("base2", "natural"), f"lse_scale: expected 'base2' or 'natural', got {lse_scale!r}")
    require(not identity_page_table, "identity_page_table: expected False (selected_indices are cache slots here), "
                                     "got True")
    check_tensor("kv_cache", kv_cache, dtype=plan.caps.kv_dtype, ndim=3, contiguous=True, device=plan.caps.device)
    return plan, _pages(kv_cache)


def _pages(kv_cache: torch.Tensor) -> torch.Tensor:
    """Upstream takes the cache flat, [slots, 1, record], or paged, [blocks, 64, record]; both are
    the same bytes. The kernels take pages: a view, nothing is copied."""
    if kv_cache.shape[1] == 64:
        return kv_cache
    require(kv_cache.shape[1] == 1 and kv_cache.shape[0] % 64 == 0,
            f"kv_cache: expected [slots, 1, record] with slots a multiple of 64 or [blocks, 64, record], "
            f"got {tuple(kv_cache.shape)}")
    return kv_cache.view(-1, 64, kv_cache.shape[2])


def _lse_base(binding: B12XSparseMLABinding, lse_scale: str, attn_sink) -> str:
    """The base the kernels write lse in: the caller's, unless a sink has to be folded in (natural)."""
    return "e" if lse_scale == "natural" or attn_sink is not None else "2"


def _finish(binding: B12XSparseMLABinding, out: torch.Tensor, lse: torch.Tensor, return_lse: bool, lse_scale: str,
            attn_sink: torch.Tensor | None):
    """out and lse of the run, at the run's head count -> the caller's: heads cut back (padded
    counts), the sink folded into lse (then the base converted). In place into scratch views;
    a native head count without a sink returns the run's own out and lse."""
    n = binding.plan.caps.num_q_heads
    if binding.plan.padded:
        binding.out.copy_(out[:, :n])
        out = binding.out
    if not return_lse:
        return out
    if not binding.plan.padded and attn_sink is None:
        return out, lse
    res = binding.lse
    if attn_sink is not None:
        torch.logaddexp(lse, attn_sink, out=res)
        if lse_scale == "base2":
            res.mul_(_INV_LN2)
    else:
        res.copy_(lse[:, :n])
    return out, res


def _sink(binding: B12XSparseMLABinding, attn_sink: torch.Tensor | None) -> torch.Tensor | None:
    if attn_sink is None:
        return None
    n = binding.plan.caps.num_q_heads
    check_tensor("attn_sink", attn_sink, dtype=torch.float32, shape=(n,), contiguous=True,
                 device=binding.plan.caps.device)
    require(not binding.plan.padded,
            f"attn_sink: expected a native head count (8, 16, 32, 64, 128) with a sink, got {n} heads")
    return attn_sink


def _stage_q(binding: B12XSparseMLABinding) -> None:
    """Padded head counts: the caller's q into the run's padded copy (one device copy)."""
    if binding.plan.padded:
        n = binding.plan.caps.num_q_heads
        binding.inner.q[:, :n].copy_(binding.q)     # the heads past n were zeroed by bind


def sparse_mla_decode_forward(*, q_all=None, kv_cache: torch.Tensor, page_table_1=None, cache_seqlens_int32=None,
                              nsa_cache_seqlens_int32=None, binding: B12XSparseMLABinding | None = None,
                              sm_scale: float, v_head_dim: int | None = None, return_lse: bool = False,
                              lse_scale: Literal["base2", "natural"] = "base2",
                              attn_sink: torch.Tensor | None = None, identity_page_table: bool = False,
                              backend: str | None = None, forced_num_splits: int | None = None):
    """Decode: split + combine (or the whole-row kernel) over binding's rows. Allocates nothing."""
    plan, pages = _check_call(binding, dict(q_all=q_all, page_table_1=page_table_1,
                                            cache_seqlens_int32=cache_seqlens_int32,
                                            nsa_cache_seqlens_int32=nsa_cache_seqlens_int32),
                              kv_cache, v_head_dim, lse_scale, identity_page_table, "decode")
    require(backend in (None, "sm120"), f"backend: expected None (or upstream's 'sm120'), got {backend!r}")
    sink = _sink(binding, attn_sink)
    inner = binding.inner
    if forced_num_splits is not None:
        require(isinstance(forced_num_splits, int) and 1 <= forced_num_splits,
                f"forced_num_splits: expected an int >= 1 or None, got {forced_num_splits!r}")
        # upstream: min(forced, the row's 64-entry chunks, max_chunks_per_row); more than this
        # package's combine merges (MAX_SPLITS) is refused rather than quietly lowered
        tiles = max(1, binding.selected_indices.shape[1] // 64)
        splits = min(forced_num_splits, tiles, plan.caps.max_chunks_per_row)
        require(splits <= plan.inner.caps.max_splits,
                f"forced_num_splits: expected at most {plan.inner.caps.max_splits} splits here (the combine "
                f"merges at most {_sm.MAX_SPLITS}), got {forced_num_splits} (effective {splits})")
        inner = plan.inner.bind(binding.scratch[: plan.inner.scratch_bytes()], q=inner.q, indices=inner.indices,
                                lengths=inner.lengths, num_splits=splits)
    _stage_q(binding)
    out, lse = _sm.run_decode(inner, kv_cache=pages, sm_scale=sm_scale, attn_sink=sink,
                              lse_base=_lse_base(binding, lse_scale, sink))
    return _finish(binding, out, lse, return_lse, lse_scale, sink)


def sparse_mla_extend_forward(*, q_all=None, kv_cache: torch.Tensor, selected_token_offsets=None,
                              cache_seqlens_int32=None, nsa_cache_seqlens_int32=None,
                              binding: B12XSparseMLABinding | None = None, sm_scale: float,
                              v_head_dim: int | None = None, return_lse: bool = False,
                              lse_scale: Literal["base2", "natural"] = "base2", identity_page_table: bool = False):
    """Extend (prefill, MTP verify, draft extend): one CTA per row and head block. Allocates nothing."""
    plan, pages = _check_call(binding, dict(q_all=q_all, selected_token_offsets=selected_token_offsets,
                                            cache_seqlens_int32=cache_seqlens_int32,
                                            nsa_cache_seqlens_int32=nsa_cache_seqlens_int32),
                              kv_cache, v_head_dim, lse_scale, identity_page_table, "extend")
    _stage_q(binding)
    out, lse = _sm.run_extend(binding.inner, kv_cache=pages, sm_scale=sm_scale,
                              lse_base=_lse_base(binding, lse_scale, None))
    return _finish(binding, out, lse, return_lse, lse_scale, None)
