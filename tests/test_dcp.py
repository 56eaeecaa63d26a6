"""DCP global top-k on CPU over gloo: W ranks in spawned processes, top-k by torch on CPU."""
import math
import multiprocessing as mp
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from b12x import dcp
from b12x.errors import InputError

K = 128


def _worker(rank, world, interleave, init_file, lengths, seed, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(seed)
        results = {}
        p = dcp.plan(dcp.DcpCaps(topk=K, world=world, interleave=interleave, max_rows=8), device="cpu")
        scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
        for length in lengths:
            rows = 3
            full = torch.randperm(rows * max(length, 1), generator=g).float().view(rows, -1)[:, :length]  # distinct
            ids, scores = dcp.shard_topk_reference(full, world=world, rank=rank, interleave=interleave, k=K)
            out = torch.empty(rows, K, dtype=torch.int32)
            out_s = torch.empty(rows, K)
            dcp.merge_topk(p, scratch=scratch, local_ids=ids, local_scores=scores, out_ids=out, out_scores=out_s,
                           rank=rank)
            conv = torch.empty_like(ids)
            conv_s = torch.empty_like(scores)
            dcp.convert_to_global(p, local_ids=ids, local_scores=scores, out_ids=conv, out_scores=conv_s, rank=rank)
            local = torch.empty_like(out)
            lens = torch.empty(rows, dtype=torch.int32)
            dcp.filter_local(p, global_ids=out, out_local=local, lengths=lens, rank=rank)
            results[length] = dict(full=full, out=out, out_s=out_s, conv=conv, local=local, lens=lens)
        # an empty chunk: zero query rows still takes part in the collective
        empty = torch.empty(0, K, dtype=torch.int32)
        dcp.merge_topk(p, scratch=scratch, local_ids=empty, local_scores=torch.empty(0, K), out_ids=empty.clone(),
                       rank=rank)
        # rank-consistent prewarm: dedup rows, barrier after each pass
        ran = dcp.prewarm_dcp_merge(p, scratch=scratch, rank=rank, max_rows=4, key=("test", world, interleave))
        again = dcp.prewarm_dcp_merge(p, scratch=scratch, rank=rank, max_rows=4, key=("test", world, interleave))
        results["prewarm"] = (ran, again)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _run_ranks(world, interleave, lengths, seed=0, timeout=120):
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        procs = [ctx.Process(target=_worker, args=(r, world, interleave, init, lengths, seed, d)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.kill()
        assert not hung, "a rank hung: the ranks did not issue the same collectives"
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        return [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(world)]


@pytest.mark.parametrize("world,interleave", [(2, 1), (2, 16), (4, 1), (4, 16)])
def test_merge_is_exact_and_identical_on_every_rank(world, interleave):
    # 5000: every rank has plenty; 100 < K: -inf winners become -1; 16: with I=16 only rank 0 has KV
    lengths = (5000, 100, 16)
    res = _run_ranks(world, interleave, lengths, seed=world * 100 + interleave)
    for length in lengths:
        full = res[0][length]["full"]
        want_k = min(K, length)
        ref = torch.topk(full, want_k, dim=-1).indices
        for r in range(world):
            out = res[r][length]["out"]
            assert torch.equal(out, res[0][length]["out"]), "ranks disagree"
            assert torch.equal(res[r][length]["out_s"], res[0][length]["out_s"])
        out = res[0][length]["out"]
        for row in range(full.shape[0]):
            got = out[row]
            assert set(got[got >= 0].tolist()) == set(ref[row].tolist())
            assert torch.all(got[want_k:] == -1)  # -inf winners come back as -1
            scores = res[0][length]["out_s"][row]
            assert torch.all(scores[want_k:] == -math.inf)
        # convert-only: the ranks' outputs together are exactly the union of the local top-k
        for row in range(full.shape[0]):
            got, want = set(), set()
            for r in range(world):
                conv = res[r][length]["conv"][row]
                got |= set(conv[conv >= 0].tolist())
                ids, _ = dcp.shard_topk_reference(full, world=world, rank=r, interleave=interleave, k=K)
                g = dcp.local_to_global(ids[row], world=world, rank=r, interleave=interleave)
                want |= set(g[g >= 0].tolist())
            assert got == want
        # filter: each rank keeps exactly what it owns, in order, as local positions
        for r in range(world):
            local, lens = res[r][length]["local"], res[r][length]["lens"]
            for row in range(full.shape[0]):
                g = out[row][out[row] >= 0]
                mine = g[dcp.owner_of(g, world=world, interleave=interleave) == r]
                want = dcp.global_to_local(mine, world=world, interleave=interleave)
                n = int(lens[row])
                assert n == len(want)
                assert torch.equal(local[row, :n], want.to(torch.int32))
                assert torch.all(local[row, n:] == -1)
    for r in range(world):
        ran, again = res[r]["prewarm"]
        assert ran == [1, 2, 4] and again == []


def test_filter_with_block_table_and_local_lens():
    p = dcp.plan(dcp.DcpCaps(topk=128, world=2, interleave=1, max_rows=4), device="cpu")
    g = torch.tensor([[0, 1, 2, 3, 5, 7, -1] + [-1] * 121] * 2, dtype=torch.int32)
    bt = torch.tensor([[3, 9], [4, 8]], dtype=torch.int32)
    out = torch.empty_like(g)
    lens = torch.empty(2, dtype=torch.int32)
    dcp.filter_local(p, global_ids=g, out_local=out, lengths=lens, rank=1, block_table=bt,
                     local_lens=torch.tensor([10, 2], dtype=torch.int32))
    # rank 1 owns odd ids 1, 3, 5, 7 -> local 0, 1, 2, 3 -> slots in block 3 (row 0) / 4 (row 1)
    assert out[0, :4].tolist() == [192, 193, 194, 195] and out[1, :4].tolist() == [256, 257, 258, 259]
    assert torch.all(out[:, 4:] == -1)
    assert lens.tolist() == [4, 2]


def test_missing_or_bad_buffers_are_clear_errors():
    p = dcp.plan(dcp.DcpCaps(topk=128, world=2, max_rows=4), device="cpu")
    ids = torch.zeros(2, 128, dtype=torch.int32)
    out = torch.empty_like(ids)
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
    with pytest.raises(InputError, match="topk_scores_buffer: expected an fp32 \\[rows, 128\\] scores buffer for DCP global top-k merge with world=2, got None"):
        dcp.merge_topk(p, scratch=scratch, local_ids=ids, local_scores=None, out_ids=out, rank=0)
    with pytest.raises(InputError, match="topk_scores_buffer: .*convert-only mode"):
        dcp.convert_to_global(p, local_ids=ids, local_scores=None, out_ids=out, out_scores=None, rank=0)
    with pytest.raises(InputError, match="local_scores: expected a contiguous tensor"):
        dcp.merge_topk(p, scratch=scratch, local_ids=ids, local_scores=torch.zeros(128, 2).t(), out_ids=out, rank=0)
    with pytest.raises(InputError, match="DcpCaps.topk: expected a multiple of 128 in \\[128, 2048\\], got 100"):
        dcp.plan(dcp.DcpCaps(topk=100, world=2), device="cpu")
    with pytest.raises(InputError, match="k: expected a multiple of 128"):
        dcp.allocate_topk_buffers(16, 1000, dcp_world_size=2, device="cpu")


def test_buffers_helper_gives_scores_under_dcp():
    b = dcp.allocate_topk_buffers(8, 2048, dcp_world_size=2, device="cpu")
    assert b.scores is not None and b.scores.shape == (8, 2048) and b.indices.dtype == torch.int32
    assert dcp.allocate_topk_buffers(8, 2048, dcp_world_size=1, device="cpu").scores is None


def test_prewarm_memoises_only_after_success(monkeypatch):
    p = dcp.plan(dcp.DcpCaps(topk=128, world=1, max_rows=8), device="cpu")
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
    calls, barriers = [], []
    real = dcp.merge_topk

    def flaky(*a, **kw):
        calls.append(kw["local_ids"].shape[0])
        if len(calls) == 2:
            raise RuntimeError("boom")
        return real(*a, **kw)

    monkeypatch.setattr(dcp, "merge_topk", flaky)
    monkeypatch.setattr(dcp, "sync_dcp_warmup", lambda world, group=None: barriers.append(world))
    with pytest.raises(RuntimeError, match="boom"):
        dcp.prewarm_dcp_merge(p, scratch=scratch, rank=0, max_rows=8, key="memo-test")
    assert calls == [1, 2] and barriers == [1]
    assert dcp.prewarm_dcp_merge(p, scratch=scratch, rank=0, max_rows=8, rows=(8, 1, 2, 4, 4),
                                 key="memo-test") == [1, 2, 4, 8]
    assert barriers == [1, 1, 1, 1, 1]  # one barrier after every pass
    assert dcp.prewarm_dcp_merge(p, scratch=scratch, rank=0, max_rows=8, key="memo-test") == []


def test_sync_barrier_policy(monkeypatch):
    assert dcp.sync_dcp_warmup(1) is False                # W = 1: no-op
    assert dcp.sync_dcp_warmup(2) is False                # group never initialised: tolerated
    monkeypatch.setattr(dist, "is_initialized", lambda: True)

    def broken(group=None):
        raise RuntimeError("barrier timed out")

    monkeypatch.setattr(dist, "barrier", broken)
    with pytest.raises(RuntimeError, match="barrier timed out"):  # barrier failures propagate
        dcp.sync_dcp_warmup(2)


@pytest.mark.parametrize("rank", [5, 2, -1, True, 1.0])
def test_every_entry_rejects_a_rank_outside_the_world(rank):
    p = dcp.plan(dcp.DcpCaps(topk=K, world=2, max_rows=4), device="cpu")
    ids = torch.arange(2 * K, dtype=torch.int32).view(2, K)
    scores = torch.randn(2, K)
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
    match = rf"^rank: expected an int in \[0, 2\) \(DcpCaps.world=2\), got {rank!r}$"
    with pytest.raises(InputError, match=match):
        dcp.convert_to_global(p, local_ids=ids, local_scores=scores, out_ids=torch.empty_like(ids),
                              out_scores=torch.empty_like(scores), rank=rank)
    with pytest.raises(InputError, match=match):
        dcp.merge_topk(p, scratch=scratch, local_ids=ids, local_scores=scores, out_ids=torch.empty_like(ids),
                       rank=rank)
    with pytest.raises(InputError, match=match):
        dcp.filter_local(p, global_ids=ids, out_local=torch.empty_like(ids), lengths=torch.empty(2, dtype=torch.int32),
                         rank=rank)
    with pytest.raises(InputError, match=match):
        dcp.prewarm_dcp_merge(p, scratch=scratch, rank=rank, max_rows=4, key=("bad-rank", repr(rank)))


def test_buffers_on_another_device_than_the_plan_name_local_ids():
    """local_ids on the CPU beside CUDA buffers, for a CUDA plan: the error is about local_ids
    (checked first against the plan), not out_ids. Fake CUDA tensors: only metadata is read."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    p = dcp.plan(dcp.DcpCaps(topk=K, world=1, max_rows=4, arch="sm_90a", num_sms=132), device="cuda")
    with FakeTensorMode():
        out = torch.empty(2, K, dtype=torch.int32, device="cuda")
        lengths = torch.empty(2, dtype=torch.int32, device="cuda")
        scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    ids = torch.zeros(2, K, dtype=torch.int32)
    with pytest.raises(InputError, match=r"^local_ids: expected a cuda tensor \(the plan's\), got cpu"):
        dcp.merge_topk(p, scratch=scratch, local_ids=ids, local_scores=torch.zeros(2, K), out_ids=out, rank=0)
    with pytest.raises(InputError, match=r"^global_ids: expected a cuda tensor \(the plan's\), got cpu"):
        dcp.filter_local(p, global_ids=ids, out_local=out, lengths=lengths, rank=0)


def test_filter_drops_ids_past_the_block_table_like_minus_one():
    """With a block table of P pages, an owned id whose local position is >= P * 64 is neither
    kept nor counted (it would read past the table); ids that no rank could own (negative) too."""
    p = dcp.plan(dcp.DcpCaps(topk=128, world=2, interleave=1, max_rows=4), device="cpu")
    bt = torch.tensor([[3, 9], [4, 8]], dtype=torch.int32)         # 2 pages: local positions [0, 128)
    # rank 1 owns odd ids; local = g // 2: 255 -> 127 (last mapped), 257 -> 128 (past the table)
    row = [1, 257, 255, 2**31 - 1, -2**31, -2, 3, 2 * 64 * 50 + 1, -100]
    g = torch.tensor([row + [-1] * (128 - len(row))] * 2, dtype=torch.int32)
    out = torch.empty_like(g)
    lens = torch.empty(2, dtype=torch.int32)
    dcp.filter_local(p, global_ids=g, out_local=out, lengths=lens, rank=1, block_table=bt)
    # kept: 1 -> local 0, 255 -> local 127 (block 1, offset 63), 3 -> local 1
    assert out[0, :3].tolist() == [3 * 64 + 0, 9 * 64 + 63, 3 * 64 + 1]
    assert out[1, :3].tolist() == [4 * 64 + 0, 8 * 64 + 63, 4 * 64 + 1]
    assert torch.all(out[:, 3:] == -1) and lens.tolist() == [3, 3]
    with pytest.raises(InputError, match=r"block_table: expected at least 2 rows \(2 rows of global_ids / "
                                         r"rows_per_req=1\), got 1"):
        dcp.filter_local(p, global_ids=g, out_local=out, lengths=lens, rank=1, block_table=bt[:1])
    with pytest.raises(InputError, match=r"rows_per_req: expected an int >= 1, got 0"):
        dcp.filter_local(p, global_ids=g, out_local=out, lengths=lens, rank=1, block_table=bt, rows_per_req=0)


def _warning_worker(rank, world, init_file, out_dir):
    import warnings

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        p = dcp.plan(dcp.DcpCaps(topk=K, world=world, max_rows=4), device="cpu")
        scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
        ids = torch.arange(3 * K, dtype=torch.int32).view(3, K)
        scores = torch.randn(3, K, generator=torch.Generator().manual_seed(rank))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dcp.merge_topk(p, scratch=scratch, local_ids=ids, local_scores=scores, out_ids=torch.empty_like(ids),
                           rank=rank)
        torch.save([f"{w.category.__name__}: {w.message}" for w in caught], os.path.join(out_dir, f"w{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_merge_issues_no_deprecation_warning():
    """The all-gather goes through the non-deprecated API (torch 2.13 warns on every
    all_gather_into_tensor call)."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=_warning_worker, args=(r, 2, os.path.join(d, "init"), d)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        for p in procs:
            if p.is_alive():
                p.kill()
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        caught = [torch.load(os.path.join(d, f"w{r}.pt")) for r in range(2)]
    assert caught == [[], []]
