"""DeepGEMM's paged fp8 MQA logits (the V3.2 lightning indexer) as a benchmark peer.

DeepGEMM 2.8.1 (the wheel in .device-kit/anchors; csrc/apis/attention.hpp of that release):

    get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None) -> [num_sms + 1, 2] int32
    fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                             max_context_len, indices=None) -> logits

  - context_lens must be 2-D [B, next_n] int32, contiguous: the context length each query row sees
    (both functions assert `context_lens.dim() == 2`; the kernels size a request's work by
    context_lens[b, next_n - 1]). A 1-D [B] tensor raises at attention.hpp:151.
  - q is a (q_fp8, q_sf) pair: q_fp8 [B, next_n, H, 128] e4m3, q_sf None for e4m3 (SM90 takes only
    that); next_n in {1, 2, 4} on SM90; H in {32, 64}.
  - kv_cache [blocks, 64, 1, 132] uint8 (the same page bytes as b12x's [blocks, 64, 132]).
  - weights [B * next_n, H] fp32; block_table [B, pages] int32.
  - There is no clean_logits argument any more (paged logits are never cleaned: columns past a
    row's length are left as the kernel wrote them); logits [B * next_n, max_context_len] fp32 are
    allocated by the op.
Releases before 2.8 took 1-D context_lens, `clean_logits=False`, and (older still) named the op
`fp8_paged_mqa_logits` with a bare q; that form is kept as a fallback.
"""
from __future__ import annotations

import inspect

import torch

_err: str | None = None
try:
    import deep_gemm as _dg
except Exception as e:  # pragma: no cover - depends on the box
    _dg = None
    _err = f"deep_gemm not importable: {type(e).__name__}: {e}"


def available() -> bool:
    return _dg is not None


def unavailable_reason() -> str | None:
    return _err


def version() -> str:
    return getattr(_dg, "__version__", "unknown") if _dg is not None else "n/a"


def _is_v28(fn) -> bool:
    """2.8 wrappers take (..., max_context_len, indices=None) and no clean_logits."""
    try:
        return "clean_logits" not in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a bare extension function: assume the current API
        return True


def context_lens_2d(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """[B] request lengths -> [B, next_n]: row i of a request sees ctx - next_n + 1 + i tokens
    (the MTP convention b12x's bench also uses). A [B, next_n] tensor is returned as is."""
    if context_lens.dim() == 2:
        return context_lens.contiguous()
    ar = torch.arange(next_n, device=context_lens.device, dtype=torch.int32)
    return (context_lens[:, None] - next_n + 1 + ar).to(torch.int32).contiguous()


def paged_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                 block_table: torch.Tensor, max_context_len: int, num_sms: int):
    """Returns a zero-argument callable that runs DeepGEMM's kernel only (metadata computed here).

    q [B, next_n, H, 128] e4m3, kv_cache [blocks, 64, 132] uint8, weights [B * next_n, H] fp32,
    context_lens [B] (request lengths) or [B, next_n] (per-row lengths) int32, block_table
    [B, pages] int32."""
    next_n = q.shape[1]
    kv4 = kv_cache.unsqueeze(2)                                       # [blocks, 64, 1, 132]
    if hasattr(_dg, "fp8_fp4_paged_mqa_logits") and _is_v28(_dg.fp8_fp4_paged_mqa_logits):
        lens = context_lens_2d(context_lens, next_n)
        schedule = _dg.get_paged_mqa_logits_metadata(lens, 64, num_sms)

        def call():
            return _dg.fp8_fp4_paged_mqa_logits((q, None), kv4, weights, lens, block_table, schedule,
                                                max_context_len)
        return call
    # pre-2.8: 1-D request lengths
    lens = context_lens[:, -1].contiguous() if context_lens.dim() == 2 else context_lens
    schedule = _dg.get_paged_mqa_logits_metadata(lens, 64, num_sms)
    if hasattr(_dg, "fp8_fp4_paged_mqa_logits"):
        def call():
            return _dg.fp8_fp4_paged_mqa_logits((q, None), kv4, weights, lens, block_table, schedule,
                                                max_context_len, clean_logits=False)
    else:
        def call():
            return _dg.fp8_paged_mqa_logits(q, kv4, weights, lens, block_table, schedule, max_context_len,
                                            clean_logits=False)
    return call
