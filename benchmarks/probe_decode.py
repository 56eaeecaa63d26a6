"""Where a sparse MLA decode call spends its time: per-kernel durations (CUPTI via torch.profiler)
for b12x's split and combine and FlashMLA's kernels, and the graph-replay time of the split
kernel alone, the combine alone and both, over forced split counts.

    python benchmarks/probe_decode.py [--cases 1x128,4x128,8x128,128x16] [--splits 8,16,32]

Not a benchmark of record (bench_sparse_mla_decode.py is); a tool for the decode notes."""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x.attention import sparse_mla as sm  # noqa: E402
from benchmarks.bench_sparse_mla_decode import SETS, TOPK, make_pool  # noqa: E402
from benchmarks.peers import flashmla  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402


def label(name: str) -> str:
    """A kernel's name short enough for the table and still distinct (the CuTe DSL names share a
    long prefix: cut at 30 characters, the split and the combine read as one kernel)."""
    for prefix in ("kernel_cutlass_kernel_", "codegencute_blockssparse_mla", "b12x_gen_"):
        name = name[len(prefix):] if name.startswith(prefix) else name
    return name[:30]


def kernel_us(fns, reps: int = 20) -> dict[str, float]:
    """Mean device duration per call of each kernel the callables launch (eager, CUPTI)."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for fn in fns:
                fn()
        torch.cuda.synchronize()
    tot = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            tot[label(e.name)] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return {k: v / (reps * len(fns)) for k, v in tot.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="1x128,4x128,8x128,128x16")
    ap.add_argument("--splits", default="")
    ap.add_argument("--fmt", default="fp8_ds_mla")
    ap.add_argument("--split-entry", default=None,
                    help="the module's split entry point to time (default: the one the plan runs at the case's rows)")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    pool = make_pool(args.fmt, 32768, g)
    slots = pool.shape[0] * 64
    table = []
    for case in args.cases.split(","):
        batch, heads = map(int, case.split("x"))
        sets = [(torch.randn(batch, heads, 576, device="cuda", generator=g).bfloat16(),
                 torch.randint(0, slots, (batch, TOPK), device="cuda", generator=g, dtype=torch.int32),
                 torch.full((batch,), TOPK, device="cuda", dtype=torch.int32)) for _ in range(SETS)]
        p = sm.plan(sm.Caps(num_heads=heads, topk=TOPK, kv_format=args.fmt, max_rows=batch))
        k = p.kernels
        entry = args.split_entry or p.split_entry(batch)
        planned = p.splits(batch, TOPK)[0]
        split_list = sorted({planned} | {int(s) for s in args.splits.split(",") if s})
        big = torch.empty(batch * 32 * heads * 512, dtype=p.regions["partial_o"].dtype, device="cuda")
        big_lse = torch.empty(batch * 32 * heads, dtype=torch.float32, device="cuda")
        out = torch.empty(batch, heads, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(batch, heads, dtype=torch.float32, device="cuda")
        for s in split_list:
            tps = -(-TOPK // 64 // s) * 64
            s_eff = -(-TOPK // tps)
            po = big[: batch * s_eff * heads * 512].view(batch, s_eff, heads, 512)
            pl = big_lse[: batch * s_eff * heads].view(batch, s_eff, heads)
            split = [lambda q=q, i=i, n=n: k[entry](q, pool, i, n, po, pl, 576 ** -0.5 * sm.LOG2E, tps)
                     for q, i, n in sets]
            comb = [lambda: k[sm.combine_entry(s_eff)](po, pl, out, lse, lse[0], 0, 1)] * SETS
            both = [lambda f=f, c=c: (f(), c()) for f, c in zip(split, comb)]
            r = {"case": case, "entry": entry, "splits": s_eff, "tiles/split": tps // 64, "ctas": batch * s_eff * p.head_blocks,
                 "split_us": time_rotated(split), "combine_us": time_rotated(comb), "both_us": time_rotated(both)}
            kd = kernel_us(both[:2])
            r["kernels"] = {n: round(v, 1) for n, v in kd.items()}
            table.append(r)
            print(r, flush=True)
        if flashmla.available():
            peer = [flashmla.decode_fp8(q, pool, i, 576 ** -0.5)[0] for q, i, _ in sets]
            r = {"case": case, "splits": "flashmla", "both_us": time_rotated(peer)}
            r["kernels"] = {n: round(v, 1) for n, v in kernel_us(peer[:2]).items()}
            table.append(r)
            print(r, flush=True)
    print("\ncase      splits tiles ctas | split  combine  both (graph µs) | kernels (CUPTI µs)")
    for r in table:
        if r["splits"] == "flashmla":
            print(f"{r['case']:>9} {'FlashMLA':>17} | {'':>22} {r['both_us']:6.1f} | {r['kernels']}")
        else:
            print(f"{r['case']:>9} {r['splits']:>6} {r['tiles/split']:>5} {r['ctas']:>4} | {r['split_us']:6.1f} "
                  f"{r['combine_us']:7.1f} {r['both_us']:6.1f} | {r['kernels']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
