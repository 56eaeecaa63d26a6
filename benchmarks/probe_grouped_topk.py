"""The grouped top-k (Caps.group_select) against the wide top-k on the same logits, same process.

    python benchmarks/probe_grouped_topk.py [--rounds 3] [rows,width ...]

Per case: both plans' winners and scores compared (the same sets, the same score at each winner:
the grouped path must select exactly what the wide one does), then run_topk of each timed in
alternating rounds (CUDA-graph replays over rotated logits, benchmarks/timing.py), and the
grouped path's three parts alone: group_max, the top-k of the maxima rows, group_final. Logits
are distributed like the indexer's (probe_topk.logits_like), with each row's valid range ending
where a causal prefill row's does (a row sees all but its last few hundred entries)."""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x import indexer as ix  # noqa: E402
from b12x import indexer_topk as tk  # noqa: E402
from benchmarks.probe_topk import logits_like  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    # prefill batches (160K, 1M c 4), then decode-sized rows of 128K (where the plain route may win)
    ap.add_argument("cases", nargs="*", default=["264,163840", "295,163840", "188,262144", "256,262144", "1,131072",
                                                 "8,131072", "32,131072", "128,131072", "256,131072"])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'rows':>5} {'width':>7} | {'wide':>8} {'grouped':>8} {'ratio':>6} | {'max':>6} {'ids':>6} {'final':>6}"
          f" | check")
    for case in args.cases:
        rows, width = (int(x) for x in case.split(","))
        n_sets = max(2, min(8, math.ceil((384 << 20) / (rows * width * 4))))
        sets = [logits_like(rows, width, g) for _ in range(n_sets)]
        ends = (width - torch.arange(rows, 0, -1, device="cuda") * 3).clamp(min=0).to(torch.int32)
        plans, binds, outs = {}, {}, {}
        for grp in (False, True):
            p = ix.plan(ix.Caps(num_heads=64, topk=2048, mode="contiguous", max_rows=rows, max_width=width,
                                with_scores=True, group_select=grp))
            assert p.group_route(width) == grp
            s = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
            o = [(torch.empty(rows, 2048, dtype=torch.int32, device="cuda"), torch.empty(rows, 2048, device="cuda"))
                 for _ in sets]
            plans[grp], outs[grp] = p, o
            binds[grp] = [p.bind(s, lengths=ends, starts=torch.zeros_like(ends), logits=lg, indices=i, scores=sc)
                          for lg, (i, sc) in zip(sets, o)]
        for grp in (False, True):
            ix.run_topk(binds[grp][0])
        torch.cuda.synchronize()
        (i0, s0), (i1, s1) = outs[False][0], outs[True][0]
        o0, o1 = i0.sort(dim=1), i1.sort(dim=1)
        same = torch.equal(o0.values, o1.values) and torch.equal(s0.gather(1, o0.indices), s1.gather(1, o1.indices))
        t = {False: [], True: []}
        for _ in range(args.rounds):
            for grp in (False, True):
                t[grp].append(time_rotated([lambda b=b: ix.run_topk(b) for b in binds[grp]]))
        wide, grouped = min(t[False]), min(t[True])
        # the grouped path's parts, each as run_topk launches it
        p, bs = plans[True], binds[True]
        fns = [tk.group_topk_steps(b, p.kernels("topk"), b.num_blocks) for b in bs]
        tm = [time_rotated([f[j] for f in fns]) for j in range(3)]
        print(f"{rows:5d} {width:7d} | {wide:8.1f} {grouped:8.1f} {grouped / wide:6.2f} | {tm[0]:6.1f} {tm[1]:6.1f}"
              f" {tm[2]:6.1f} | {'same winners and scores' if same else 'DIFFERENT'}", flush=True)
        del sets, binds, outs, plans
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
