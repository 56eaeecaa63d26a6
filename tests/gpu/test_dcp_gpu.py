"""DCP merge with the generated kernels on the GPU, against the CPU path of the same module."""
import math
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from b12x import dcp
from b12x.metadata import decode_active_width

pytestmark = pytest.mark.gpu
K = 2048


@pytest.mark.parametrize("world,interleave,length", [(1, 1, 5000), (2, 1, 9000), (2, 16, 3000), (4, 16, 1000)])
def test_merge_kernels_match_cpu_path(world, interleave, length, monkeypatch):
    rows = 5
    full = torch.randperm(rows * length, generator=torch.Generator().manual_seed(world * 31 + interleave))
    full = full.float().view(rows, length)  # one global row set, sharded consistently over the ranks
    locals_ = [_local_from(full, world, r, interleave) for r in range(world)]
    caps = dcp.DcpCaps(topk=K, world=world, interleave=interleave, max_rows=8)
    pc = dcp.plan(caps, device="cpu")  # the torch path of the same module, for the other ranks' sends
    sends = []
    for r, (ids, sc) in enumerate(locals_):
        g, gs = torch.empty_like(ids), torch.empty_like(sc)
        dcp.convert_to_global(pc, local_ids=ids, local_scores=sc, out_ids=g, out_scores=gs, rank=r)
        sends.append(torch.cat([g, gs.view(torch.int32)], dim=1))  # the packed (ids | scores) row layout

    def fake_all_gather(out, inp, group=None):  # stands in for the collective on one GPU
        out.copy_(torch.cat([x.reshape(-1) for x in sends]).to(out.device))

    monkeypatch.setattr(dcp, "_all_gather_into", fake_all_gather)
    p = dcp.plan(caps)
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    ids, sc = locals_[0]
    out = torch.full((rows, K), 7, dtype=torch.int32, device="cuda")
    out_s = torch.full((rows, K), float("nan"), device="cuda")
    dcp.merge_topk(p, scratch=scratch, local_ids=ids.cuda(), local_scores=sc.cuda(), out_ids=out, out_scores=out_s,
                   rank=0)
    want = torch.topk(full, min(K, length), dim=-1).indices
    for r in range(rows):
        got = out[r].cpu()
        assert set(got[got >= 0].tolist()) == set(want[r].tolist())
        # winners come in candidate order: -inf winners are -1 wherever they sit
        assert int((got == -1).sum()) == K - min(K, length)
        assert torch.equal(got == -1, out_s[r].cpu() == -math.inf)
    # attention side on the GPU equals the CPU path
    for r in range(world):
        loc, lens = torch.empty_like(out), torch.empty(rows, dtype=torch.int32, device="cuda")
        dcp.filter_local(p, global_ids=out, out_local=loc, lengths=lens, rank=r)
        loc_c, lens_c = torch.empty(rows, K, dtype=torch.int32), torch.empty(rows, dtype=torch.int32)
        dcp.filter_local(pc, global_ids=out.cpu(), out_local=loc_c, lengths=lens_c, rank=r)
        assert torch.equal(loc.cpu(), loc_c) and torch.equal(lens.cpu(), lens_c)


def _local_from(full, world, rank, interleave):
    return dcp.shard_topk_reference(full, world=world, rank=rank, interleave=interleave, k=K)


def test_no_host_sync_in_metadata_and_merge():
    p = dcp.plan(dcp.DcpCaps(topk=K, world=1, max_rows=8))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    ids = torch.randint(0, 50000, (8, K), dtype=torch.int32, device="cuda")
    sc = torch.randn(8, K, device="cuda")
    out = torch.empty_like(ids)
    width = torch.zeros(1, dtype=torch.int32, device="cuda")
    shadow = torch.randint(1, 9000, (8,), dtype=torch.int32)
    dcp.merge_topk(p, scratch=scratch, local_ids=ids, local_scores=sc, out_ids=out, rank=0)  # module loads
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        decode_active_width(width, max_seq_len=9000, compress_ratio=4, seq_lens_cpu=shadow)
        decode_active_width(width, max_seq_len=9000, compress_ratio=4, seq_lens_cpu=None)
        dcp.merge_topk(p, scratch=scratch, local_ids=ids, local_scores=sc, out_ids=out, rank=0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert int(width) == -(-9000 // 4)


def _nccl_worker(rank, world, init, out_dir):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        full = torch.randperm(4 * 20000, generator=torch.Generator().manual_seed(5)).float().view(4, 20000)
        ids, sc = _local_from(full, world, rank, 16)
        p = dcp.plan(dcp.DcpCaps(topk=K, world=world, interleave=16, max_rows=8))
        scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
        out = torch.empty(4, K, dtype=torch.int32, device="cuda")
        dcp.merge_topk(p, scratch=scratch, local_ids=ids.cuda(), local_scores=sc.cuda(), out_ids=out, rank=rank)
        torch.save(out.cpu(), os.path.join(out_dir, f"r{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_nccl_merge_two_gpus():
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=_nccl_worker, args=(r, 2, os.path.join(d, "init"), d)) for r in range(2)]
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join(180)
        assert all(pr.exitcode == 0 for pr in procs)
        a, b = torch.load(os.path.join(d, "r0.pt")), torch.load(os.path.join(d, "r1.pt"))
    assert torch.equal(a, b)
    full = torch.randperm(4 * 20000, generator=torch.Generator().manual_seed(5)).float().view(4, 20000)
    want = torch.topk(full, K, dim=-1).indices
    for r in range(4):
        assert set(a[r].tolist()) == set(want[r].tolist())


def test_merge_is_graph_capturable_without_allocation():
    rows = 8
    p = dcp.plan(dcp.DcpCaps(topk=K, world=1, max_rows=rows))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    full = torch.randperm(rows * 30000, generator=torch.Generator().manual_seed(7)).float().view(rows, 30000)
    ids, sc = _local_from(full, 1, 0, 1)
    ids, sc = ids.cuda(), sc.cuda()
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    out_s = torch.empty(rows, K, device="cuda")
    args = dict(scratch=scratch, local_ids=ids, local_scores=sc, out_ids=out, out_scores=out_s, rank=0)
    dcp.merge_topk(p, **args)  # lazy module loads before capture
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    dcp.merge_topk(p, **args)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, "merge_topk allocated"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dcp.merge_topk(p, **args)
    fresh = torch.randperm(rows * 30000, generator=torch.Generator().manual_seed(8)).float().view(rows, 30000)
    ids2, sc2 = _local_from(fresh, 1, 0, 1)
    ids.copy_(ids2)
    sc.copy_(sc2)
    out.fill_(7)
    allocated = torch.cuda.memory_stats()["allocation.all.allocated"]
    graph.replay()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocated
    want = torch.topk(fresh, K, dim=-1).indices
    for r in range(rows):
        assert set(out[r].cpu().tolist()) == set(want[r].tolist())


@pytest.mark.parametrize("rows_per_req", (1, 3))
def test_filter_local_drops_ids_past_the_block_table(rows_per_req):
    """Owned ids whose local position is past the block table's pages (and negative ids of
    every kind) are dropped like -1 by the kernel, as by the CPU path; no fault, and a normal
    call afterwards still works."""
    world, interleave, rows, pages = 2, 16, 6, 5
    g = torch.Generator().manual_seed(rows_per_req)
    ids = torch.randint(0, world * pages * 64, (rows, K), generator=g, dtype=torch.int32)
    wild = torch.tensor([world * pages * 64, world * pages * 64 * 50, 2**31 - 1, -2**31, -2, -100, -1],
                        dtype=torch.int32)
    pos = torch.rand(rows, K, generator=g) < 0.3
    ids[pos] = wild[torch.randint(0, len(wild), (int(pos.sum()),), generator=g)]
    bt = torch.randint(0, 1000, (-(-rows // rows_per_req), pages), generator=g, dtype=torch.int32)
    lens_in = torch.randint(0, K, (rows,), generator=g, dtype=torch.int32)
    p = dcp.plan(dcp.DcpCaps(topk=K, world=world, interleave=interleave, max_rows=8))
    pc = dcp.plan(dcp.DcpCaps(topk=K, world=world, interleave=interleave, max_rows=8), device="cpu")
    for r in range(world):
        loc, lens = torch.empty(rows, K, dtype=torch.int32, device="cuda"), torch.empty(rows, dtype=torch.int32,
                                                                                      device="cuda")
        dcp.filter_local(p, global_ids=ids.cuda(), out_local=loc, lengths=lens, rank=r, block_table=bt.cuda(),
                         local_lens=lens_in.cuda(), rows_per_req=rows_per_req)
        torch.cuda.synchronize()
        loc_c, lens_c = torch.empty(rows, K, dtype=torch.int32), torch.empty(rows, dtype=torch.int32)
        dcp.filter_local(pc, global_ids=ids, out_local=loc_c, lengths=lens_c, rank=r, block_table=bt,
                         local_lens=lens_in, rows_per_req=rows_per_req)
        assert torch.equal(loc.cpu(), loc_c) and torch.equal(lens.cpu(), lens_c)
        kept = loc_c[loc_c >= 0]
        assert kept.numel() and bool((kept < 1000 * 64).all())   # only table pages, never past them
    ok = torch.where((ids >= 0) & (ids < world * pages * 64), ids, -1).cuda()
    loc = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    lens = torch.empty(rows, dtype=torch.int32, device="cuda")
    dcp.filter_local(p, global_ids=ok, out_local=loc, lengths=lens, rank=0, block_table=bt.cuda(),
                     rows_per_req=rows_per_req)
    torch.cuda.synchronize()
