"""The indexer's active width is in entries on every route, and block-table entries outside the
cache never fault: their pages score -inf and their physical slots are -1.

Kernels come from B12X_CACHE_DIR (presets indexer-all, or deepseek-v3.2-indexer + indexer-compressed)."""
import pytest
import torch

from b12x import indexer as ix
from b12x.indexer_reference import indexer_logits_paged_reference
from b12x.metadata import decode_active_width

from .indexer_cases import INT32_MAX, INT32_MIN, check_logits, check_selection, gen, paged_inputs, slots_of

pytestmark = pytest.mark.gpu
K = 2048
HEADS = 64


def make_plan(c, rows, width, fused):
    return ix.plan(ix.Caps(num_heads=HEADS, topk=K, compress_ratio=c, max_rows=rows, max_width=width,
                           with_scores=True, fused=fused))


def poisoned_scratch(p):
    return torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")   # NaN bytes


def token_lengths(entries: list[int], c: int) -> list[int]:
    """Token lengths of rows with these entry counts, never a multiple of c (c > 1)."""
    return [e * c + (c // 2 + i % (c // 2) if c > 1 else 0) for i, e in enumerate(entries)]


# ---- the active width: entries, as the metadata helper writes it, on every route --------------
@pytest.mark.parametrize("c", (1, 4, 128))
def test_active_width_from_metadata_is_entries_on_every_route(c):
    """width 40000 entries (the graph-stable capacity), rows of 1500 .. 30001 entries. The helper
    writes the exact max (30001 entries) and the kernels use it as is: with c = 4 or 128, a second
    division would cut every row to a few thousand entries. Then a buffer narrower than the
    longest rows (20000) clips them there, on the unfused path (logits + wide top-k) and the fused
    one alike."""
    rows, width = 4, 40000
    entries = [30001, 1500, 24000, 17777]
    lengths_l = token_lengths(entries, c)
    q, w, kv, bt, lengths = paged_inputs(lengths_l, heads=HEADS, next_n=1, c=c, width=width, seed=100 + c)
    active = torch.zeros(1, dtype=torch.int32, device="cuda")
    exact = decode_active_width(active, max_seq_len=max(lengths_l) + 1000, compress_ratio=c,
                                seq_lens_cpu=torch.tensor(lengths_l, dtype=torch.int32))
    assert exact == 30001 and int(active) == 30001
    for act in (exact, 20000):
        active.fill_(act)
        out = {}
        for fused in (False, True):
            p = make_plan(c, rows, width, fused)
            b = ix.bind(p, scratch=poisoned_scratch(p), q=q, weights=w, lengths=lengths, block_table=bt, width=width,
                        active_width=active)
            idx, sc = ix.run_index_topk(b, kv_cache=kv)
            out[fused] = (idx.clone(), sc.clone(), None if fused else b.logits[:, :act].clone())
        torch.cuda.synchronize()
        ref = indexer_logits_paged_reference(q, w, kv, bt, lengths, width, compress_ratio=c, active_width=act)
        own = out[False][2]
        check_logits(own, ref[:, :act])
        for r in range(rows):
            n = min(entries[r], act)
            check_selection(out[False][0][r], own[r, :n], K, scores_row=out[False][1][r],
                            what=f"unfused c={c} act={act} row {r}")
            # the fused path scores the same fp8 sums: compared on the unfused logits
            check_selection(out[True][0][r], own[r, :n], K, tol=1e-5, what=f"fused c={c} act={act} row {r}")


# ---- block-table entries outside the cache ------------------------------------------------------
def corrupt(bt: torch.Tensor, nblk: int, short_req: int) -> list[tuple[int, int]]:
    """Overwrite pages inside the rows with entries outside [0, nblk): past the end, INT32_MAX,
    INT32_MIN, -5 (also in the short row's request, so -inf entries reach its top-k); and the pad
    columns with INT32_MIN (never read). Returns the (request, page) pairs changed inside rows."""
    hits = [(0, 3, nblk), (0, 10, INT32_MAX), (1, 5, INT32_MIN), (1, 0, -5), (short_req, 2, -5),
            (short_req, 7, nblk + 1000)]
    for r, p, v in hits:
        bt[r, p] = v
    return [(r, p) for r, p, _ in hits]


@pytest.mark.parametrize("next_n,fused,width,c", [(1, False, 8192, 1), (2, False, 8192, 1), (1, False, 40000, 1),
                                                  (2, False, 40000, 4), (1, True, 8192, 1), (1, True, 40000, 4)])
def test_out_of_range_block_table_entries_never_fault(next_n, fused, width, c):
    """Paged logits (one row per page, or row pairs with next_n = 2), the fused path, and the
    physical top-k (one CTA per row at 8192, the wide top-k at 40000): a page whose entry is past
    the cache, INT32_MAX, INT32_MIN or -5 scores -inf, like the reference treats it, and its slots
    are -1; the process stays healthy and a clean call afterwards is right."""
    rows = 4
    long_e = min(width, 7000) if width == 8192 else 33000
    entries = [long_e, long_e - 1, 1500, 1501] if next_n == 2 else [long_e, long_e - 3, 1500, long_e - 700]
    lengths_l = token_lengths(entries, c)
    q, w, kv, bt, lengths = paged_inputs(lengths_l, heads=HEADS, next_n=next_n, c=c, width=width, seed=7 * width + c,
                                         pad_entry=INT32_MIN)
    nblk = kv.shape[0]
    clean_bt = bt.clone()
    short_req = 2 // next_n                       # the request of row 2 (1500 entries < K)
    corrupt(bt, nblk, short_req)
    p = make_plan(c, rows, width, fused)
    for table, label in ((bt, "corrupt"), (clean_bt, "clean")):
        b = ix.bind(p, scratch=poisoned_scratch(p), q=q, weights=w, lengths=lengths, block_table=table, width=width,
                    physical=True)
        idx, sc = ix.run_index_topk(b, kv_cache=kv)
        torch.cuda.synchronize()                  # a fault would surface here
        ref = indexer_logits_paged_reference(q, w, kv, table, lengths, width, compress_ratio=c)
        if label == "corrupt":
            assert torch.isinf(ref).sum() > torch.isinf(indexer_logits_paged_reference(
                q, w, kv, clean_bt, lengths, width, compress_ratio=c)).sum()          # pages really are cut
        if fused:
            vals = ref                             # the fused path keeps no logits: the reference's
            tol = 1e-3
        else:
            check_logits(b.logits, ref)
            vals, tol = b.logits, 0.0
        for r in range(rows):
            n = entries[r]
            check_selection(idx[r], vals[r, :n], K, tol=tol, scores_row=sc[r], bt_row=table[r // next_n],
                            num_blocks=nblk, what=f"{label} row {r}")


@pytest.mark.parametrize("width", (8192, 20000, 40000))
def test_physical_top_k_of_given_logits_with_out_of_range_entries(width):
    """run_topk alone (logits given, no cache): with bind(num_blocks=...) a winner whose entry lies
    outside [0, num_blocks) is -1 and every other winner is its slot (one CTA per row at 8192 and,
    with 66 rows, at 20000; the wide top-k at 40000)."""
    rows = 66 if width == 20000 else 4
    g = gen(width)
    logits = torch.rand(rows, width, device="cuda", generator=g).argsort(dim=1).float() * 1e-3 - 3.0   # distinct
    pages = -(-width // 64)
    nblk = rows * pages + 7
    bt = torch.randperm(nblk, device="cuda", generator=g)[: rows * pages].int().view(rows, pages)
    corrupt(bt, nblk, 3)
    ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    ends[1], ends[2], ends[3] = width - 5, 1200, width - 64          # row 2: fewer entries than K
    p = make_plan(1, rows, width, None)
    if width == 20000:
        assert p.row_final(rows, width)
    b = ix.bind(p, scratch=poisoned_scratch(p), lengths=ends, logits=logits, block_table=bt, physical=True,
                num_blocks=nblk)
    idx, sc = ix.run_topk(b)
    torch.cuda.synchronize()
    for r in range(rows):
        n = int(ends[r])
        # (given logits are finite on the corrupt pages too: only the slots tell them apart)
        check_selection(idx[r], logits[r, :n], K, bt_row=bt[r], num_blocks=nblk, what=f"row {r}")
        m = min(K, n)
        assert torch.all(torch.isfinite(sc[r, :m])) and torch.all(sc[r, m:] == float("-inf"))
        # distinct scores: the winners are exact, so the outputs are exactly their slots, -1 included
        win = torch.topk(logits[r, :n].cpu(), m).indices
        want = slots_of(bt[r], win, nblk)
        assert sorted(idx[r, :m].tolist()) == sorted(want.tolist()), f"row {r}: slots"
    assert int((idx[0] == -1).sum()) > 0 or width > 8192    # row 0 has winners on its corrupt pages
