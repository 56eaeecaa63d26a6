"""Sparse MLA extend (prefill chunks): b12x vs FlashMLA's SM90 sparse prefill, side by side.

    python benchmarks/bench_sparse_mla_extend.py [--json out.json] [--skv 131072] [--sq 4096] [--heads 16,32] [--no-fp8]
        [--no-peer]

Grid: cache s_kv {32768, 131072} tokens x s_q {512, 4096} x heads {8, 16, 32, 64, 128} x top-k
2048, random indices per row. FlashMLA's `flash_mla_sparse_fwd` runs bf16 KV with 64 or 128 heads
only: below 64 it runs q zero-padded to 64 heads. FlashMLA has no fp8-KV prefill on SM90; what
engines run on an fp8_ds_mla cache is a dequantisation of the cache to bf16 (torch ops,
`b12x.reference.dequantize_fp8_ds_mla`) and then FlashMLA: our fp8 extend is compared with the sum
(`peer_fp8_total_us`, `ratio_fp8`). Timing: CUDA-graph replays of two rotated input sets, median."""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x.attention import sparse_mla as sm  # noqa: E402
from b12x.reference import dequantize_fp8_ds_mla  # noqa: E402
from benchmarks.bench_sparse_mla_decode import make_pool  # noqa: E402
from benchmarks.peers import flashmla  # noqa: E402
from benchmarks.roofline import BF16_FLOP_PER_S, roofline_us, run_info  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402

TOPK = 2048
SETS = 2
RECORD = {"fp8_ds_mla": 656, "bf16": 1152}


def bench_ours(sets, heads, kv_format, pool, plan=None):
    """Median µs of run_extend over the rotated sets; `plan` (default: the Caps' plan) lets a
    probe time a variant of it."""
    rows = sets[0][0].shape[0]
    p = plan or sm.plan(sm.Caps(num_heads=heads, topk=TOPK, kv_format=kv_format, max_rows=rows, mode="extend"))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    calls = []
    for q, idx, lengths in sets:
        out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device="cuda")
        b = sm.bind(p, scratch=scratch, q=q, indices=idx, lengths=lengths, out=out)
        calls.append(lambda b=b: sm.run_extend(b, kv_cache=pool, sm_scale=576 ** -0.5))
    return time_rotated(calls, replays=10)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--skv", default="32768,131072", help="cache tokens, comma-separated (multiples of 64)")
    ap.add_argument("--sq", default="512,4096", help="query rows per call, comma-separated")
    ap.add_argument("--heads", default="8,16,32,64,128", help="head counts, comma-separated")
    ap.add_argument("--no-fp8", action="store_true", help="skip the fp8-KV column")
    ap.add_argument("--no-peer", action="store_true", help="skip FlashMLA (A/B runs of our kernels)")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}  flashmla: {flashmla.unavailable_reason() or 'available'}")
    rows_out = []
    for skv, s_q, heads in [(k, q, h) for k in map(int, args.skv.split(",")) for q in map(int, args.sq.split(","))
                            for h in map(int, args.heads.split(","))]:
        if not rows_out or rows_out[-1]["skv"] != skv:
            pools = {f: make_pool(f, skv // 64, g) for f in RECORD}
            # what engines run on an fp8 cache before FlashMLA: the cache dequantised to bf16
            dequant_us = None if args.no_fp8 else time_rotated(
                [lambda: dequantize_fp8_ds_mla(pools["fp8_ds_mla"], torch.bfloat16)], replays=10)

        sets = [(torch.randn(s_q, heads, 576, device="cuda", generator=g).bfloat16(),
                 torch.randint(0, skv, (s_q, TOPK), device="cuda", generator=g, dtype=torch.int32),
                 torch.full((s_q,), TOPK, device="cuda", dtype=torch.int32)) for _ in range(SETS)]
        flops = 2.0 * s_q * heads * TOPK * (576 + 512)
        r = {"skv": skv, "s_q": s_q, "heads": heads, "topk": TOPK}
        r["ours_bf16_us"] = bench_ours(sets, heads, "bf16", pools["bf16"])
        r["ours_fp8_us"] = None if args.no_fp8 else bench_ours(sets, heads, "fp8_ds_mla", pools["fp8_ds_mla"])
        r["peer_bf16_us"] = r["peer_dequant_us"] = r["peer_fp8_total_us"] = r["ratio_fp8"] = None
        if flashmla.available() and not args.no_peer:
            flat = pools["bf16"].view(-1, 576)
            r["peer_bf16_us"] = time_rotated([flashmla.prefill_bf16(q, flat, idx, 576 ** -0.5)
                                              for q, idx, _ in sets], replays=10)
            if r["ours_fp8_us"]:
                r["peer_dequant_us"] = dequant_us
                r["peer_fp8_total_us"] = dequant_us + r["peer_bf16_us"]
                r["ratio_fp8"] = r["ours_fp8_us"] / r["peer_fp8_total_us"]
        for tag in ("bf16",) if args.no_fp8 else ("bf16", "fp8"):
            fmt = "bf16" if tag == "bf16" else "fp8_ds_mla"
            nbytes = s_q * (TOPK * (RECORD[fmt] + 4) + heads * (576 + 512) * 2)
            r[f"{tag}_tflops"] = flops / r[f"ours_{tag}_us"] / 1e6
            r[f"{tag}_roofline_share"] = roofline_us(flops, nbytes) / r[f"ours_{tag}_us"]
        r["peer_tflops"] = flops / r["peer_bf16_us"] / 1e6 if r["peer_bf16_us"] else None
        r["ratio_bf16"] = r["ours_bf16_us"] / r["peer_bf16_us"] if r["peer_bf16_us"] else None
        rows_out.append(r)
        print(json.dumps(r), flush=True)
    print(f"\nsparse MLA extend, top-k {TOPK}, bf16 roofline {BF16_FLOP_PER_S / 1e12:.0f} TFLOP/s")
    hdr = (f"{'s_kv':>6} {'s_q':>5} {'H':>4} | {'ours bf16 us':>12} {'FlashMLA us':>11} {'ours/peer':>9} {'TFLOP/s':>7} "
           f"{'peer TF/s':>9} | {'ours fp8 us':>11} {'TFLOP/s':>7} {'%roof':>5} {'deq+FMLA':>8} {'ratio':>5}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows_out:
        peer = f"{r['peer_bf16_us']:11.1f}" if r["peer_bf16_us"] else f"{'n/a':>11}"
        ratio = f"{r['ratio_bf16']:9.2f}" if r["ratio_bf16"] else f"{'n/a':>9}"
        ptf = f"{r['peer_tflops']:9.1f}" if r["peer_tflops"] else f"{'n/a':>9}"
        fp8 = (f"{r['ours_fp8_us']:11.1f} {r['fp8_tflops']:7.1f} {100 * r['fp8_roofline_share']:5.1f}"
               if r["ours_fp8_us"] else f"{'n/a':>11}")
        if r["peer_fp8_total_us"]:
            fp8 += f" {r['peer_fp8_total_us']:8.1f} {r['ratio_fp8']:5.2f}"
        print(f"{r['skv']:>6} {r['s_q']:>5} {r['heads']:>4} | {r['ours_bf16_us']:12.1f} {peer} {ratio} "
              f"{r['bf16_tflops']:7.1f} {ptf} | {fp8}")
    if args.json:
        with open(args.json, "w") as f:
            info = run_info(torch.cuda.get_device_name(), torch=torch.__version__)
            json.dump({**info, "rows": rows_out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
