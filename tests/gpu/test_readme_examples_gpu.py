"""The README's engine call sequence and its indexer example run as written: each block's text is
read from README.md (tests/readme_blocks.py: the first ```python block under its `## ` heading) and
exec'd after a prelude that defines the tensors the block leaves to the reader, with random data of
realistic shapes; the results are checked against the torch references. (The DCP block needs a
process group per rank; tests/test_readme_examples.py checks its calls.)

Build first, with B12X_CACHE_DIR set: `b12x-codegen build --preset deepseek-v3.2-tp8 --arch sm_90a`
(the engine block prewarms that preset: sparse MLA decode and extend at 16 heads with fp8 KV, the
64-head indexer, the DCP kernels; the indexer block's Caps are that indexer)."""
import math

import pytest
import torch

from b12x import registry
from b12x.indexer_reference import indexer_logits_paged_reference, quantize_k_pages, quantize_q
from readme_blocks import README_SECTIONS, free_names, python_block

from .sparse_mla_cases import Case, check, random_case

pytestmark = pytest.mark.gpu

HEADS = 16                 # the engine block's Caps(num_heads=16)
ROWS, XROWS, LIVE = 5, 37, 29
INDEX_HEADS, WIDTH = 64, 8192


def run_readme_block(section: str, prelude: dict) -> dict:
    """Exec README block `section` in a namespace holding `prelude`; returns the namespace.
    Leaves b12x unfrozen afterwards if it was before (the engine block calls b12x.freeze())."""
    code = python_block(section)
    missing = free_names(code) - set(prelude)
    assert not missing, (f"the README '{README_SECTIONS[section]}' block reads {sorted(missing)}, which the "
                         f"prelude of tests/gpu/test_readme_examples_gpu.py does not define")
    ns = dict(prelude)
    was_frozen = registry.is_frozen()
    try:
        exec(compile(code, f"README.md[{README_SECTIONS[section]}]", "exec"), ns)
        torch.cuda.synchronize()
    finally:
        if not was_frozen:
            registry.unfreeze()
    return ns


def _rows(case: Case, lo: int, hi: int) -> Case:
    return Case(case.q[lo:hi], case.kv, case.kv_ref, case.indices[lo:hi], case.lengths[lo:hi], case.sm_scale)


def test_engine_call_sequence_as_written():
    # one fp8_ds_mla cache for both parts, as in the README: decode rows, then an extend chunk
    case = random_case(ROWS + XROWS, HEADS, 2048, "fp8_ds_mla", seed=11, blocks=512)
    dec, chunk = _rows(case, 0, ROWS), _rows(case, ROWS, ROWS + XROWS)
    nan = float("nan")
    prelude = dict(
        torch=torch,
        q=dec.q, topk_indices=dec.indices, topk_lengths=dec.lengths, kv_cache=case.kv,
        softmax_scale=case.sm_scale,
        attn_out=torch.full((ROWS, HEADS, 512), nan, dtype=torch.bfloat16, device="cuda"),
        q_chunk=chunk.q, idx_chunk=chunk.indices, len_chunk=chunk.lengths,
        out_chunk=torch.full((XROWS, HEADS, 512), nan, dtype=torch.bfloat16, device="cuda"),
        live_rows=torch.tensor([LIVE], dtype=torch.int32, device="cuda"),
    )
    ns = run_readme_block("engine", prelude)

    assert ns["out"] is prelude["attn_out"], "run_decode returns the caller's out"
    check(dec, prelude["attn_out"], ns["lse"])
    out_chunk = prelude["out_chunk"]
    check(_rows(chunk, 0, LIVE), out_chunk[:LIVE], ns["xb"].lse[:LIVE])
    assert out_chunk[LIVE:].isnan().all(), "rows at or past num_rows[0] are not written"


def test_indexer_example_as_written():
    g = torch.Generator(device="cuda").manual_seed(21)
    rows, pages = 4, WIDTH // 64
    blocks = rows * pages + 3
    k_cache = quantize_k_pages(torch.randn(blocks, 64, 128, device="cuda", generator=g))
    bt = torch.randperm(blocks, device="cuda", generator=g)[: rows * pages].view(rows, pages).int().contiguous()
    q_fp8 = quantize_q(torch.randn(rows, INDEX_HEADS, 128, device="cuda", generator=g) * 4)
    w = torch.randn(rows, INDEX_HEADS, device="cuda", generator=g)
    seq_lens = torch.tensor([WIDTH, 6000, 3001, 1500], dtype=torch.int32, device="cuda")   # one row under K
    prelude = dict(
        torch=torch, q_fp8=q_fp8, w=w, seq_lens=seq_lens, bt=bt, width=WIDTH, k_cache=k_cache,
        # compress ratio 1: the longest row's tokens are also its entries
        active_width_buf=torch.tensor([int(seq_lens.max())], dtype=torch.int32, device="cuda"),
        topk_indices=torch.full((rows, 2048), -7, dtype=torch.int32, device="cuda"),
        topk_scores=torch.full((rows, 2048), float("nan"), device="cuda"),
    )
    run_readme_block("indexer", prelude)

    logits = indexer_logits_paged_reference(q_fp8, w, k_cache, bt, seq_lens, WIDTH)
    idx, scores = prelude["topk_indices"], prelude["topk_scores"]
    for r in range(rows):
        length = int(seq_lens[r])
        n = min(2048, length)
        got = idx[r, :n].long()
        assert torch.all((got >= 0) & (got < length)) and got.unique().numel() == n, f"row {r}: bad winners"
        assert torch.all(idx[r, n:] == -1) and torch.all(scores[r, n:] == -math.inf), f"row {r}: bad tail"
        ref = logits[r, :length]
        torch.testing.assert_close(scores[r, :n], ref[got], rtol=1e-3, atol=5e-3 * ref.abs().max().item())
        if length > n:
            # against reference logits the 2048th and 2049th values can swap within fp32 rounding
            kth = torch.topk(ref, n).values[-1]
            tol = 1e-3 * kth.abs() + 1e-3
            unchosen = torch.ones(length, dtype=torch.bool, device="cuda")
            unchosen[got] = False
            assert ref[got].min() >= kth - tol and ref[unchosen].max() <= kth + tol, f"row {r}: not a top-{n}"


def test_v4_block_as_written():
    """The README's DeepSeek-V4 block (SWA + C128, the extra list from CompressedEntries), run as
    written against the reference."""
    from b12x.reference import quantize_model1_fp8, sparse_mla_v4_reference

    g = torch.Generator(device="cuda").manual_seed(4)
    rows, heads = 5, 8
    swa = quantize_model1_fp8(torch.randn(6, 256, 512, device="cuda", generator=g))
    c128 = quantize_model1_fp8(torch.randn(4096, 2, 512, device="cuda", generator=g))
    prelude = dict(
        seq_lens=torch.tensor([300000, 128, 0, 5000, 10**6], dtype=torch.int32, device="cuda"),
        c128_block_table=torch.randperm(4096, device="cuda", generator=g).to(torch.int32).repeat(rows, 1),
        extra_indices=torch.empty(rows, 8192, dtype=torch.int32, device="cuda"),
        extra_lengths=torch.empty(rows, dtype=torch.int32, device="cuda"),
        q=torch.randn(rows, heads, 512, device="cuda", generator=g).bfloat16(),
        swa_indices=torch.randint(0, 6 * 256, (rows, 128), device="cuda", generator=g, dtype=torch.int32),
        swa_lengths=torch.tensor([128, 128, 0, 60, 128], dtype=torch.int32, device="cuda"),
        attn_out=torch.full((rows, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda"),
        swa_pages=swa, c128_pages=c128, attn_sink=torch.randn(heads, device="cuda", generator=g),
    )
    ns = run_readme_block("v4", prelude)
    ref, _ = sparse_mla_v4_reference(prelude["q"], swa, prelude["swa_indices"], prelude["swa_lengths"], 512 ** -0.5,
                                     main_page=256, extra_kv=c128, extra_indices=prelude["extra_indices"],
                                     extra_lengths=prelude["extra_lengths"], extra_page=2, attn_sink=prelude["attn_sink"])
    torch.testing.assert_close(ns["out"].float(), ref, atol=1e-2 * ref.abs().max().item() + 1e-4, rtol=5e-2)


def test_upstream_block_as_written():
    """The README's vLLM B12X backend block: sparse MLA decode with the backend's forced splits and
    natural lse, then the indexer's paged decode, against the references."""
    rows, pages = 4, 32
    case = random_case(rows, 16, 2048, "fp8_ds_mla", seed=31)
    g = torch.Generator(device="cuda").manual_seed(32)
    k_pages = quantize_k_pages(torch.randn(rows * pages + 3, 64, 128, device="cuda", generator=g))
    bt = torch.randperm(rows * pages + 3, device="cuda", generator=g)[: rows * pages].view(rows, pages).int()
    seq = torch.tensor([2048, 1000, 300, 2048], dtype=torch.int32, device="cuda")
    q_fp8 = quantize_q(torch.randn(rows, INDEX_HEADS, 128, device="cuda", generator=g) * 4)
    w = torch.randn(rows, INDEX_HEADS, device="cuda", generator=g)
    prelude = dict(torch=torch, q_all=case.q, page_table_1=case.indices, seq_lens=seq,
                   valid_counts=case.lengths, kv_c_and_k_pe_cache=case.kv, scale=case.sm_scale, rows=rows,
                   pages=pages, block_table=bt, active_width=torch.tensor([2048], dtype=torch.int32, device="cuda"),
                   q_fp8=q_fp8, weights=w, index_k_pages=k_pages,
                   topk_indices=torch.full((rows, 2048), -7, dtype=torch.int32, device="cuda"),
                   topk_scores=torch.full((rows, 2048), float("nan"), device="cuda"))
    ns = run_readme_block("upstream", prelude)
    check(case, ns["out"], ns["lse"])
    logits = indexer_logits_paged_reference(q_fp8, w, k_pages, bt, seq, pages * 64)
    idx, scores = prelude["topk_indices"], prelude["topk_scores"]
    for r in range(rows):
        n = min(2048, int(seq[r]))
        got = idx[r, :n].long()
        assert torch.all(got >= 0) and got.unique().numel() == n and torch.all(idx[r, n:] == -1)
        torch.testing.assert_close(scores[r, :n], logits[r][got], rtol=1e-3, atol=5e-3 * logits[r, :n].abs().max().item())
