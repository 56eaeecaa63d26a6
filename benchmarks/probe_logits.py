"""One eager run_logits on a paged MTP case, for Nsight Compute:

    ncu --kernel-name regex:IndexerLogits ... python benchmarks/probe_logits.py [batch ctx next_n]"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x import indexer as ix  # noqa: E402
from b12x.indexer_reference import quantize_k_pages  # noqa: E402


def main() -> None:
    batch, ctx, next_n = (int(a) for a in (sys.argv[1:4] if len(sys.argv) >= 4 else (128, 32768, 2)))
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, pages = batch * next_n, ctx // 64
    pool = quantize_k_pages(torch.randn(batch * pages + 8, 64, 128, device="cuda", generator=g))
    q = torch.randn(rows, 64, 128, device="cuda", generator=g).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = torch.randn(rows, 64, device="cuda", generator=g) / 8
    bt = torch.randperm(pool.shape[0], device="cuda", generator=g)[: batch * pages].int().view(batch, pages)
    lengths = torch.full((rows,), ctx, dtype=torch.int32, device="cuda")
    p = ix.plan(ix.Caps(num_heads=64, topk=2048, max_batched=rows, max_width=ctx, logits_in_scratch=False))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    logits = torch.empty(rows, ctx, device="cuda")
    b = ix.bind(p, scratch=scratch, q=q, weights=w, lengths=lengths, block_table=bt, logits=logits)
    ix.run_logits(b, kv_cache=pool)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
