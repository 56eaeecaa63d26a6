"""The grouped top-k (Caps.group_select; codegen/cute_blocks/indexer/group_select.py) on the CPU:
the algorithm its three launches run, step by step in torch, gives the whole row's winners under
the kernels' key order and tie rule; the plan routes, sizes and carves its scratch."""
from dataclasses import replace

import pytest
import torch

from b12x import indexer as ix
from codegen.indexer_specs import topk_tiling

GROUP = topk_tiling("sm_90a")["group"]


def keys(x: torch.Tensor) -> torch.Tensor:
    """The select's sortable u32 keys (as int64): negatives flipped, the sign bit set on the rest."""
    bits = x.contiguous().view(torch.int32).long()
    return torch.where(bits < 0, (~bits) & 0xFFFFFFFF, bits | 0x80000000)


def select(key: torch.Tensor, valid: torch.Tensor, k: int) -> list:
    """Elements (indices into key) of the top-k valid keys, equal keys by lowest index, in index
    order: the radix select's winners."""
    order = sorted((i for i in range(key.numel()) if valid[i]), key=lambda i: (-int(key[i]), i))
    return sorted(order[:k])


def whole_row(x: torch.Tensor, start: int, end: int, k: int) -> list:
    pos = torch.arange(x.numel())
    return select(keys(x), (pos >= start) & (pos < end), k)


def grouped(x: torch.Tensor, start: int, end: int, k: int) -> list:
    """The three launches as the kernels run them: group_max (the maxima row from the group of
    start on, key 0 for a group without a valid logit), one CTA's top-k of the maxima row (the
    row ends kept, no starts; ids in position order), group_final (ids back to positions)."""
    width = x.numel()
    ng = -(-width // GROUP)
    ends = end                               # the maxima rows keep the row ends; the rest clip to the width
    start, end = max(start, 0), min(max(end, 0), width)
    first = min(start, end) // GROUP
    key = keys(x)
    maxima = []
    for j in range(ng):
        lo, hi = max((first + j) * GROUP, start), min((first + j) * GROUP + GROUP, end)
        maxima.append(max((int(key[p]) for p in range(lo, hi)), default=0))
    ids = select(torch.tensor(maxima), torch.arange(ng) < min(max(ends, 0), ng), k)
    ids += [-1] * (k - len(ids))
    elem_pos = [(first + g) * GROUP + j if g >= 0 else -1 for g in ids for j in range(GROUP)]
    elem_key = torch.tensor([int(key[p]) if 0 <= p < width else 0 for p in elem_pos])
    elem_ok = torch.tensor([p >= 0 and start <= p < end for p in elem_pos])
    return [elem_pos[i] for i in select(elem_key, elem_ok, k)]


def _row(kind: str, width: int, g: torch.Generator) -> torch.Tensor:
    if kind == "continuous":
        return torch.randn(width, generator=g)
    if kind == "ties":                                       # a few values: threshold ties everywhere
        return torch.randint(0, 6, (width,), generator=g).float()
    if kind == "clustered":                                  # the winners packed into a few groups
        x = torch.randn(width, generator=g) - 10.0
        x[width // 3: width // 3 + 40] = 5.0
        return x
    x = torch.randn(width, generator=g)                      # "special": NaNs, infinities, signed zeros
    p = torch.randperm(width, generator=g)
    x[p[:7]] = float("nan")
    x.view(torch.int32)[p[7:12]] = -4194304                  # 0xFFC00000: a negative NaN
    x[p[12:20]] = float("inf")
    x[p[20:30]] = float("-inf")
    x[p[30:60]] = 0.0
    x[p[60:90]] = -0.0
    return x


@pytest.mark.parametrize("kind", ("continuous", "ties", "clustered", "special"))
@pytest.mark.parametrize("k", (8, 24))
def test_grouped_selection_equals_the_whole_row(kind, k):
    g = torch.Generator().manual_seed(k * 7 + len(kind))
    width = 389                                              # not a multiple of the group
    for start, end in ((0, width), (5, width), (13, 300), (0, 3 * k), (40, 47), (0, 0), (200, 100), (0, 2 * width)):
        x = _row(kind, width, g)
        want = whole_row(x, start, end, k)
        got = grouped(x, start, end, k)
        assert got == want, f"{kind} [{start}, {end}): {got} != {want}"


def _bits(v: int) -> float:
    return torch.tensor([v], dtype=torch.int32).view(torch.float32).item()


@pytest.mark.parametrize("k", (2, 16))
def test_grouped_rows_of_infinities_and_nans(k):
    """Rows whose k-th key is -inf or a NaN below it: the groups before the row's start do not
    exist in the maxima row, so none of them displaces a valid group at that key; a group of
    NaNs of all-ones bits (key 0, as a group without a valid logit) ties the padding after the
    row and wins by position."""
    nan_ones, neg_nan = _bits(-1), _bits(-4194304)          # 0xFFFFFFFF, 0xFFC00000
    width = 24 * k + 37
    rows = []
    x = torch.full((width,), float("-inf"))
    x[8 * k + 3: 8 * k + 6] = 1.0                           # fewer finite logits than k, start past 8k
    rows.append((x, 8 * k + 1, width))
    x = torch.full((width,), float("-inf"))
    x[:8] = neg_nan                                         # a group of negative NaNs before -inf groups
    rows.append((x, 0, width))
    x = torch.full((width,), nan_ones)
    x[5] = 2.0
    rows.append((x, 3, width - 9))                          # NaNs of all-ones bits everywhere
    x = torch.full((width,), float("-inf"))
    x[16 * k:] = neg_nan
    rows.append((x, 8 * k + 5, width))
    for x, start, end in rows:
        assert grouped(x, start, end, k) == whole_row(x, start, end, k), (start, end)


def _caps(**kw):
    base = dict(num_heads=64, topk=2048, mode="contiguous", max_rows=4096, max_width=262144, arch="sm_90a",
                num_sms=132)
    return ix.Caps(**{**base, **kw})


def test_group_route_and_scratch():
    t = topk_tiling("sm_90a")
    p = ix.plan(_caps(group_select=True, logits_rows=376))
    assert p.group_route(262144) and p.group_route(t["row_chunk"] + 1) and not p.group_route(t["row_chunk"])
    assert not p.wide_route(376, 262144) and not p.wide_route(10, 262144)
    # the maxima rows are at most row_chunk wide (one CTA a row selects them); rows no wider than
    # row_chunk still take the wide top-k below row_min_rows rows, so its state covers that many
    assert -(-262144 // t["group"]) <= t["row_chunk"]
    assert p.regions["wide_state"].numel == (t["row_min_rows"] - 1) * 4
    assert p.regions["group_max"].numel == 376 * 262144 // t["group"]
    assert p.regions["group_idx"].numel == 376 * 2048
    assert "group_scores" not in p.regions
    assert "group_scores" in ix.plan(_caps(group_select=True, logits_rows=376, with_scores=True)).regions
    off = ix.plan(_caps(logits_rows=376))
    assert "group_max" not in off.regions and off.wide_route(376, 262144)
    # rows no wider than row_final's keep their route and need no maxima
    narrow = ix.plan(_caps(group_select=True, max_width=32768))
    assert not narrow.group_route(32768) and "group_max" not in narrow.regions


def test_grouped_batches_within_512_mib_overlap():
    """Within an engine's 512 MiB the grouped plan holds more logits rows than the wide one (its
    wide state shrinks by more than the maxima add), and its batches still overlap."""
    for width in (163840, 262144):
        rows = {}
        for grp in (False, True):
            caps = _caps(max_width=width, group_select=grp)
            n = ix.logits_rows_within(caps, 512 << 20)
            p = ix.plan(replace(caps, logits_rows=n))
            assert p.scratch_bytes() <= 512 << 20
            assert p.overlap_rows(n, width, 4096) >= 132
            rows[grp] = n
        assert rows[True] >= rows[False]


def test_group_select_names_the_field():
    with pytest.raises(ix.InputError, match="group_select"):
        ix.plan(_caps(group_select=True, arch="sm_120a"))


def test_grouped_launches_hand_their_buffers_on(monkeypatch):
    """The seams of the three steps, as run_index_topk wires them (recorded launches, no kernels):
    group_max writes the maxima view of the scratch that the maxima rows' top-k reads (no starts,
    no active width, row-relative ids, into the ids view), and group_final reads those very ids
    with the row's own starts and ends, writing the caller's outputs."""
    from tests.test_indexer_cpu import _recording_kernels

    calls = _recording_kernels(monkeypatch)
    rows, width, k = 10, 100000, 2048
    p = ix.plan(_caps(max_rows=rows, max_width=width, with_scores=True, group_select=True))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
    starts = torch.arange(rows, dtype=torch.int32) * 100
    ends = torch.full((rows,), width - 3, dtype=torch.int32)
    idx, sc = torch.empty(rows, k, dtype=torch.int32), torch.empty(rows, k)
    b = p.bind(scratch, q=torch.zeros(rows, 64, 128).to(torch.float8_e4m3fn), weights=torch.ones(rows, 64),
               lengths=ends, starts=starts, width=width, indices=idx, scores=sc)
    ix.run_index_topk(b, kv_cache=(torch.zeros(width, 128).to(torch.float8_e4m3fn), torch.ones(width)))
    assert [e for _, e, _ in calls] == ["logits", "group_max", "chunk_final", "group_final"]
    lo, hi = scratch.data_ptr(), scratch.data_ptr() + scratch.numel()
    (_, _, lg), (_, _, gm), (_, _, sa), (_, _, gf) = calls
    logits, maxima = lg[6], gm[4]
    assert gm[0] is logits and gm[1] is starts and gm[2] is ends and gm[-2:] == (1, 0)
    assert maxima.shape == (rows, -(-width // GROUP)) and lo <= maxima.data_ptr() < hi
    assert sa[0].data_ptr() == maxima.data_ptr() and sa[0].shape == maxima.shape
    assert sa[2] is ends and sa[-5:-2] == (0, 0, 0)              # ends kept; no starts, active width, slots
    ids = sa[11]
    assert ids.shape == (rows, k) and lo <= ids.data_ptr() < hi and sa[12] is not sc
    assert gf[0] is logits and gf[1] is starts and gf[2] is ends and gf[-5:-2] == (1, 0, 0)
    assert gf[6].data_ptr() == ids.data_ptr() and gf[6].shape == (rows, 1, k)
    assert gf[11] is idx and gf[12] is sc and gf[13] == k


def test_grouped_maxima_rows_take_one_cta_a_row(monkeypatch):
    """At any row count, the maxima rows are selected one CTA a row (row_final past one chunk):
    group_final's tie rule needs their ids in position order, which the wide top-k's ranked
    writes do not give."""
    from tests.test_indexer_cpu import _recording_kernels

    calls = _recording_kernels(monkeypatch)
    width, k = 262144, 2048
    for rows in (3, 64):
        calls.clear()
        p = ix.plan(_caps(max_rows=rows, max_width=width, group_select=True))
        scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
        b = p.bind(scratch, lengths=torch.full((rows,), width, dtype=torch.int32), width=width,
                   logits=torch.empty(rows, width))
        ix.run_topk(b)
        assert [e for _, e, _ in calls] == ["group_max", "row_final", "group_final"], rows
