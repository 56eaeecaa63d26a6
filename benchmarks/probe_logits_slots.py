"""Indexer prefill: the persistent logits grid sized for fewer CTAs an SM than it can hold, so the
overlapped top-k of the previous batch finds room on every SM beside it (docs/notes/indexer-logits.md,
"Leaving the top-k a slot").

    python benchmarks/probe_logits_slots.py [--cases 4096x163840x1,4096x1048576x4] [--slots 4,3,2]

The kernel is compiled for 4 CTAs an SM (min_blocks_per_mp); the planner sizes its grid as SMs x
logits_ctas_per_sm CTAs, each taking an even share of the (row pair, page) units. Here that count
is patched per variant (b12x.indexer.logits_ctas_per_sm), so a grid of 3 or 2 CTAs an SM leaves
shared memory and registers for one or two wide top-k CTAs (256 threads, 4 an SM) on each SM while
the logits run. Same inputs for every variant; the peer once per case. Each variant's winners are
checked on sampled rows as the bench checks them."""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x import indexer as ix  # noqa: E402
from benchmarks.bench_indexer_prefill import SCRATCH_BUDGET, make_case, ours_times, peer_times  # noqa: E402

_ORIGINAL = ix.logits_ctas_per_sm


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x163840x1,4096x1048576x4")
    ap.add_argument("--slots", default="4,3,2")
    ap.add_argument("--grouped", action="store_true", help="also each slot count with the grouped top-k")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.scratch_mib, args.budget_mib = SCRATCH_BUDGET >> 20, None
    g = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for spec in args.cases.split(","):
        rows, ctx, c = (int(x) for x in spec.split("x"))
        sets = [make_case(rows, ctx, c, g) for _ in range(2)]
        n = sets[0]["n"]
        peer = peer_times(sets, rows, n, args.replays)
        for grouped in ((False, True) if args.grouped else (False,)):
            for slots in (int(s) for s in args.slots.split(",")):
                ix.logits_ctas_per_sm = lambda heads, arch, s=slots: s if arch == "sm_90a" else _ORIGINAL(heads, arch)
                r = {"rows": rows, "ctx": ctx, "c": c, "slots": slots, "grouped": grouped, **peer}
                try:
                    r.update(ours_times(sets, rows, n, grouped, args))
                except Exception as e:  # report, keep going
                    r.update(ours_us=None, ours_error=f"{type(e).__name__}: {e}")
                finally:
                    ix.logits_ctas_per_sm = _ORIGINAL
                r["ratio"] = r["ours_us"] / r["peer_us"] if r["ours_us"] and r["peer_us"] else None
                results.append(r)
                print(json.dumps(r), flush=True)
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(results, f, indent=1)
        del sets
        torch.cuda.empty_cache()
    print(f"\n{'case':>18} {'grp':>3} {'slots':>5} | {'N':>4} {'ours us':>8} {'logits':>7} {'top-k':>6} | "
          f"{'peer us':>8} {'ratio':>6} | check")
    for r in results:
        if r["ours_us"] is None:
            print(f"{r['rows']}x{r['ctx']}x{r['c']:>1} {r['slots']}: {r['ours_error']}")
            continue
        peer = f"{r['peer_us']:8.0f}" if r["peer_us"] else f"{'n/a':>8}"
        ratio = f"{r['ratio']:6.3f}" if r["ratio"] else f"{'n/a':>6}"
        print(f"{r['rows']:>5}x{r['ctx']:>8}x{r['c']:<3} {'on' if r['grouped'] else 'off':>3} {r['slots']:>5} | "
              f"{r['batch_rows']:>4} {r['ours_us']:8.0f} {r['ours_logits_us']:7.0f} {r['ours_topk_us']:6.0f} | "
              f"{peer} {ratio} | rel {r['max_rel_score_diff']:.1e}, ties {r['tie_swaps']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
