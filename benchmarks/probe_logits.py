"""One eager run_logits, for Nsight Compute: a paged MTP case, or contiguous prefill rows (the last
`rows` tokens of a `ctx`-token sequence, causal ends, as bench_indexer_prefill.py):

    ncu --kernel-name regex:IndexerLogits ... python benchmarks/probe_logits.py [batch ctx next_n]
    ncu --kernel-name regex:IndexerLogits ... python benchmarks/probe_logits.py contiguous rows ctx"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x import indexer as ix  # noqa: E402
from b12x.indexer_reference import quantize_k_pages  # noqa: E402


def contiguous(rows: int, ctx: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(ctx, 128, device="cuda", generator=g).clamp(-448, 448).to(torch.float8_e4m3fn)
    sc = torch.rand(ctx, device="cuda", generator=g) + 0.1
    q = torch.randn(rows, 64, 128, device="cuda", generator=g).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = torch.randn(rows, 64, device="cuda", generator=g) / 8
    ends = torch.arange(ctx - rows + 1, ctx + 1, device="cuda", dtype=torch.int32)
    starts = torch.zeros(rows, dtype=torch.int32, device="cuda")
    p = ix.plan(ix.Caps(num_heads=64, topk=2048, mode="contiguous", max_rows=rows, max_width=ctx))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    b = p.bind(scratch, q=q, weights=w, lengths=ends, starts=starts, width=ctx)
    ix.run_logits(b, kv_cache=(kv, sc))
    torch.cuda.synchronize()


def main() -> None:
    if sys.argv[1:2] == ["contiguous"]:
        return contiguous(int(sys.argv[2]), int(sys.argv[3]))
    batch, ctx, next_n = (int(a) for a in (sys.argv[1:4] if len(sys.argv) >= 4 else (128, 32768, 2)))
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, pages = batch * next_n, ctx // 64
    pool = quantize_k_pages(torch.randn(batch * pages + 8, 64, 128, device="cuda", generator=g))
    q = torch.randn(rows, 64, 128, device="cuda", generator=g).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = torch.randn(rows, 64, device="cuda", generator=g) / 8
    bt = torch.randperm(pool.shape[0], device="cuda", generator=g)[: batch * pages].int().view(batch, pages)
    lengths = torch.full((rows,), ctx, dtype=torch.int32, device="cuda")
    p = ix.plan(ix.Caps(num_heads=64, topk=2048, max_rows=rows, max_width=ctx, logits_in_scratch=False))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    logits = torch.empty(rows, ctx, device="cuda")
    b = ix.bind(p, scratch=scratch, q=q, weights=w, lengths=lengths, block_table=bt, logits=logits)
    ix.run_logits(b, kv_cache=pool)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
