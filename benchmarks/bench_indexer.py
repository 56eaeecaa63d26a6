"""Lightning indexer: b12x vs DeepGEMM fp8_fp4_paged_mqa_logits (logits) and torch.topk (top-k).

    python benchmarks/bench_indexer.py [--json out.json] [--quick]

Grid: batch {1, 8, 32, 128} x context {8K, 32K, 64K, 128K} x next_n {1, 2}, H = 64, K = 2048,
compress ratio 1, paged [blocks, 64, 132] cache. Columns:
  logits    b12x run_logits vs DeepGEMM fp8_fp4_paged_mqa_logits (bar: ours >= 0.9x peer speed);
  top-k     b12x run_topk vs torch.topk on the same logits (bar: >= 3x faster);
  pipeline  b12x run_index_topk (logits, then top-k) vs DeepGEMM + torch.topk.
Timing: CUDA-graph replay over rotated input sets (distinct pages of a 2.2 GB pool, distinct logits
buffers: together far beyond the 60 MB L2), median of 30 replays."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x import indexer as ix  # noqa: E402
from b12x.indexer_reference import quantize_k_pages  # noqa: E402
from benchmarks.peers import deepgemm  # noqa: E402
from benchmarks.roofline import HBM_BYTES_PER_S, run_info, topk_bytes  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402

H = 64
K = 2048
ROTATE_BYTES = 256 << 20   # enough distinct data per graph to defeat the L2


def make_pool(blocks: int, g: torch.Generator) -> torch.Tensor:
    out = []
    for s in range(0, blocks, 8192):
        out.append(quantize_k_pages(torch.randn(min(8192, blocks - s), 64, 128, device="cuda", generator=g)))
    return torch.cat(out)


def make_sets(batch: int, ctx: int, next_n: int, pool: torch.Tensor, g: torch.Generator, n_sets: int):
    rows = batch * next_n
    pages = ctx // 64
    sets = []
    for _ in range(n_sets):
        q = torch.randn(rows, H, 128, device="cuda", generator=g).clamp(-448, 448).to(torch.float8_e4m3fn)
        w = torch.randn(rows, H, device="cuda", generator=g) * H ** -0.5
        bt = torch.randint(0, pool.shape[0], (batch, pages), device="cuda", generator=g, dtype=torch.int32)
        ctx_lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
        # MTP rows: row i of a request sees ctx - next_n + 1 + i tokens (DeepGEMM's convention)
        lengths = (ctx_lens[:, None] - next_n + 1 + torch.arange(next_n, device="cuda", dtype=torch.int32)).view(-1)
        logits = torch.empty(rows, ctx, device="cuda")
        sets.append(dict(q=q, w=w, bt=bt, ctx_lens=ctx_lens, lengths=lengths.contiguous(), logits=logits))
    return sets


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="batch {1, 128} x context {8K, 128K} x next_n 1")
    ap.add_argument("--next-n", type=int, default=None, help="only this next_n")
    args = ap.parse_args()
    batches = (1, 128) if args.quick else (1, 8, 32, 128)
    ctxs = (8192, 131072) if args.quick else (8192, 32768, 65536, 131072)
    next_ns = (1,) if args.quick else (1, 2)
    if args.next_n is not None:
        next_ns = (args.next_n,)
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name()}  deep_gemm: {deepgemm.unavailable_reason() or deepgemm.version()}")
    pool = make_pool(max(batches) * max(ctxs) // 64 + 1024, g)          # 2.2 GB
    results = []
    for next_n in next_ns:
        for batch in batches:
            for ctx in ctxs:
                rows = batch * next_n
                k_bytes = batch * ctx * 132
                per_call = k_bytes + rows * ctx * 4
                n_sets = max(2, min(32, math.ceil(ROTATE_BYTES / per_call)))
                sets = make_sets(batch, ctx, next_n, pool, g, n_sets)
                p = ix.plan(ix.Caps(num_heads=H, topk=K, max_rows=rows, max_width=ctx, with_scores=False,
                                    logits_in_scratch=False))
                scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
                binds = [ix.bind(p, scratch=scratch, q=s["q"], weights=s["w"], lengths=s["lengths"],
                                 block_table=s["bt"], logits=s["logits"]) for s in sets]
                r = {"batch": batch, "ctx": ctx, "next_n": next_n, "sets": n_sets}
                r["ours_logits_us"] = time_rotated([lambda b=b: ix.run_logits(b, kv_cache=pool) for b in binds])
                for b in binds:
                    ix.run_logits(b, kv_cache=pool)
                r["ours_topk_us"] = time_rotated([lambda b=b: ix.run_topk(b) for b in binds])
                r["torch_topk_us"] = time_rotated([lambda s=s: torch.topk(s["logits"], K, dim=-1) for s in sets])
                r["ours_pipeline_us"] = time_rotated([lambda b=b: ix.run_index_topk(b, kv_cache=pool) for b in binds])
                r["fused"] = p.use_fused(rows, ctx)
                r["peer_logits_us"] = r["peer_pipeline_us"] = None
                if deepgemm.available():
                    try:
                        peer = [deepgemm.paged_logits(s["q"].view(batch, next_n, H, 128), pool, s["w"], s["ctx_lens"],
                                                      s["bt"], ctx, sms) for s in sets]
                        # same function as ours? compare on the valid columns of the first set
                        ref = peer[0]().float()
                        ix.run_logits(binds[0], kv_cache=pool)
                        ours = sets[0]["logits"]
                        valid = (torch.arange(ctx, device="cuda")[None, :] < sets[0]["lengths"][:, None])
                        diff = (ours[valid].double() - ref[:, :ctx][valid].double()).norm()
                        r["peer_rel_err"] = float(diff / ref[:, :ctx][valid].double().norm().clamp(min=1e-30))
                        r["peer_logits_us"] = time_rotated(peer)
                        r["peer_pipeline_us"] = time_rotated([lambda f=f: torch.topk(f(), K, dim=-1) for f in peer])
                    except Exception as e:  # report, keep going
                        r["peer_error"] = f"{type(e).__name__}: {e}"
                r["logits_speed_vs_peer"] = (r["peer_logits_us"] / r["ours_logits_us"]) if r["peer_logits_us"] else None
                r["topk_speedup"] = r["torch_topk_us"] / r["ours_topk_us"]
                r["logits_hbm_share"] = (k_bytes + rows * ctx * 4) / HBM_BYTES_PER_S * 1e6 / r["ours_logits_us"]
                r["topk_hbm_share"] = topk_bytes(rows, ctx, K) / HBM_BYTES_PER_S * 1e6 / r["ours_topk_us"]
                results.append(r)
                print(json.dumps(r), flush=True)
                del sets, binds, scratch
                torch.cuda.empty_cache()
    hdr = (f"{'n':>2} {'B':>4} {'ctx':>7} | {'logits us':>9} {'DG us':>8} {'DG/ours':>7} {'%HBM':>5} | "
           f"{'topk us':>8} {'torch us':>8} {'speedup':>7} | {'pipe us':>8} {'DG+torch':>8} {'ratio':>6} {'fused':>5}")
    print(f"\nlightning indexer, H={H}, K={K}, fp8 paged cache; HBM roofline {HBM_BYTES_PER_S / 1e12:.1f} TB/s")
    print(hdr)
    print("-" * len(hdr))
    na = "n/a"
    for r in results:
        dg = f"{r['peer_logits_us']:8.1f}" if r["peer_logits_us"] else f"{na:>8}"
        sp = f"{r['logits_speed_vs_peer']:7.2f}" if r["logits_speed_vs_peer"] else f"{na:>7}"
        pp = f"{r['peer_pipeline_us']:8.1f}" if r["peer_pipeline_us"] else f"{na:>8}"
        pr = f"{r['peer_pipeline_us'] / r['ours_pipeline_us']:6.2f}" if r["peer_pipeline_us"] else f"{na:>6}"
        print(f"{r['next_n']:>2} {r['batch']:>4} {r['ctx']:>7} | {r['ours_logits_us']:9.1f} {dg} {sp} "
              f"{100 * r['logits_hbm_share']:5.1f} | {r['ours_topk_us']:8.1f} {r['torch_topk_us']:8.1f} "
              f"{r['topk_speedup']:7.2f} | {r['ours_pipeline_us']:8.1f} {pp} {pr} {str(r['fused']):>5}")
    if args.json:
        with open(args.json, "w") as f:
            info = run_info(torch.cuda.get_device_name(), torch=torch.__version__, deep_gemm=deepgemm.version())
            json.dump({**info, "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
