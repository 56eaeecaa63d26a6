"""The vLLM B12X backend's sparse MLA call sequences, replayed against the upstream-named layer
(b12x.integration.sparse_mla_scratch / .mla) on our kernels, compared with our own API and the
torch reference (docs/notes/upstream-b12x-surface.md, section 2)."""
import math

import pytest
import torch

from b12x.integration.mla import sparse_mla_decode_forward, sparse_mla_extend_forward
from b12x.integration.sparse_mla_scratch import B12XSparseMLAScratchCaps, plan_sparse_mla_scratch

from .sparse_mla_cases import check, random_case, run_ours

pytestmark = pytest.mark.gpu


def _plan(mode, heads, rows, width=2048, splits_cap=32):
    return plan_sparse_mla_scratch(B12XSparseMLAScratchCaps(
        device="cuda", num_q_heads=heads, max_q_rows=rows, max_width=width, dtype=torch.bfloat16,
        kv_dtype=torch.uint8, head_dim=576, v_head_dim=512, mode=mode, max_batch=rows,
        max_chunks_per_row=splits_cap, page_size=64))


def _flat(kv):
    """The backend's view of the cache: [slots, 1, 656] uint8."""
    return kv.view(torch.uint8).reshape(-1, 1, kv.shape[-1])


@pytest.mark.parametrize("heads", [16, 24, 64, 128])
def test_decode_sequence_matches_our_api_and_the_reference(heads):
    rows = 5
    case = random_case(rows, heads, 2048, "fp8_ds_mla", seed=11)
    plan = _plan("decode", heads, rows)
    scratch = torch.full((plan.layout.nbytes,), 0xFF, dtype=torch.uint8, device="cuda")   # NaN poison
    seqlens = torch.full((rows,), 4096, dtype=torch.int32, device="cuda")
    b = plan.bind(scratch=scratch, q=case.q, selected_indices=case.indices, cache_seqlens_int32=seqlens,
                  nsa_cache_seqlens_int32=case.lengths)
    # without DCP: out only, the backend's forced split count (ceil(topk / 64))
    out = sparse_mla_decode_forward(binding=b, kv_cache=_flat(case.kv), sm_scale=case.sm_scale, v_head_dim=512,
                                    forced_num_splits=32)
    assert out.shape == (rows, heads, 512) and out.is_contiguous()
    out = out.clone()
    # with DCP: (out, lse) in natural log, the same forced splits
    out2, lse = sparse_mla_decode_forward(binding=b, kv_cache=_flat(case.kv), sm_scale=case.sm_scale,
                                          v_head_dim=512, forced_num_splits=32, return_lse=True, lse_scale="natural")
    torch.cuda.synchronize()
    check(case, out2, lse)
    assert torch.equal(out, out2)
    # base-2 lse, the planner's own splits (no forced count), page-shaped cache
    out3, lse2 = sparse_mla_decode_forward(binding=b, kv_cache=case.kv, sm_scale=case.sm_scale, return_lse=True)
    torch.cuda.synchronize()
    check(case, out3, lse2, lse_base="2")
    if heads in (16, 64, 128):
        ours, ours_lse = run_ours(case, "fp8_ds_mla", max_rows=rows)
        assert torch.equal(out3, ours)                     # same kernels, same plan
        torch.testing.assert_close(lse2, ours_lse / math.log(2.0), rtol=1e-6, atol=1e-6)


def test_decode_sink_folds_into_lse():
    rows, heads = 3, 16
    case = random_case(rows, heads, 1024, "fp8_ds_mla", seed=12)
    sink = torch.randn(heads, device="cuda")
    plan = _plan("decode", heads, rows)
    scratch = torch.empty(plan.layout.nbytes, dtype=torch.uint8, device="cuda")
    b = plan.bind(scratch=scratch, q=case.q, selected_indices=case.indices,
                  cache_seqlens_int32=case.lengths.clone(), nsa_cache_seqlens_int32=case.lengths)
    out, lse = sparse_mla_decode_forward(binding=b, kv_cache=case.kv, sm_scale=case.sm_scale, attn_sink=sink,
                                         return_lse=True, lse_scale="natural")
    torch.cuda.synchronize()
    ours, ours_lse = run_ours(case, "fp8_ds_mla", sink=sink, max_rows=rows)
    torch.testing.assert_close(out.float(), ours.float(), rtol=0, atol=0)
    torch.testing.assert_close(lse, torch.logaddexp(ours_lse, sink[None, :]), rtol=1e-6, atol=1e-6)


def test_nsa_above_the_width_counts_as_the_width():
    rows, heads = 2, 16
    case = random_case(rows, heads, 512, "fp8_ds_mla", seed=13, invalid_frac=0.0)
    plan = _plan("decode", heads, rows)
    scratch = torch.empty(plan.layout.nbytes, dtype=torch.uint8, device="cuda")
    big = torch.full((rows,), 100000, dtype=torch.int32, device="cuda")
    b = plan.bind(scratch=scratch, q=case.q, selected_indices=case.indices, cache_seqlens_int32=big,
                  nsa_cache_seqlens_int32=big)
    out, lse = sparse_mla_decode_forward(binding=b, kv_cache=case.kv, sm_scale=case.sm_scale, return_lse=True,
                                         lse_scale="natural")
    torch.cuda.synchronize()
    case.lengths = torch.full((rows,), 512, dtype=torch.int32, device="cuda")
    check(case, out, lse)


@pytest.mark.parametrize("heads", [16, 32, 64, 128])
def test_extend_sequence_and_its_prewarm(heads):
    rows = 6
    case = random_case(rows, heads, 2048, "fp8_ds_mla", seed=14)
    plan = _plan("extend", heads, rows)
    scratch = torch.full((plan.layout.nbytes,), 0xFF, dtype=torch.uint8, device="cuda")
    # the backend's extend prewarm: a 64-slot flat cache of zeros, zero q, one valid entry per row
    pw = dict(q=torch.zeros(rows, heads, 576, dtype=torch.bfloat16, device="cuda"),
              selected_indices=torch.zeros(rows, 2048, dtype=torch.int32, device="cuda"),
              cache_seqlens_int32=torch.full((1,), 64, dtype=torch.int32, device="cuda"),
              nsa_cache_seqlens_int32=torch.ones(rows, dtype=torch.int32, device="cuda"))
    sparse_mla_extend_forward(binding=plan.bind(scratch=scratch, **pw),
                              kv_cache=torch.zeros(64, 1, 656, dtype=torch.uint8, device="cuda"),
                              sm_scale=576 ** -0.5, v_head_dim=512, return_lse=True, lse_scale="natural")
    b = plan.bind(scratch=scratch, q=case.q, selected_indices=case.indices,
                  cache_seqlens_int32=torch.full((rows,), 4096, dtype=torch.int32, device="cuda"),
                  nsa_cache_seqlens_int32=case.lengths)
    out, lse = sparse_mla_extend_forward(binding=b, kv_cache=_flat(case.kv), sm_scale=case.sm_scale,
                                         v_head_dim=512, return_lse=True, lse_scale="natural")
    torch.cuda.synchronize()
    check(case, out, lse)
    ours, ours_lse = run_ours(case, "fp8_ds_mla", max_rows=rows, mode="extend")
    assert torch.equal(out, ours)


def test_decode_replays_under_a_cuda_graph():
    rows, heads = 4, 24          # a padded head count: the q copy and the out copy are in the graph
    case = random_case(rows, heads, 2048, "fp8_ds_mla", seed=15)
    plan = _plan("decode", heads, rows)
    scratch = torch.empty(plan.layout.nbytes, dtype=torch.uint8, device="cuda")
    q = case.q.clone()
    b = plan.bind(scratch=scratch, q=q, selected_indices=case.indices, cache_seqlens_int32=case.lengths.clone(),
                  nsa_cache_seqlens_int32=case.lengths)
    kv = _flat(case.kv)

    def step():
        return sparse_mla_decode_forward(binding=b, kv_cache=kv, sm_scale=case.sm_scale, forced_num_splits=32,
                                         return_lse=True, lse_scale="natural")

    step()                       # lazy module loads before capture
    torch.cuda.synchronize()
    # (as the decode tests do: allocations counted over an eager call and over a replay; the
    # capture itself allocates torch's graph RNG state, two small blocks)
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    step()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, "the forward allocated"
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = step()
    fresh = random_case(rows, heads, 2048, "fp8_ds_mla", seed=16)
    q.copy_(fresh.q)
    allocated = torch.cuda.memory_stats()["allocation.all.allocated"]
    g.replay()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocated
    case.q = fresh.q
    check(case, out, lse)


# ---- the indexer layer (b12x.attention.indexer), the fork's decode and prefill calls -----------
from b12x import indexer as ix  # noqa: E402
from b12x.attention import indexer as uix  # noqa: E402
from b12x.attention.indexer.tiled_topk import run_row_topk  # noqa: E402
from b12x.indexer_reference import indexer_logits_paged_reference, quantize_k_pages, quantize_q  # noqa: E402
from .indexer_cases import check_logits  # noqa: E402


def _is_topk_of(logits, got, k):
    """got holds a top-k of logits up to fp32 rounding at the k-th value (sets, not order): its
    entries with a finite logit are min(k, finite entries) distinct columns; the others are -1
    or columns whose logit is -inf."""
    for r in range(logits.shape[0]):
        valid = torch.isfinite(logits[r])
        n = min(k, int(valid.sum()))
        g = got[r].long()
        live = g[g >= 0]
        fin = live[torch.isfinite(logits[r][live])]
        assert fin.numel() == n and fin.unique().numel() == n
        if n == 0:
            continue
        kth = torch.topk(logits[r], n).values[-1]
        tol = 1e-3 * kth.abs() + 1e-3
        assert logits[r][fin].min() >= kth - tol
        unchosen = valid.clone()
        unchosen[fin] = False
        if unchosen.any():
            assert logits[r][unchosen].max() <= kth + tol


def _index_problem(rows, pages, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    big = torch.zeros(600, 64 * 576, dtype=torch.uint8, device="cuda")    # page stride 64 x 576, as in the fork
    kv = quantize_k_pages(torch.randn(600, 64, 128, device="cuda", generator=g))
    big[:, :8448].copy_(kv.view(600, -1))
    q = quantize_q(torch.randn(rows, 64, 128, device="cuda", generator=g) * 4)
    w = torch.randn(rows, 64, device="cuda", generator=g)
    return big[:, :8448], kv, q, w, g


def test_indexer_decode_sequence_matches_our_api():
    rows, pages = 4, 128
    flat, kv, q, w, g = _index_problem(rows, pages, 21)
    bt = torch.randperm(600, device="cuda", generator=g)[: rows * pages].view(rows, pages).int()
    seq = torch.tensor([8192, 5000, 64, 8000], dtype=torch.int32, device="cuda")
    plan = uix.plan_indexer_scratch(uix.B12XIndexerScratchCaps(
        device=q.device, source_layout=uix.INDEXER_SOURCE_LAYOUT_PAGED, num_q_heads=64, max_q_rows=rows,
        max_page_table_width=pages, topk=2048, mode="decode", shared_page_table=False))
    scratch = [torch.empty(s, dtype=d, device="cuda") for s, d in plan.shapes_and_dtypes()]
    active = torch.full((1,), 8192, dtype=torch.int32, device="cuda")
    b = plan.bind(scratch=scratch, real_page_table=bt, cache_seqlens_int32=seq, active_width=active,
                  schedule_metadata=None, expected_num_q_heads=64, shared_page_table=False)
    idx = torch.full((rows, 2048), -7, dtype=torch.int32, device="cuda")
    scores = torch.full((rows, 2048), float("nan"), device="cuda")
    uix.index_topk_fp8(q_fp8=q, weights=w, index_k_cache=flat, binding=b, page_size=uix.PAGED_INDEX_PAGE_SIZE,
                       expected_num_q_heads=64, out_indices=idx, out_scores=scores)
    p = ix.plan(ix.Caps(num_heads=64, topk=2048, max_rows=rows, max_width=pages * 64, with_scores=True))
    ours = p.bind(torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda"), q=q, weights=w, lengths=seq,
                  block_table=bt, width=pages * 64, active_width=active)
    oi, os_ = ix.run_index_topk(ours, kv_cache=kv)
    torch.cuda.synchronize()
    assert torch.equal(idx, oi) and torch.equal(scores, os_)
    _is_topk_of(indexer_logits_paged_reference(q, w, kv, bt, seq, pages * 64), idx, 2048)


def test_indexer_prefill_with_a_shared_page_table():
    rows, pages = 16, 96
    flat, kv, q, w, g = _index_problem(rows, pages, 22)
    table = torch.randperm(600, device="cuda", generator=g)[:pages].int()[None]
    seq = torch.arange(6000 - rows, 6000, dtype=torch.int32, device="cuda")     # causal rows of one request
    plan = uix.plan_indexer_scratch(uix.B12XIndexerScratchCaps(
        device="cuda", source_layout="paged", num_q_heads=64, max_q_rows=rows, max_page_table_width=pages, topk=2048,
        mode="prefill", shared_page_table=True))
    assert plan.route == "packed_contiguous"
    scratch = [torch.empty(s, dtype=d, device="cuda") for s, d in plan.shapes_and_dtypes()]
    b = plan.bind(scratch=scratch, real_page_table=table.expand(rows, pages), cache_seqlens_int32=seq,
                  active_width=None, schedule_metadata=None, expected_num_q_heads=64, shared_page_table=True)
    assert b.route == "packed_contiguous"
    idx = torch.full((rows, 2048), -7, dtype=torch.int32, device="cuda")
    scores = torch.full((rows, 2048), float("nan"), device="cuda")
    uix.index_topk_fp8(q_fp8=q, weights=w.view(rows, 64, 1), index_k_cache=flat, binding=b, page_size=64,
                       expected_num_q_heads=64, out_indices=idx, out_scores=scores)
    torch.cuda.synchronize()
    logits = indexer_logits_paged_reference(q, w, kv, table.expand(rows, pages).contiguous(), seq, pages * 64)
    _is_topk_of(logits, idx, 2048)
    ok = idx >= 0
    # the reference's fp32 sums against the fp8 wgmma's accumulation: the indexer tests' tolerance
    check_logits(scores[ok][None], logits.gather(1, idx.clamp(min=0).long())[ok][None])
    assert torch.all(scores[~ok] == float("-inf"))
    # the same rows through our own API on a per-row copy of the table: the same selection
    p = ix.plan(ix.Caps(num_heads=64, topk=2048, max_rows=rows, max_width=pages * 64, with_scores=True))
    ours = p.bind(torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda"), q=q, weights=w, lengths=seq,
                  block_table=table.expand(rows, pages).contiguous(), width=pages * 64)
    oi, _ = ix.run_index_topk(ours, kv_cache=kv)
    torch.cuda.synchronize()
    for r in range(rows):       # (two rows a K page load here, one there: ties at the k-th may differ)
        a, b2 = set(idx[r][idx[r] >= 0].tolist()), set(oi[r][oi[r] >= 0].tolist())
        assert len(a ^ b2) <= 8, f"row {r}: {len(a ^ b2)} entries differ"


def test_run_row_topk_is_the_dcp_merge():
    g = torch.Generator(device="cuda").manual_seed(23)
    rows, width = 3, 2 * 2048
    logits = torch.randn(rows, width, device="cuda", generator=g)
    logits[1, 100:] = float("-inf")                       # a rank-merge row with few live candidates
    lengths = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    vals = torch.empty(rows, 2048, device="cuda")
    ids = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
    run_row_topk(row_logits=logits, lengths=lengths, topk=2048, output_values=vals, output_indices=ids)
    torch.cuda.synchronize()
    _is_topk_of(logits, ids, 2048)
    ok = ids >= 0
    assert torch.equal(vals[ok], logits.gather(1, ids.clamp(min=0).long())[ok])


def test_indexer_mtp_rows_then_the_dcp_merge():
    """MTP decode (B requests x next_n rows, the block table repeat_interleaved per row as the
    fork does), then the DCP candidate merge of two ranks' top-k through run_row_topk and the id
    gather by position, against the unsharded top-k of the same logits."""
    reqs, next_n, pages = 2, 2, 64
    rows = reqs * next_n
    flat, kv, q, w, g = _index_problem(rows, pages, 24)
    bt_req = torch.randperm(600, device="cuda", generator=g)[: reqs * pages].view(reqs, pages).int()
    bt = bt_req.repeat_interleave(next_n, dim=0).contiguous()
    seq = torch.tensor([4000, 4001, 2500, 2501], dtype=torch.int32, device="cuda")
    plan = uix.plan_indexer_scratch(uix.B12XIndexerScratchCaps(
        device="cuda", source_layout="paged", num_q_heads=64, max_q_rows=rows, max_page_table_width=pages,
        topk=2048, mode="decode", shared_page_table=False))
    b = plan.bind(scratch=[torch.empty(plan.layout.nbytes, dtype=torch.uint8, device="cuda")], real_page_table=bt,
                  cache_seqlens_int32=seq, active_width=None, schedule_metadata=None, expected_num_q_heads=64,
                  shared_page_table=False)
    idx = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
    sc = torch.empty(rows, 2048, device="cuda")
    uix.index_topk_fp8(q_fp8=q, weights=w, index_k_cache=flat, binding=b, page_size=64, expected_num_q_heads=64,
                       out_indices=idx, out_scores=sc)
    torch.cuda.synchronize()
    logits = indexer_logits_paged_reference(q, w, kv, bt, seq, pages * 64)
    _is_topk_of(logits, idx, 2048)
    # two "ranks" each holding half of the columns: their top-k, then the fork's merge
    half = pages * 32
    cand_ids, cand_sc = [], []
    for lo in (0, half):
        part = logits[:, lo:lo + half].contiguous()
        v, i = run_row_topk(row_logits=part, lengths=torch.full((rows,), half, dtype=torch.int32, device="cuda"),
                            topk=2048)
        cand_ids.append(torch.where(i >= 0, i + lo, -1))
        cand_sc.append(v)
    ids, scores = torch.cat(cand_ids, 1).contiguous(), torch.cat(cand_sc, 1).contiguous()
    mv, mi = run_row_topk(row_logits=scores, lengths=torch.full((rows,), 4096, dtype=torch.int32, device="cuda"),
                          topk=2048)
    merged = torch.where(mi >= 0, ids.gather(1, mi.clamp(min=0).long()), -1)
    torch.cuda.synchronize()
    _is_topk_of(logits, merged.int(), 2048)


def test_profile_run_reservation_then_prefill_prewarm():
    """The fork's profile run: plans for decode and shared-table prefill at the profile's rows,
    scratch borrowed from shapes_and_dtypes(), then the prefill prewarm on a zero table."""
    q_rows, k_rows = 256, 8192
    pages = -(-k_rows // 64)
    plans = [uix.plan_indexer_scratch(uix.B12XIndexerScratchCaps(
        device="cuda", source_layout="paged", num_q_heads=64, max_q_rows=q_rows, max_page_table_width=pages,
        topk=2048, mode="prefill" if shared else "decode", shared_page_table=shared)) for shared in (False, True)]
    scratch = [torch.empty(s, dtype=d, device="cuda") for p in plans for s, d in p.shapes_and_dtypes()]
    pre = plans[1]
    kv = torch.zeros(pages, 8448, dtype=torch.uint8, device="cuda")
    b = pre.bind(scratch=[scratch[1]], real_page_table=torch.zeros(1, pages, dtype=torch.int32, device="cuda").expand(
        q_rows, pages), cache_seqlens_int32=torch.full((q_rows,), k_rows, dtype=torch.int32, device="cuda"),
        active_width=None, schedule_metadata=None, expected_num_q_heads=64, shared_page_table=True)
    idx = torch.empty(q_rows, 2048, dtype=torch.int32, device="cuda")
    uix.index_topk_fp8(q_fp8=torch.zeros(q_rows, 64, 128, dtype=torch.float8_e4m3fn, device="cuda"),
                       weights=torch.zeros(q_rows, 64, device="cuda"), index_k_cache=kv, binding=b, page_size=64,
                       expected_num_q_heads=64, out_indices=idx, out_scores=torch.empty(q_rows, 2048, device="cuda"))
    torch.cuda.synchronize()
    assert torch.all((idx >= -1) & (idx < k_rows))
