"""The upstream-named sparse MLA layer (b12x.integration.sparse_mla_scratch / .mla) on the CPU:
the keyword names and defaults the vLLM B12X backend uses, the head-count padding, forced split
counts, and clear errors before any launch (docs/notes/upstream-b12x-surface.md)."""
import inspect

import pytest
import torch

import b12x
from b12x.attention import sparse_mla as sm
from b12x.errors import InputError
from b12x.integration import mla
from b12x.integration.sparse_mla_scratch import B12XSparseMLAScratchCaps, native_heads, plan_sparse_mla_scratch


@pytest.fixture(autouse=True)
def _h200(monkeypatch):
    monkeypatch.setattr(sm, "device_arch", lambda: "sm_90a")
    monkeypatch.setattr(sm, "device_num_sms", lambda: 132)


def _caps(**kw):
    base = dict(device="cpu", num_q_heads=16, max_q_rows=8, max_width=2048, kv_dtype=torch.uint8, mode="decode",
                max_chunks_per_row=32)
    base.update(kw)
    return B12XSparseMLAScratchCaps(**base)


def _bind(plan, rows=3, heads=None, width=2048):
    heads = heads or plan.caps.num_q_heads
    return plan.bind(scratch=torch.zeros(plan.layout.nbytes, dtype=torch.uint8),
                     q=torch.zeros(rows, heads, 576, dtype=torch.bfloat16),
                     selected_indices=torch.zeros(rows, width, dtype=torch.int32),
                     cache_seqlens_int32=torch.zeros(rows, dtype=torch.int32),
                     nsa_cache_seqlens_int32=torch.zeros(rows, dtype=torch.int32))


def test_caps_defaults_and_normalisation_are_upstreams():
    c = B12XSparseMLAScratchCaps(device="cpu", num_q_heads=0, max_q_rows=4, max_width=2048)
    assert (c.dtype, c.kv_dtype, c.head_dim, c.v_head_dim, c.mode) == (torch.bfloat16, torch.bfloat16, 576, 512,
                                                                       "decode")
    assert (c.num_q_heads, c.max_batch, c.max_chunks_per_row, c.page_size, c.max_page_table_width) == (1, 4, 64, 64,
                                                                                                     2048)
    with pytest.raises(TypeError):
        B12XSparseMLAScratchCaps(device="cpu", num_q_heads=16, max_q_rows=4, max_width=2048, arch="sm_90a")


def test_the_backends_keywords():
    bind = inspect.signature(plan_sparse_mla_scratch(_caps()).bind).parameters
    assert set(bind) == {"scratch", "q", "selected_indices", "cache_seqlens_int32", "nsa_cache_seqlens_int32"}
    dec = inspect.signature(mla.sparse_mla_decode_forward).parameters
    assert {"binding", "kv_cache", "sm_scale", "v_head_dim", "return_lse", "lse_scale", "attn_sink",
            "forced_num_splits", "identity_page_table", "backend", "q_all", "page_table_1"} <= set(dec)
    assert dec["lse_scale"].default == "base2" and dec["return_lse"].default is False
    ext = inspect.signature(mla.sparse_mla_extend_forward).parameters
    assert "forced_num_splits" not in ext and "attn_sink" not in ext
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in dec.values())
    assert b12x.freeze_kernel_resolution and b12x.kernel_resolution_frozen and b12x.unfreeze_kernel_resolution


def test_layout_and_native_heads():
    p = plan_sparse_mla_scratch(_caps())
    assert p.layout.nbytes >= p.inner.scratch_bytes() and p.shapes_and_dtypes() == (((p.layout.nbytes,), torch.uint8),)
    assert not p.padded and p.inner.caps.max_splits == 32
    assert [native_heads(h) for h in (8, 16, 24, 32, 40, 48, 64, 72, 96, 128)] == [8, 16, 32, 32, 64, 64, 64, 128,
                                                                                   128, 128]
    for h in (0, 12, 136):
        with pytest.raises(InputError, match="num_q_heads"):
            plan_sparse_mla_scratch(_caps(num_q_heads=h))
    ext = plan_sparse_mla_scratch(_caps(mode="verify"))
    assert ext.mode == "extend" and ext.inner.caps.max_splits == 0


def test_padded_heads_run_on_the_next_native_count(caplog):
    with caplog.at_level("INFO", logger="b12x"):
        p = plan_sparse_mla_scratch(_caps(num_q_heads=24))
    assert "num_q_heads=24 runs on 32 heads" in caplog.text
    assert p.padded and p.inner.caps.num_heads == 32
    b = _bind(p)
    assert b.inner.q.shape == (3, 32, 576) and b.out.shape == (3, 24, 512) and b.lse.shape == (3, 24)
    assert b.inner.q.data_ptr() != b.q.data_ptr()


@pytest.mark.parametrize("field,value,match", [
    ("kv_dtype", torch.float16, "kv_dtype"), ("head_dim", 512, "head_dim"), ("v_head_dim", 448, "v_head_dim"),
    ("page_size", 256, "page_size"), ("mode", "prefill", "mode"), ("max_width", 16384, "max_width"),
    ("dtype", torch.float16, "dtype")])
def test_caps_outside_what_runs_here_are_named(field, value, match):
    with pytest.raises(InputError, match=match):
        plan_sparse_mla_scratch(_caps(**{field: value}))


def test_bind_errors_name_the_tensor():
    p = plan_sparse_mla_scratch(_caps())
    with pytest.raises(InputError, match="q: expected num_q_heads=16"):
        _bind(p, heads=32)
    with pytest.raises(InputError, match="selected_indices: expected a width"):
        _bind(p, width=100)
    with pytest.raises(InputError, match="q: expected at most max_q_rows"):
        _bind(p, rows=9)
    with pytest.raises(InputError, match="scratch: expected at least"):
        p.bind(scratch=torch.zeros(16, dtype=torch.uint8), q=torch.zeros(1, 16, 576, dtype=torch.bfloat16),
               selected_indices=torch.zeros(1, 64, dtype=torch.int32), cache_seqlens_int32=torch.zeros(1, dtype=torch.int32),
               nsa_cache_seqlens_int32=torch.zeros(1, dtype=torch.int32))
    b = p.bind(scratch={"sparse_mla.scratch": torch.zeros(p.layout.nbytes, dtype=torch.uint8)},
               q=torch.zeros(1, 16, 576, dtype=torch.bfloat16), selected_indices=torch.zeros(1, 64, dtype=torch.int32),
               cache_seqlens_int32=torch.zeros(1, dtype=torch.int32), nsa_cache_seqlens_int32=torch.zeros(1, dtype=torch.int32))
    assert b.out.shape == (1, 16, 512)


def test_forward_refusals_come_before_any_launch():
    p = plan_sparse_mla_scratch(_caps())
    b = _bind(p)
    kv = torch.zeros(64, 1, 656, dtype=torch.uint8)
    with pytest.raises(TypeError, match="requires binding"):
        mla.sparse_mla_decode_forward(kv_cache=kv, sm_scale=0.1)
    with pytest.raises(ValueError, match="q_all"):
        mla.sparse_mla_decode_forward(binding=b, q_all=b.q, kv_cache=kv, sm_scale=0.1)
    for kw, match in ((dict(identity_page_table=True), "identity_page_table"), (dict(lse_scale="log10"), "lse_scale"),
                      (dict(backend="sm90"), "backend"), (dict(forced_num_splits=0), "forced_num_splits"),
                      (dict(v_head_dim=448), "v_head_dim")):
        with pytest.raises(InputError, match=match):
            mla.sparse_mla_decode_forward(binding=b, kv_cache=kv, sm_scale=0.1, **kw)
    with pytest.raises(InputError, match="kv_cache"):
        mla.sparse_mla_decode_forward(binding=b, kv_cache=torch.zeros(10, 1, 656, dtype=torch.uint8), sm_scale=0.1)
    with pytest.raises(InputError, match="mode"):
        mla.sparse_mla_extend_forward(binding=b, kv_cache=kv, sm_scale=0.1)
    # upstream's default max_chunks_per_row (64) on a 4096-wide row: 64 splits, more than merge here
    wide = plan_sparse_mla_scratch(_caps(max_width=4096, max_chunks_per_row=64))
    with pytest.raises(InputError, match="forced_num_splits: expected at most 32"):
        mla.sparse_mla_decode_forward(binding=_bind(wide, width=4096), kv_cache=kv, sm_scale=0.1,
                                      forced_num_splits=64)


def test_forced_splits_in_our_bind():
    p = sm.plan(sm.Caps(num_heads=16, topk=2048, max_rows=128, max_splits=32))
    scratch = torch.zeros(p.scratch_bytes(), dtype=torch.uint8)
    q = torch.zeros(128, 16, 576, dtype=torch.bfloat16)
    idx = torch.zeros(128, 2048, dtype=torch.int32)
    n = torch.zeros(128, dtype=torch.int32)
    assert p.bind(scratch, q=q, indices=idx, lengths=n).partial_o.shape[1] < 32      # the planner's
    b = p.bind(scratch, q=q, indices=idx, lengths=n, num_splits=32)
    assert b.partial_o.shape[1] == 32 and b.tokens_per_split == 64
    assert p.bind(scratch, q=q[:2], indices=idx[:2, :512].contiguous(), lengths=n[:2],
                  num_splits=32).partial_o.shape[1] == 8                         # one split per tile at most
    with pytest.raises(InputError, match="num_splits"):
        p.bind(scratch, q=q, indices=idx, lengths=n, num_splits=33)
    with pytest.raises(InputError, match="num_splits"):
        sm.plan(sm.Caps(num_heads=16, max_rows=4)).bind(torch.zeros(1 << 22, dtype=torch.uint8), q=q[:1],
                                                         indices=idx[:1], lengths=n[:1], num_splits=4)
    with pytest.raises(InputError, match="max_splits"):
        sm.plan(sm.Caps(num_heads=16, max_splits=64))


# ---- the indexer half (b12x.attention.indexer) ------------------------------------------------
from b12x import indexer as _ix  # noqa: E402
from b12x.attention import indexer as uix  # noqa: E402
from b12x.attention.indexer import tiled_topk  # noqa: E402


@pytest.fixture()
def _ix_h200(monkeypatch):
    monkeypatch.setattr(_ix, "device_arch", lambda: "sm_90a")
    monkeypatch.setattr(_ix, "device_num_sms", lambda: 132)


def _icaps(**kw):
    base = dict(device="cpu", source_layout=uix.INDEXER_SOURCE_LAYOUT_PAGED, num_q_heads=64, max_q_rows=2,
                max_page_table_width=10, topk=2048, mode="decode", shared_page_table=False)
    base.update(kw)
    return uix.B12XIndexerScratchCaps(**base)


def test_indexer_constants_and_keywords():
    assert (uix.PAGED_INDEX_PAGE_SIZE, uix.INDEXER_SOURCE_LAYOUT_PAGED, uix.PAGE_BYTES) == (64, "paged", 8448)
    bind = inspect.signature(uix.B12XIndexerScratchPlan.bind).parameters
    assert {"scratch", "real_page_table", "cache_seqlens_int32", "active_width", "schedule_metadata",
            "expected_num_q_heads", "shared_page_table"} <= set(bind)
    top = inspect.signature(uix.index_topk_fp8).parameters
    assert {"q_fp8", "weights", "index_k_cache", "binding", "page_size", "expected_num_q_heads", "out_indices",
            "out_scores"} <= set(top)
    assert set(inspect.signature(tiled_topk.run_row_topk).parameters) >= {"row_logits", "lengths", "topk",
                                                                          "output_values", "output_indices"}


def test_indexer_plans_and_routes(_ix_h200):
    dec = uix.plan_indexer_scratch(_icaps())
    assert dec.layout.route == dec.route == "paged_fused" and dec.shapes_and_dtypes() == (((dec.layout.nbytes,),
                                                                                            torch.uint8),)
    assert uix.plan_indexer_scratch(_icaps(max_q_rows=64)).route == "paged_tiled"
    pre = uix.plan_indexer_scratch(_icaps(mode="prefill", shared_page_table=True, max_q_rows=8))
    assert pre.route == "packed_contiguous"
    assert uix.B12XIndexerScratchCaps(device="cpu", source_layout="paged", num_q_heads=64, max_q_rows=4, topk=2048,
                                      max_k_rows=1000).max_page_table_width == 16
    for kw, match in ((dict(topk=4096), "topk"), (dict(source_layout="contiguous"), "source_layout"),
                      (dict(score_mode="msa"), "score_mode"), (dict(page_size=128), "page_size")):
        with pytest.raises(InputError, match=match):
            uix.plan_indexer_scratch(_icaps(**kw))


def test_indexer_bind_takes_the_shared_table_as_an_expand(_ix_h200):
    pre = uix.plan_indexer_scratch(_icaps(mode="prefill", shared_page_table=True, max_q_rows=8))
    scratch = [torch.zeros(pre.layout.nbytes, dtype=torch.uint8)]          # what get_simultaneous returns
    table = torch.arange(10, dtype=torch.int32)[None].expand(8, 10)
    b = pre.bind(scratch=scratch, real_page_table=table, cache_seqlens_int32=torch.arange(8, dtype=torch.int32),
                 active_width=None, schedule_metadata=None, expected_num_q_heads=64, shared_page_table=True)
    assert b.route == "packed_contiguous" and b.block_table.shape == (1, 10)
    with pytest.raises(InputError, match="row-shared"):
        pre.bind(scratch=scratch, real_page_table=torch.zeros(8, 10, dtype=torch.int32),
                 cache_seqlens_int32=torch.zeros(8, dtype=torch.int32), shared_page_table=True)
    with pytest.raises(InputError, match="shared_page_table"):
        pre.bind(scratch=scratch, real_page_table=table, cache_seqlens_int32=torch.zeros(8, dtype=torch.int32),
                 shared_page_table=False)
    dec = uix.plan_indexer_scratch(_icaps())
    with pytest.raises(InputError, match="max_page_table_width"):
        dec.bind(scratch=torch.zeros(dec.layout.nbytes, dtype=torch.uint8),
                 real_page_table=torch.zeros(2, 11, dtype=torch.int32), cache_seqlens_int32=torch.zeros(2, dtype=torch.int32))


def test_flat_index_cache_view_is_the_same_bytes():
    pages = torch.randint(0, 255, (3, 64 * 576), dtype=torch.uint8)      # a page stride of 64 x 576
    flat = pages[:, :8448]
    view = uix._k_pages(flat, torch.device("cpu"))
    assert view.shape == (3, 64, 132) and view.stride() == (64 * 576, 132, 1)
    assert torch.equal(view[1].reshape(-1), pages[1, :8448])
    with pytest.raises(InputError, match="index_k_cache"):
        uix._k_pages(torch.zeros(3, 8000, dtype=torch.uint8), torch.device("cpu"))


def test_schedule_helpers():
    assert uix.uses_paged_mqa_schedule(q_rows=2, max_pages=4096) is False
    out = torch.zeros(5, 2, dtype=torch.int32)
    got = uix.build_paged_mqa_schedule_metadata(torch.tensor([64, 128], dtype=torch.int32), 64, 4, out=out)
    assert got is out and out.tolist() == [[0, 0], [0, 0], [1, 0], [1, 0], [2, 0]]
    lens = torch.tensor([1000, 10, 3000], dtype=torch.int32)           # 4, 1 and 12 segments of 256
    sched = uix.build_paged_mqa_schedule_metadata(lens, 64, 8)
    assert sched[0].tolist() == [0, 0] and sched[-1].tolist() == [3, 0]
    assert sched[2].tolist() == [1, 0]                                 # split 2 starts at segment 4 of 17


def test_run_row_topk_refuses_before_launch():
    with pytest.raises(InputError, match="topk"):
        tiled_topk.run_row_topk(row_logits=torch.zeros(2, 8), lengths=torch.full((2,), 8, dtype=torch.int32), topk=4)
    with pytest.raises(InputError, match="lengths"):
        tiled_topk.run_row_topk(row_logits=torch.zeros(2, 4096), lengths=torch.zeros(3, dtype=torch.int32), topk=512)


def test_split_planner_under_upstreams_name():
    from b12x.attention.mla.kernel import plan_unified_decode_splits
    assert plan_unified_decode_splits(topk=2048, max_chunks=32, forced_num_splits=32) == (32, 32, 1)
    assert plan_unified_decode_splits(topk=2048, max_chunks=8, forced_num_splits=32) == (32, 8, 4)
    assert plan_unified_decode_splits(topk=2048, max_chunks=64, forced_num_splits=64) == (32, 32, 1)
    chunks, splits, per = plan_unified_decode_splits(topk=2048, max_chunks=32, num_tokens=8, sm_count=132)
    assert (chunks, splits * per >= chunks) == (32, True)
    assert splits == sm.split_plan(8, 2048, 132, 1)[0]


# ---- the seam: what the upstream-named calls hand to this package's run (runs stubbed) ---------
def test_index_topk_hands_our_run_the_fork_shaped_call(_ix_h200, monkeypatch):
    """The fork's decode call (T:164-239 with 64 index heads): flat [10, 8448] index cache of page
    stride 8448 or 36864, a [2, 10] table, lengths, an active width; our run gets the pages view,
    the table, width 640 and the caller's output buffers."""
    seen = {}
    monkeypatch.setattr(_ix, "run_index_topk", lambda b, *, kv_cache: seen.update(b=b, kv=kv_cache) or (b.indices, b.scores))
    for stride0 in (8448, 36864):
        plan = uix.plan_indexer_scratch(_icaps())
        store = torch.zeros(10, stride0, dtype=torch.uint8)
        flat = store.as_strided((10, 8448), (stride0, 1))
        table = torch.arange(20, dtype=torch.int32).view(2, 10)
        b = plan.bind(scratch=[torch.zeros(plan.layout.nbytes, dtype=torch.uint8)], real_page_table=table,
                      cache_seqlens_int32=torch.tensor([640, 100], dtype=torch.int32),
                      active_width=torch.tensor([640], dtype=torch.int32), schedule_metadata=None,
                      expected_num_q_heads=64, shared_page_table=False)
        out = torch.empty(2, 2048, dtype=torch.int32)
        got = uix.index_topk_fp8(q_fp8=torch.zeros(2, 64, 128, dtype=torch.float8_e4m3fn),
                                 weights=torch.zeros(2, 64), index_k_cache=flat, binding=b, page_size=64,
                                 expected_num_q_heads=64, out_indices=out, out_scores=None)
        inner = seen["b"]
        assert got is out and inner.indices is out and inner.width == 640 and inner.k == 2048
        assert inner.block_table is table and inner.rows_per_req == 1 and inner.active_width is b.active_width
        assert seen["kv"].shape == (10, 64, 132) and seen["kv"].stride() == (stride0, 132, 1)
        assert seen["kv"].data_ptr() == store.data_ptr()


def test_index_topk_prefill_runs_one_shared_table(_ix_h200, monkeypatch):
    seen = {}
    monkeypatch.setattr(_ix, "run_index_topk", lambda b, *, kv_cache: seen.update(b=b) or (b.indices, b.scores))
    rows, pages = 8, 12
    plan = uix.plan_indexer_scratch(_icaps(mode="prefill", shared_page_table=True, max_q_rows=rows,
                                           max_page_table_width=pages))
    row = torch.arange(pages, dtype=torch.int32)
    b = plan.bind(scratch=[torch.zeros(plan.layout.nbytes, dtype=torch.uint8)], real_page_table=row[None].expand(rows, pages),
                  cache_seqlens_int32=torch.arange(700, 700 + rows, dtype=torch.int32), active_width=None,
                  schedule_metadata=None, expected_num_q_heads=64, shared_page_table=True)
    scores = torch.empty(rows, 2048)
    uix.index_topk_fp8(q_fp8=torch.zeros(rows, 64, 128, dtype=torch.float8_e4m3fn), weights=torch.zeros(rows, 64, 1),
                       index_k_cache=torch.zeros(20, 8448, dtype=torch.uint8), binding=b, page_size=64,
                       expected_num_q_heads=64, out_indices=torch.empty(rows, 2048, dtype=torch.int32), out_scores=scores)
    inner = seen["b"]
    assert inner.block_table.shape == (1, pages) and inner.rows_per_req == rows and inner.scores is scores
    assert inner.block_table.data_ptr() == row.data_ptr() and inner.width == pages * 64


def test_decode_forward_hands_our_run_the_forced_splits(monkeypatch):
    seen = {}
    monkeypatch.setattr(sm, "run_decode", lambda b, **kw: seen.update(b=b, kw=kw) or (b.out, b.lse))
    p = plan_sparse_mla_scratch(_caps(num_q_heads=24, max_q_rows=4))
    b = _bind(p, rows=4)
    kv = torch.zeros(128, 1, 656, dtype=torch.uint8)
    out, lse = mla.sparse_mla_decode_forward(binding=b, kv_cache=kv, sm_scale=0.07, v_head_dim=512,
                                             forced_num_splits=32, return_lse=True, lse_scale="natural")
    inner = seen["b"]
    assert inner.partial_o.shape[:2] == (4, 32) and inner.q.shape == (4, 32, 576) and inner.q is not b.q
    assert seen["kw"]["kv_cache"].shape == (2, 64, 656) and seen["kw"]["lse_base"] == "e"      # natural asked
    assert out.shape == (4, 24, 512) and lse.shape == (4, 24) and out.is_contiguous()
    mla.sparse_mla_decode_forward(binding=b, kv_cache=kv, sm_scale=0.07)
    assert seen["b"].partial_o.shape[1] == sm.split_plan(4, 2048, 132, 1, seen["b"].plan.ctas_per_sm)[0]
    assert seen["kw"]["lse_base"] == "2"                       # upstream's default base, written by the kernels
    native = _bind(plan_sparse_mla_scratch(_caps()), rows=2)
    o, l = mla.sparse_mla_decode_forward(binding=native, kv_cache=kv, sm_scale=0.07, return_lse=True)
    assert o is native.inner.out and l is native.inner.lse     # no copies at a native count without a sink
