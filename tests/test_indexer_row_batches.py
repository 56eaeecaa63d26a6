"""Indexer prefill in bounded memory by row batches (Caps.logits_rows): the plan's logits region
holds N rows, and run_index_topk scores and selects N rows at a time. CPU: the layout, the
bindings each batch gets (the kernels stubbed), and the refusals of the whole-logits calls."""
import pytest
import torch

from b12x import indexer as ix
from b12x.errors import InputError


def _plan(**kw):
    base = dict(num_heads=64, topk=2048, mode="paged", max_rows=16, max_width=4096, with_scores=True,
                arch="sm_90a", num_sms=132)
    base.update(kw)
    return ix.plan(ix.Caps(**base))


def _bind(p, rows, table_rows, width=4096):
    pages = width // 64
    return p.bind(torch.zeros(p.scratch_bytes(), dtype=torch.uint8), lengths=torch.arange(rows, dtype=torch.int32),
                  q=torch.zeros(rows, 64, 128, dtype=torch.float8_e4m3fn), weights=torch.zeros(rows, 64),
                  block_table=torch.arange(table_rows * pages, dtype=torch.int32).view(table_rows, pages),
                  width=width)


def test_layout_holds_the_batch_rows():
    whole, batched = _plan(), _plan(logits_rows=4)
    assert whole.regions["logits"].numel == 16 * 4096 and batched.regions["logits"].numel == 4 * 4096
    assert ix.logits_rows_for(512 << 20, 163840, 4096) == 818            # 4096 rows x 160K: 818 a batch
    assert ix.logits_rows_for(512 << 20, 4096, 16) == 0                  # everything fits
    with pytest.raises(InputError, match="logits_rows"):
        _plan(logits_rows=-1)


@pytest.mark.parametrize("table_rows,rows,batch,want", [
    (1, 10, 4, [(0, 4, 4, 1), (4, 8, 4, 1), (8, 10, 2, 1)]),        # one shared table: any split
    (5, 10, 3, [(0, 2, 2, 2), (2, 4, 2, 2), (4, 6, 2, 2), (6, 8, 2, 2), (8, 10, 2, 2)]),  # whole requests
])
def test_run_index_topk_covers_every_row_once(monkeypatch, table_rows, rows, batch, want):
    seen = []
    monkeypatch.setattr(ix, "_launch_logits", lambda b, kv: seen.append(("logits", b)))
    monkeypatch.setattr(ix, "_run_topk", lambda b, n: seen.append(("topk", b)) or (b.indices, b.scores))
    p = _plan(logits_rows=batch)
    b = _bind(p, rows, table_rows)
    assert b.row_batch and b.logits.shape == (batch, 4096)
    kv = torch.zeros(200, 64, 132, dtype=torch.uint8)
    ix.run_index_topk(b, kv_cache=kv)
    got = [(s.lengths[0].item(), s.lengths[-1].item() + 1, s.rows, s.block_table.shape[0]) for w, s in seen
           if w == "logits"]
    assert got == [(r0, r1, n, t if table_rows > 1 else 1) for r0, r1, n, t in
                   [(r0, r1, r1 - r0, (r1 - r0) // 2) for r0, r1, _, _ in want]]
    for what, s in seen:
        r0 = s.lengths[0].item()
        assert s.indices.data_ptr() == b.indices[r0].data_ptr() and s.scores.data_ptr() == b.scores[r0].data_ptr()
        assert s.logits.data_ptr() == b.logits.data_ptr() and s.logits.shape[0] == s.rows and not s.row_batch
        if table_rows == 1:
            assert s.rows_per_req == s.rows and s.block_table.data_ptr() == b.block_table.data_ptr()
        else:
            assert s.rows_per_req == 2 and s.block_table.data_ptr() == b.block_table[r0 // 2].data_ptr()


def test_whole_logits_calls_are_refused_on_a_batched_binding():
    p = _plan(logits_rows=4)
    b = _bind(p, 10, 1)
    kv = torch.zeros(200, 64, 132, dtype=torch.uint8)
    with pytest.raises(InputError, match="row batch"):
        ix.run_logits(b, kv_cache=kv)
    with pytest.raises(InputError, match="row batch"):
        ix.run_topk(b)
    small = _bind(p, 4, 1)                                # rows that fit: one batch, nothing refused
    assert not small.row_batch and small.logits.shape == (4, 4096)
    with pytest.raises(InputError, match="logits_rows"):     # the top-k state holds 4 rows
        p.bind(torch.zeros(p.scratch_bytes(), dtype=torch.uint8), lengths=torch.zeros(10, dtype=torch.int32),
               logits=torch.zeros(10, 4096))


def test_scratch_of_a_long_prefill_is_bounded():
    p = _plan(max_rows=4096, max_width=163840, logits_rows=ix.logits_rows_for(256 << 20, 163840, 4096))
    assert p.caps.logits_rows == 408 and p.scratch_bytes() <= 512 << 20
    assert _plan(max_rows=4096, max_width=163840).scratch_bytes() > 3 << 30


@pytest.mark.parametrize("width,held,batch", [
    (163840, 408, 264),     # 408 rows (1 CTA each) would leave 120 of the 528 wide top-k slots idle
    (163840, 640, 528),     # past one wave: whole waves
    (262144, 256, 256),     # 2 CTAs a row: 512 of 528 slots, kept
    (163840, 64, 64),       # 8 CTAs a row: 512 of 528, kept
    (32768, 2048, 2048),    # one CTA a row (row_final), not the wide route: kept
])
def test_row_batches_fill_the_wide_topk_wave(width, held, batch):
    """The batch a binding runs: the region's rows, or fewer that fill the top-k's resident slots."""
    p = _plan(mode="contiguous", max_rows=4096, max_width=width, logits_rows=held)
    n = 4096
    kv_len = torch.full((n,), width, dtype=torch.int32)
    b = p.bind(torch.zeros(p.scratch_bytes(), dtype=torch.uint8), lengths=kv_len,
               starts=torch.zeros(n, dtype=torch.int32), q=torch.zeros(n, 64, 128, dtype=torch.float8_e4m3fn),
               weights=torch.zeros(n, 64), width=width)
    assert b.row_batch == batch and b.logits.shape == (held, width)
    assert batch <= held and batch % 2 == 0


def test_overlapped_batches_where_the_rows_take_the_wide_top_k():
    """Row batches of rows wider than a top-k chunk alternate between the halves of the logits
    region (Binding.overlap_batch) where a half still holds a row per SM; Caps(overlap_batches=
    False) keeps them one after the other."""
    for overlap, want in ((True, 4), (False, 0)):
        p = _plan(max_rows=22, max_width=40000, logits_rows=8, num_sms=2, overlap_batches=overlap)
        b = _bind(p, 22, 1, width=40000)
        assert b.row_batch and b.overlap_batch == want
    narrow = _plan(max_rows=22, logits_rows=8, num_sms=2)         # 4096 entries: one chunk a row
    assert _bind(narrow, 22, 1).overlap_batch == 0
    # the benchmark's shapes (132 SMs, a 256 MiB logits budget): 160K overlaps 176-row halves;
    # 1M tokens at c 4 would give 128-row halves, fewer than the SMs, and stays sequential
    for width, want in ((163840, 176), (262144, 0)):
        held = ix.logits_rows_for(256 << 20, width, 4096)
        p = _plan(mode="contiguous", max_rows=4096, max_width=width, logits_rows=held)
        assert p.overlap_rows(held, width, 4096) == want


@pytest.mark.parametrize("width,rows_want,half", [(32768, 2048, 0), (163840, 528, 264), (262144, 352, 176)])
def test_logits_rows_within_a_workspace(width, rows_want, half):
    """4096 prefill rows in a 512 MiB workspace: the whole scratch fits, and the region holds just
    what the batches use: two overlapped halves that fill the wide top-k's slots (160K, 1M tokens
    c 4), or equal batches (32K: two of 2048)."""
    caps = ix.Caps(num_heads=64, topk=2048, mode="contiguous", max_rows=4096, max_width=width, arch="sm_90a",
                   num_sms=132)
    n = ix.logits_rows_within(caps, 512 << 20)
    assert n == rows_want
    p = _plan(mode="contiguous", max_rows=4096, max_width=width, logits_rows=n, with_scores=False)
    assert p.scratch_bytes() <= 512 << 20
    assert p.overlap_rows(n, width, 4096) == half
    if half:
        assert p.batch_rows(half, width) == half          # bind finds the same halves again
    assert ix.logits_rows_within(caps, 64 << 30) == 0     # everything fits
    with pytest.raises(InputError, match="scratch_bytes"):
        ix.logits_rows_within(caps, 1 << 20)


def test_wide_state_covers_the_rows_that_take_the_wide_top_k():
    """Rows of at most row_chunk logits take the wide top-k only in launches of fewer than
    row_min_rows rows (row_final takes the rest), so their wide state covers that many; wider rows
    need it for every row of a batch."""
    narrow = _plan(mode="contiguous", max_rows=4096, max_width=32768, logits_rows=2048, with_scores=False)
    t = narrow.tiling
    assert narrow.regions["tie_key"].numel == (t["row_min_rows"] - 1) * t["tie_cap"]
    assert narrow.wide_route(t["row_min_rows"] - 1, 32768) and not narrow.wide_route(t["row_min_rows"], 32768)
    wide = _plan(mode="contiguous", max_rows=4096, max_width=65536, logits_rows=512, with_scores=False)
    assert wide.regions["tie_key"].numel == 512 * t["tie_cap"]
