"""Upstream b12x's decode split planner under its name (`b12x.attention.mla.kernel`), which the
vLLM B12X backend's boot prewarm enumerates before it calls the decode forward with each count
as forced_num_splits. Here the counts come from b12x.attention.sparse_mla.split_plan."""
from __future__ import annotations

from ...device import num_sms as _device_num_sms
from ..sparse_mla import MAX_SPLITS, split_plan

_TILE = 64


def plan_unified_decode_splits(*, topk: int, max_chunks: int, forced_num_splits: int | None = None,
                               num_tokens: int = 1, h_blocks: int = 1, sm_count: int | None = None,
                               extra_topk: int = 0) -> tuple[int, int, int]:
    """(num_chunks, num_splits, chunks_per_split) for a decode call of num_tokens rows and
    h_blocks head blocks: forced_num_splits as upstream clamps it, else this package's planner
    (one CTA per SM slot, a small cost model), both at most max_chunks and MAX_SPLITS."""
    num_chunks = max(1, -(-topk // _TILE) + -(-extra_topk // _TILE))
    if forced_num_splits is not None:
        splits = max(1, int(forced_num_splits))
    else:
        sms = sm_count if sm_count is not None else _device_num_sms()
        splits = split_plan(max(1, num_tokens), num_chunks * _TILE, sms, max(1, h_blocks))[0]
    splits = min(splits, num_chunks, max(1, max_chunks), MAX_SPLITS)
    per = -(-num_chunks // splits)
    return num_chunks, -(-num_chunks // per), per
