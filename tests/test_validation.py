"""Input validation of the sparse MLA facade, on CPU tensors (checks run before any launch)."""
import dataclasses

import pytest
import torch

from b12x.attention import sparse_mla as sm
from b12x.errors import InputError
from codegen.specs import SpecError

H, ROWS, W = 16, 3, 128


@pytest.fixture(scope="module")
def plan():
    return sm.plan(sm.Caps(num_heads=H, topk=256, max_rows=8, arch="sm_90a", num_sms=132))


def _inputs(rows=ROWS, width=W):
    return dict(q=torch.randn(rows, H, 576).bfloat16(), indices=torch.randint(0, 64, (rows, width), dtype=torch.int32),
                lengths=torch.full((rows,), width, dtype=torch.int32))


def _scratch(plan):
    return torch.empty(plan.scratch_bytes(), dtype=torch.uint8)


def test_bind_makes_views_of_scratch(plan):
    s = _scratch(plan)
    b = sm.bind(plan, scratch=s, **_inputs())
    for t in (b.out, b.lse, b.partial_o, b.partial_lse):
        assert t.untyped_storage().data_ptr() == s.untyped_storage().data_ptr()
    assert b.out.shape == (ROWS, H, 512) and b.lse.shape == (ROWS, H)
    assert b.tokens_per_split % 64 == 0 and b.partial_o.shape[1] * b.tokens_per_split >= W


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.update(q=d["q"].float()), r"q: expected dtype torch.bfloat16, got torch.float32"),
    (lambda d: d.update(q=torch.randn(ROWS, 32, 576).bfloat16()), r"q: expected shape \(\*, 16, 576\), got \(3, 32, 576\)"),
    (lambda d: d.update(q=torch.randn(ROWS, 576, H).bfloat16().transpose(1, 2)), r"q: expected a contiguous tensor"),
    (lambda d: d.update(q=torch.randn(9, H, 576).bfloat16()), r"q: expected at most Caps.max_rows=8 rows, got 9"),
    (lambda d: d.update(indices=d["indices"].long()), r"indices: expected dtype torch.int32, got torch.int64"),
    (lambda d: d.update(indices=d["indices"][:2]), r"indices: expected shape \(3, \*\), got \(2, 128\)"),
    (lambda d: d.update(indices=torch.zeros(ROWS, 100, dtype=torch.int32)), r"multiple of 64 in \[64, 256\], got 100"),
    (lambda d: d.update(indices=torch.zeros(ROWS, 320, dtype=torch.int32)), r"multiple of 64 in \[64, 256\], got 320"),
    (lambda d: d.update(lengths=d["lengths"][:1]), r"lengths: expected shape \(3,\), got \(1,\)"),
    (lambda d: d.update(out=torch.empty(ROWS, H, 512)), r"out: expected dtype torch.bfloat16, got torch.float32"),
    (lambda d: d.update(lse=torch.empty(ROWS, H + 1)), r"lse: expected shape \(3, 16\), got \(3, 17\)"),
    (lambda d: d.update(indices=d["indices"].to("meta")), r"indices: expected device cpu, got meta"),
])
def test_bind_rejects_bad_tensors(plan, mutate, match):
    d = _inputs()
    mutate(d)
    with pytest.raises(InputError, match=match):
        sm.bind(plan, scratch=_scratch(plan), **d)


def test_bind_names_q_when_only_q_is_off_cuda(plan):
    """q on the CPU beside CUDA tensors: the error is about q, not the first tensor compared
    with q's device. (Fake CUDA tensors stand in for real ones: bind only reads their metadata.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        on_cuda = dict(indices=torch.zeros(ROWS, W, dtype=torch.int32, device="cuda"),
                       lengths=torch.zeros(ROWS, dtype=torch.int32, device="cuda"))
        scratch = torch.empty(plan.scratch_bytes(), dtype=torch.uint8, device="cuda")
    with pytest.raises(InputError, match=r"^q: expected a CUDA tensor, got device cpu \(the other inputs are on cuda"):
        sm.bind(plan, scratch=scratch, q=_inputs()["q"], **on_cuda)


def test_run_needs_q_on_cuda(plan):
    b = sm.bind(plan, scratch=_scratch(plan), **_inputs())   # bind's checks run on CPU tensors
    with pytest.raises(InputError, match=r"^q: expected a CUDA tensor to launch on, got device cpu"):
        sm.run_decode(b, kv_cache=torch.zeros(2, 64, 656, dtype=torch.uint8), sm_scale=0.1)


def test_bind_rejects_small_scratch(plan):
    with pytest.raises(InputError, match=r"scratch: expected at least \d+ bytes \(plan.scratch_bytes\(\)\), got 10"):
        sm.bind(plan, scratch=torch.empty(10, dtype=torch.uint8), **_inputs())


@pytest.mark.parametrize("fmt,kv,match", [
    ("fp8_ds_mla", torch.zeros(4, 64, 576, dtype=torch.uint8), r"kv_cache: expected shape \(\*, 64, 656\)"),
    ("fp8_ds_mla", torch.zeros(4, 64, 656, dtype=torch.float16), r"kv_cache: expected dtype torch.uint8"),
    ("fp8_ds_mla", torch.zeros(4, 64, 700, dtype=torch.uint8)[..., :656], r"kv_cache: expected token stride 656"),
    ("fp8_ds_mla", torch.zeros(4 * 64 * 656 + 4, dtype=torch.uint8)[: 4 * 64 * 656].view(4, 64, 656)[:, :, :],
     None),
    ("bf16", torch.zeros(4, 64, 656, dtype=torch.uint8), r"kv_cache: expected dtype torch.bfloat16"),
    ("bf16", torch.zeros(4, 32, 576, dtype=torch.bfloat16), r"kv_cache: expected shape \(\*, 64, 576\)"),
])
def test_kv_cache_checks(fmt, kv, match):
    if match is None:
        sm.check_kv_cache(kv, fmt, kv.device)
        return
    with pytest.raises(InputError, match=match):
        sm.check_kv_cache(kv, fmt, kv.device)


def test_run_rejects_bad_scalars_and_sink(plan):
    b = sm.bind(plan, scratch=_scratch(plan), **_inputs())
    kv = torch.zeros(2, 64, 656, dtype=torch.uint8)
    with pytest.raises(InputError, match="sm_scale: expected a float > 0, got -1.0"):
        sm.run_decode(b, kv_cache=kv, sm_scale=-1.0)
    with pytest.raises(InputError, match="lse_base: expected 'e' or '2', got 'ten'"):
        sm.run_decode(b, kv_cache=kv, sm_scale=0.1, lse_base="ten")
    with pytest.raises(InputError, match=r"attn_sink: expected shape \(16,\), got \(8,\)"):
        sm.run_decode(b, kv_cache=kv, sm_scale=0.1, attn_sink=torch.zeros(8))


def test_caps_errors_name_the_field():
    with pytest.raises(SpecError, match="SparseMLASpec.num_heads: got 24"):
        sm.plan(sm.Caps(num_heads=24, arch="sm_90a", num_sms=132))
    with pytest.raises(InputError, match="Caps.max_batched: expected an int >= 1, got 0"), \
            pytest.warns(DeprecationWarning, match="max_batched"):   # the old name, spelled back
        sm.plan(sm.Caps(num_heads=16, max_batched=0, arch="sm_90a", num_sms=132))


def test_split_plan_fills_the_gpu_and_scratch_covers_every_row_count(plan):
    assert sm.split_plan(1, 2048, 132, 1) == (32, 64)      # one row: every tile its own CTA
    s, tps = sm.split_plan(4, 2048, 132, 2)
    assert 4 * 2 * s >= 64 and s * tps >= 2048
    assert sm.split_plan(512, 2048, 132, 2) == (1, 2048)   # many rows: no split
    need = max(r * plan.splits(r, 256)[0] for r in range(1, 9)) * H * 512 * 2
    assert plan.regions["partial_o"].nbytes == need


def test_8_head_fp8_calls_of_many_rows_run_the_warp_group_split():
    """The 8-head fp8_ds_mla decode module holds both split forms; the plan names the one a call
    runs by its row count, and the scratch covers the partials of either."""
    p = sm.plan(sm.Caps(num_heads=8, topk=2048, max_rows=256, arch="sm_90a", num_sms=132))
    assert p.warp_group_min_rows == 33 and p.warp_group_ctas_per_sm == 4
    from codegen.cute_blocks.sparse_mla import warp_group   # the kernel's launch bound is what the plan counts
    assert warp_group.CTAS_PER_SM == p.warp_group_ctas_per_sm
    assert [p.split_entry(r) for r in (1, 32, 33, 256)] == ["split", "split", "split_warp_group", "split_warp_group"]
    part = p.regions["partial_o"]
    assert part.numel >= max(r * p.splits(r, 2048)[0] for r in range(1, 257)) * 8 * 512
    for caps in (sm.Caps(num_heads=16, topk=2048, max_rows=256), sm.Caps(num_heads=8, kv_format="bf16", max_rows=256),
                 sm.Caps(num_heads=8, topk=2048, max_rows=256, arch="sm_120a")):
        q = sm.plan(dataclasses.replace(caps, arch=caps.arch or "sm_90a", num_sms=132))
        assert q.warp_group_min_rows == 0 and q.split_entry(256) == "split"


def test_one_split_pays_no_combine_for_whole_64_head_blocks():
    """A 64-head x 512-dim block's partials are the combine's cost, which one split does not pay:
    V4 sliding-window rows (2 tiles) of 32 requests x 64 heads (64 rows) and 16 x 128 run whole
    (measured 12.1 / 12.0 us against 14.1 / 13.4 at 2 splits); at 8 heads, whose partials are
    small, they keep 2 splits (8.2 against 9.0); V3.2 rows keep their plans at the benched sizes
    (32 rows x 16 heads: 4, see the next test)."""
    def splits(heads, rows, **kw):
        caps = sm.v4_caps(num_heads=heads, topk=512, page_size=256, max_rows=rows, **kw)
        return sm.plan(dataclasses.replace(caps, arch="sm_90a", num_sms=132)).splits(rows, 128)[0]
    assert splits(64, 64) == 1 and splits(128, 32) == 1 and splits(8, 64) == 2
    for heads, rows, want in ((128, 1, 32), (128, 8, 8), (128, 128, 1), (16, 32, 4)):
        p = sm.plan(sm.Caps(num_heads=heads, topk=2048, max_rows=rows, arch="sm_90a", num_sms=132))
        assert p.splits(rows, 2048)[0] == want, (heads, rows)


def test_register_form_plans_by_the_share_of_its_busiest_sm():
    """fp8_ds_mla at 8 and 16 heads (the register form, two CTAs an SM): split_plan's sm_share
    model, where a second resident CTA adds ~10% to the SM. Its plans at the decode grid's rows;
    the row counts where it moved the plan from the earlier short-split rule, each measured
    faster (docs/notes/launch-and-splits.md): 23 rows 5 -> 11 splits, 16 heads at 36 rows 4 -> 7,
    40 4 -> 3, 48 4 -> 5. model1_fp8 and bf16 plans keep the plain model. 8 heads from 33 rows run
    the warp-group split (its own share)."""
    for heads in (8, 16):
        p = sm.plan(sm.Caps(num_heads=heads, topk=2048, max_rows=128, arch="sm_90a", num_sms=132))
        assert p.sm_share == sm.REGISTER_SM_SHARE
        want = [32, 32, 16, 8, 4, 8, 4] if heads == 8 else [32, 32, 16, 8, 4, 4, 2]
        assert [p.splits(r, 2048)[0] for r in (1, 4, 8, 16, 32, 64, 128)] == want
        # between the grid's rows: the moved counts above and measured neighbours that kept theirs
        between = {23: 11, 24: 11, 28: 4} if heads == 8 else {23: 11, 36: 7, 40: 3, 48: 5, 60: 4, 72: 3, 96: 2}
        assert {r: p.splits(r, 2048)[0] for r in between} == between
        for caps in (sm.Caps(num_heads=heads, topk=2048, kv_format="bf16", max_rows=128),
                     sm.v4_caps(num_heads=heads, topk=512, page_size=256, extra_topk=8192, extra_page_size=2)):
            q = sm.plan(dataclasses.replace(caps, arch="sm_90a", num_sms=132))
            assert q.sm_share is None
            for rows in (8, 16, 32, 64):
                width = 2048 if q.caps.kv_format == "bf16" else 640
                assert q.splits(rows, width)[0] == sm.split_plan(
                    rows, width, 132, q.head_blocks, q.ctas_per_sm,
                    sm.partial_size(heads, q.head_block, q.caps.v_head_dim),
                    whole_row_cost=q.whole_row_cost)[0]


def test_fp8_32_heads_counts_the_faster_whole_row_form():
    """fp8 at 32 heads: one split runs the whole-row kernel in the producer form, whose tile
    costs less than the split form's (PRODUCER_WHOLE_ROW_COST); measured at 89-99 rows (1 split
    87 µs against 98-100 at 4) and 184-216 (171-173 against 177-208). Other plans count it at 1."""
    p = sm.plan(sm.Caps(num_heads=32, topk=2048, max_rows=256, arch="sm_90a", num_sms=132))
    assert p.whole_row and p.whole_row_cost == sm.PRODUCER_WHOLE_ROW_COST
    want = {48: 2, 72: 3, 96: 1, 112: 1, 160: 4, 184: 1, 216: 1}
    assert {r: p.splits(r, 2048)[0] for r in want} == want
    for heads, fmt in ((16, "fp8_ds_mla"), (64, "fp8_ds_mla"), (128, "fp8_ds_mla"), (64, "bf16"), (128, "bf16")):
        q = sm.plan(sm.Caps(num_heads=heads, topk=2048, kv_format=fmt, max_rows=8, arch="sm_90a", num_sms=132))
        assert q.whole_row_cost == 1.0, (heads, fmt)


def test_bf16_heads_as_n_counts_one_split_below_a_full_wave():
    """bf16 at 8/16/32 heads (heads as N, bound by HBM): split_plan counts one split a row at
    HEADS_N_BF16_WHOLE_ROW_COST, which moves 89-99 rows from 4 splits to 1 (measured at 96 rows:
    62.6 / 67.0 / 72.4 us against 65.3 / 70.4 / 77.2 at 8 / 16 / 32 heads); 88 rows keep 3 and the
    decode grid's rows keep theirs. One split runs the split kernel (extend tiles these differently)."""
    for heads in (8, 16, 32):
        p = sm.plan(sm.Caps(num_heads=heads, topk=2048, kv_format="bf16", max_rows=256, arch="sm_90a",
                            num_sms=132))
        assert p.whole_row_cost == sm.HEADS_N_BF16_WHOLE_ROW_COST and not p.whole_row
        want = {1: 32, 4: 32, 8: 16, 16: 8, 32: 4, 64: 2, 72: 3, 88: 3, 89: 1, 96: 1, 99: 1, 104: 1, 128: 1}
        assert {r: p.splits(r, 2048)[0] for r in want} == want, heads


def test_warp_group_plans_by_the_share_of_its_busiest_sm():
    """The 8-head warp group (4 CTAs an SM) is planned by split_plan's sm_share (WARP_GROUP_SM_SHARE):
    one wave's tile costs (2 + k) / 6 of a full wave's when the busiest SM holds k CTAs, more waves
    count whole. Row counts where that moved the plan, each measured faster (docs/notes/launch-and-splits.md):
    33 rows 11 -> 16 splits, 40 8 -> 11, 78 6 -> 5, 96 5 -> 4, 100 4 -> 5; 64 and 128 rows keep
    8 and 4. The scratch holds the partials of every row count."""
    p = sm.plan(sm.Caps(num_heads=8, topk=2048, max_rows=256, arch="sm_90a", num_sms=132))
    want = {33: 16, 40: 11, 48: 11, 64: 8, 72: 7, 78: 5, 88: 6, 96: 4, 100: 5, 105: 5, 108: 4, 128: 4, 192: 2, 256: 2}
    assert {r: p.splits(r, 2048)[0] for r in want} == want
    assert all(p.split_form(r)[1] == sm.WARP_GROUP_SM_SHARE for r in want)
    assert all(p.split_form(r)[1] == sm.REGISTER_SM_SHARE for r in (1, 32))
    for rows in range(33, 257):
        s, tps = p.splits(rows, 2048)
        assert s * tps >= 2048 and (s - 1) * tps < 2048, rows
        assert rows * s * 8 * 512 * 2 <= p.regions["partial_o"].nbytes, rows


def test_scratch_covers_every_width_and_row_count_of_a_two_list_plan():
    """The split cost model is not monotone in the width (a main list of 128 + 8192 extra entries
    wants more splits than the plan's widest 512 + 8192 row at some row counts): every bind's
    partials must fit the scratch, and the splits still cover the row."""
    for heads in (8, 32, 64, 128):
        caps = sm.v4_caps(num_heads=heads, topk=512, page_size=256, extra_topk=8192, extra_page_size=2, max_rows=12)
        p = sm.plan(dataclasses.replace(caps, arch="sm_90a", num_sms=132))
        for rows in range(1, 13):
            for width in range(128, 512 + 8192 + 1, 64):
                s, tps = p.splits(rows, width)
                assert s * tps >= width and (s - 1) * tps < width, (heads, rows, width, s, tps)
                assert rows * s * heads * 512 * 2 <= p.regions["partial_o"].nbytes, (heads, rows, width, s)


def test_extend_plan_and_routing():
    p = sm.plan(sm.Caps(num_heads=H, topk=256, max_rows=8192, mode="extend", arch="sm_90a", num_sms=132))
    # no per-split partials: extend writes out directly; fp8 KV keeps the caller's order
    assert set(p.regions) == {"out", "lse", "num_rows"}
    assert p.scratch_bytes() < 8192 * H * 512 * 2 + 8192 * H * 4 + 1024
    b = sm.bind(p, scratch=torch.empty(p.scratch_bytes(), dtype=torch.uint8), **_inputs())
    assert b.owns_num_rows and b.num_rows.shape == (1,)  # run_extend fills it; bind only makes views
    with pytest.raises(InputError, match="plan: expected a Caps\\(mode='decode'\\) plan for run_decode, got mode='extend'"):
        sm.run_decode(b, kv_cache=torch.zeros(2, 64, 656, dtype=torch.uint8), sm_scale=0.1)
    with pytest.raises(InputError, match="num_rows: only extend plans"):
        dec = sm.plan(sm.Caps(num_heads=H, topk=256, max_rows=8, arch="sm_90a", num_sms=132))
        sm.bind(dec, scratch=torch.empty(dec.scratch_bytes(), dtype=torch.uint8), **_inputs(),
                num_rows=torch.ones(1, dtype=torch.int32))
    assert sm.route(64, 1, num_heads=128, num_sms=132) == "decode"
    assert sm.route(4096, 4, num_heads=16, num_sms=132) == "extend"
    assert sm.route(8, 3, num_heads=16, num_sms=132) == "decode"  # too few rows to fill the GPU


def test_extend_sort_rows_plan_and_bind():
    """bf16 extend at 8-32 heads (the heads-as-N one-stage form, codegen.tiling sort_rows) holds a
    copy of the rows in cache order in its scratch; other forms hold none."""
    def caps(heads, fmt="bf16"):
        return sm.Caps(num_heads=heads, topk=2048, kv_format=fmt, max_rows=512, mode="extend", arch="sm_90a",
                       num_sms=132)
    for heads in (8, 16, 32):
        p = sm.plan(caps(heads))
        assert p.sort_rows and p.regions["ordered"].nbytes == 512 * 2048 * 4 and p.l2_bytes > 0
        q = torch.zeros(300, heads, 576, dtype=torch.bfloat16)
        b = sm.bind(p, scratch=torch.empty(p.scratch_bytes(), dtype=torch.uint8), q=q,
                    indices=torch.zeros(300, 1024, dtype=torch.int32), lengths=torch.zeros(300, dtype=torch.int32))
        assert b.ordered.shape == (300, 1024)
    for heads, fmt in ((64, "bf16"), (128, "bf16"), (8, "fp8_ds_mla"), (32, "fp8_ds_mla")):
        p = sm.plan(caps(heads, fmt))
        assert not p.sort_rows and "ordered" not in p.regions
    assert sm.ORDER_MIN_ROWS == 256


@pytest.mark.parametrize("heads,fmt,whole_row", [
    (128, "fp8_ds_mla", True), (64, "bf16", True), (16, "fp8_ds_mla", True),
    (32, "fp8_ds_mla", True),    # extend runs the producer form: faster for whole rows
    (32, "bf16", False), (16, "bf16", False),   # extend tiles bf16 at 16/32 heads differently
])
def test_which_decode_plans_hand_one_split_rows_to_the_extend_kernel(heads, fmt, whole_row):
    p = sm.plan(sm.Caps(num_heads=heads, kv_format=fmt, max_rows=8, arch="sm_90a", num_sms=132))
    assert p.whole_row is whole_row
    ext = sm.plan(sm.Caps(num_heads=heads, kv_format=fmt, max_rows=8, mode="extend", arch="sm_90a", num_sms=132))
    assert ext.head_blocks == -(-heads // 64)    # 16/32 heads: one block, native or 64 rows wide


def test_combine_kernel_by_split_count():
    """Up to COMBINE_FEW_SPLITS splits run the 34-register combine (grids of many CTAs), more run
    the one that loads every split before the weights; small batches get the latter."""
    assert [sm.combine_entry(s) for s in (2, 3, 4, 5, 8, 16, 32)] == ["combine"] * 3 + ["combine_many_splits"] * 4
    p = sm.plan(sm.Caps(num_heads=128, kv_format="fp8_ds_mla", max_rows=128, arch="sm_90a", num_sms=132))
    assert sm.combine_entry(p.splits(4, 2048)[0]) == "combine_many_splits"
    assert sm.combine_entry(p.splits(32, 2048)[0]) == "combine"

