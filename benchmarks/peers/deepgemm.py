"""DeepGEMM's paged fp8 MQA logits (the V3.2 lightning indexer) as a benchmark peer.

DeepGEMM 2.x:

    schedule = deep_gemm.get_paged_mqa_logits_metadata(context_lens, 64, num_sms)
    logits = deep_gemm.fp8_fp4_paged_mqa_logits((q_fp8, None), kv_cache, weights, context_lens,
                                                block_table, schedule, max_context_len,
                                                clean_logits=False)

q_fp8 [B, next_n, H, 128] e4m3; kv_cache [blocks, 64, 1, 132] uint8 (the same page bytes as
b12x's [blocks, 64, 132]); weights [B * next_n, H] fp32; context_lens [B] int32 (row i of a
request sees context_len - next_n + 1 + i tokens); block_table [B, pages] int32. Returns
logits [B * next_n, max_context_len] fp32 (allocated by the op). Older releases name the op
`fp8_paged_mqa_logits` and take q without the (q, scale) tuple; both are tried.
"""
from __future__ import annotations

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


def paged_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                 block_table: torch.Tensor, max_context_len: int, num_sms: int):
    """Returns a zero-argument callable that runs DeepGEMM's kernel only (metadata computed here).

    q [B, next_n, H, 128] e4m3, kv_cache [blocks, 64, 132] uint8, weights [B * next_n, H] fp32,
    context_lens [B] int32, block_table [B, pages] int32."""
    kv4 = kv_cache.unsqueeze(2)                                       # [blocks, 64, 1, 132]
    schedule = _dg.get_paged_mqa_logits_metadata(context_lens, 64, num_sms)
    if hasattr(_dg, "fp8_fp4_paged_mqa_logits"):
        def call():
            return _dg.fp8_fp4_paged_mqa_logits((q, None), kv4, weights, context_lens, block_table, schedule,
                                                max_context_len, clean_logits=False)
    else:
        def call():
            return _dg.fp8_paged_mqa_logits(q, kv4, weights, context_lens, block_table, schedule, max_context_len,
                                            clean_logits=False)
    return call
