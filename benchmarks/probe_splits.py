"""Decode calls over forced split counts, through the runtime (plan, bind(num_splits=...),
run_decode): the split planner's choice beside each count, graph replays over rotated input sets.
A tool for the planner's notes (docs/notes/launch-and-splits.md), not a benchmark of record.

    python benchmarks/probe_splits.py --heads 8 --rows 40,96,100 --splits 4,5,8,11 [--rounds 2]"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x.attention import sparse_mla as sm  # noqa: E402
from benchmarks.bench_sparse_mla_decode import SETS, TOPK, make_pool  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--fmt", default="fp8_ds_mla")
    ap.add_argument("--rows", default="40,96,100")
    ap.add_argument("--splits", default="4,5,8,11")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    pool = make_pool(args.fmt, 32768, g)
    slots = pool.shape[0] * 64
    forced = [int(s) for s in args.splits.split(",")]
    for _ in range(args.rounds):
        for rows in (int(r) for r in args.rows.split(",")):
            p = sm.plan(sm.Caps(num_heads=args.heads, topk=TOPK, kv_format=args.fmt, max_rows=rows,
                                max_splits=max(forced)))
            scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
            sets = [(torch.randn(rows, args.heads, 576, device="cuda", generator=g).bfloat16(),
                     torch.randint(0, slots, (rows, TOPK), device="cuda", generator=g, dtype=torch.int32),
                     torch.full((rows,), TOPK, device="cuda", dtype=torch.int32)) for _ in range(SETS)]
            line = [f"rows {rows:4d} planned {p.splits(rows, TOPK)[0]:2d} |"]
            for s in [None] + forced:
                bs = [sm.bind(p, scratch=scratch, q=q, indices=i, lengths=n, num_splits=s) for q, i, n in sets]
                us = time_rotated([lambda b=b: sm.run_decode(b, kv_cache=pool, sm_scale=576 ** -0.5) for b in bs])
                line.append(f"{'plan' if s is None else s}: {us:6.1f}")
            print(" ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
