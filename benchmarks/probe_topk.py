"""Per-launch timings of the wide-row top-k (memset, chunk kernel, tie pass) on indexer-like logits.

    python benchmarks/probe_topk.py [--sweep] [rows,width ...]

Times each launch on its own with CUDA-graph replays over rotated logits (benchmarks/timing.py), so
a slow step shows up directly. --sweep also times run_topk with 2x, 4x, 8x the planner's tiles per
CTA (fewer, longer CTAs). Logits: scores distributed like the indexer's (see logits_like)."""
from __future__ import annotations

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x import indexer as ix  # noqa: E402
from b12x import indexer_topk as tk  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402


def logits_like(rows: int, width: int, g: torch.Generator) -> torch.Tensor:
    """Scores distributed like the indexer's: sum_h w_h relu(q_h . k) over random q, k."""
    q = torch.randn(rows, 64, 128, device="cuda", generator=g)
    w = torch.randn(rows, 64, device="cuda", generator=g) / 8
    out = torch.empty(rows, width, device="cuda")
    for s in range(0, width, 8192):
        k = torch.randn(min(8192, width - s), 128, device="cuda", generator=g)
        out[:, s:s + k.shape[0]] = torch.einsum("rh,rht->rt", w, torch.relu(torch.einsum("rhd,td->rht", q, k)))
    return out


def main() -> None:
    once = "--once" in sys.argv          # one eager run_topk per case (for Nsight Compute)
    sweep = "--sweep" in sys.argv
    argv = [a for a in sys.argv[1:] if a not in ("--once", "--sweep")]
    cases = [tuple(map(int, a.split(","))) for a in argv] or [(1, 131072), (8, 131072), (32, 131072),
                                                                       (128, 32768), (128, 131072)]
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'rows':>5} {'width':>7} {'tpc':>4} | {'memset':>7} {'chunk+ms':>8} {'ties':>7} {'run_topk':>8} {'torch':>7}")
    for rows, width in cases:
        n_sets = 1 if once else max(2, min(16, math.ceil((256 << 20) / (rows * width * 4))))
        sets = [logits_like(rows, width, g) for _ in range(n_sets)]
        p = ix.plan(ix.Caps(num_heads=64, topk=2048, max_rows=rows, max_width=width, with_scores=False))
        scratch = torch.zeros(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
        ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        binds = [ix.bind(p, scratch=scratch, lengths=ends, logits=lg) for lg in sets]
        if once:
            ix.run_topk(binds[0])
            torch.cuda.synchronize()
            continue
        kernels = p.kernels("topk")
        t = p.tiling
        tpc = p.wide_tiles_per_cta(rows, width)
        hist = tk.wide_args(binds[0])[0]                         # shared by every binding (one scratch)
        full = time_rotated([lambda b=b: ix.run_topk(b) for b in binds])
        memset = time_rotated([lambda: hist.zero_() for _ in binds])
        # the chunk kernel needs the memset in front of it; the tie pass only reads its outputs

        ix.run_topk(binds[0])
        torch.cuda.synchronize()
        chunk_ms = time_rotated([lambda b=b: (hist.zero_(), _wide_call(b, kernels, tk.wide_chunk_entry(b)))
                                 for b in binds])
        ties = time_rotated([lambda b=b: _wide_call(b, kernels, "wide_ties") for b in binds])
        tt = time_rotated([lambda lg=lg: torch.topk(lg, 2048, dim=-1) for lg in sets])
        print(f"{rows:5d} {width:7d} {tpc:4d} | {memset:7.1f} {chunk_ms:8.1f} {ties:7.1f} {full:8.1f} {tt:7.1f}",
              flush=True)
        tiles = -(-width // t["wide_tile"])
        for f in (2, 4, 8) if sweep else ():
            if tpc * f > tiles:
                break
            p.wide_tiles_per_cta = lambda r, w, n=tpc * f: n      # the planner's choice, overridden
            alt = time_rotated([lambda b=b: ix.run_topk(b) for b in binds])
            print(f"{rows:5d} {width:7d} {tpc * f:4d} | {'':7} {'':8} {'':7} {alt:8.1f}", flush=True)


def _wide_call(b, kernels, which):
    """One launch of the wide path with the arguments run_topk would pass."""
    _, args = tk.wide_args(b)
    kernels[which](*args)


if __name__ == "__main__":
    main()
