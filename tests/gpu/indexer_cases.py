"""Inputs and checks shared by the indexer GPU tests: random paged K caches for rows of given
token lengths, logits against the reference, and top-k selections compared as exact sets."""
from __future__ import annotations

import math

import torch

from b12x.indexer_reference import PAGE, quantize_k_pages, quantize_q

INT32_MAX = (1 << 31) - 1
INT32_MIN = -(1 << 31)


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def paged_inputs(lengths: list[int], *, heads: int, next_n: int, c: int, width: int, seed: int,
                 pad_entry: int = 0):
    """(q, weights, kv, block_table, lengths) for rows of the given token lengths; a row of L tokens
    holds floor(L / c) entries. Rows r * next_n .. + next_n - 1 form request r, whose distinct,
    shuffled pages of the pool cover its longest row; the block table has ceil(width / 64) columns,
    the ones past a request's pages set to `pad_entry` (never read)."""
    g = gen(seed)
    rows = len(lengths)
    req = rows // next_n
    assert req * next_n == rows and all(L // c <= width for L in lengths)
    need = [-(-(max(lengths[i * next_n:(i + 1) * next_n]) // c) // PAGE) for i in range(req)]
    blocks = sum(need) + 5
    kv = quantize_k_pages(torch.randn(blocks, PAGE, 128, device="cuda", generator=g))
    perm = torch.randperm(blocks, device="cuda", generator=g).int()
    bt = torch.full((req, -(-width // PAGE)), pad_entry, dtype=torch.int32, device="cuda")
    off = 0
    for i, n in enumerate(need):
        bt[i, :n] = perm[off:off + n]
        off += n
    q = quantize_q(torch.randn(rows, heads, 128, device="cuda", generator=g) * 2)
    w = torch.randn(rows, heads, device="cuda", generator=g)
    return q, w, kv, bt, torch.tensor(lengths, dtype=torch.int32, device="cuda")


def check_logits(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """-inf exactly where the reference is, the rest within fp32 rounding of the fp8 sums."""
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(ours), fin), "logits are -inf exactly where the reference is"
    assert torch.all(ours[~fin] == float("-inf"))
    a, b = ours[fin].double(), ref[fin].double()
    if a.numel():
        rel = ((a - b).norm() / b.norm().clamp(min=1e-12)).item()
        assert rel <= 1e-3, f"relative error {rel:.2e}"


def slots_of(bt_row: torch.Tensor, pos: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """Physical slots of row positions through one request's block table; -1 where the entry is
    outside [0, num_blocks)."""
    pages = bt_row.long().cpu()[pos // PAGE]
    ok = (pages >= 0) & (pages < num_blocks)
    return torch.where(ok, pages * PAGE + pos % PAGE, torch.full_like(pages, -1))


def check_selection(idx_row: torch.Tensor, vals: torch.Tensor, k: int, *, what: str, tol: float = 0.0,
                    scores_row: torch.Tensor | None = None, bt_row: torch.Tensor | None = None,
                    num_blocks: int | None = None) -> None:
    """idx_row [k]: one row's top-k output; vals [n]: the row's n valid logits (positions 0 .. n-1).

    The first m = min(k, n) outputs must be a top-m of vals as a set: every position whose value
    is above the m-th largest (by more than tol x |m-th|) is in, none below it (by more than that)
    is, no duplicates; then a -1 tail. tol = 0 is the exact set whenever the scores are distinct.
    With bt_row, outputs are physical slots: the chosen positions of pages inside the cache as
    slots, the others (pages outside it, which only hold -inf) as -1. scores_row, when given, is
    position-aligned: the chosen value (logical), or finite exactly where the slot is not -1."""
    n = vals.numel()
    m = min(k, n)
    assert torch.all(idx_row[m:] == -1), f"{what}: expected a -1 tail after {m} winners"
    if scores_row is not None:
        assert torch.all(scores_row[m:] == float("-inf")), f"{what}: expected -inf scores after {m}"
    if m == 0:
        return
    v = vals.double().cpu()
    kth = float(torch.topk(v, m).values[-1])
    t = tol * abs(kth) if math.isfinite(kth) else 0.0
    must = (v > kth + t).nonzero().flatten()
    may = (v >= kth - t).nonzero().flatten()
    got = idx_row[:m].long().cpu()
    if bt_row is None:
        g = got.tolist()
        assert len(set(g)) == m, f"{what}: duplicate positions"
        assert set(must.tolist()) <= set(g), f"{what}: {len(set(must.tolist()) - set(g))} winners missing"
        assert set(g) <= set(may.tolist()), f"{what}: {len(set(g) - set(may.tolist()))} positions that lose"
        if scores_row is not None:
            assert torch.equal(scores_row[:m].cpu().double(), v[got]), f"{what}: scores are the chosen logits"
        return
    must_s, may_s = slots_of(bt_row, must, num_blocks), slots_of(bt_row, may, num_blocks)
    valid = [s for s in got.tolist() if s >= 0]
    assert len(set(valid)) == len(valid), f"{what}: duplicate slots"
    assert set(must_s.tolist()) - {-1} <= set(valid), f"{what}: winners missing"
    assert set(valid) <= set(may_s.tolist()) - {-1}, f"{what}: slots that lose"
    assert m - len(valid) <= int((may_s == -1).sum()), f"{what}: more -1 than positions on pages outside the cache"
    if scores_row is not None:
        assert torch.equal(torch.isfinite(scores_row[:m]).cpu(), got >= 0), f"{what}: -inf scores are the -1 slots"
