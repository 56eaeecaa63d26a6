"""Row-batched indexer prefill (Caps.logits_rows) against the whole-rows plan: the same logits
kernels over row slices, so the same winners and scores, bit for bit."""
import pytest
import torch

from b12x import indexer as ix
from b12x.indexer_reference import quantize_k_pages, quantize_q

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("reqs,rows_per_req,batch", [(1, 24, 8), (1, 24, 10), (6, 2, 5)])
def test_row_batches_match_the_whole_rows(reqs, rows_per_req, batch):
    g = torch.Generator(device="cuda").manual_seed(41)
    rows, pages = reqs * rows_per_req, 96
    kv = quantize_k_pages(torch.randn(reqs * pages + 5, 64, 128, device="cuda", generator=g))
    bt = torch.randperm(reqs * pages + 5, device="cuda", generator=g)[: reqs * pages].view(reqs, pages).int()
    q = quantize_q(torch.randn(rows, 64, 128, device="cuda", generator=g) * 4)
    w = torch.randn(rows, 64, device="cuda", generator=g)
    seq = torch.randint(1000, pages * 64 + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
    res = []
    for logits_rows in (0, batch):
        p = ix.plan(ix.Caps(num_heads=64, topk=2048, max_rows=rows, max_width=pages * 64, with_scores=True,
                            logits_rows=logits_rows))
        scratch = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
        idx = torch.full((rows, 2048), -7, dtype=torch.int32, device="cuda")
        sc = torch.full((rows, 2048), float("nan"), device="cuda")
        b = p.bind(scratch, q=q, weights=w, lengths=seq, block_table=bt, width=pages * 64, indices=idx, scores=sc)
        assert bool(b.row_batch) == bool(logits_rows)
        ix.run_index_topk(b, kv_cache=kv)
        torch.cuda.synchronize()
        res.append((idx, sc))
    # the top-k path depends on the row count (row-per-CTA or wide), so the order within a row may
    # differ: the same winners with the same scores, compared in index order
    for (i0, s0), (i1, s1) in [(res[0], res[1])]:
        o0, o1 = i0.sort(dim=1), i1.sort(dim=1)
        assert torch.equal(o0.values, o1.values)
        assert torch.equal(s0.gather(1, o0.indices), s1.gather(1, o1.indices))


@pytest.mark.parametrize("batch", (10, 7))     # 10: row-pair batches; 7: single-row batches and a tail of 3
def test_contiguous_row_batches_match_the_whole_rows(batch):
    """Prefill rows (causal ends over one contiguous K) scored in row batches, with and without
    row pairs, against the whole rows in one row-pair launch."""
    g = torch.Generator(device="cuda").manual_seed(43)
    rows, n = 24, 6000
    kv = quantize_q(torch.randn(n, 128, device="cuda", generator=g))
    sc = torch.rand(n, device="cuda", generator=g) + 0.1
    q = quantize_q(torch.randn(rows, 64, 128, device="cuda", generator=g) * 4)
    w = torch.randn(rows, 64, device="cuda", generator=g)
    ends = torch.arange(n - rows + 1, n + 1, dtype=torch.int32, device="cuda")
    starts = torch.zeros(rows, dtype=torch.int32, device="cuda")
    starts[5] = 2500                                     # a pair whose ranges differ
    res = []
    for logits_rows in (0, batch):
        p = ix.plan(ix.Caps(num_heads=64, topk=2048, mode="contiguous", max_rows=rows, max_width=n,
                            with_scores=True, logits_rows=logits_rows))
        scratch = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
        idx = torch.full((rows, 2048), -7, dtype=torch.int32, device="cuda")
        s = torch.full((rows, 2048), float("nan"), device="cuda")
        b = p.bind(scratch, q=q, weights=w, lengths=ends, starts=starts, width=n, indices=idx, scores=s)
        assert bool(b.row_batch) == bool(logits_rows)
        ix.run_index_topk(b, kv_cache=(kv, sc))
        torch.cuda.synchronize()
        res.append((idx, s))
    (i0, s0), (i1, s1) = res
    o0, o1 = i0.sort(dim=1), i1.sort(dim=1)
    assert torch.equal(o0.values, o1.values)
    assert torch.equal(s0.gather(1, o0.indices), s1.gather(1, o1.indices))


def _wide_prefill_case(g, rows, n):
    kv = quantize_q(torch.randn(n, 128, device="cuda", generator=g))
    sc = torch.rand(n, device="cuda", generator=g) + 0.1
    q = quantize_q(torch.randn(rows, 64, 128, device="cuda", generator=g) * 4)
    w = torch.randn(rows, 64, device="cuda", generator=g)
    ends = torch.arange(n - 3 * rows, n, 3, dtype=torch.int32, device="cuda") + 1
    starts = torch.zeros(rows, dtype=torch.int32, device="cuda")
    starts[3] = 9000
    return kv, sc, q, w, ends, starts


def prefill_bindings(plans: dict, g, rows: int, n: int):
    """Per plan a poisoned scratch and outputs, one wide prefill case (a list: its tensors are
    refilled in place for graph replays) and bind(key) of the case to that plan's buffers."""
    scratch = {key: torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
               for key, p in plans.items()}
    outs = {key: (torch.full((rows, 2048), -7, dtype=torch.int32, device="cuda"),
                  torch.full((rows, 2048), float("nan"), device="cuda")) for key in plans}
    case = list(_wide_prefill_case(g, rows, n))

    def bind(key):
        kv, sc, q, w, ends, starts = case
        return plans[key].bind(scratch[key], q=q, weights=w, lengths=ends, starts=starts, width=n,
                               indices=outs[key][0], scores=outs[key][1])

    return outs, case, bind


def test_overlapped_row_batches_match_the_whole_rows_and_replay_in_a_graph():
    """Rows wider than a top-k chunk in row batches: the batches alternate between the halves of
    the logits region and each batch's top-k runs on a side stream beside the next batch's
    logits. The winners and scores equal the whole rows', in eager calls and in graph replays
    with new inputs, and a replay allocates nothing. (Planned for 2 SMs: overlapped batches hold
    at least a row per SM.)"""
    g = torch.Generator(device="cuda").manual_seed(47)
    rows, n = 22, 40000
    plans = {lr: ix.plan(ix.Caps(num_heads=64, topk=2048, mode="contiguous", max_rows=rows, max_width=n,
                                 with_scores=True, logits_rows=lr, num_sms=2)) for lr in (0, 8)}
    outs, case, bind = prefill_bindings(plans, g, rows, n)

    def check():
        (i0, s0), (i1, s1) = outs[0], outs[8]
        o0, o1 = i0.sort(dim=1), i1.sort(dim=1)
        assert torch.equal(o0.values, o1.values)
        assert torch.equal(s0.gather(1, o0.indices), s1.gather(1, o1.indices))
        assert int((i1 >= 0).sum(1).min()) == 2048

    b = {lr: bind(lr) for lr in plans}
    assert b[8].row_batch and b[8].overlap_batch == 4 and b[0].overlap_batch == 0
    for lr in plans:
        ix.run_index_topk(b[lr], kv_cache=(case[0], case[1]))
    torch.cuda.synchronize()
    check()

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ix.run_index_topk(b[8], kv_cache=(case[0], case[1]))          # warm-up on the capture stream
        with torch.cuda.graph(graph, stream=stream):
            ix.run_index_topk(b[8], kv_cache=(case[0], case[1]))
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    for t, new in zip(case, _wide_prefill_case(g, rows, n)):          # fresh inputs in place
        t.copy_(new)
    outs[8][0].fill_(-7)
    outs[8][1].fill_(float("nan"))
    before = torch.cuda.memory_allocated()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    ix.run_index_topk(b[0], kv_cache=(case[0], case[1]))
    torch.cuda.synchronize()
    check()
