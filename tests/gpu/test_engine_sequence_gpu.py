"""The per-step sequence of a vLLM attention backend, wired as b12x.integration.vllm documents it:
decode_metadata -> SparseIndexer.topk (logits + top-k) -> dcp_global_topk (DCP merge, or
convert-only) -> filter_local, for compress ratios 1, 4 and 128, against the torch references.

The active width travels in one unit, entries of the (compressed) cache: the buffer
decode_metadata fills goes to topk(active_width=...) as it is. The contexts are long enough that a
second division by c (the old bug) would cut every row short.

Kernels come from B12X_CACHE_DIR (presets indexer-all and dcp-topk)."""
import math

import pytest
import torch
import torch.distributed as dist

from b12x import dcp
from b12x import indexer as ix
from b12x.indexer_reference import indexer_logits_paged_reference
from b12x.integration import vllm as adapter

from .indexer_cases import check_logits, check_selection, paged_inputs

pytestmark = pytest.mark.gpu
K = 2048
HEADS = 64
# compress ratio -> (graph-stable width in entries = ceil(max_model_len / c), entries of the rows)
SHAPES = {1: (32768, (23001, 1500, 17000, 20480)),
          4: (32768, (25000, 1500, 16500, 21111)),
          128: (8192, (7812, 1500, 2400, 6001))}


def token_lengths(entries, c: int, next_n: int) -> list[int]:
    """Token lengths of rows with these entry counts, never a multiple of c when c > 1; with MTP
    (next_n = 2) the second row of each request gets one token more (the same entries when c > 1)."""
    out = []
    for i, e in enumerate(entries):
        base = e * c + (c // 2 if c > 1 else 0)
        out.append(base + (i % next_n) if next_n > 1 else base)
    return out


def poisoned(n: int) -> torch.Tensor:
    return torch.full((n,), 0xFF, dtype=torch.uint8, device="cuda")      # NaN bytes


def own_logits(sparse_indexer, ws, q, w, bt, lengths, width):
    """The [rows, width] logits the indexer left in its scratch (bind only makes views)."""
    b = ix.bind(sparse_indexer.plan, scratch=ws, q=q, weights=w, lengths=lengths, block_table=bt, width=width)
    return b.logits.clone()


@pytest.mark.parametrize("next_n", (1, 2))
@pytest.mark.parametrize("c", (1, 4, 128))
def test_metadata_indexer_topk_single_rank(c, next_n):
    width, entries = SHAPES[c]
    rows = len(entries)
    lengths_l = token_lengths(entries, c, next_n)
    row_entries = [L // c for L in lengths_l]
    q, w, kv, bt, lengths = paged_inputs(lengths_l, heads=HEADS, next_n=next_n, c=c, width=width, seed=c * 10 + next_n)
    sparse = adapter.SparseIndexer(num_heads=HEADS, topk=K, max_rows=rows, max_width=width, compress_ratio=c)
    bufs = adapter.make_topk_buffers(rows, K, dcp_world_size=1, device="cuda")
    ws = poisoned(sparse.scratch_bytes())
    active = torch.zeros(1, dtype=torch.int32, device="cuda")     # the engine's persistent buffer
    shadow = torch.tensor(lengths_l, dtype=torch.int32)             # the runner's CPU shadow (tokens)
    max_seq_len = max(lengths_l) + 333                              # the metadata's upper bound (tokens)
    for authoritative in (True, False):
        act = adapter.decode_metadata(active, max_seq_len=max_seq_len, compress_ratio=c, seq_lens_cpu=shadow,
                                      authoritative=authoritative)
        want = max(row_entries) if authoritative else -(-max_seq_len // c)
        assert act == want and act < width
        bufs.indices.fill_(7)
        sparse.topk(q, w, kv, bt, lengths, scratch=ws, out=bufs, width=width, active_width=active)
        torch.cuda.synchronize()
        assert int(active) == act                                   # the buffer is read, never rescaled
        logits = own_logits(sparse, ws, q, w, bt, lengths, width)[:, :act]     # columns past act: not written
        ref = indexer_logits_paged_reference(q, w, kv, bt, lengths, width, compress_ratio=c, active_width=act)
        check_logits(logits, ref[:, :act])
        for r in range(rows):
            # the plan has no scores (no DCP): the indices alone, as exact sets on the kernel's logits
            check_selection(bufs.indices[r], logits[r, :row_entries[r]], K,
                            what=f"c={c} next_n={next_n} shadow={authoritative} row {r}")
        assert int(bufs.indices[0].max()) >= act // 2       # the far half of the longest row competes


def _shard(entries: int, world: int, rank: int, interleave: int) -> int:
    """Local entries of a row of `entries` global entries on `rank` (DESIGN's DCP positions)."""
    g = torch.arange(entries)
    return int(((g // interleave) % world == rank).sum())


@pytest.mark.parametrize("c,interleave", [(1, 1), (1, 64), (4, 1), (128, 1)])
def test_metadata_indexer_topk_dcp_merge_and_filter(c, interleave, monkeypatch):
    """DCP world 2 on one GPU: each rank's indexer scores its own shard (rank-local lengths and
    active width from the DCP-local shadow); convert-only gives each rank's top-k as global ids;
    the merge (its all-gather fed with both ranks' real send buffers) gives the exact global top-K,
    identical on both ranks; filter_local hands each rank its share as local positions."""
    world = 2
    width_g, entries_g = SHAPES[c]
    rows = len(entries_g)
    width = -(-width_g // world)                      # the rank-local graph-stable width
    ranks = []
    for rank in range(world):
        local_e = [_shard(e, world, rank, interleave) for e in entries_g]
        lengths_l = [e * c + c // 2 for e in local_e]                # tokens, never a multiple of c > 1
        q_w = paged_inputs(lengths_l, heads=HEADS, next_n=1, c=c, width=width, seed=1000 * c + interleave + rank)
        ranks.append(dict(local_e=local_e, lengths_l=lengths_l, inputs=q_w))
    # the query is replicated over the ranks: every rank scores the same q and weights
    q, w = ranks[0]["inputs"][0], ranks[0]["inputs"][1]
    global_shadow = torch.tensor([e * c + c // 2 for e in entries_g], dtype=torch.int32)

    merged_all, sends, own_all = [], [], []
    for rank in range(world):
        st = ranks[rank]
        _, _, kv, bt, lengths = st["inputs"]
        cfg = adapter.DcpConfig(world=world, rank=rank, interleave=interleave, global_topk=True)
        sparse = adapter.SparseIndexer(num_heads=HEADS, topk=K, max_rows=rows, max_width=width, compress_ratio=c,
                                       dcp=cfg)
        convert = adapter.SparseIndexer(num_heads=HEADS, topk=K, max_rows=rows, max_width=width,
                                        compress_ratio=c, dcp=adapter.DcpConfig(world=world, rank=rank,
                                                                                interleave=interleave,
                                                                                global_topk=False))
        bufs = adapter.make_topk_buffers(rows, K, dcp_world_size=world, device="cuda")
        ws = poisoned(max(sparse.scratch_bytes(), convert.scratch_bytes()))
        active = torch.zeros(1, dtype=torch.int32, device="cuda")
        act = adapter.decode_metadata(active, max_seq_len=int(global_shadow.max()), compress_ratio=c,
                                      seq_lens_cpu=global_shadow,
                                      dcp_local_seq_lens_cpu=torch.tensor(st["lengths_l"], dtype=torch.int32))
        assert act == max(st["local_e"]) and act < width
        sparse.topk(q, w, kv, bt, lengths, scratch=ws, out=bufs, width=width, active_width=active)
        torch.cuda.synchronize()
        logits = own_logits(sparse, ws, q, w, bt, lengths, width)[:, :act]
        ref = indexer_logits_paged_reference(q, w, kv, bt, lengths, width, compress_ratio=c, active_width=act)
        check_logits(logits, ref[:, :act])
        for r in range(rows):
            check_selection(bufs.indices[r], logits[r, :st["local_e"][r]], K, scores_row=bufs.scores[r],
                            what=f"rank {rank} local row {r}")
        # convert-only: this rank's local top-k as global ids, -1 kept with -inf
        conv = adapter.make_topk_buffers(rows, K, dcp_world_size=world, device="cuda")
        convert.dcp_global_topk(bufs, rows, scratch=ws, merged=conv)
        torch.cuda.synchronize()
        want = dcp.local_to_global(bufs.indices[:rows].cpu(), world=world, rank=rank, interleave=interleave)
        assert torch.equal(conv.indices[:rows].cpu(), want)
        assert torch.equal(conv.scores[:rows].cpu(), bufs.scores[:rows].cpu().masked_fill(want < 0, -math.inf))
        sends.append(torch.cat([conv.indices[:rows], conv.scores[:rows].view(torch.int32)], dim=1).contiguous())
        own_all.append(logits)
        ranks[rank].update(sparse=sparse, bufs=bufs, ws=ws)

    for rank in range(world):
        st = ranks[rank]

        def fake_all_gather(out, inp, group=None, rank=rank):     # the collective, on one GPU
            parts = [inp.reshape(-1) if i == rank else sends[i].reshape(-1) for i in range(world)]
            out.copy_(torch.cat(parts))

        monkeypatch.setattr(dist, "all_gather_into_tensor", fake_all_gather)
        merged = adapter.make_topk_buffers(rows, K, dcp_world_size=world, device="cuda")
        st["sparse"].dcp_global_topk(st["bufs"], rows, scratch=st["ws"], merged=merged)
        torch.cuda.synchronize()
        merged_all.append(merged)

    assert torch.equal(merged_all[0].indices[:rows], merged_all[1].indices[:rows]), "identical on every rank"
    assert torch.equal(merged_all[0].scores[:rows], merged_all[1].scores[:rows])
    out = merged_all[0]
    for r in range(rows):
        # the unsharded row, assembled from both ranks' logits at their global positions
        full = torch.full((entries_g[r],), float("-inf"), dtype=torch.float64)
        for rank in range(world):
            n = ranks[rank]["local_e"][r]
            g = dcp.local_to_global(torch.arange(n, dtype=torch.int32), world=world, rank=rank,
                                    interleave=interleave).long()
            full[g] = own_all[rank][r, :n].double().cpu()
        assert torch.isfinite(full).all()
        ids = out.indices[r].cpu()
        won = ids[ids >= 0]
        m = min(K, entries_g[r])
        assert won.numel() == m and int((ids == -1).sum()) == K - m
        packed = torch.full((K,), -1, dtype=torch.int32)       # winners first (any order), then -1
        packed[:m] = won
        check_selection(packed, full, K, what=f"c={c} I={interleave} merged row {r}")
        assert torch.equal(torch.isfinite(out.scores[r].cpu()), ids >= 0)

    # attention side: each rank keeps the merged ids it owns, as local positions, compacted
    for rank in range(world):
        st = ranks[rank]
        loc = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        lens = torch.empty(rows, dtype=torch.int32, device="cuda")
        dcp.filter_local(st["sparse"].dcp_plan, global_ids=out.indices[:rows].contiguous(), out_local=loc,
                         lengths=lens, rank=rank)
        torch.cuda.synchronize()
        for r in range(rows):
            g = out.indices[r].cpu()
            mine = g[(g >= 0) & (dcp.owner_of(g, world=world, interleave=interleave) == rank)]
            want = dcp.global_to_local(mine, world=world, interleave=interleave)
            n = int(lens[r])
            assert n == want.numel()
            assert sorted(loc[r, :n].tolist()) == sorted(want.tolist())
            assert all(0 <= x < st["local_e"][r] for x in loc[r, :n].tolist())
            assert torch.all(loc[r, n:] == -1)
