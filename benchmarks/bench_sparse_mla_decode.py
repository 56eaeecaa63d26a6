"""Sparse MLA decode: b12x vs FlashMLA's SM90 sparse decode, side by side in one process.

    python benchmarks/bench_sparse_mla_decode.py [--json out.json] [--quick]

Grid: batch {1,4,8,32,128} x heads {16,32,64,128} x top-k 2048 over an fp8_ds_mla cache, plus
a bf16-KV column (no peer). FlashMLA runs 64 or 128 heads only: at h=16/32 it runs q zero-padded
to 64 heads, as engines do today. Timing: CUDA-graph replay over 8 rotated input sets drawn from a
1.4 GB cache (far beyond the 60 MB L2), median of 30 replays."""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x.attention import sparse_mla as sm  # noqa: E402
from b12x.reference import quantize_fp8_ds_mla  # noqa: E402
from benchmarks.peers import flashmla  # noqa: E402
from benchmarks.roofline import BF16_FLOP_PER_S, HBM_BYTES_PER_S, roofline_us, run_info  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402

TOPK = 2048
CAPS_TOPK = None   # the plan's top-k (the spec built), when wider than the rows measured
SETS = 8
RECORD = {"fp8_ds_mla": 656, "bf16": 1152}


def make_pool(kv_format: str, blocks: int, g: torch.Generator) -> torch.Tensor:
    out = []
    for start in range(0, blocks, 2048):  # quantize in slices to bound temporary memory
        k = torch.randn(min(2048, blocks - start), 64, 576, device="cuda", generator=g)
        out.append(quantize_fp8_ds_mla(k) if kv_format == "fp8_ds_mla" else k.bfloat16())
    return torch.cat(out)


def problem_size(batch: int, heads: int, kv_format: str) -> tuple[float, float]:
    flops = 2.0 * batch * heads * TOPK * (576 + 512)
    nbytes = batch * (TOPK * (RECORD[kv_format] + 4) + heads * 576 * 2 + heads * 512 * 2 + heads * 4)
    return flops, nbytes


def bench_ours(sets, heads: int, kv_format: str, pool: torch.Tensor) -> float:
    batch = sets[0][0].shape[0]
    p = sm.plan(sm.Caps(num_heads=heads, topk=CAPS_TOPK or TOPK, kv_format=kv_format, max_rows=batch))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    calls = []
    for q, idx, lengths in sets:
        out = torch.empty(batch, heads, 512, dtype=torch.bfloat16, device="cuda")
        b = sm.bind(p, scratch=scratch, q=q, indices=idx, lengths=lengths, out=out)
        calls.append(lambda b=b: sm.run_decode(b, kv_cache=pool, sm_scale=576 ** -0.5))
    return time_rotated(calls)


def bench_peer(sets, pool: torch.Tensor) -> float | None:
    if not flashmla.available():
        return None
    calls = [flashmla.decode_fp8(q, pool, idx, 576 ** -0.5)[0] for q, idx, _ in sets]
    return time_rotated(calls)


def main() -> int:
    global TOPK, CAPS_TOPK
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="batch {1, 128} x heads {16, 128}")
    ap.add_argument("--blocks", type=int, default=32768, help="cache pages (32768 x 64 tokens = 1.4 GB fp8)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (overrides the grid)")
    ap.add_argument("--heads", default=None, help="comma-separated head counts (overrides the grid)")
    ap.add_argument("--topk", type=int, default=TOPK,
                    help="index row width (a multiple of 64 up to 8192; the peer runs only at 2048)")
    ap.add_argument("--caps-topk", type=int, default=None,
                    help="Caps.topk of the plan (default: --topk), e.g. 8192 for the sparse-mla-wide specs")
    ap.add_argument("--formats", default="fp8_ds_mla,bf16", help="KV formats of ours to time (comma-separated)")
    ap.add_argument("--no-peer", action="store_true", help="skip FlashMLA (e.g. a second variant of ours in the same run)")
    args = ap.parse_args()
    formats = args.formats.split(",")
    batches = (1, 128) if args.quick else (1, 4, 8, 32, 128)
    heads_list = (16, 128) if args.quick else (16, 32, 64, 128)
    batches = tuple(map(int, args.batches.split(","))) if args.batches else batches
    heads_list = tuple(map(int, args.heads.split(","))) if args.heads else heads_list
    TOPK, CAPS_TOPK = args.topk, args.caps_topk
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}  flashmla: {flashmla.unavailable_reason() or 'available'}")
    pools = {f: make_pool(f, args.blocks if f == "fp8_ds_mla" else args.blocks // 2, g) for f in RECORD}
    rows = []
    for batch in batches:
        for heads in heads_list:
            sets = {}
            for f, pool in pools.items():
                slots = pool.shape[0] * 64
                sets[f] = [(torch.randn(batch, heads, 576, device="cuda", generator=g).bfloat16(),
                            torch.randint(0, slots, (batch, TOPK), device="cuda", generator=g, dtype=torch.int32),
                            torch.full((batch,), TOPK, device="cuda", dtype=torch.int32)) for _ in range(SETS)]
            r = {"batch": batch, "heads": heads, "topk": TOPK}
            nan = float("nan")
            r["ours_fp8_us"] = bench_ours(sets["fp8_ds_mla"], heads, "fp8_ds_mla", pools["fp8_ds_mla"]) if "fp8_ds_mla" in formats else nan
            r["peer_fp8_us"] = bench_peer(sets["fp8_ds_mla"], pools["fp8_ds_mla"]) if TOPK == 2048 and not args.no_peer else None
            r["ours_bf16_us"] = bench_ours(sets["bf16"], heads, "bf16", pools["bf16"]) if "bf16" in formats else nan
            for f, key in (("fp8_ds_mla", "ours_fp8_us"), ("bf16", "ours_bf16_us")):
                flops, nbytes = problem_size(batch, heads, f)
                tag = "fp8" if f == "fp8_ds_mla" else "bf16"
                r[f"{tag}_tflops"] = flops / r[key] / 1e6
                r[f"{tag}_gbps"] = nbytes / r[key] / 1e3
                r[f"{tag}_roofline_share"] = roofline_us(flops, nbytes) / r[key]
            r["ratio"] = r["ours_fp8_us"] / r["peer_fp8_us"] if r["peer_fp8_us"] else None
            rows.append(r)
            print(json.dumps(r), flush=True)
    hdr = f"{'B':>4} {'H':>4} | {'ours fp8 us':>11} {'FlashMLA us':>11} {'ours/peer':>9} | {'TFLOP/s':>7} {'GB/s':>6} {'%roof':>5} | {'ours bf16 us':>12} {'%roof':>5}"
    print(f"\nsparse MLA decode, top-k {TOPK}; roofline {HBM_BYTES_PER_S / 1e12:.1f} TB/s, {BF16_FLOP_PER_S / 1e12:.0f} TFLOP/s")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        peer = f"{r['peer_fp8_us']:11.1f}" if r["peer_fp8_us"] else f"{'n/a':>11}"
        ratio = f"{r['ratio']:9.2f}" if r["ratio"] else f"{'n/a':>9}"
        print(f"{r['batch']:>4} {r['heads']:>4} | {r['ours_fp8_us']:11.1f} {peer} {ratio} | {r['fp8_tflops']:7.1f} "
              f"{r['fp8_gbps']:6.0f} {100 * r['fp8_roofline_share']:5.1f} | {r['ours_bf16_us']:12.1f} "
              f"{100 * r['bf16_roofline_share']:5.1f}")
    if args.json:
        with open(args.json, "w") as f:
            info = run_info(torch.cuda.get_device_name(), torch=torch.__version__)
            json.dump({**info, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
