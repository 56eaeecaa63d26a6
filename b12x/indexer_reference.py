"""Torch references of the lightning indexer: fp8 logits and top-k selection.

Written for clarity; they run on any device in float32/float64. fp8 paths are compared against
these run on the dequantized data."""
from __future__ import annotations

import torch

PAGE = 64
INDEX_DIM = 128
K_RECORD = INDEX_DIM + 4          # bytes per token in a page: 128 e4m3 + one fp32 scale
PAGE_BYTES = PAGE * K_RECORD      # 8448: 64 x 128 e4m3 rows, then 64 fp32 scales


def quantize_k_pages(k: torch.Tensor) -> torch.Tensor:
    """[blocks, 64, 128] float -> [blocks, 64, 132] uint8 in DeepGEMM's paged layout: per page,
    the 64 rows of 128 e4m3 values first, then the 64 fp32 per-token scales (amax / 448)."""
    if k.dim() != 3 or k.shape[1:] != (PAGE, INDEX_DIM):
        raise ValueError(f"k: expected [blocks, {PAGE}, {INDEX_DIM}], got {tuple(k.shape)}")
    blocks = k.shape[0]
    k = k.float()
    scale = (k.abs().amax(dim=-1) / 448.0).clamp(min=1e-8)                       # [blocks, 64]
    fp8 = (k / scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    out = torch.empty(blocks, PAGE_BYTES, dtype=torch.uint8, device=k.device)
    out[:, :PAGE * INDEX_DIM] = fp8.view(torch.uint8).reshape(blocks, PAGE * INDEX_DIM)
    out[:, PAGE * INDEX_DIM:] = scale.contiguous().view(torch.uint8).reshape(blocks, PAGE * 4)
    return out.view(blocks, PAGE, K_RECORD)


def dequantize_k_pages(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[blocks, 64, 132] uint8 (any page stride) -> (k [blocks, 64, 128] fp32 unscaled e4m3 values,
    scale [blocks, 64] fp32)."""
    if kv.dtype != torch.uint8 or kv.dim() != 3 or kv.shape[1:] != (PAGE, K_RECORD):
        raise ValueError(f"kv: expected uint8 [blocks, {PAGE}, {K_RECORD}], got {kv.dtype} {tuple(kv.shape)}")
    flat = kv.contiguous().view(kv.shape[0], PAGE_BYTES)
    k = flat[:, :PAGE * INDEX_DIM].contiguous().view(torch.float8_e4m3fn).float().view(-1, PAGE, INDEX_DIM)
    scale = flat[:, PAGE * INDEX_DIM:].contiguous().view(torch.float32).view(-1, PAGE)
    return k, scale


def quantize_q(q: torch.Tensor) -> torch.Tensor:
    """Plain saturating cast to e4m3 (the q scale is folded into the weights by the engine)."""
    return q.float().clamp(-448, 448).to(torch.float8_e4m3fn)


def effective_width(width: int, active_width: int | None) -> int:
    """The columns the kernels consider: the logits width, or the active width (in entries, as
    b12x.metadata writes it; never divided by the compress ratio) when it is narrower."""
    if active_width is None:
        return width
    return min(width, max(int(active_width), 0))


def _pages_in_cache(pages: torch.Tensor, blocks: int) -> torch.Tensor:
    """Which block-table entries name a page of a cache of `blocks` pages."""
    return (pages >= 0) & (pages < blocks)


def _score(q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor, scale: torch.Tensor,
           dtype: torch.dtype) -> torch.Tensor:
    """q [rows, H, 128], k [rows, T, 128] or [T, 128], scale [rows, T] or [T] -> [rows, T]."""
    q = q.to(dtype)
    if k.dim() == 2:
        s = torch.einsum("rhd,td->rht", q, k.to(dtype))
    else:
        s = torch.einsum("rhd,rtd->rht", q, k.to(dtype))
    logits = (s.relu() * weights.to(dtype)[:, :, None]).sum(dim=1)
    return logits * scale.to(dtype)


def indexer_logits_paged_reference(q: torch.Tensor, weights: torch.Tensor, kv: torch.Tensor,
                                   block_table: torch.Tensor, lengths: torch.Tensor, width: int,
                                   compress_ratio: int = 1, active_width: int | None = None,
                                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """logits [rows, width]: k_scale[t] * sum_h w[r, h] relu(q[r, h] . k[t]) for entries
    t < floor(len_r / c) (lengths in tokens) and t < the active width (in entries), -inf elsewhere.
    Row r uses block_table[r // (rows / requests)]; a page whose entry lies outside [0, blocks)
    is never read and all its entries are -inf."""
    rows = q.shape[0]
    rows_per_req = rows // max(block_table.shape[0], 1)
    k_all, s_all = dequantize_k_pages(kv)
    blocks = k_all.shape[0]
    act = effective_width(width, active_width)
    out = torch.full((rows, width), float("-inf"), dtype=dtype, device=q.device)
    for r in range(rows):
        n = min(max(int(lengths[r]), 0) // compress_ratio, act)
        if n == 0 or blocks == 0:
            continue
        pages = block_table[r // rows_per_req, :-(-n // PAGE)].long()
        ok = _pages_in_cache(pages, blocks)
        safe = torch.where(ok, pages, torch.zeros_like(pages))
        k = k_all[safe].reshape(-1, INDEX_DIM)[:n]
        s = s_all[safe].reshape(-1)[:n]
        row = _score(q[r:r + 1].float(), weights[r:r + 1], k, s, dtype)[0]
        out[r, :n] = row.masked_fill(~ok.repeat_interleave(PAGE)[:n], float("-inf"))
    return out


def indexer_logits_contiguous_reference(q: torch.Tensor, weights: torch.Tensor, kv: torch.Tensor,
                                        kv_scale: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                                        width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Prefill: kv [n, 128] e4m3 (or uint8 bits), kv_scale [n]; row r is valid on [starts[r], ends[r])."""
    if kv.dtype == torch.uint8:
        kv = kv.view(torch.float8_e4m3fn)
    n = kv.shape[0]
    full = _score(q.float(), weights, kv.float(), kv_scale, dtype)       # [rows, n]
    out = torch.full((q.shape[0], width), float("-inf"), dtype=dtype, device=q.device)
    for r in range(q.shape[0]):
        a, b = max(int(starts[r]), 0), min(int(ends[r]), n, width)
        if b > a:
            out[r, a:b] = full[r, a:b]
    return out


def topk_reference(logits: torch.Tensor, k: int, ends: torch.Tensor | None = None,
                   starts: torch.Tensor | None = None, compress_ratio: int = 1, active_width: int | None = None,
                   block_table: torch.Tensor | None = None,
                   num_blocks: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row top-k over the valid range [start, min(end // c, active width)): ends in tokens,
    positions and the active width in entries.

    Returns (indices [rows, k] int32, scores [rows, k] fp32): the winners in ascending position
    order, then a -1 / -inf tail. Indices are row-relative (position - start), or physical slots
    block_table[r // rows_per_req, pos // 64] * 64 + pos % 64 when a block table is given; -1
    where that entry lies outside [0, num_blocks) (negative entries only, without num_blocks)."""
    rows, width = logits.shape
    act = effective_width(width, active_width)
    idx = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    scores = torch.full((rows, k), float("-inf"), dtype=torch.float32, device=logits.device)
    rows_per_req = rows // max(block_table.shape[0], 1) if block_table is not None else 1
    for r in range(rows):
        a = max(int(starts[r]), 0) if starts is not None else 0
        b = min(max(int(ends[r]), 0) // compress_ratio, act) if ends is not None else act
        if b <= a:
            continue
        vals = logits[r, a:b].float()
        n = min(k, b - a)
        top = torch.topk(vals, n, sorted=False).indices.sort().values
        pos = top + a
        if block_table is not None:
            pages = block_table[r // rows_per_req].long()[pos // PAGE]
            ok = (pages >= 0) if num_blocks is None else _pages_in_cache(pages, num_blocks)
            out = torch.where(ok, pages * PAGE + pos % PAGE, torch.full_like(pages, -1))
        else:
            out = pos - a
        idx[r, :n] = out.to(torch.int32)
        scores[r, :n] = vals[top]
    return idx, scores
