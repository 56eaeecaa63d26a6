"""Probe: does the order of a row's indices change the extend's time? (docs/notes/extend.md)

    python benchmarks/probe_extend_order.py [--skv 32768,131072] [--sq 4096] [--heads 8,16,32,64,128]

The same extend calls as `bench_sparse_mla_extend.py` (random top-k 2048 a row over an s_kv-token
cache, two rotated input sets, CUDA-graph replays, median µs), with each row's indices in three
orders: as drawn (random), sorted ascending, and bucketed (sorted by id // 1024, random inside a
bucket). The rows' index sets, hence the results up to summation order, are the same in all three.
FlashMLA (bf16, q padded to 64 heads below 64) runs the same three orders. This probe measured
the kernels before the locality pass; run_extend now sorts the rows itself where that pays (bf16
at 8-32 heads, 256 rows or more, a cache beyond L2), so there the three orders read alike."""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x.attention import sparse_mla as sm  # noqa: E402
from benchmarks.bench_sparse_mla_decode import make_pool  # noqa: E402
from benchmarks.bench_sparse_mla_extend import TOPK, bench_ours  # noqa: E402
from benchmarks.peers import flashmla  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402


def orders(idx: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
    srt = torch.sort(idx, dim=1).values.contiguous()
    noise = torch.randint(0, 1 << 20, idx.shape, device=idx.device, generator=g, dtype=torch.int64)
    key = (idx.to(torch.int64) // 1024) * (1 << 20) + noise
    bucket = torch.gather(idx, 1, torch.sort(key, dim=1).indices).contiguous()
    return {"random": idx, "sorted": srt, "bucket1024": bucket}


def run_once(one_set, heads, kv_format, pool):
    q, idx, lengths = one_set
    p = sm.plan(sm.Caps(num_heads=heads, topk=TOPK, kv_format=kv_format, max_rows=q.shape[0], mode="extend"))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    out = torch.full((q.shape[0], heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    b = sm.bind(p, scratch=scratch, q=q, indices=idx, lengths=lengths, out=out)
    for _ in range(3):   # the phase word moves between calls: each walks from another tile
        sm.run_extend(b, kv_cache=pool, sm_scale=576 ** -0.5)
    return out.clone()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skv", default="32768,131072")
    ap.add_argument("--sq", default="4096")
    ap.add_argument("--heads", default="8,16,32,64,128")
    ap.add_argument("--formats", default="bf16,fp8_ds_mla")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}")
    rows = []
    for skv in map(int, args.skv.split(",")):
        pools = {f: make_pool(f, skv // 64, g) for f in args.formats.split(",")}
        for s_q in map(int, args.sq.split(",")):
            for heads in map(int, args.heads.split(",")):
                base = [(torch.randn(s_q, heads, 576, device="cuda", generator=g).bfloat16(),
                         torch.randint(0, skv, (s_q, TOPK), device="cuda", generator=g, dtype=torch.int32),
                         torch.full((s_q,), TOPK, device="cuda", dtype=torch.int32)) for _ in range(2)]
                per_order = [orders(idx, g) for _, idx, _ in base]
                ref = {}
                for name in ("random", "sorted", "bucket1024"):
                    sets = [(q, o[name], n) for (q, _, n), o in zip(base, per_order)]
                    r = {"skv": skv, "s_q": s_q, "heads": heads, "order": name}
                    for fmt, pool in pools.items():
                        r[f"ours_{fmt}_us"] = bench_ours(sets, heads, fmt, pool)
                    for fmt, pool in pools.items():   # the same index sets: the same out up to order
                        out = run_once(sets[0], heads, fmt, pool)
                        if name == "random":
                            ref[fmt] = out
                        r[f"maxdiff_{fmt}"] = (out.float() - ref[fmt].float()).abs().max().item()
                    if flashmla.available() and "bf16" in pools and not args.no_peer:
                        flat = pools["bf16"].view(-1, 576)
                        r["flashmla_us"] = time_rotated([flashmla.prefill_bf16(q, flat, idx, 576 ** -0.5)
                                                         for q, idx, _ in sets], replays=10)
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    keys = [k for k in rows[0] if k.endswith("_us") or k.startswith("maxdiff")]
    print(f"\n{'s_kv':>6} {'s_q':>5} {'H':>4} {'order':>10} | " + " ".join(f"{k[:-3]:>15}" for k in keys))
    for r in rows:
        print(f"{r['skv']:>6} {r['s_q']:>5} {r['heads']:>4} {r['order']:>10} | "
              + " ".join(f"{r.get(k, float('nan')):15.4g}" for k in keys))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
