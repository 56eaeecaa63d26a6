"""Sparse MLA extend (prefill chunks, MTP verify): many query rows, each with its own indices."""
import dataclasses
import math

import pytest
import torch

from b12x.attention import sparse_mla as sm

from .sparse_mla_cases import Case, assert_no_allocation, capture_allocation_free, check, random_case, run_ours

pytestmark = pytest.mark.gpu

HEADS = (8, 16, 32, 64, 128)
FORMATS = ("fp8_ds_mla", "bf16")


def _slice(case: Case, n: int) -> Case:
    return Case(case.q[:n], case.kv, case.kv_ref, case.indices[:n], case.lengths[:n], case.sm_scale)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("width", (512, 1024, 2048))
def test_matches_reference(kv_format, heads, width):
    case = random_case(37, heads, width, kv_format, seed=heads + width, blocks=128)
    out, lse = run_ours(case, kv_format, mode="extend")
    check(case, out, lse)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("rows", (1, 8192))
def test_row_counts(kv_format, rows):
    case = random_case(rows, 16, 512, kv_format, seed=rows, blocks=512)
    out, lse = run_ours(case, kv_format, mode="extend")
    check(case, out, lse)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", (8, 16, 32, 128))   # 32: fp8 runs the heads-as-N producer form
def test_edge_cases_sink_and_base2(kv_format, heads):
    case = random_case(6, heads, 512, kv_format, seed=3, invalid_frac=0.3)
    case.lengths[1] = 0
    case.indices[2] = -1
    case.indices[3, :100] = case.indices[3, 0].clamp(min=0)
    case.lengths[4] = 4096
    case.lengths[5] = 1
    sink = torch.randn(heads, device="cuda")
    out, lse = run_ours(case, kv_format, mode="extend", sink=sink, lse_base="2")
    check(case, out, lse, sink=sink, lse_base="2")
    assert torch.all(out[1:3] == 0) and torch.all(lse[1:3] == -math.inf)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", (8, 64))
def test_page_strided_and_beyond_2gib(kv_format, heads):
    case = random_case(9, heads, 1024, kv_format, seed=5, page_stride_pad=4096)
    out, lse = run_ours(case, kv_format, mode="extend")
    check(case, out, lse)
    rec = 656 if kv_format == "fp8_ds_mla" else 1152
    blocks = (2**31) // (64 * rec) + 2048
    small = random_case(5, min(heads, 32), 512, kv_format, blocks=256, seed=9)
    big = torch.empty((blocks,) + tuple(small.kv.shape[1:]), dtype=small.kv.dtype, device="cuda")
    big[-256:] = small.kv
    far = torch.where(small.indices >= 0, small.indices + (blocks - 256) * 64, small.indices)
    out, lse = run_ours(Case(small.q, big, small.kv_ref, far, small.lengths), kv_format, mode="extend")
    check(small, out, lse)


def test_mtp_verify_goes_through_extend():
    """B requests x next_n = 3 verify rows, each row with its own top-k indices and length."""
    reqs, next_n, heads = 8, 3, 16
    case = random_case(reqs * next_n, heads, 2048, "fp8_ds_mla", seed=17, blocks=256)
    case.lengths.copy_(torch.tensor([1000 + 3 * r + i for r in range(reqs) for i in range(next_n)],
                                    dtype=torch.int32).clamp(max=2048))
    assert sm.route(reqs * next_n, next_n, num_heads=heads, num_sms=16) == "extend"
    out, lse = run_ours(case, "fp8_ds_mla", mode="extend")
    check(case, out, lse)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", (8, 32))
def test_capacity_grid_graph_capture_without_allocation(kv_format, heads):
    cap = 64
    case = random_case(cap, heads, 1024, kv_format, seed=23)
    p = sm.plan(sm.Caps(num_heads=heads, topk=2048, kv_format=kv_format, max_rows=cap, mode="extend"))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    out = torch.full((cap, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((cap, heads), float("nan"), device="cuda")
    live = torch.tensor([cap], dtype=torch.int32, device="cuda")
    b = sm.bind(p, scratch=scratch, q=case.q, indices=case.indices, lengths=case.lengths, out=out, lse=lse,
                num_rows=live)
    run = lambda: sm.run_extend(b, kv_cache=case.kv, sm_scale=case.sm_scale)  # noqa: E731
    graph = capture_allocation_free(run, "run_extend")
    # replay with fewer live rows: rows past the count are left alone
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    live.fill_(20)
    assert_no_allocation(graph.replay, "the replay")
    check(_slice(case, 20), out[:20], lse[:20])
    assert out[20:].isnan().all() and lse[20:].isnan().all()


@pytest.mark.parametrize("kv_format", FORMATS)
def test_determinism(kv_format):
    case = random_case(64, 128, 2048, kv_format, seed=31)
    a = run_ours(case, kv_format, mode="extend")
    b = run_ours(case, kv_format, mode="extend")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_extend_matches_decode():
    case = random_case(24, 64, 2048, "fp8_ds_mla", seed=41)
    d = run_ours(case, "fp8_ds_mla", mode="decode")
    e = run_ours(case, "fp8_ds_mla", mode="extend")
    torch.testing.assert_close(d[0].float(), e[0].float(), atol=2e-2, rtol=2e-2)


BIG = 1100     # cache blocks: 81 MB of bf16 records, beyond L2, where run_extend sorts the rows


def _ordered_rows(indices, lengths):
    """What the order kernel writes: the first `length` entries of each row stably by bucket (the
    row's live range [lo, hi] of non-negative ids cut at 2^shift ids a bucket, at most 128 buckets;
    -1 and other negative ids last), -1 past them."""
    width = indices.shape[1]
    n = lengths.clamp(0, width).long()
    idx = indices.long()
    live = torch.arange(width, device=indices.device)[None, :] < n[:, None]
    valid = live & (idx >= 0)
    big = torch.iinfo(torch.int64).max
    lo = torch.where(valid, idx, big).min(dim=1).values
    hi = torch.where(valid, idx, -1).max(dim=1).values
    span = (hi - lo).clamp(min=0)
    bits = torch.stack([(span >> k) > 0 for k in range(32)]).sum(dim=0)
    shift = (bits - 7).clamp(min=0)
    bucket = torch.where(valid, (idx - lo[:, None]) >> shift[:, None], 255)
    bucket = torch.where(live, bucket, 256)
    order = torch.sort(bucket, dim=1, stable=True).indices
    out = torch.gather(indices, 1, order)
    return out.masked_fill(~live, -1)


@pytest.mark.parametrize("heads,width,cap", [(h, w, 2048) for h in (8, 16, 32) for w in (1344, 2048)]
                         + [(16, 4992, 8192), (16, 8192, 8192)])
def test_rows_in_cache_order(heads, width, cap):
    """bf16 extend at 8-32 heads with ORDER_MIN_ROWS rows or more over a cache beyond L2 puts each
    row's entries in cache order in the scratch (the "order" kernel) before the attention kernel
    reads them, with every edge case the kernel masks: -1 and other negative ids, ids past the cache, lengths
    of 0, under the width and past it, all-invalid rows, duplicates. The same call with the sort
    off (a plan that takes the cache for L2-resident) gives the same result up to the sum order."""
    rows = sm.ORDER_MIN_ROWS + 44
    case = random_case(rows, heads, width, "bf16", seed=heads + width, blocks=BIG, invalid_frac=0.2)
    g = torch.Generator(device="cuda").manual_seed(width)
    case.indices[torch.rand(case.indices.shape, device="cuda", generator=g) < 0.05] = BIG * 64 + 7  # past the cache
    case.indices[:, 5] = -7
    case.lengths[0] = 0
    case.lengths[1] = width + 999
    case.lengths[2] = 1
    case.indices[3] = -1
    case.indices[4, :300] = case.indices[4, 300]
    case.lengths[5] = 65
    p = sm.plan(sm.Caps(num_heads=heads, topk=cap, kv_format="bf16", max_rows=rows, mode="extend"))
    assert p.sort_rows and case.kv.numel() * 2 > p.l2_bytes
    scratch = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
    out = torch.full((rows, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((rows, heads), float("nan"), device="cuda")
    idx = case.indices.clone()
    b = sm.bind(p, scratch=scratch, q=case.q, indices=idx, lengths=case.lengths, out=out, lse=lse)
    sm.run_extend(b, kv_cache=case.kv, sm_scale=case.sm_scale)
    torch.cuda.synchronize()
    assert torch.equal(idx, case.indices), "the caller's indices were written"
    assert torch.equal(b.ordered, _ordered_rows(case.indices, case.lengths))
    check(case, out, lse)
    assert torch.all(out[0] == 0) and torch.all(lse[0] == -math.inf)
    assert torch.all(out[3] == 0) and torch.all(lse[3] == -math.inf)
    unsorted = dataclasses.replace(p, l2_bytes=2**62)
    given, _ = sm.run_extend(sm.bind(unsorted, scratch=torch.empty_like(scratch), q=case.q, indices=case.indices,
                                     lengths=case.lengths), kv_cache=case.kv, sm_scale=case.sm_scale)
    torch.testing.assert_close(out.float(), given.float(), atol=2e-3 * given.float().abs().max().item(), rtol=1e-2)


@pytest.mark.parametrize("heads", (8, 32))
def test_rows_in_cache_order_capacity_graph(heads):
    """The order kernel inside a captured graph over a capacity grid: no allocation, rows past the
    live count untouched, fresh indices copied in before each replay."""
    cap = 400
    case = random_case(cap, heads, 2048, "bf16", seed=heads, blocks=BIG)
    p = sm.plan(sm.Caps(num_heads=heads, topk=2048, kv_format="bf16", max_rows=cap, mode="extend"))
    assert p.sort_rows
    scratch = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
    out = torch.full((cap, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((cap, heads), float("nan"), device="cuda")
    live = torch.tensor([cap], dtype=torch.int32, device="cuda")
    idx = case.indices.clone()
    b = sm.bind(p, scratch=scratch, q=case.q, indices=idx, lengths=case.lengths, out=out, lse=lse, num_rows=live)
    run = lambda: sm.run_extend(b, kv_cache=case.kv, sm_scale=case.sm_scale)  # noqa: E731
    graph = capture_allocation_free(run, "run_extend")
    fresh = random_case(cap, heads, 2048, "bf16", seed=heads + 99, blocks=16)
    fresh = Case(case.q, case.kv, case.kv_ref, fresh.indices * (BIG // 16), fresh.lengths, case.sm_scale)
    for n in (300, 257):
        idx.copy_(fresh.indices)
        case.lengths.copy_(fresh.lengths)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        live.fill_(n)
        assert_no_allocation(graph.replay, "the replay")
        check(_slice(fresh, n), out[:n], lse[:n])
        assert out[n:].isnan().all() and lse[n:].isnan().all()
