"""The default preset's bundle, prewarmed with one call and then frozen, serves everything the
model's layers call (sparse MLA decode and extend, the indexer's paged, row-pair and contiguous
logits, top-k with and without scores, the fused path, the DCP kernels) with no compile and no
lazy load: nothing raises KernelResolutionFrozenError, and every result matches its reference.

Build first: `b12x-codegen build --preset deepseek-v3.2-tp8 --arch sm_90a` (B12X_CACHE_DIR set)."""
import math

import pytest
import torch

from b12x import dcp, freeze, registry, unfreeze
from b12x import indexer as ix
from b12x.errors import KernelResolutionFrozenError
from b12x.indexer_reference import (indexer_logits_contiguous_reference, indexer_logits_paged_reference, quantize_q,
                                    topk_reference)
from b12x.prewarm import prewarm_preset
from codegen.catalog import DEFAULT_PRESET, get_preset
from codegen.specs import SparseMLASpec

from .sparse_mla_cases import check, random_case, run_ours
from .test_indexer_gpu import check_logits, check_topk_sets, paged_case

pytestmark = pytest.mark.gpu

MAX_BATCHED = 8
MAX_WIDTH = 40000      # past row_chunk (32K): the warm-up takes the wide top-k too
INDEX_HEADS = 64       # DeepSeek-V3.2's indexer
HEADS = 16             # DeepSeek-V3.2 attention heads per rank at TP8


@pytest.fixture
def frozen_bundle():
    bundle = prewarm_preset(DEFAULT_PRESET, max_rows=MAX_BATCHED, max_width=MAX_WIDTH)
    freeze()
    yield bundle
    unfreeze()


def test_bundle_is_loaded_and_freeze_holds(frozen_bundle):
    assert registry.is_frozen()
    want = get_preset(DEFAULT_PRESET).specs((frozen_bundle.arch,))
    assert set(frozen_bundle.specs()) == set(want)
    assert set(want) <= set(registry.loaded_specs())
    # memoised: a second call with the same arguments resolves nothing and launches nothing
    assert prewarm_preset(DEFAULT_PRESET, max_rows=MAX_BATCHED, max_width=MAX_WIDTH) == frozen_bundle
    outside = SparseMLASpec(num_heads=HEADS, topk=1024, arch=frozen_bundle.arch)   # in no preset
    if outside not in registry.loaded_specs():
        with pytest.raises(KernelResolutionFrozenError, match=outside.name):
            registry.resolve(outside)


@pytest.mark.parametrize("rows", (1, 5))
@pytest.mark.parametrize("mode", ("decode", "extend"))
def test_sparse_mla_frozen(frozen_bundle, mode, rows):
    case = random_case(rows, HEADS, 2048, "fp8_ds_mla", seed=70 + rows)
    out, lse = run_ours(case, "fp8_ds_mla", mode=mode)
    check(case, out, lse)


@pytest.mark.parametrize("with_scores", (False, True))
@pytest.mark.parametrize("next_n", (1, 2))    # 2: MTP rows take the row-pair logits kernel
def test_indexer_paged_topk_frozen(frozen_bundle, next_n, with_scores):
    rows, max_len = 4, MAX_WIDTH
    q, w, kv, bt, lengths = paged_case(rows, INDEX_HEADS, next_n, max_len=max_len, seed=80 + next_n)
    lengths[0] = max_len
    out = {}
    for fused in (False, True):
        p = ix.plan(ix.Caps(num_heads=INDEX_HEADS, topk=2048, max_rows=rows, max_width=max_len,
                            with_scores=with_scores, fused=fused))
        scratch = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
        b = ix.bind(p, scratch=scratch, q=q, weights=w, lengths=lengths, block_table=bt, width=max_len)
        idx, sc = ix.run_index_topk(b, kv_cache=kv)
        out[fused] = (idx.clone(), None if sc is None else sc.clone(), b)
    torch.cuda.synchronize()
    pairs = next_n == 2 and frozen_bundle.arch == "sm_90a"
    assert out[False][2].plan.logits_rows_per_unit(rows, next_n) == (2 if pairs else 1)
    logits = out[False][2].logits
    check_logits(logits, indexer_logits_paged_reference(q, w, kv, bt, lengths, max_len))
    ref_idx, _ = topk_reference(logits, 2048, lengths)
    check_topk_sets(out[False][0], out[False][1], ref_idx, logits)
    check_topk_sets(out[True][0], None, ref_idx)        # fused: the same selection, no logits in HBM
    assert (out[True][1] is None) == (not with_scores)


@pytest.mark.parametrize("with_scores", (False, True))
def test_indexer_contiguous_topk_frozen(frozen_bundle, with_scores):
    g = torch.Generator(device="cuda").manual_seed(90)
    n, rows = 6000, 5
    kv = quantize_q(torch.randn(n, 128, device="cuda", generator=g))
    kv_scale = torch.rand(n, device="cuda", generator=g) + 0.1
    q = quantize_q(torch.randn(rows, INDEX_HEADS, 128, device="cuda", generator=g))
    w = torch.randn(rows, INDEX_HEADS, device="cuda", generator=g)
    starts = torch.tensor([0, 0, 100, 3000, 63], dtype=torch.int32, device="cuda")
    ends = torch.tensor([6000, 64, 2500, 6000, 5999], dtype=torch.int32, device="cuda")
    p = ix.plan(ix.Caps(num_heads=INDEX_HEADS, topk=2048, mode="contiguous", max_rows=rows, max_width=n,
                        with_scores=with_scores))
    scratch = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
    b = ix.bind(p, scratch=scratch, q=q, weights=w, lengths=ends, starts=starts, width=n)
    idx, sc = ix.run_index_topk(b, kv_cache=(kv, kv_scale))
    torch.cuda.synchronize()
    check_logits(b.logits, indexer_logits_contiguous_reference(q, w, kv, kv_scale, starts, ends, n))
    ref_idx, _ = topk_reference(b.logits, 2048, ends, starts)
    check_topk_sets(idx, sc, ref_idx)      # indices are row-relative (position - start); scores -inf tail
    assert (sc is None) == (not with_scores)


@pytest.mark.parametrize("world,rank,interleave", [(1, 0, 1), (4, 2, 16)])
def test_dcp_kernels_frozen(frozen_bundle, world, rank, interleave):
    """No process group is needed for the conversion and the owner filter at any world size, nor
    for the merge at world 1: each runs on the bundle's DCP and top-k kernels."""
    k, rows, length = 2048, 3, 9000
    full = torch.randperm(rows * length, generator=torch.Generator().manual_seed(world)).float().view(rows, length)
    ids, scores = dcp.shard_topk_reference(full, world=world, rank=rank, interleave=interleave, k=k)
    caps = dcp.DcpCaps(topk=k, world=world, interleave=interleave, max_rows=MAX_BATCHED)
    p, pc = dcp.plan(caps), dcp.plan(caps, device="cpu")
    g_ids = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    g_scores = torch.empty(rows, k, device="cuda")
    dcp.convert_to_global(p, local_ids=ids.cuda(), local_scores=scores.cuda(), out_ids=g_ids, out_scores=g_scores,
                          rank=rank)
    torch.cuda.synchronize()
    want = dcp.local_to_global(ids, world=world, rank=rank, interleave=interleave)
    assert torch.equal(g_ids.cpu(), want)
    assert torch.equal(g_scores.cpu(), scores.masked_fill(ids < 0, -math.inf))
    # attention side: this rank's share of the global ids, as local positions, compacted
    loc, lens = torch.empty_like(g_ids), torch.empty(rows, dtype=torch.int32, device="cuda")
    dcp.filter_local(p, global_ids=g_ids, out_local=loc, lengths=lens, rank=rank)
    loc_c, lens_c = torch.empty(rows, k, dtype=torch.int32), torch.empty(rows, dtype=torch.int32)
    dcp.filter_local(pc, global_ids=g_ids.cpu(), out_local=loc_c, lengths=lens_c, rank=rank)
    torch.cuda.synchronize()
    assert torch.equal(loc.cpu(), loc_c) and torch.equal(lens.cpu(), lens_c)
    if world == 1:   # the merge without a collective: the exact top-k of the row
        scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
        out = torch.full((rows, k), 7, dtype=torch.int32, device="cuda")
        out_s = torch.full((rows, k), float("nan"), device="cuda")
        dcp.merge_topk(p, scratch=scratch, local_ids=ids.cuda(), local_scores=scores.cuda(), out_ids=out,
                       out_scores=out_s, rank=0)
        torch.cuda.synchronize()
        top = torch.topk(full, k, dim=-1).indices
        for r in range(rows):
            assert set(out[r].tolist()) == set(top[r].tolist())
            torch.testing.assert_close(out_s[r].cpu(), full[r, out[r].cpu().long()])


def test_bf16_extend_rows_in_cache_order_after_freeze():
    """The seam an engine crosses with a bf16 bundle: prewarm_preset, freeze, then an extend chunk
    of ORDER_MIN_ROWS rows or more over a cache beyond L2, which takes the order kernel before the
    attention kernel. Nothing resolves after the freeze, and the result matches the reference."""
    from b12x.attention import sparse_mla as sm

    from .test_sparse_mla_extend_gpu import BIG, _ordered_rows

    rows = sm.ORDER_MIN_ROWS + 20
    bundle = prewarm_preset("deepseek-v3.2-tp8-bf16", max_rows=rows, max_width=4096)
    freeze()
    try:
        loaded = set(registry.loaded_specs())
        case = random_case(rows, HEADS, 2048, "bf16", seed=123, blocks=BIG, invalid_frac=0.1)
        p = sm.plan(sm.Caps(num_heads=HEADS, topk=2048, kv_format="bf16", max_rows=rows, mode="extend"))
        assert p.sort_rows and case.kv.numel() * case.kv.element_size() > p.l2_bytes
        scratch = torch.full((bundle.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
        out = torch.full((rows, HEADS, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((rows, HEADS), float("nan"), device="cuda")
        b = sm.bind(p, scratch=scratch, q=case.q, indices=case.indices, lengths=case.lengths, out=out, lse=lse)
        sm.run_extend(b, kv_cache=case.kv, sm_scale=case.sm_scale)
        torch.cuda.synchronize()
        assert set(registry.loaded_specs()) == loaded
        assert torch.equal(b.ordered, _ordered_rows(case.indices, case.lengths)), "the order kernel did not run"
        check(case, out, lse)
    finally:
        unfreeze()
