"""Indexer prefill in bounded memory: b12x contiguous run_index_topk with row batches
(Caps.logits_rows whose whole scratch fits 512 MiB, `ix.logits_rows_within`) vs DeepGEMM
fp8_fp4_mqa_logits + torch.topk.

    python benchmarks/bench_indexer_prefill.py [--json out.json] [--cases 4096x163840x1,...]

A case is rows x context (tokens) x compress ratio c: the prefill chunk's `rows` query tokens are
the last ones of a `context`-token sequence, so query row i sees the first floor((ctx - rows + i
+ 1) / c) entries of the (compressed) K (starts 0, causal ends; contiguous bounds are in entries,
so the plan's compress_ratio stays 1). H = 64, K = 2048. --group-select on / both: ours with
Caps.group_select (the grouped top-k of wide rows), or each case both ways in one process.

The peer writes [rows, max_seqlen_k] logits relative to each row's start (one full-width fp32
buffer: 2.7 GB at 4096 x 160K) and torch.topk selects over the raw buffer (no masking pass of the
columns past each row's end: that only flatters the peer). Engines chunk the peer's rows when the
buffer does not fit; on the H200 it fits, so the peer runs unchunked, its fastest form.

Before timing, sampled rows of our top-k are checked against a float reference of the logits:
the reference scores at our winners equal the reference's own top-k scores (sets equal up to
ties within the float tolerance; the count of differing entries is reported). The logits and
top-k columns split our time: one batch of N rows scored, then selected, scaled to all rows."""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x import indexer as ix  # noqa: E402
from b12x.indexer_reference import quantize_q  # noqa: E402
from benchmarks.peers import deepgemm  # noqa: E402
from benchmarks.roofline import run_info  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402

H = 64
K = 2048
SCRATCH_BUDGET = 512 << 20     # the indexer workspace an engine gives (the figure)
DEFAULT_CASES = "4096x32768x1,4096x163840x1,4096x1048576x4"


def make_case(rows: int, ctx: int, c: int, g: torch.Generator) -> dict:
    n = ctx // c
    kv = quantize_q(torch.randn(n, 128, device="cuda", generator=g))
    sc = torch.rand(n, device="cuda", generator=g) + 0.1
    q = quantize_q(torch.randn(rows, H, 128, device="cuda", generator=g))
    w = torch.randn(rows, H, device="cuda", generator=g) * H ** -0.5
    tok = torch.arange(ctx - rows, ctx, device="cuda", dtype=torch.int64)
    ends = ((tok + 1) // c).to(torch.int32).contiguous()
    starts = torch.zeros(rows, dtype=torch.int32, device="cuda")
    return dict(kv=kv, sc=sc, q=q, w=w, starts=starts, ends=ends, n=n)


def reference_check(case: dict, idx: torch.Tensor, rows: list[int]) -> dict:
    """Reference scores of our winners vs the reference's own top-k, on sampled rows."""
    kvf = case["kv"].float()
    worst, differing = 0.0, 0
    for r in rows:
        e = int(case["ends"][r])
        s = torch.einsum("hd,td->ht", case["q"][r].float(), kvf[:e])
        ref = (s.relu() * case["w"][r][:, None]).sum(0) * case["sc"][:e]
        got = idx[r][idx[r] >= 0].long()
        want = torch.topk(ref, min(K, e)).indices
        assert got.numel() == want.numel() == len(set(got.tolist())), \
            f"row {r}: {got.numel()} winners, want {want.numel()}"
        gv, wv = ref[got].sort(descending=True).values, ref[want].sort(descending=True).values
        scale = float(wv.abs().max().clamp(min=1e-30))
        worst = max(worst, float((gv - wv).abs().max()) / scale)
        differing += len(set(got.tolist()) ^ set(want.tolist())) // 2
    assert worst < 1e-4, f"top-k scores differ from the reference by {worst:.2e} of the row's scale"
    return {"checked_rows": len(rows), "max_rel_score_diff": worst, "tie_swaps": differing}


def ours_times(sets: list, rows: int, n: int, grouped: bool, args) -> dict:
    """run_index_topk in row batches within the scratch budget: checked on sampled rows, timed, and
    where its time goes (one batch of N rows, the last and widest, scored, then selected, by a
    plan that holds them all, scaled to the call's rows)."""
    caps = ix.Caps(num_heads=H, topk=K, mode="contiguous", max_rows=rows, max_width=n, group_select=grouped)
    caps = replace(caps, logits_rows=ix.logits_rows_within(caps, args.scratch_mib << 20)
                   if args.budget_mib is None else ix.logits_rows_for(args.budget_mib << 20, n, rows))
    p = ix.plan(caps)
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    outs = [torch.empty(rows, K, dtype=torch.int32, device="cuda") for _ in sets]
    binds = [p.bind(scratch, q=s["q"], weights=s["w"], lengths=s["ends"], starts=s["starts"], width=n,
                    indices=o) for s, o in zip(sets, outs)]
    batch = binds[0].overlap_batch or binds[0].row_batch     # the rows of one batch as run_index_topk runs them
    r = {"logits_rows": caps.logits_rows, "batch_rows": batch, "overlapped": bool(binds[0].overlap_batch),
         "scratch_mib": p.scratch_bytes() / 2 ** 20}
    outs[0].fill_(-7)
    ix.run_index_topk(binds[0], kv_cache=(sets[0]["kv"], sets[0]["sc"]))
    torch.cuda.synchronize()
    r.update(reference_check(sets[0], outs[0], [0, 1, rows // 3, rows // 2, rows - 2, rows - 1]))
    r["ours_us"] = time_rotated([lambda b=b, s=s: ix.run_index_topk(b, kv_cache=(s["kv"], s["sc"]))
                                 for b, s in zip(binds, sets)], replays=args.replays)
    del binds, scratch
    nb = batch or rows
    pb = ix.plan(ix.Caps(num_heads=H, topk=K, mode="contiguous", max_rows=nb, max_width=n, group_select=grouped))
    sb = torch.empty(pb.scratch_bytes(), dtype=torch.uint8, device="cuda")
    bb = [pb.bind(sb, q=s["q"][-nb:], weights=s["w"][-nb:], lengths=s["ends"][-nb:], starts=s["starts"][-nb:],
                  width=n) for s in sets]
    r["ours_logits_us"] = time_rotated([lambda b=b, s=s: ix.run_logits(b, kv_cache=(s["kv"], s["sc"]))
                                        for b, s in zip(bb, sets)], replays=args.replays) * rows / nb
    r["ours_topk_us"] = time_rotated([lambda b=b: ix.run_topk(b) for b in bb], replays=args.replays) * rows / nb
    return r


def peer_times(sets: list, rows: int, n: int, replays: int) -> dict:
    """DeepGEMM fp8_fp4_mqa_logits (unchunked) + torch.topk on the raw buffer, once per case."""
    r = {"peer_us": None, "peer_logits_us": None, "peer_bytes_mib": None}
    if deepgemm.available():
        try:
            dg = deepgemm._dg

            def peer_logits(s):
                return dg.fp8_fp4_mqa_logits((s["q"], None), (s["kv"], s["sc"]), s["w"], s["starts"], s["ends"], n)

            r["peer_bytes_mib"] = rows * n * 4 / 2 ** 20
            r["peer_logits_us"] = time_rotated([lambda s=s: peer_logits(s) for s in sets], replays=replays)
            r["peer_us"] = time_rotated([lambda s=s: torch.topk(peer_logits(s), K, dim=-1) for s in sets],
                                        replays=replays)
        except Exception as e:  # report, keep going
            r["peer_error"] = f"{type(e).__name__}: {e}"
    torch.cuda.empty_cache()
    return r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--cases", default=DEFAULT_CASES, help="rows x context tokens x c, comma-separated")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--scratch-mib", type=int, default=SCRATCH_BUDGET >> 20, help="our whole scratch's budget")
    ap.add_argument("--budget-mib", type=int, default=None,
                    help="a budget of the logits region alone instead (ix.logits_rows_for)")
    ap.add_argument("--group-select", choices=("off", "on", "both"), default="off",
                    help="ours with Caps.group_select (the grouped top-k); both: each case twice, same process")
    args = ap.parse_args()
    variants = {"off": (False,), "on": (True,), "both": (False, True)}[args.group_select]
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}  deep_gemm: {deepgemm.unavailable_reason() or deepgemm.version()}")
    results = []
    info = run_info(torch.cuda.get_device_name(), torch=torch.__version__, deep_gemm=deepgemm.version())

    def save():  # after every row: a bench stopped at its time limit keeps the rows it has
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**info, "rows": results}, f, indent=1)

    for spec in args.cases.split(","):
        rows, ctx, c = (int(x) for x in spec.split("x"))
        sets = [make_case(rows, ctx, c, g) for _ in range(2)]      # one set of inputs for every variant
        n = sets[0]["n"]
        peer = peer_times(sets, rows, n, args.replays)
        for grouped in variants:
            routed = grouped and ix.plan(ix.Caps(num_heads=H, topk=K, mode="contiguous", max_rows=rows, max_width=n,
                                                 group_select=True)).group_route(n)
            if grouped and not routed:      # rows no wider than one CTA's: the grouped plan runs the same route
                print(f"{spec}: group_select does not apply at width {n}; skipped", flush=True)
                continue
            r = {"rows": rows, "ctx": ctx, "c": c, "width": n, "group_select": grouped, **peer}
            try:
                r.update(ours_times(sets, rows, n, grouped, args))
            except Exception as e:  # report, keep the other variants and cases
                r.update(ours_us=None, ours_error=f"{type(e).__name__}: {e}")
            r["ratio"] = r["ours_us"] / r["peer_us"] if r["ours_us"] and r["peer_us"] else None
            results.append(r)
            print(json.dumps(r), flush=True)
            save()
        del sets
        torch.cuda.empty_cache()
    hdr = (f"{'rows':>5} {'ctx':>8} {'c':>3} {'width':>7} {'grp':>3} | {'N':>4} {'scratch MiB':>11} {'ours us':>9} "
           f"{'logits':>8} {'top-k':>7} | "
           f"{'DG logits':>9} {'DG+topk':>9} {'DG MiB':>7} | {'ours/peer':>9}")
    print(f"\nindexer prefill, H={H}, K={K}, contiguous fp8 K; ours: row batches of N rows in scratch")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        na = f"{'n/a':>9}"
        if r["ours_us"] is None:
            print(f"{r['rows']:>5} {r['ctx']:>8} {r['c']:>3} {r['width']:>7} {'on' if r['group_select'] else 'off':>3} | "
                  f"error: {r['ours_error']}")
            continue
        pl = f"{r['peer_logits_us']:9.0f}" if r["peer_logits_us"] else na
        pu = f"{r['peer_us']:9.0f}" if r["peer_us"] else na
        pm = f"{r['peer_bytes_mib']:7.0f}" if r["peer_bytes_mib"] else f"{'n/a':>7}"
        ra = f"{r['ratio']:9.2f}" if r["ratio"] else na
        print(f"{r['rows']:>5} {r['ctx']:>8} {r['c']:>3} {r['width']:>7} {'on' if r['group_select'] else 'off':>3} | "
              f"{r['batch_rows'] or r['logits_rows']:>4} "
              f"{r['scratch_mib']:11.0f} {r['ours_us']:9.0f} {r['ours_logits_us']:8.0f} {r['ours_topk_us']:7.0f} | "
              f"{pl} {pu} {pm} | {ra}")
    save()
    return 0 if all(r["ours_us"] is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
