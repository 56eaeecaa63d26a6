"""Probe: bf16 extend over one sequence's pages inside an engine-sized pool (docs/notes/extend.md,
"Rows in cache order").

    python benchmarks/probe_extend_pool.py [--skv 32768,131072] [--pool-blocks 16384] [--sq 512,4096]

run_extend sorts each row's entries (the order kernel) when the cache tensor it is given is larger
than L2. An engine passes its whole pool, so a call sorts even when the sequence's own pages (its
working set) fit L2. This times the same calls three ways: over a cache of the sequence alone
(what the extend bench runs), over the sequence's pages scattered at random blocks of a larger
pool with the sort (the product's choice there), and the same without it (a plan that takes the
cache for L2-resident). Random top-k 2048 a row, two rotated input sets, CUDA-graph replays,
median µs. `--phases 1,2,4` adds rows sorted in torch before the call (the order pass off) and
each row's sorted list rotated to start at (row % P) / P of its length: P = 1 is the order pass's
order; P > 1 spreads the rows that run together over P bands of the cache."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x.attention import sparse_mla as sm  # noqa: E402
from benchmarks.bench_sparse_mla_decode import make_pool  # noqa: E402
from benchmarks.bench_sparse_mla_extend import TOPK, bench_ours  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402


def timed(sets, heads, pool, *, sort: bool) -> float:
    rows = sets[0][0].shape[0]
    p = sm.plan(sm.Caps(num_heads=heads, topk=TOPK, kv_format="bf16", max_rows=rows, mode="extend"))
    if not sort:
        p = dataclasses.replace(p, l2_bytes=2**62)   # the cache taken for L2-resident: no pass
    return bench_ours(sets, heads, "bf16", pool, plan=p)


def rotated(idx: torch.Tensor, phases: int) -> torch.Tensor:
    """Each row sorted ascending, then rotated to start at (row % phases) / phases of its length."""
    srt = torch.sort(idx, dim=1).values
    rows, n = idx.shape
    off = (torch.arange(rows, device=idx.device) % phases) * n // phases
    pos = (torch.arange(n, device=idx.device)[None, :] + off[:, None]) % n
    return torch.gather(srt, 1, pos).contiguous()


def breakdown(sets, heads, pool) -> dict:
    """The product's sorted call in parts: the order kernel alone, and the attention alone reading
    the copy the order kernel wrote (a plan without the pass, given that copy as its indices)."""
    rows = sets[0][0].shape[0]
    p = sm.plan(sm.Caps(num_heads=heads, topk=TOPK, kv_format="bf16", max_rows=rows, mode="extend"))
    order_calls, copies = [], []
    for q, idx, lengths in sets:
        scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
        b = sm.bind(p, scratch=scratch, q=q, indices=idx, lengths=lengths)
        if b.owns_num_rows:
            b.num_rows.fill_(rows)    # what run_extend does before it launches the pass
        sm.order_rows(b)
        copies.append((q, b.ordered.clone(), lengths))
        order_calls.append(lambda b=b: sm.order_rows(b))
    torch.cuda.synchronize()
    same = all(torch.equal(torch.sort(c[1], dim=1).values, torch.sort(s_[1], dim=1).values)
               for c, s_ in zip(copies, sets))
    return {"order_alone_us": time_rotated(order_calls, replays=10),
            "attention_on_copy_us": timed(copies, heads, pool, sort=False),
            "copy_holds_the_row": same}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skv", default="32768,131072")
    ap.add_argument("--pool-blocks", type=int, default=16384, help="pool size in 64-token blocks (16384: 1M tokens)")
    ap.add_argument("--sq", default="512,4096")
    ap.add_argument("--heads", default="8,16,32")
    ap.add_argument("--phases", default="", help="comma-separated P: rows sorted in torch, rotated by (row % P) / P")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the order kernel alone, and the attention alone on its sorted copy")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}")
    pool = make_pool("bf16", args.pool_blocks, g)
    results = []
    for skv in map(int, args.skv.split(",")):
        blocks = skv // 64
        alone = make_pool("bf16", blocks, g)
        where = torch.randperm(args.pool_blocks, device="cuda", generator=g)[:blocks]
        for s_q in map(int, args.sq.split(",")):
            for heads in map(int, args.heads.split(",")):
                seq = [(torch.randn(s_q, heads, 576, device="cuda", generator=g).bfloat16(),
                        torch.randint(0, skv, (s_q, TOPK), device="cuda", generator=g, dtype=torch.int32),
                        torch.full((s_q,), TOPK, device="cuda", dtype=torch.int32)) for _ in range(2)]
                in_pool = [(q, (where[idx // 64] * 64 + idx % 64).to(torch.int32), n) for q, idx, n in seq]
                r = {"skv": skv, "pool_tokens": args.pool_blocks * 64, "s_q": s_q, "heads": heads,
                     "alone_us": timed(seq, heads, alone, sort=True),
                     "pool_sorted_us": timed(in_pool, heads, pool, sort=True),
                     "pool_unsorted_us": timed(in_pool, heads, pool, sort=False)}
                for ph in (int(x) for x in args.phases.split(",") if x):
                    r[f"phase{ph}_us"] = timed([(q, rotated(idx, ph), n) for q, idx, n in in_pool], heads, pool,
                                               sort=False)
                if args.breakdown:
                    r.update(breakdown(in_pool, heads, pool))
                results.append(r)
                print(json.dumps(r), flush=True)
    print(f"\n{'s_kv':>7} {'s_q':>5} {'H':>3} | {'alone':>8} {'pool sort':>10} {'pool no sort':>13} | sort / no sort")
    for r in results:
        print(f"{r['skv']:>7} {r['s_q']:>5} {r['heads']:>3} | {r['alone_us']:8.1f} {r['pool_sorted_us']:10.1f} "
              f"{r['pool_unsorted_us']:13.1f} | {r['pool_sorted_us'] / r['pool_unsorted_us']:.3f}"
              + "".join(f"  {k}: {v:.1f}" for k, v in r.items() if k.startswith("phase")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
