"""DeepSeek-V4 sparse MLA decode: b12x vs FlashMLA's MODEL1 decode, side by side in one process.

    python benchmarks/bench_sparse_mla_v4.py [--json out.json] [--batches 1,8,32,128] [--heads 8,16,64,128]

Layer kinds as FlashMLA's production configs (s_q = 2: MTP, so 2 rows per request): SWA 128 (pages
of 256) alone, + C4 (512 at 64 heads and fewer, 1024 at 128; pages of 64), + C128 (1024 entries,
pages of 2). FlashMLA runs 64 or 128 heads: fewer run on q zero-padded to 64. Timing: CUDA-graph
replays over 8 rotated input sets drawn from caches far beyond L2, median."""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x.attention import sparse_mla as sm  # noqa: E402
from b12x.reference import quantize_model1_fp8  # noqa: E402
from benchmarks.peers import flashmla  # noqa: E402
from benchmarks.roofline import run_info  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402

SETS, SWA_W, SWA_PAGE, MTP = 8, 128, 256, 2
SM_SCALE = 512 ** -0.5


def pool(tokens: int, page: int, g) -> torch.Tensor:
    blocks, step = -(-tokens // page), max(1, 65536 // page)    # quantise 64K tokens at a time
    out = [quantize_model1_fp8(torch.randn(min(step, blocks - b), page, 512, device="cuda", generator=g))
           for b in range(0, blocks, step)]
    return torch.cat(out)


def kinds(heads: int):
    c4 = 1024 if heads == 128 else 512
    return {"swa": None, f"swa+c4_{c4}": (c4, 64, 1024 if heads == 128 else 512), "swa+c128_1024": (1024, 2, 8192)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--heads", default="8,16,64,128")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    swa = pool(1 << 21, SWA_PAGE, g)                 # 2M tokens: 1.2 GB
    extra_pools = {64: pool(1 << 21, 64, g), 2: pool(1 << 20, 2, g)}
    print(f"device: {torch.cuda.get_device_name()}  flashmla: {flashmla.unavailable_reason() or 'available'}")
    rows_out = []
    for batch in map(int, args.batches.split(",")):
        for heads in map(int, args.heads.split(",")):
            for kind, extra in kinds(heads).items():
                rows = batch * MTP
                caps = sm.v4_caps(num_heads=heads, topk=512, page_size=SWA_PAGE, max_rows=rows,
                                  extra_topk=extra[2] if extra else 0, extra_page_size=extra[1] if extra else 0)
                p = sm.plan(caps)
                scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
                ours, peer = [], []
                for _ in range(SETS):
                    q = torch.randn(rows, heads, 512, device="cuda", generator=g).bfloat16()
                    idx = torch.randint(0, swa.shape[0] * SWA_PAGE, (rows, SWA_W), device="cuda", generator=g,
                                        dtype=torch.int32)
                    lens = torch.full((rows,), SWA_W, dtype=torch.int32, device="cuda")
                    sink = torch.randn(heads, device="cuda", generator=g)
                    xkw, pkw = {}, {}
                    if extra:
                        w, page, _ = extra
                        xp = extra_pools[page]
                        xidx = torch.randint(0, xp.shape[0] * page, (rows, w), device="cuda", generator=g,
                                             dtype=torch.int32)
                        xlen = torch.full((rows,), w, dtype=torch.int32, device="cuda")
                        xkw = dict(extra_indices=xidx, extra_lengths=xlen)
                        pkw = dict(extra_pages=xp, extra_page=page, extra_indices=xidx, extra_lengths=xlen)
                    out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device="cuda")
                    b = p.bind(scratch, q=q, indices=idx, lengths=lens, out=out, **xkw)
                    ours.append(lambda b=b, xp=pkw.get("extra_pages"), s=sink: sm.run_decode(
                        b, kv_cache=swa, sm_scale=SM_SCALE, attn_sink=s, extra_kv_cache=xp))
                    if flashmla.available():
                        peer.append(flashmla.decode_model1(q, swa, SWA_PAGE, idx, lens, SM_SCALE, attn_sink=sink,
                                                           **pkw)[0])
                r = {"batch": batch, "heads": heads, "kind": kind, "rows": rows, "ours_us": time_rotated(ours),
                     "peer_us": time_rotated(peer) if peer else None}
                r["ratio"] = r["ours_us"] / r["peer_us"] if r["peer_us"] else None
                rows_out.append(r)
                print(json.dumps(r), flush=True)
    print(f"\n{'B':>4} {'H':>4} {'kind':>16} | {'ours us':>8} {'FlashMLA us':>11} {'ratio':>6}")
    for r in rows_out:
        peer = f"{r['peer_us']:11.1f}" if r["peer_us"] else f"{'n/a':>11}"
        ratio = f"{r['ratio']:6.2f}" if r["ratio"] else f"{'n/a':>6}"
        print(f"{r['batch']:>4} {r['heads']:>4} {r['kind']:>16} | {r['ours_us']:8.1f} {peer} {ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": run_info(torch.cuda.get_device_name(), torch=torch.__version__), "rows": rows_out}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
