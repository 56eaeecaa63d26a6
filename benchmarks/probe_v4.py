"""Where a DeepSeek-V4 decode call's time goes over forced split counts: graph-replay time of the
split kernel alone and of split + combine per split count, the whole-row (one split, no combine)
path, the planner's choice and FlashMLA's MODEL1 decode, on bench_sparse_mla_v4.py's inputs.

    python benchmarks/probe_v4.py [--cases 1x64,32x64,32x128] [--kinds swa,c4] [--splits 1,2,4,8]

Not a benchmark of record (bench_sparse_mla_v4.py is); a tool for docs/notes/kv-formats.md."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x.attention import sparse_mla as sm  # noqa: E402
from benchmarks.bench_sparse_mla_v4 import MTP, SETS, SM_SCALE, SWA_PAGE, SWA_W, kinds, pool  # noqa: E402
from benchmarks.peers import flashmla  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="1x8,32x8,128x8,1x64,8x64,32x64,128x64,32x128,128x128")
    ap.add_argument("--kinds", default="swa,c4")
    ap.add_argument("--splits", default="1,2,3,4,6,8,16")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    swa = pool(1 << 20, SWA_PAGE, g)
    c4_pool = pool(1 << 20, 64, g)
    table = []
    for case in args.cases.split(","):
        batch, heads = map(int, case.split("x"))
        rows = batch * MTP
        for kind in args.kinds.split(","):
            extra = next(v for k, v in kinds(heads).items() if k.startswith("swa+c4")) if kind == "c4" else None
            caps = sm.v4_caps(num_heads=heads, topk=512, page_size=SWA_PAGE, max_rows=4096,
                              extra_topk=extra[2] if extra else 0, extra_page_size=extra[1] if extra else 0)
            p = sm.plan(caps)
            scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
            sets = []
            for _ in range(SETS):
                q = torch.randn(rows, heads, 512, device="cuda", generator=g).bfloat16()
                idx = torch.randint(0, swa.shape[0] * SWA_PAGE, (rows, SWA_W), device="cuda", generator=g,
                                    dtype=torch.int32)
                lens = torch.full((rows,), SWA_W, dtype=torch.int32, device="cuda")
                xkw, pkw = {}, {}
                if extra:
                    xidx = torch.randint(0, c4_pool.shape[0] * 64, (rows, extra[0]), device="cuda", generator=g,
                                         dtype=torch.int32)
                    xlen = torch.full((rows,), extra[0], dtype=torch.int32, device="cuda")
                    xkw = dict(extra_indices=xidx, extra_lengths=xlen)
                    pkw = dict(extra_pages=c4_pool, extra_page=64, extra_indices=xidx, extra_lengths=xlen)
                sets.append((q, idx, lens, xkw, pkw))
            width = SWA_W + (extra[0] if extra else 0)
            planned = p.splits(rows, width)
            name = f"{case}{'+c4' if extra else ''}"
            for s in sorted({planned[0]} | {int(x) for x in args.splits.split(",")}):
                tiles = width // 64
                if s > tiles:
                    continue
                tps = -(-tiles // s) * 64
                s_eff = -(-width // tps)
                forced = dataclasses.replace(p)
                object.__setattr__(forced, "splits", lambda r, w, s_eff=s_eff, tps=tps: (s_eff, tps))
                if s_eff == 1:
                    object.__setattr__(forced, "whole_row", True)
                calls, split_only = [], []
                for q, idx, lens, xkw, _ in sets:
                    out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device="cuda")
                    b = forced.bind(scratch, q=q, indices=idx, lengths=lens, out=out, **xkw)
                    xp = c4_pool if xkw else None
                    calls.append(lambda b=b, xp=xp: sm.run_decode(b, kv_cache=swa, sm_scale=SM_SCALE,
                                                                  extra_kv_cache=xp))
                    if s_eff > 1:
                        k = forced.kernels
                        split_only.append(lambda b=b, xp=xp, k=k: k["split"](
                            b.q, *b.lists(swa, xp), b.partial_o, b.partial_lse, SM_SCALE * sm.LOG2E,
                            b.tokens_per_split))
                r = {"case": name, "splits": s_eff, "tiles/split": tps // 64, "planned": s_eff == planned[0],
                     "ctas": rows * p.head_blocks * s_eff, "us": time_rotated(calls),
                     "split_us": time_rotated(split_only) if split_only else None}
                table.append(r)
                print(r, flush=True)
            if flashmla.available():
                peer = [flashmla.decode_model1(q, swa, SWA_PAGE, idx, lens, SM_SCALE, **pkw)[0]
                        for q, idx, lens, _, pkw in sets]
                r = {"case": name, "splits": "flashmla", "us": time_rotated(peer)}
                table.append(r)
                print(r, flush=True)
    print(f"\n{'case':>12} {'splits':>8} {'tiles':>5} {'ctas':>5} | {'us':>7} {'split us':>8}")
    for r in table:
        if r["splits"] == "flashmla":
            print(f"{r['case']:>12} {'FlashMLA':>8} {'':>5} {'':>5} | {r['us']:7.1f}")
        else:
            mark = "*" if r["planned"] else " "
            su = f"{r['split_us']:8.1f}" if r["split_us"] else f"{'-':>8}"
            print(f"{r['case']:>12} {r['splits']:>7}{mark} {r['tiles/split']:>5} {r['ctas']:>5} | {r['us']:7.1f} {su}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
