"""Sparse MLA extend: the time of one wave of CTAs against the tiles each CTA runs, per KV format,
to separate a per-CTA fixed cost (Q, the pipeline's fill, the epilogue) from the per-tile cost
(docs/notes/extend.md, "Fixed and per-tile cost").

    python benchmarks/probe_extend_tiles.py [--heads 64,128] [--lengths 64,128,256,512,1024,2048]

Every row of a call has the same length L (tiles = L / 64), so each CTA (one row, one 64-head
block) runs the same work; rows = 4 x SMs per head block (four full waves at one CTA an SM).
Random indices over a 32K-token cache, 2 rotated input sets, CUDA-graph replays, median. Prints
µs per call, µs per wave, and a least-squares fit wave = fixed + per_tile x tiles per format.
`--formats ...,flashmla` adds FlashMLA's sparse prefill on the bf16 cache (index rows L wide:
it takes no per-row length; L a multiple of 128), the same split for the peer."""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x.attention import sparse_mla as sm  # noqa: E402
from b12x.reference import V4_DIM, quantize_model1_fp8  # noqa: E402
from benchmarks.bench_sparse_mla_decode import make_pool  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402

SKV = 32768
SETS = 2


def peer_waves(heads, rows, lengths, pool, g) -> list[dict]:
    """FlashMLA's flash_mla_sparse_fwd on the bf16 pool, index rows exactly L wide."""
    from benchmarks.peers import flashmla

    flat = pool.view(-1, 576)
    out = []
    for L in (x for x in lengths if x % flashmla.PREFILL_TOPK_ALIGN == 0):
        calls = []
        for _ in range(SETS):
            q = torch.randn(rows, heads, 576, device="cuda", generator=g).bfloat16()
            idx = torch.randint(0, SKV, (rows, L), device="cuda", generator=g, dtype=torch.int32)
            calls.append(flashmla.prefill_bf16(q, flat, idx, 576 ** -0.5))
        us = time_rotated(calls, replays=20)
        r = {"heads": heads, "format": "flashmla", "rows": rows, "length": L, "tiles": L // 64, "us": us,
             "wave_us": us / 4}
        print(json.dumps(r), flush=True)
        out.append(r)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", default="64,128")
    ap.add_argument("--lengths", default="64,128,256,512,1024,2048")
    ap.add_argument("--formats", default="bf16,fp8_ds_mla,model1_fp8", help="and flashmla: the peer on bf16")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lengths = [int(x) for x in args.lengths.split(",")]
    pools = {f: make_pool(f, SKV // 64, g) for f in ("bf16", "fp8_ds_mla")}
    pools["model1_fp8"] = quantize_model1_fp8(torch.randn(SKV // 256, 256, V4_DIM, device="cuda", generator=g))
    results = []
    for heads in (int(h) for h in args.heads.split(",")):
        rows = 4 * sms // max(1, heads // 64)
        for fmt in args.formats.split(","):
            if fmt == "flashmla":
                results += peer_waves(heads, rows, lengths, pools["bf16"], g)
                continue
            v4 = fmt == "model1_fp8"
            dim = V4_DIM if v4 else 576
            width = 512 if v4 else 2048
            if v4:
                p = sm.plan(sm.v4_caps(num_heads=heads, topk=width, page_size=256, max_rows=rows, mode="extend"))
            else:
                p = sm.plan(sm.Caps(num_heads=heads, topk=width, kv_format=fmt, max_rows=rows, mode="extend"))
            scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
            for L in (x for x in lengths if x <= width):
                calls = []
                for _ in range(SETS):
                    q = torch.randn(rows, heads, dim, device="cuda", generator=g).bfloat16()
                    idx = torch.randint(0, SKV, (rows, width), device="cuda", generator=g, dtype=torch.int32)
                    lens = torch.full((rows,), L, device="cuda", dtype=torch.int32)
                    out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device="cuda")
                    b = p.bind(scratch, q=q, indices=idx, lengths=lens, out=out)
                    calls.append(lambda b=b: sm.run_extend(b, kv_cache=pools[fmt], sm_scale=dim ** -0.5))
                us = time_rotated(calls, replays=20)
                r = {"heads": heads, "format": fmt, "rows": rows, "length": L, "tiles": L // 64, "us": us,
                     "wave_us": us / 4}
                results.append(r)
                print(json.dumps(r), flush=True)
    print(f"\n{'H':>4} {'format':>11} | " + " ".join(f"{'L=' + str(x):>8}" for x in lengths) + " | fixed  per tile (µs a wave)")
    for heads in sorted({r["heads"] for r in results}):
        for fmt in args.formats.split(","):
            rs = [r for r in results if r["heads"] == heads and r["format"] == fmt]
            if len(rs) < 2:
                continue
            b, a = np.polyfit([r["tiles"] for r in rs], [r["wave_us"] for r in rs], 1)
            by_len = {r["length"]: r["wave_us"] for r in rs}
            cells = " ".join(f"{by_len[x]:8.2f}" if x in by_len else f"{'':>8}" for x in lengths)
            print(f"{heads:>4} {fmt:>11} | {cells} | {a:5.2f}  {b:6.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
