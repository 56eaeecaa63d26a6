"""Lightning indexer on the GPU against the torch references (fp8 paths on the dequantized data).

Kernels come from B12X_CACHE_DIR (build them ahead of time) or are built on first use."""
import pytest
import torch

from b12x import indexer as ix
from b12x.indexer_reference import (effective_width, indexer_logits_contiguous_reference,
                                    indexer_logits_paged_reference, quantize_k_pages, quantize_q, topk_reference)
from b12x.metadata import decode_active_width

from .indexer_cases import check_logits

pytestmark = pytest.mark.gpu


def _gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def paged_case(rows, heads, next_n=1, max_len=4096, c=1, blocks=None, page_stride=None, seed=0, lengths=None,
               pool=None):
    """Random e4m3 q/K, positive and negative weights, a shuffled block table. max_len is in tokens;
    the cache holds ceil(max_len / c) entries per request."""
    g = _gen(seed)
    req = rows // next_n
    pages = -(-(-(-max_len // c)) // 64)
    if pool is None:
        blocks = blocks or req * pages + 3
        kv = quantize_k_pages(torch.randn(blocks, 64, 128, device="cuda", generator=g))
        if page_stride is not None:
            big = torch.zeros(blocks, page_stride, dtype=torch.uint8, device="cuda")
            big[:, :8448] = kv.view(blocks, -1)
            kv = torch.as_strided(big, (blocks, 64, 132), (page_stride, 132, 1))
    else:
        kv = pool
    nblk = kv.shape[0]
    perm = torch.randperm(nblk, device="cuda", generator=g)[: req * pages]
    bt = perm.view(req, pages).int().contiguous()
    q = quantize_q(torch.randn(rows, heads, 128, device="cuda", generator=g) * 2)
    w = torch.randn(rows, heads, device="cuda", generator=g)
    if lengths is None:
        lengths = torch.randint(1, max_len + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
    return q, w, kv, bt, lengths


def make_plan(heads=64, k=2048, c=1, mode="paged", rows=8, width=8192, scores=True, fused=None):
    return ix.plan(ix.Caps(num_heads=heads, topk=k, compress_ratio=c, mode=mode, max_rows=rows, max_width=width,
                           with_scores=scores, fused=fused))


def scratch_for(p):
    return torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")  # NaN poison


def check_topk_sets(idx, scores, ref_idx, logits=None):
    for r in range(idx.shape[0]):
        got = [i for i in idx[r].tolist() if i >= 0]
        want = [i for i in ref_idx[r].tolist() if i >= 0]
        assert len(got) == len(set(got)), f"row {r}: duplicate indices"
        assert set(got) == set(want), f"row {r}: top-k set differs ({len(set(got) ^ set(want))} entries)"
        n = len(want)
        assert (idx[r, n:] == -1).all(), f"row {r}: expected a -1 tail after {n} winners"
        if scores is not None:
            assert torch.isinf(scores[r, n:]).all() and (scores[r, n:] < 0).all()
            if logits is not None and n:
                torch.testing.assert_close(scores[r, :n], logits[r, idx[r, :n].long()])


# ---- logits ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("heads", (8, 16, 32, 64))
@pytest.mark.parametrize("c", (1, 4, 128))
@pytest.mark.parametrize("next_n", (1, 2))
def test_paged_logits(heads, c, next_n):
    rows, width = 4 * next_n, 6000
    q, w, kv, bt, lengths = paged_case(rows, heads, next_n, max_len=width * c, c=c, seed=heads + c + next_n)
    lengths[0] = 0                                            # a zero-length row
    p = make_plan(heads, c=c, rows=rows, width=width)
    b = ix.bind(p, scratch=scratch_for(p), q=q, weights=w, lengths=lengths, block_table=bt[:, : -(-width // 64)],
                width=width)
    ours = ix.run_logits(b, kv_cache=kv).clone()
    torch.cuda.synchronize()
    ref = indexer_logits_paged_reference(q, w, kv, bt, lengths, width, compress_ratio=c)
    check_logits(ours, ref)


def test_paged_logits_active_width_bound_and_strided_pages():
    c, rows, width = 4, 6, 4096
    q, w, kv, bt, lengths = paged_case(rows, 32, 2, max_len=width * c, c=c, page_stride=8448 + 512, seed=5)
    ml = torch.zeros(1, dtype=torch.int32, device="cuda")   # the caller's persistent buffer
    # the graph-stable bound, in entries: ceil(max_seq_len / c)
    act = decode_active_width(ml, max_seq_len=int(lengths.max()), compress_ratio=c, authoritative=False)
    assert act == -(-int(lengths.max()) // c) and int(ml) == act
    p = make_plan(32, c=c, rows=rows, width=width)
    logits = torch.full((rows, width), 12345.0, device="cuda")
    b = ix.bind(p, scratch=scratch_for(p), q=q, weights=w, lengths=lengths, block_table=bt, active_width=ml,
                logits=logits)
    ix.run_logits(b, kv_cache=kv)
    torch.cuda.synchronize()
    ref = indexer_logits_paged_reference(q, w, kv, bt, lengths, width, compress_ratio=c, active_width=act)
    check_logits(logits[:, :act], ref[:, :act])
    assert torch.all(logits[:, -(-act // 64) * 64:] == 12345.0), "columns past the active width are not written"


def test_logits_address_beyond_2gb():
    blocks = (1 << 31) // 8448 + 4096                        # a 2.1 GB pool
    pool = torch.zeros(blocks, 64, 132, dtype=torch.uint8, device="cuda")
    g = _gen(9)
    hi = torch.arange(blocks - 256, blocks, device="cuda")
    pool[hi] = quantize_k_pages(torch.randn(256, 64, 128, device="cuda", generator=g))
    q = quantize_q(torch.randn(2, 64, 128, device="cuda", generator=g))
    w = torch.randn(2, 64, device="cuda", generator=g)
    bt = hi[torch.randperm(256, device="cuda", generator=g)].int().view(2, 128).contiguous()
    lengths = torch.tensor([8192, 5000], dtype=torch.int32, device="cuda")
    assert int(bt.min()) * 8448 > (1 << 31)
    p = make_plan(64, rows=2, width=8192)
    b = ix.bind(p, scratch=scratch_for(p), q=q, weights=w, lengths=lengths, block_table=bt, width=8192, physical=True)
    ours = ix.run_logits(b, kv_cache=pool).clone()
    idx, sc = ix.run_topk(b)
    torch.cuda.synchronize()
    ref = indexer_logits_paged_reference(q, w, pool, bt, lengths, 8192)
    check_logits(ours, ref)
    ref_idx, _ = topk_reference(ours, 2048, lengths, block_table=bt)
    check_topk_sets(idx, None, ref_idx)
    del pool


@pytest.mark.parametrize("heads", (32, 64))
@pytest.mark.parametrize("rows", (7, 8))     # 8: row pairs on sm_90a (disjoint, nested, empty ranges in a pair)
def test_contiguous_logits(heads, rows):
    g = _gen(heads + rows)
    n = 5000
    kv = quantize_q(torch.randn(n, 128, device="cuda", generator=g))
    sc = torch.rand(n, device="cuda", generator=g) + 0.1
    q = quantize_q(torch.randn(rows, heads, 128, device="cuda", generator=g))
    w = torch.randn(rows, heads, device="cuda", generator=g)
    starts = torch.tensor([0, 0, 100, 4000, 63, 2000, 10, 300][:rows], dtype=torch.int32, device="cuda")
    ends = torch.tensor([0, 64, 1500, 5000, 4999, 2001, 6000, 301][:rows], dtype=torch.int32, device="cuda")
    p = make_plan(heads, mode="contiguous", rows=rows, width=n)
    b = ix.bind(p, scratch=scratch_for(p), q=q, weights=w, lengths=ends, starts=starts, width=n, k=512)
    ours = ix.run_logits(b, kv_cache=(kv, sc)).clone()
    idx, scores = ix.run_topk(b)
    torch.cuda.synchronize()
    ref = indexer_logits_contiguous_reference(q, w, kv, sc, starts, ends, n)
    check_logits(ours, ref)
    ref_idx, _ = topk_reference(ours, 512, ends, starts)
    check_topk_sets(idx, None, ref_idx)


# ---- top-k ----------------------------------------------------------------------------------------
def check_topk_exact_and_repeatable(b, logits, k, ends):
    """run_topk's sets against the torch reference, then bit for bit the same on a second run."""
    idx, scores = ix.run_topk(b)
    torch.cuda.synchronize()
    ref_idx, _ = topk_reference(logits, k, ends)
    check_topk_sets(idx, scores, ref_idx, logits)
    idx1, sc1 = idx.clone(), scores.clone()
    ix.run_topk(b)
    torch.cuda.synchronize()
    assert torch.equal(idx, idx1) and torch.equal(scores, sc1)


def distinct_logits(rows, width, seed):
    """Distinct scores (a random permutation), some rows shorter than K, one empty row."""
    g = _gen(seed)
    vals = torch.rand(rows, width, device="cuda", generator=g).argsort(dim=1).float() * 1e-3 - 3.0
    return vals


WIDTHS = (1, 100, 2048, 8191, 16384, 16385, 32768, 32769, 65536, 131072, 262144)   # both sides of chunk and row_chunk


@pytest.mark.parametrize("k", (512, 1024, 2048))
@pytest.mark.parametrize("width", WIDTHS)
def test_topk_matches_torch(k, width):
    rows = 5
    logits = distinct_logits(rows, width, seed=width + k)
    g = _gen(k)
    ends = torch.randint(0, width + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
    ends[0] = width
    ends[1] = min(width, k // 2)        # shorter than K
    ends[2] = 0                         # empty row
    p = make_plan(k=k, rows=rows, width=max(width, 1))
    b = ix.bind(p, scratch=scratch_for(p), lengths=ends, logits=logits, k=k)
    check_topk_exact_and_repeatable(b, logits, k, ends)


@pytest.mark.parametrize("k", (512, 2048))
@pytest.mark.parametrize("width", (16385, 20000, 32768))
def test_topk_row_final_many_rows(k, width):
    """Enough rows between one chunk and row_chunk wide take row_final (one CTA per row): the same
    exact sets, short and empty rows included, and the same physical-slot semantics."""
    p = make_plan(k=k, rows=80, width=width)
    rows = p.tiling["row_min_rows"] + 3
    assert p.row_final(rows, width)
    logits = distinct_logits(rows, width, seed=width + k + 1)
    ends = torch.randint(0, width + 1, (rows,), device="cuda", generator=_gen(k + 1), dtype=torch.int32)
    ends[0], ends[1], ends[2] = width, min(width, k // 2), 0
    b = ix.bind(p, scratch=scratch_for(p), lengths=ends, logits=logits, k=k)
    torch.cuda.synchronize()
    idx, scores = ix.run_topk(b)
    torch.cuda.synchronize()
    ref_idx, _ = topk_reference(logits, k, ends)
    check_topk_sets(idx, scores, ref_idx, logits)


@pytest.mark.parametrize("k", (512, 2048))
def test_topk_wide_chunk_long(k):
    """Prefill-sized batches (264 rows x 163840) give each wide-top-k CTA 20 tiles, more than
    wide_chunk keeps hit masks for: wide_chunk_long (sm_90a) selects them, the same exact sets,
    short and empty rows included, and bit for bit run to run."""
    rows, width = 264, 163840
    p = make_plan(k=k, rows=rows, width=width)
    t = p.tiling
    if not t["wide_long_hit_tiles"]:
        pytest.skip("wide_chunk_long is sm_90a's")
    assert not p.row_final(rows, width) and p.wide_tiles_per_cta(rows, width) > t["wide_hit_tiles"]
    logits = distinct_logits(rows, width, seed=k + 7)
    ends = torch.randint(0, width + 1, (rows,), device="cuda", generator=_gen(k + 7), dtype=torch.int32)
    ends[0], ends[1], ends[2] = width, min(width, k // 2), 0
    b = ix.bind(p, scratch=scratch_for(p), lengths=ends, logits=logits, k=k)
    check_topk_exact_and_repeatable(b, logits, k, ends)


@pytest.mark.parametrize("k", (128, 384, 2048))
def test_topk_any_multiple_of_128_and_ties(k):
    rows, width = 3, 40000
    logits = torch.randint(0, 50, (rows, width), device="cuda", generator=_gen(3)).float()   # heavy ties
    ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    p = make_plan(k=2048, rows=rows, width=width)
    b = ix.bind(p, scratch=scratch_for(p), lengths=ends, logits=logits, k=k)
    idx, scores = ix.run_topk(b)
    torch.cuda.synchronize()
    for r in range(rows):
        assert len(set(idx[r].tolist())) == k and (idx[r] >= 0).all()
        kth = torch.topk(logits[r], k).values[-1]
        assert (logits[r, idx[r].long()] >= kth).all()                # a valid top-k under ties
        assert torch.equal(scores[r], logits[r, idx[r].long()])


@pytest.mark.parametrize("width", (16385, 32769, 50000, 131072))
def test_topk_wide_rows_with_starts(width):
    """Rows with [start, end) bounds, one chunk (<= 32K on sm_90a) and wider: starts mid-chunk, near
    the end, past it."""
    rows, k = 6, 2048
    logits = torch.randn(rows, width, device="cuda", generator=_gen(width))       # near-continuous scores
    starts = torch.tensor([0, 4095, 4097, width - 3000, width - 100, width], dtype=torch.int32, device="cuda")
    ends = torch.tensor([width, width - 1, 9000, width, width, width], dtype=torch.int32, device="cuda")
    p = make_plan(k=k, rows=rows, width=width)
    b = ix.bind(p, scratch=scratch_for(p), lengths=ends, starts=starts, logits=logits, k=k)
    idx, scores = ix.run_topk(b)
    torch.cuda.synchronize()
    ref_idx, _ = topk_reference(logits, k, ends, starts)
    check_topk_sets(idx, None, ref_idx)
    for r in range(rows):
        n = int((ref_idx[r] >= 0).sum())
        got = idx[r, :n].long() + int(starts[r])
        torch.testing.assert_close(scores[r, :n], logits[r, got])


def key_order_topk(logits: torch.Tensor, k: int) -> list:
    """Per row, the k largest by the kernels' key order (the float order with -0.0 below +0.0,
    positive NaNs above +inf and negative ones below -inf), equal keys by lowest position."""
    assert logits.shape[1] <= 1 << 17, "positions share the rank with the 32-bit key: 17 bits"
    bits = logits.contiguous().view(torch.int32).long()
    key = torch.where(bits < 0, (~bits) & 0xFFFFFFFF, bits | 0x80000000)
    pos = torch.arange(logits.shape[1], device=logits.device)
    rank = key * (1 << 17) + ((1 << 17) - 1 - pos)
    return [set(torch.topk(rank[r], k).indices.tolist()) for r in range(logits.shape[0])]


def test_topk_wide_threshold_bins_at_the_edges():
    """Wide rows whose threshold bin sits where the count pass's shortcuts change: +0.0 (with
    -0.0 just below it), +inf, a negative threshold, NaNs of both signs, and a continuous row;
    full and partial tiles (70000 logits). Sets against the key-order reference, twice."""
    rows, width, k = 5, 70000, 2048
    g = _gen(11)
    logits = torch.randn(rows, width, device="cuda", generator=g)
    perm = lambda: torch.randperm(width, device="cuda", generator=g)      # noqa: E731
    p0 = perm()
    logits[0] = -1.0 - torch.rand(width, device="cuda", generator=g)
    logits[0, p0[:1000]] = 1.0 + torch.rand(1000, device="cuda", generator=g)
    logits[0, p0[1000:4000]] = 0.0
    logits[0, p0[4000:7000]] = -0.0
    logits[1, perm()[:2500]] = float("inf")
    logits[2] = logits[2] - 10.0                                           # every score negative
    nan_pos = perm()[:200]
    logits[4, nan_pos[:100]] = float("nan")
    logits[4].view(torch.int32)[nan_pos[100:]] = -4194304                 # 0xFFC00000: a negative NaN
    ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    p = make_plan(k=k, rows=rows, width=width)
    assert not p.row_final(rows, width) and width > p.tiling["chunk"]
    b = ix.bind(p, scratch=scratch_for(p), lengths=ends, logits=logits, k=k)
    want = key_order_topk(logits, k)
    runs = []
    for _ in range(2):
        idx, scores = ix.run_topk(b)
        torch.cuda.synchronize()
        for r in range(rows):
            assert set(idx[r].tolist()) == want[r], f"row {r}: {len(set(idx[r].tolist()) ^ want[r])} differ"
            torch.testing.assert_close(scores[r], logits[r, idx[r].long()], equal_nan=True)
        runs.append(idx.clone())
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("k", (128, 2048))
def test_topk_wide_row_of_equal_scores(k):
    """Every score equal: the threshold bin holds the whole row, more than the tie buffer, so the
    last pass selects from the row itself; the winners are then the lowest positions."""
    rows, width = 2, 70000
    logits = torch.full((rows, width), 1.25, device="cuda")
    logits[1, ::7] = 2.0                            # 10000 larger keys, then ties at 1.25
    ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    p = make_plan(k=2048, rows=rows, width=width)
    b = ix.bind(p, scratch=scratch_for(p), lengths=ends, logits=logits, k=k)
    idx, scores = ix.run_topk(b)
    torch.cuda.synchronize()
    assert torch.equal(idx[0].sort().values, torch.arange(k, dtype=torch.int32, device="cuda"))
    assert (logits[1, idx[1].long()] == 2.0).all() and len(set(idx[1].tolist())) == k
    assert torch.equal(scores[0], logits[0, idx[0].long()])


def test_topk_compressed_rows_and_physical_slots():
    c, rows, next_n, width = 4, 6, 2, 20000
    logits = distinct_logits(rows, width, seed=11)
    g = _gen(12)
    lengths = torch.randint(0, width * c, (rows,), device="cuda", generator=g, dtype=torch.int32)
    ml = (lengths.max() // c).view(1).contiguous()                 # the exact active width, in entries
    bt = torch.randperm(4096, device="cuda", generator=g)[: rows // next_n * 313].int().view(rows // next_n, 313)
    p = make_plan(k=2048, c=c, rows=rows, width=width)
    b = ix.bind(p, scratch=scratch_for(p), lengths=lengths, logits=logits, active_width=ml, block_table=bt,
                physical=True, num_blocks=4096)
    idx, _ = ix.run_topk(b)
    torch.cuda.synchronize()
    ref_idx, _ = topk_reference(logits, 2048, lengths, compress_ratio=c, active_width=int(ml), block_table=bt,
                                num_blocks=4096)
    check_topk_sets(idx, None, ref_idx)


# ---- fused + graphs -------------------------------------------------------------------------------
@pytest.mark.parametrize("heads", (16, 64))
@pytest.mark.parametrize("c", (1, 4))
@pytest.mark.parametrize("max_len", (3000, 40000))
def test_fused_matches_unfused(heads, c, max_len):
    rows, next_n = 4, 2
    width = -(-max_len // c)
    q, w, kv, bt, lengths = paged_case(rows, heads, next_n, max_len=max_len, c=c, seed=heads * c)
    out = {}
    for fused in (True, False):
        p = make_plan(heads, c=c, rows=rows, width=width, fused=fused)
        b = ix.bind(p, scratch=scratch_for(p), q=q, weights=w, lengths=lengths, block_table=bt, width=width)
        idx, sc = ix.run_index_topk(b, kv_cache=kv)
        out[fused] = (idx.clone(), sc.clone(), b)
    torch.cuda.synchronize()
    logits = out[False][2].logits
    ref_idx, _ = topk_reference(logits, 2048, lengths, compress_ratio=c)
    check_topk_sets(out[False][0], out[False][1], ref_idx, logits)
    check_topk_sets(out[True][0], None, ref_idx)
    # same logits, so the same scores per index
    for r in range(rows):
        a = dict(zip(out[True][0][r].tolist(), out[True][1][r].tolist()))
        bb = dict(zip(out[False][0][r].tolist(), out[False][1][r].tolist()))
        assert a.keys() == bb.keys()
        for i in a:
            if i >= 0:
                assert abs(a[i] - bb[i]) <= 1e-5 * abs(bb[i]) + 1e-6


@pytest.mark.parametrize("fused,width", [(True, 8192), (False, 8192), (False, 40000)])
def test_cuda_graph_capture_without_allocation(fused, width):
    """40000: the wide-row top-k (its memset node and row-wide waits) inside the graph."""
    rows, heads, c = 4, 64, 4
    q, w, kv, bt, lengths = paged_case(rows, heads, 2, max_len=width * c, c=c, seed=21)
    ml = torch.zeros(1, dtype=torch.int32, device="cuda")
    decode_active_width(ml, max_seq_len=width * c, compress_ratio=c, seq_lens_cpu=lengths.cpu())   # entries
    p = make_plan(heads, c=c, rows=rows, width=width, fused=fused)
    scratch = scratch_for(p)
    b = ix.bind(p, scratch=scratch, q=q, weights=w, lengths=lengths, block_table=bt, width=width, active_width=ml)
    ix.run_index_topk(b, kv_cache=kv)          # lazy module loads happen before capture
    torch.cuda.synchronize()
    want = b.indices.clone()
    b.indices.fill_(7)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    # torch's own capture_begin registers the default CUDA generator with the graph and, when no
    # other graph holds it, allocates its two 8-byte seed/offset tensors (1024 bytes with the
    # allocator's rounding), so the counters are read inside the capture, around run_index_topk
    # alone. Counting allocation events as well as bytes also catches temporaries freed again.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            before = torch.cuda.memory_allocated()
            n_allocs = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
            ix.run_index_topk(b, kv_cache=kv)
            after = torch.cuda.memory_allocated()
            n_allocs = torch.cuda.memory_stats().get("allocation.all.allocated", 0) - n_allocs
    torch.cuda.current_stream().wait_stream(stream)
    assert after == before, f"run_index_topk allocated {after - before} bytes during capture"
    assert n_allocs == 0, f"run_index_topk made {n_allocs} allocations during capture"
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(b.indices, want)
    # new lengths and active width on the device: the same graph follows them, no host sync needed
    lengths.copy_(lengths // 2)
    decode_active_width(ml, max_seq_len=width * c, compress_ratio=c, seq_lens_cpu=lengths.cpu())
    graph.replay()
    torch.cuda.synchronize()
    if fused:
        logits = indexer_logits_paged_reference(q, w, kv, bt, lengths, width, compress_ratio=c,
                                                active_width=int(ml))
    else:
        # the graph's own logits: near-ties at the K-th value within fp32 rounding of the
        # reference cannot flip the comparison of the selection itself
        act = effective_width(width, int(ml))        # columns past it are not written
        ref = indexer_logits_paged_reference(q, w, kv, bt, lengths, width, compress_ratio=c, active_width=int(ml))
        check_logits(b.logits[:, :act], ref[:, :act])
        logits = b.logits
    ref_idx, _ = topk_reference(logits, 2048, lengths, compress_ratio=c, active_width=int(ml))
    check_topk_sets(b.indices, None, ref_idx)


def test_custom_ops_run():
    rows, heads, width = 2, 32, 4096
    q, w, kv, bt, lengths = paged_case(rows, heads, 1, max_len=width, seed=31)
    p = ix.plan(ix.Caps(num_heads=heads, topk=2048, max_rows=rows, max_width=width, with_scores=True))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    idx = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
    sc = torch.empty(rows, 2048, dtype=torch.float32, device="cuda")
    torch.ops.b12x.indexer_index_topk(q, w, kv, bt, lengths, None, scratch, idx, sc, width, 1, 2048, rows, width,
                                      False)
    torch.cuda.synchronize()
    logits = indexer_logits_paged_reference(q, w, kv, bt, lengths, width)
    ref_idx, _ = topk_reference(logits, 2048, lengths)
    check_topk_sets(idx, None, ref_idx)


@pytest.mark.parametrize("mode,fused", (("paged", None), ("paged", True), ("contiguous", None)))
def test_prewarm_covers_every_route(mode, fused):
    from b12x.prewarm import prewarm_indexer

    caps = ix.Caps(num_heads=64, topk=2048, mode=mode, max_rows=4, max_width=40000, with_scores=True, fused=fused)
    # the caller's scratch, sized by its own plan, is all the warm-up uses
    p = ix.plan(caps)
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    ran = prewarm_indexer(caps, scratch=scratch)
    routes = {r for r, _, _ in ran}
    pairs = "mtp-pairs" if mode == "paged" else "row-pairs"
    assert routes == ({"fused"} if fused else {"unfused", pairs})
    assert {rows for r, rows, _ in ran if r != pairs} == {1, 4} and max(w for _, _, w in ran) == 40000
    assert pairs not in routes or {rows for r, rows, _ in ran if r == pairs} == {2, 4}
