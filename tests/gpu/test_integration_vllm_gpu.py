"""The vLLM-shaped adapter drives the same kernels as the facades, with caller-owned buffers."""
import pytest
import torch

from b12x.indexer_reference import indexer_logits_paged_reference, quantize_k_pages, quantize_q
from b12x.integration import vllm as adapter

from .sparse_mla_cases import check, random_case

pytestmark = pytest.mark.gpu


def test_indexer_then_sparse_mla_through_the_adapter():
    g = torch.Generator(device="cuda").manual_seed(3)
    rows, heads, width, ctx = 4, 64, 8192, 6000
    kv = quantize_k_pages(torch.randn(600, 64, 128, device="cuda", generator=g))
    q = quantize_q(torch.randn(rows, heads, 128, device="cuda", generator=g) * 4)
    w = torch.randn(rows, heads, device="cuda", generator=g)
    bt = torch.randperm(600, device="cuda", generator=g)[: rows * 128].view(rows, 128).int()
    lengths = torch.full((rows,), ctx, dtype=torch.int32, device="cuda")
    idx = adapter.SparseIndexer(num_heads=heads, topk=2048, max_rows=rows, max_width=width)
    bufs = adapter.make_topk_buffers(rows, 2048, dcp_world_size=1, device="cuda")
    ws = torch.empty(idx.scratch_bytes(), dtype=torch.uint8, device="cuda")
    idx.topk(q, w, kv, bt, lengths, scratch=ws, out=bufs, width=width)
    # Against reference logits (not our own), the 2048th and 2049th values can swap within fp32
    # rounding, so check the selection is a top-2048 of the reference up to that tolerance.
    logits = indexer_logits_paged_reference(q, w, kv, bt, lengths, width)
    for r in range(rows):
        got = bufs.indices[r].long()
        assert torch.all(got >= 0) and got.unique().numel() == 2048
        kth = torch.topk(logits[r], 2048).values[-1]
        tol = 1e-3 * kth.abs() + 1e-3
        assert logits[r][got].min() >= kth - tol
        unchosen = torch.ones(width, dtype=torch.bool, device="cuda")
        unchosen[got] = False
        assert logits[r][unchosen].max() <= kth + tol

    case = random_case(rows, 16, 2048, "fp8_ds_mla", seed=5)
    mla = adapter.SparseMLA(num_heads=16, max_rows=rows)
    out = torch.full((rows, 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((rows, 16), float("nan"), device="cuda")
    mws = torch.empty(mla.scratch_bytes(), dtype=torch.uint8, device="cuda")
    mla.decode(case.q, case.kv, case.indices, case.lengths, out=out, lse=lse, scratch=mws, sm_scale=case.sm_scale)
    check(case, out, lse)


def test_dcp_needs_a_scores_buffer_in_the_draft_layer_too():
    bufs = adapter.make_topk_buffers(8, 2048, dcp_world_size=2, device="cuda")  # target and MTP draft alike
    assert bufs.scores is not None and bufs.scores.shape == (8, 2048)
