"""The grouped top-k of wide rows (Caps.group_select) on the GPU: the same winners and scores as
the wide top-k and the references, through both routes of its maxima rows (chunk_final,
row_final: one CTA a row at any row count), in position order, with starts, short and empty
rows, ties and special values (rows of -inf and NaNs past a late start included), physical slots,
and in run_index_topk's overlapped row batches captured in a graph."""
import pytest
import torch

from b12x import indexer as ix
from b12x.indexer_reference import topk_reference

from .test_indexer_gpu import _gen, check_topk_sets, distinct_logits, scratch_for
from .test_indexer_row_batches_gpu import _wide_prefill_case, prefill_bindings

pytestmark = pytest.mark.gpu


def _plans(rows, width, k=2048, scores=True, **kw):
    base = dict(num_heads=64, topk=k, max_rows=rows, max_width=width, with_scores=scores, **kw)
    wide, grouped = ix.plan(ix.Caps(**base)), ix.plan(ix.Caps(**base, group_select=True))
    assert grouped.group_route(width) and not wide.group_route(width)
    return wide, grouped


def _run(p, logits, k, **bind):
    rows = logits.shape[0]
    idx = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
    sc = torch.full((rows, k), float("nan"), device="cuda") if p.caps.with_scores else None
    b = ix.bind(p, scratch=scratch_for(p), logits=logits, k=k, indices=idx, scores=sc, **bind)
    ix.run_topk(b)
    torch.cuda.synchronize()
    return idx, sc


def _index_order(idx, sc):
    """A row's entries by index, equal indices (the -1 holes of physical slots) by score."""
    if sc is None:
        return idx.sort(dim=1, stable=True).indices
    by_score = sc.sort(dim=1, stable=True).indices
    return by_score.gather(1, idx.gather(1, by_score).sort(dim=1, stable=True).indices)


def _same(a, b):
    """The same winners (compared in index order: the routes may order a row differently) with the
    same scores."""
    (i0, s0), (i1, s1) = a, b
    o0, o1 = _index_order(i0, s0), _index_order(i1, s1)
    assert torch.equal(i0.gather(1, o0), i1.gather(1, o1))
    if s0 is not None:
        assert torch.equal(s0.gather(1, o0), s1.gather(1, o1))


@pytest.mark.parametrize("rows,width", [(5, 40000), (8, 163840), (70, 163840), (3, 262144)])
@pytest.mark.parametrize("k", (512, 2048))
def test_grouped_matches_wide_and_the_reference(rows, width, k):
    """Maxima rows of 5000 (chunk_final), 20480 with 8 and with 70 rows, 32768 (row_final);
    starts, ends off the group grid, short and empty rows. Winners in position order, their
    scores the logits' own bits."""
    wide, grouped = _plans(rows, width, k=k, mode="contiguous")
    g = _gen(rows + width + k)
    logits = distinct_logits(rows, width, seed=rows + k)
    ends = torch.randint(width // 2, width + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
    starts = torch.randint(0, 5000, (rows,), device="cuda", generator=g, dtype=torch.int32)
    ends[0], starts[0] = width, 0
    ends[1], starts[1] = 1000 + k // 2, 1000        # fewer than K valid
    ends[2], starts[2] = 333, 333                   # empty
    if rows > 3:
        ends[3], starts[3] = width - 5, 7           # ends and starts inside a group
    ref_idx, _ = topk_reference(logits, k, ends, starts)
    got = _run(grouped, logits, k, lengths=ends, starts=starts)
    check_topk_sets(got[0], None, ref_idx)
    for r in range(rows):
        n = int((ref_idx[r] >= 0).sum())
        won = got[0][r, :n]
        assert bool((won[1:] > won[:-1]).all()), f"row {r}: winners not in position order"
        assert torch.equal(got[1][r, :n], logits[r, won.long() + int(starts[r])])
        assert torch.isinf(got[1][r, n:]).all()
    _same(got, _run(wide, logits, k, lengths=ends, starts=starts))
    again = _run(grouped, logits, k, lengths=ends, starts=starts)
    assert torch.equal(got[0], again[0]) and torch.equal(got[1], again[1])


def _key_order(logits: torch.Tensor, k: int, starts: torch.Tensor, ends: torch.Tensor) -> list:
    """Per row, the row-relative positions of the k largest logits of [start, end) in the
    kernels' key order (-0.0 below +0.0, positive NaNs above +inf, negative ones below -inf),
    equal keys by lowest position, ascending (18-bit positions: rows up to 262144 wide)."""
    bits = logits.contiguous().view(torch.int32).long()
    key = torch.where(bits < 0, (~bits) & 0xFFFFFFFF, bits | 0x80000000)
    pos = torch.arange(logits.shape[1], device=logits.device)
    rank = key * (1 << 18) + ((1 << 18) - 1 - pos)
    out = []
    for r in range(logits.shape[0]):
        s, e = int(starts[r]), int(ends[r])
        valid = (pos >= s) & (pos < e)
        n = min(k, int(valid.sum()))
        top = torch.topk(torch.where(valid, rank[r], -1), n).indices if n else pos[:0]
        out.append(sorted((top - s).tolist()))
    return out


@pytest.mark.parametrize("width", (70000, 262144))
def test_grouped_ties_and_special_values(width):
    """Rows whose winners tie at the threshold (few distinct scores; every score equal), clustered
    winners, NaNs of both signs, infinities and signed zeros, and a row of -inf past a late start
    with fewer finite logits than K and negative NaNs after them: the key-order reference's
    winners in position order, ties to the lowest positions, scores bit for bit. Maxima rows of
    8750 (chunk_final) and 32768 (row_final at 6 rows)."""
    rows, k = 6, 2048
    _, grouped = _plans(rows, width, mode="contiguous")
    g = _gen(5)
    logits = torch.randn(rows, width, device="cuda", generator=g)
    perm = lambda: torch.randperm(width, device="cuda", generator=g)      # noqa: E731
    logits[0] = torch.randint(0, 6, (width,), device="cuda", generator=g).float()
    logits[1] = 1.25
    logits[2] = -10.0 + torch.rand(width, device="cuda", generator=g)
    logits[2, 30000:31500] = 3.0                                           # 1500 winners in 188 groups
    nan_pos = perm()[:300]
    logits[3, nan_pos[:100]] = float("nan")
    logits[3].view(torch.int32)[nan_pos[100:200]] = -4194304               # 0xFFC00000: a negative NaN
    logits[3, nan_pos[200:]] = float("inf")
    p4 = perm()
    logits[4, p4[:3000]] = 0.0
    logits[4, p4[3000:6000]] = -0.0
    logits[4, p4[6000:6500]] = float("-inf")
    logits[5] = float("-inf")
    logits[5, 20003:20006] = 1.0
    logits[5].view(torch.int32)[40000:40050] = -4194304
    ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    starts = torch.zeros(rows, dtype=torch.int32, device="cuda")
    starts[5] = 20001                                                      # past 8 K: its groups start there
    want = _key_order(logits, k, starts, ends)
    idx, sc = _run(grouped, logits, k, lengths=ends, starts=starts)
    for r in range(rows):
        n = len(want[r])
        assert idx[r, :n].tolist() == want[r], f"row {r}: {len(set(idx[r, :n].tolist()) ^ set(want[r]))} differ"
        assert (idx[r, n:] == -1).all()
        got_bits = sc[r, :n].view(torch.int32)
        assert torch.equal(got_bits, logits[r, idx[r, :n].long() + int(starts[r])].view(torch.int32))


def test_grouped_compressed_rows_and_physical_slots():
    """Paged logits with a compress ratio, an active width and physical slots through the block
    table (-1 for entries outside the cache)."""
    c, rows, next_n, width = 4, 6, 2, 40000
    wide, grouped = _plans(rows, width, compress_ratio=c)
    logits = distinct_logits(rows, width, seed=13)
    g = _gen(14)
    lengths = torch.randint(0, width * c, (rows,), device="cuda", generator=g, dtype=torch.int32)
    active = (lengths.max() // c - 3).view(1).contiguous()
    pages = -(-width // 64)
    bt = torch.randperm(8192, device="cuda", generator=g)[: rows // next_n * pages].int().view(rows // next_n, pages)
    bt[0, 5] = 9000                                                        # outside the 8192-page cache
    kw = dict(lengths=lengths, active_width=active, block_table=bt, physical=True, num_blocks=8192)
    got = _run(grouped, logits, 2048, **kw)
    ref_idx, _ = topk_reference(logits, 2048, lengths, compress_ratio=c, active_width=int(active), block_table=bt,
                                num_blocks=8192)
    # a winner on the page outside the cache is -1 where it ranks (a hole, not the tail): the
    # rows compared as sorted multisets, -1 entries included
    assert torch.equal(got[0].sort(dim=1).values, ref_idx.sort(dim=1).values)
    _same(got, _run(wide, logits, 2048, **kw))


def test_grouped_prefill_batches_overlapped_and_replayed_in_a_graph():
    """run_index_topk over contiguous row batches (the halves of the logits region in turn, each
    batch's top-k on a side stream) with the grouped top-k: the whole rows' winners and scores by
    the wide top-k, eagerly and in a graph replay over fresh inputs that allocates nothing."""
    g = torch.Generator(device="cuda").manual_seed(53)
    rows, n = 22, 40000
    caps = dict(num_heads=64, topk=2048, mode="contiguous", max_rows=rows, max_width=n, with_scores=True, num_sms=2)
    plans = {"wide": ix.plan(ix.Caps(**caps)), "grouped": ix.plan(ix.Caps(**caps, logits_rows=8, group_select=True))}
    outs, case, bind = prefill_bindings(plans, g, rows, n)
    b = {key: bind(key) for key in plans}
    assert b["grouped"].overlap_batch == 4
    for key in plans:
        ix.run_index_topk(b[key], kv_cache=(case[0], case[1]))
    torch.cuda.synchronize()
    _same(outs["wide"], outs["grouped"])
    assert int((outs["grouped"][0] >= 0).sum(1).min()) == 2048

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ix.run_index_topk(b["grouped"], kv_cache=(case[0], case[1]))
        with torch.cuda.graph(graph, stream=stream):
            ix.run_index_topk(b["grouped"], kv_cache=(case[0], case[1]))
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    for t, new in zip(case, _wide_prefill_case(g, rows, n)):
        t.copy_(new)
    outs["grouped"][0].fill_(-7)
    outs["grouped"][1].fill_(float("nan"))
    before = torch.cuda.memory_allocated()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    ix.run_index_topk(b["wide"], kv_cache=(case[0], case[1]))
    torch.cuda.synchronize()
    _same(outs["wide"], outs["grouped"])
