"""Sparse MLA decode on the GPU against the torch reference, from artifacts built ahead of time.

Run on a GPU box after `b12x-codegen build --preset sparse-mla-all` (B12X_CACHE_DIR set to
the same cache)."""
import math

import pytest
import torch

from b12x.attention import sparse_mla as sm

from .sparse_mla_cases import Case, assert_no_allocation, capture_allocation_free, check, random_case, run_ours

pytestmark = pytest.mark.gpu

HEADS = (8, 16, 32, 64, 128)
FORMATS = ("fp8_ds_mla", "bf16")


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("width", (512, 1024, 1536, 2048))
def test_matches_reference(kv_format, heads, width):
    case = random_case(3, heads, width, kv_format, seed=heads * 7 + width)
    out, lse = run_ours(case, kv_format)
    check(case, out, lse)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", HEADS)
def test_lse_base2_and_sink(kv_format, heads):
    case = random_case(5, heads, 1024, kv_format, seed=11)
    sink = torch.randn(heads, device="cuda") * 2
    out, lse = run_ours(case, kv_format, sink=sink, lse_base="2")
    check(case, out, lse, sink=sink, lse_base="2")


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", (8, 16, 128))
def test_edge_cases(kv_format, heads):
    case = random_case(6, heads, 512, kv_format, seed=3, invalid_frac=0.3)
    case.lengths[1] = 0                  # zero-length row: out 0, lse -inf
    case.indices[2] = -1                 # all-invalid row
    case.indices[3, :100] = case.indices[3, 0].clamp(min=0)  # duplicates count each time
    case.lengths[4] = 4096               # lengths beyond the width clamp to it
    case.lengths[5] = 1                  # a single token
    out, lse = run_ours(case, kv_format)
    check(case, out, lse)
    assert torch.all(out[1:3] == 0) and torch.all(lse[1:3] == -math.inf)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", (8, 16, 128))
@pytest.mark.parametrize("num_sms", (132, 32, 16))
def test_both_combine_kernels(kv_format, heads, num_sms):
    """Few splits (<= COMBINE_FEW_SPLITS) run "combine", more run "combine_many_splits"; plans for
    fewer SMs give fewer splits. Sink and base-2 lse go through either."""
    splits = sm.plan(sm.Caps(num_heads=heads, kv_format=kv_format, max_rows=4, num_sms=num_sms)).splits(4, 1024)[0]
    assert splits > 1
    case = random_case(4, heads, 1024, kv_format, seed=num_sms + heads)
    sink = torch.randn(heads, device="cuda")
    out, lse = run_ours(case, kv_format, sink=sink, lse_base="2", num_sms=num_sms)
    check(case, out, lse, sink=sink, lse_base="2")


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", (16, 32, 128))
def test_one_split_runs_the_whole_row_kernel(kv_format, heads):
    """When the rows alone fill the GPU (here: a plan for one SM) a row gets one split, and
    decode runs the extend kernel, which writes out, lse and the sink itself (where extend runs
    the same tile loop or the producer form, as fp8 at 32 heads does; bf16 at 16/32 heads keeps
    split + combine)."""
    assert sm.plan(sm.Caps(num_heads=heads, kv_format=kv_format, max_rows=4, num_sms=1)).splits(4, 1024)[0] == 1
    case = random_case(4, heads, 1024, kv_format, seed=21)
    case.lengths[1] = 0
    sink = torch.randn(heads, device="cuda")
    for base in ("e", "2"):
        out, lse = run_ours(case, kv_format, sink=sink, lse_base=base, num_sms=1)
        check(case, out, lse, sink=sink, lse_base=base)
        assert torch.all(out[1] == 0) and torch.all(lse[1] == -math.inf)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", (8, 64))
def test_page_strided_cache_view(kv_format, heads):
    case = random_case(4, heads, 1024, kv_format, seed=5, page_stride_pad=4096)
    assert not case.kv.is_contiguous()
    out, lse = run_ours(case, kv_format)
    check(case, out, lse)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", (8, 16))
def test_addresses_beyond_2gib(kv_format, heads):
    rec = 656 if kv_format == "fp8_ds_mla" else 1152
    blocks = (2**31) // (64 * rec) + 2048  # > 2 GiB of cache
    small = random_case(3, heads, 512, kv_format, blocks=256, seed=9)
    big = torch.empty((blocks,) + tuple(small.kv.shape[1:]), dtype=small.kv.dtype, device="cuda")
    big[-256:] = small.kv                  # the data lives past 2^31 bytes
    assert big[-256:].data_ptr() - big.data_ptr() > 2**31
    small.indices = torch.where(small.indices >= 0, small.indices + (blocks - 256) * 64, small.indices)
    ref_kv = small.kv_ref
    case = Case(small.q, big, ref_kv, small.indices, small.lengths)
    out, lse = run_ours(case, kv_format)
    # the reference reads the small copy with the original slots
    ref_case = Case(small.q, small.kv, ref_kv, torch.where(small.indices >= 0, small.indices - (blocks - 256) * 64,
                                                            small.indices), small.lengths)
    check(ref_case, out, lse)
    del big


def _capture_and_replay(case, fresh, kv_format):
    """run_decode allocates nothing, captures into a graph, and the replay over `fresh`'s inputs
    copied in place matches the reference."""
    rows, heads = case.q.shape[:2]
    p = sm.plan(sm.Caps(num_heads=heads, topk=2048, kv_format=kv_format, max_rows=rows))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device="cuda")
    b = sm.bind(p, scratch=scratch, q=case.q, indices=case.indices, lengths=case.lengths, out=out)
    run = lambda: sm.run_decode(b, kv_cache=case.kv, sm_scale=case.sm_scale)  # noqa: E731
    graph = capture_allocation_free(run, "run_decode")
    # new inputs in place, then replay
    case.q.copy_(fresh.q)
    case.indices.copy_(fresh.indices)
    case.lengths.copy_(fresh.lengths)
    out.fill_(float("nan"))
    assert_no_allocation(graph.replay, "the replay")
    check(Case(case.q, case.kv, case.kv_ref, case.indices, case.lengths), out, b.lse)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", (8, 32))
def test_cuda_graph_capture_replay_without_allocation(kv_format, heads):
    _capture_and_replay(random_case(8, heads, 2048, kv_format, seed=21), random_case(8, heads, 2048, kv_format, seed=22),
                        kv_format)


WG_ROWS = 64   # calls of the 8-head fp8 plan's warp_group_min_rows (33) rows or more run that split


def _warp_group_case(seed, **kw):
    """64 rows x 8 heads over fp8_ds_mla (the warp-group split) with every edge case in its rows:
    zero length, all -1, duplicates, lengths past the width, one token, ids past the cache."""
    case = random_case(WG_ROWS, 8, 2048, "fp8_ds_mla", seed=seed, invalid_frac=0.2, **kw)
    slots = case.kv.shape[0] * 64
    case.lengths[1] = 0
    case.indices[2] = -1
    case.indices[3, :300] = case.indices[3, 0].clamp(min=0)
    case.lengths[4] = 4096
    case.lengths[5] = 1
    case.indices[6, ::3] = slots + torch.arange(0, 2048, 3, device="cuda", dtype=torch.int32)
    case.indices[7, 5] = -7
    return case


def test_warp_group_split_is_the_one_that_runs():
    p = sm.plan(sm.Caps(num_heads=8, topk=2048, max_rows=WG_ROWS))
    assert p.warp_group_min_rows <= WG_ROWS and p.split_entry(WG_ROWS) == "split_warp_group"
    assert "split_warp_group" in p.kernels.functions


@pytest.mark.parametrize("sink,lse_base", [(False, "e"), (True, "2")])
def test_warp_group_split_matches_reference(sink, lse_base):
    case = _warp_group_case(31 + int(sink))
    s = torch.randn(8, device="cuda") * 2 if sink else None
    out, lse = run_ours(case, "fp8_ds_mla", sink=s, lse_base=lse_base)
    check(case, out, lse, sink=s, lse_base=lse_base)
    assert torch.all(out[1:3] == 0) and torch.all(lse[1:3] == -math.inf)


def _check_planned_rows(rows, heads, kv_format):
    """A call of `rows` rows at its planned split count, against the reference: a zero-length row,
    a row that ends inside a split, sink and base-2 lse."""
    case = random_case(rows, heads, 2048, kv_format, seed=rows + heads, invalid_frac=0.1)
    case.lengths[1] = 0
    case.lengths[2] = 700
    s = torch.randn(heads, device="cuda") * 2
    out, lse = run_ours(case, kv_format, sink=s, lse_base="2")
    check(case, out, lse, sink=s, lse_base="2")
    assert torch.all(out[1] == 0) and torch.all(lse[1] == -math.inf)


@pytest.mark.parametrize("heads,rows", [(8, 33), (8, 40), (8, 100), (8, 23), (16, 36), (16, 40)])
def test_split_counts_of_the_share_model(heads, rows):
    """Row counts whose plans split 16, 11, 5 (the 8-head warp group), 11, 7 and 3 ways (the
    register form) under split_plan's sm_share, sink and base-2 lse, against the reference."""
    p = sm.plan(sm.Caps(num_heads=heads, topk=2048, max_rows=rows))
    assert p.split_entry(rows) == ("split_warp_group" if heads == 8 and rows >= 33 else "split")
    assert p.splits(rows, 2048)[0] == {(8, 33): 16, (8, 40): 11, (8, 100): 5, (8, 23): 11, (16, 36): 7,
                                       (16, 40): 3}[(heads, rows)]
    _check_planned_rows(rows, heads, "fp8_ds_mla")


@pytest.mark.parametrize("heads", [8, 32])
def test_bf16_heads_as_n_one_split_rows(heads):
    """bf16 at 8-32 heads, 96 rows: one split a row (HEADS_N_BF16_WHOLE_ROW_COST), the split kernel
    over all 32 tiles and a one-split combine, sink and base-2 lse, against the reference."""
    p = sm.plan(sm.Caps(num_heads=heads, topk=2048, kv_format="bf16", max_rows=96))
    assert p.splits(96, 2048)[0] == 1 and not p.whole_row
    _check_planned_rows(96, heads, "bf16")


def test_warp_group_split_page_strided_view_past_2gib():
    """A page-strided view whose data lives past 2^31 bytes, read by the warp-group split."""
    small = _warp_group_case(37, blocks=256, page_stride_pad=4096)
    assert not small.kv.is_contiguous()
    rec = small.kv.stride(0)
    blocks = (2**31) // rec + 512
    big = torch.empty(blocks, rec, dtype=torch.uint8, device="cuda")
    big.fill_(0x7F)
    view = big[:, : 64 * 656].view(blocks, 64, 656)
    view[-256:] = small.kv
    assert view[-256:].data_ptr() - view.data_ptr() > 2**31 and not view.is_contiguous()
    shift = (blocks - 256) * 64
    idx = small.indices
    past = idx >= 256 * 64     # past the small cache: past the big one too
    moved = torch.where(past, idx - 256 * 64 + blocks * 64, torch.where(idx >= 0, idx + shift, idx))
    case = Case(small.q, view, small.kv_ref, moved, small.lengths)
    out, lse = run_ours(case, "fp8_ds_mla")
    check(small, out, lse)
    del big, view


def test_warp_group_split_graph_replay_without_allocation():
    _capture_and_replay(_warp_group_case(41), _warp_group_case(42), "fp8_ds_mla")


@pytest.mark.parametrize("heads", (8, 16, 64))
def test_block_scales_and_q_magnitudes(heads):
    """fp8_ds_mla's four 128-dim blocks at very different magnitudes (each token's scales
    differ by 30x) and q heads from 1e-2 to 30 times randn, one head all zeros: a scale applied
    to the wrong block, or q losing range or precision in the MMA operand type, shows here
    (random_case's blocks all have about the same scale)."""
    from b12x.reference import dequantize_fp8_ds_mla, quantize_fp8_ds_mla

    g = torch.Generator(device="cuda").manual_seed(41 + heads)
    k = torch.randn(64, 64, 576, device="cuda", generator=g)
    k[..., :512] *= torch.tensor([0.1, 3.0, 1.0, 0.3], device="cuda").repeat_interleave(128)
    case = random_case(6, heads, 1024, "fp8_ds_mla", seed=heads)
    case.kv = quantize_fp8_ds_mla(k)
    case.kv_ref = dequantize_fp8_ds_mla(case.kv)
    mags = torch.logspace(-2, math.log10(30.0), heads, device="cuda")
    mags[1] = 0.0
    case.q = (case.q.float() * mags[None, :, None]).bfloat16()
    out, lse = run_ours(case, "fp8_ds_mla")
    check(case, out, lse)


@pytest.mark.parametrize("kv_format", FORMATS)
def test_run_to_run_determinism(kv_format):
    case = random_case(16, 64, 2048, kv_format, seed=31)
    a = run_ours(case, kv_format)
    b = run_ours(case, kv_format)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_custom_op_matches_facade():
    case = random_case(4, 16, 512, "fp8_ds_mla", seed=41)
    p = sm.plan(sm.Caps(num_heads=16, topk=2048, max_rows=4))  # width 512 on the catalog's top-k 2048 bundle
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    out = torch.empty(4, 16, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(4, 16, device="cuda")
    torch.ops.b12x.sparse_mla_decode(case.q, case.kv, case.indices, case.lengths, scratch, out, lse,
                                     case.sm_scale, None, True, "fp8_ds_mla", 2048, 4)
    check(case, out, lse)


def test_frozen_after_prewarm():
    from b12x import freeze, unfreeze
    from b12x.errors import KernelResolutionFrozenError
    from b12x.prewarm import prewarm_sparse_mla

    prewarm_sparse_mla(num_heads=16, kv_format="fp8_ds_mla", max_rows=8)
    freeze()
    try:
        case = random_case(2, 16, 512, "fp8_ds_mla", seed=51)
        out, lse = run_ours(case, "fp8_ds_mla")
        check(case, out, lse)
        with pytest.raises(KernelResolutionFrozenError, match="topk.:1024"):
            sm.plan(sm.Caps(num_heads=16, topk=1024)).kernels
    finally:
        unfreeze()
