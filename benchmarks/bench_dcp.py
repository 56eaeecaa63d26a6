"""DCP global top-k merge: the local part on one GPU (ours vs the same steps in torch ops), and the
whole merge with its NCCL all-gather on two GPUs.

    python benchmarks/bench_dcp.py [--json out.json]        # local part (+ 2-GPU merge if 2 GPUs)

K = 2048, W = 2, rows T in {1, 8, 64, 512}. Timing: CUDA-graph replays over rotated input sets
(local part), CUDA events around eager merges (NCCL part), medians."""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x import dcp  # noqa: E402
from benchmarks.roofline import HBM_BYTES_PER_S, dcp_local_bytes, run_info  # noqa: E402
from benchmarks.timing import time_rotated  # noqa: E402

K, W = 2048, 2
ROWS = (1, 8, 64, 512)
SETS = 8


def _inputs(rows: int, g: torch.Generator):
    ids = torch.randint(0, 1 << 20, (rows, K), dtype=torch.int32, device="cuda", generator=g)
    ids[:, -100:] = -1
    scores = torch.randn(rows, K, device="cuda", generator=g).masked_fill(ids < 0, -math.inf)
    return ids, scores


def torch_local_merge(ids, scores, gathered_ids, gathered_scores, rank):
    """The same steps with torch ops: convert, (gathered), top-k over W*K, gather ids, mask."""
    g = dcp.local_to_global(ids, world=W, rank=rank, interleave=1)
    s = scores.masked_fill(ids < 0, -math.inf)
    gathered_ids[rank].copy_(g)
    gathered_scores[rank].copy_(s)
    rows = ids.shape[0]
    cand = gathered_scores.transpose(0, 1).reshape(rows, W * K)
    vals, pos = torch.topk(cand, K, dim=-1)
    out = gathered_ids.transpose(0, 1).reshape(rows, W * K).gather(1, pos)
    return out.masked_fill(vals == -math.inf, -1)


def bench_local() -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    real = dcp._all_gather_into
    res = []
    for rows in ROWS:
        p = dcp.plan(dcp.DcpCaps(topk=K, world=W, interleave=1, max_rows=rows))
        scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
        sets = [_inputs(rows, g) for _ in range(SETS)]
        outs = [torch.empty(rows, K, dtype=torch.int32, device="cuda") for _ in sets]

        # One GPU: the all-gather is replaced by a copy of this rank's packed rows into both slots.
        def local_gather(out, inp, group=None):
            out.view(W, -1).copy_(inp.view(1, -1).expand(W, -1))

        dcp._all_gather_into = local_gather
        try:
            ours = time_rotated([lambda s=s, o=o: dcp.merge_topk(p, scratch=scratch, local_ids=s[0],
                                                                 local_scores=s[1], out_ids=o, rank=0)
                                 for s, o in zip(sets, outs)])
        finally:
            dcp._all_gather_into = real
        gi = torch.empty(W, rows, K, dtype=torch.int32, device="cuda")
        gs = torch.empty(W, rows, K, device="cuda")
        gi[1].copy_(sets[0][0])
        gs[1].copy_(sets[0][1])
        ref = time_rotated([lambda s=s: torch_local_merge(s[0], s[1], gi, gs, 0) for s in sets])
        r = {"rows": rows, "ours_local_us": ours, "torch_local_us": ref, "speedup": ref / ours,
             "roofline_share": dcp_local_bytes(rows, K, W) / HBM_BYTES_PER_S * 1e6 / ours}
        print(json.dumps(r), flush=True)
        res.append(r)
    return res


def _nccl_worker(rank: int, init: str, out: str) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=W)
    g = torch.Generator(device="cuda").manual_seed(rank)
    res = []
    for rows in ROWS:
        p = dcp.plan(dcp.DcpCaps(topk=K, world=W, interleave=1, max_rows=rows))
        scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
        ids, scores = _inputs(rows, g)
        o = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        for _ in range(5):
            dcp.merge_topk(p, scratch=scratch, local_ids=ids, local_scores=scores, out_ids=o, rank=rank)
        torch.cuda.synchronize()
        dist.barrier()
        times = []
        for _ in range(50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dcp.merge_topk(p, scratch=scratch, local_ids=ids, local_scores=scores, out_ids=o, rank=rank)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        res.append({"rows": rows, "merge_us": statistics.median(times)})
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def bench_nccl() -> list[dict] | None:
    if torch.cuda.device_count() < 2:
        return None
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        procs = [ctx.Process(target=_nccl_worker, args=(r, os.path.join(d, "init"), out)) for r in range(W)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
        if any(p.exitcode != 0 for p in procs):
            return None
        with open(out) as f:
            return json.load(f)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    local = bench_local()
    nccl = bench_nccl()
    print(f"\nDCP global top-k merge, K={K}, W={W}")
    print(f"{'rows':>5} | {'ours local us':>13} {'torch local us':>14} {'speedup':>7} | {'2-GPU merge us (NCCL)':>21}")
    for i, r in enumerate(local):
        m = f"{nccl[i]['merge_us']:21.1f}" if nccl else f"{'n/a (one GPU)':>21}"
        print(f"{r['rows']:>5} | {r['ours_local_us']:13.1f} {r['torch_local_us']:14.1f} {r['speedup']:7.2f} | {m}")
    if args.json:
        with open(args.json, "w") as f:
            info = run_info(torch.cuda.get_device_name(), torch=torch.__version__, gpus=torch.cuda.device_count(),
                            k=K, world=W)
            json.dump({**info, "local": local, "nccl": nccl}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
