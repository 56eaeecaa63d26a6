"""DeepSeek-V4 sparse MLA over model1_fp8 pages: the sliding-window cache alone (pages of 64 and
256 tokens) and with a compressed one in the same softmax (C4: page 64; C128: page 2, its list
filled by CompressedEntries), decode and extend at every head count, against the torch reference
on the dequantised pages. Build first: `b12x-codegen build --preset sparse-mla-model1` and
`--preset deepseek-v4-pro-tp1/2/4/8/16` (`--arch sm_90a`)."""
import math

import pytest
import torch

from b12x.attention import sparse_mla as sm
from b12x.reference import V4_DIM, dequantize_model1_fp8, model1_page_bytes, quantize_model1_fp8, sparse_mla_v4_reference

pytestmark = pytest.mark.gpu

SM_SCALE = V4_DIM ** -0.5


def pages(blocks, page, g, stride_pad=0):
    k = torch.randn(blocks, page, V4_DIM, device="cuda", generator=g)
    dense = quantize_model1_fp8(k)
    if stride_pad:
        big = torch.full((blocks, dense.shape[1] + stride_pad), 0x7F, dtype=torch.uint8, device="cuda")  # poisoned gaps
        big[:, :dense.shape[1]] = dense
        dense = big[:, :dense.shape[1]]
    return dense


def run(heads, page, q, kv, idx, lengths, *, mode="decode", sink=None, lse_base="e", topk=2048):
    rows = q.shape[0]
    p = sm.plan(sm.Caps(num_heads=heads, topk=topk, kv_format="model1_fp8", q_head_dim=V4_DIM,
                        kv_lora_rank=448, page_size=page, max_rows=max(rows, 1), mode=mode))
    scratch = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
    out = torch.full((rows, heads, V4_DIM), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((rows, heads), float("nan"), device="cuda")
    b = p.bind(scratch, q=q, indices=idx, lengths=lengths, out=out, lse=lse)
    (sm.run_extend if mode == "extend" else sm.run_decode)(b, kv_cache=kv, sm_scale=SM_SCALE, attn_sink=sink,
                                                          lse_base=lse_base)
    torch.cuda.synchronize()
    return out, lse


def check(q, kv, page, idx, lengths, out, lse, sink=None, lse_base="e"):
    ref, ref_lse = sparse_mla_v4_reference(q, kv, idx, lengths, SM_SCALE, main_page=page, attn_sink=sink)
    assert_matches(out, lse, ref, ref_lse, lse_base)


def assert_matches(out, lse, ref, ref_lse, lse_base):
    """out and lse (in lse_base) written everywhere and within tolerance of the reference's; lse
    finite exactly where the reference's is. Returns the finite mask."""
    assert not out.isnan().any() and not lse.isnan().any(), "unwritten outputs"
    torch.testing.assert_close(out.float(), ref, atol=1e-2 * ref.abs().max().item() + 1e-4, rtol=5e-2)
    want = ref_lse if lse_base == "e" else ref_lse / math.log(2.0)
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(lse), fin)
    torch.testing.assert_close(lse[fin], want[fin], atol=2e-3 * want[fin].abs().max().item() + 2e-3, rtol=1e-3)
    return fin


# (heads, page, Caps.topk): sparse-mla-model1's specs, then the DeepSeek-V4 presets' (topk 512)
MAIN_CASES = [(h, p, 2048) for h in (8, 16) for p in (64, 256)] + [(h, 256, 512) for h in (32, 64, 128)]


@pytest.mark.parametrize("mode", ("decode", "extend"))
@pytest.mark.parametrize("heads,page,topk", MAIN_CASES)
def test_model1_main_cache_matches_reference(heads, page, topk, mode):
    g = torch.Generator(device="cuda").manual_seed(heads + page)
    blocks = 40
    kv = pages(blocks, page, g)
    for rows, width in ((1, 128), (5, 512), (33, 2048)):
        if width > topk:
            continue
        q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
        idx = torch.randint(0, blocks * page, (rows, width), device="cuda", generator=g, dtype=torch.int32)
        idx[torch.rand(rows, width, device="cuda", generator=g) < 0.1] = -1
        lengths = torch.randint(width // 2, width + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
        out, lse = run(heads, page, q, kv, idx, lengths, mode=mode, topk=topk)
        check(q, kv, page, idx, lengths, out, lse)


@pytest.mark.parametrize("mode", ("decode", "extend"))
def test_model1_edge_cases(mode):
    """Out-of-range and negative ids, duplicates, a zero-length row, an all-invalid row, a
    page-strided cache, a sink and lse in base 2."""
    g = torch.Generator(device="cuda").manual_seed(3)
    heads, page, blocks, width = 16, 64, 24, 256
    kv = pages(blocks, page, g, stride_pad=576)
    q = torch.randn(5, heads, V4_DIM, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, blocks * page, (5, width), device="cuda", generator=g, dtype=torch.int32)
    idx[0, ::3] = blocks * page + 7
    idx[0, 1::5] = -12345
    idx[1, :40] = idx[1, 0]
    idx[3] = -1
    lengths = torch.tensor([width, width, 0, width, 100], dtype=torch.int32, device="cuda")
    sink = torch.randn(heads, device="cuda", generator=g)
    out, lse = run(heads, page, q, kv, idx, lengths, mode=mode, sink=sink, lse_base="2")
    check(q, kv, page, idx, lengths, out, lse, sink=sink, lse_base="2")
    assert torch.all(out[2] == 0) and torch.all(out[3] == 0)


def test_model1_dequant_is_the_references():
    """The pages the kernel reads dequantise, in the reference, to the values the quantiser was
    given (within e4m3): the reference is not compared against itself only."""
    g = torch.Generator(device="cuda").manual_seed(1)
    k = torch.randn(2, 64, V4_DIM, device="cuda", generator=g)
    kv = quantize_model1_fp8(k)
    assert kv.shape[1] == model1_page_bytes(64)
    torch.testing.assert_close(dequantize_model1_fp8(kv, 64), k, rtol=2 ** -3, atol=2e-2)


def v4_plan(heads, rows, xtopk, xpage, mode="decode", num_sms=None):
    return sm.plan(sm.Caps(num_heads=heads, topk=512, kv_format="model1_fp8", q_head_dim=V4_DIM, kv_lora_rank=448,
                           page_size=256, extra_topk=xtopk, extra_page_size=xpage, max_rows=max(rows, 1), mode=mode,
                           num_sms=num_sms))


def run_two(heads, q, main, idx, lengths, extra, xidx, xlengths, xtopk, xpage, *, mode="decode", sink=None,
            lse_base="e", num_sms=None):
    rows = q.shape[0]
    p = v4_plan(heads, rows, xtopk, xpage, mode, num_sms)
    scratch = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
    out = torch.full((rows, heads, V4_DIM), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((rows, heads), float("nan"), device="cuda")
    b = p.bind(scratch, q=q, indices=idx, lengths=lengths, out=out, lse=lse, extra_indices=xidx, extra_lengths=xlengths)
    (sm.run_extend if mode == "extend" else sm.run_decode)(b, kv_cache=main, sm_scale=SM_SCALE, attn_sink=sink,
                                                          lse_base=lse_base, extra_kv_cache=extra)
    torch.cuda.synchronize()
    return out, lse


def check_two(q, main, idx, lengths, extra, xidx, xlengths, xpage, out, lse, sink, base, empty_row):
    """run_two's out and lse against the reference (main pages of 256); row empty_row has
    neither list: out 0 and lse -inf."""
    ref, ref_lse = sparse_mla_v4_reference(q, main, idx, lengths, SM_SCALE, main_page=256, extra_kv=extra,
                                           extra_indices=xidx, extra_lengths=xlengths, extra_page=xpage,
                                           attn_sink=sink)
    fin = assert_matches(out, lse, ref, ref_lse, base)
    assert not fin[empty_row].any() and torch.all(out[empty_row] == 0)


@pytest.mark.parametrize("mode", ("decode", "extend"))
@pytest.mark.parametrize("heads", (8, 16, 32, 64, 128))
@pytest.mark.parametrize("xtopk,xpage,xwidth", [(1024, 64, 512), (1024, 64, 1024), (8192, 2, 8192), (8192, 2, 1024)])
def test_model1_main_and_extra_in_one_softmax(heads, xtopk, xpage, xwidth, mode):
    """SWA 128 (page 256) + C4 (page 64) or C128 (page 2): every row's main and extra entries in
    one softmax; zero-length main or extra lists, a row with neither, -1 and out-of-range ids in
    both lists, duplicates, a sink and both lse bases."""
    g = torch.Generator(device="cuda").manual_seed(heads + xtopk + xwidth)
    main = pages(12, 256, g)
    extra = pages(-(-xwidth // xpage) + 8, xpage, g, stride_pad=576)
    rows = 6
    q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, 12 * 256, (rows, 128), device="cuda", generator=g, dtype=torch.int32)
    xidx = torch.randint(0, extra.shape[0] * xpage, (rows, xwidth), device="cuda", generator=g, dtype=torch.int32)
    idx[0, ::7] = -1
    xidx[0, ::5] = extra.shape[0] * xpage + 3           # past the extra cache
    xidx[1, :30] = xidx[1, 0]                            # duplicates
    lengths = torch.tensor([128, 0, 77, 128, 0, 100], dtype=torch.int32, device="cuda")
    xlengths = torch.tensor([xwidth, xwidth - 64, 0, 13, 0, xwidth], dtype=torch.int32, device="cuda")  # row 4: none
    for sink, base in ((None, "e"), (torch.randn(heads, device="cuda", generator=g), "2")):
        out, lse = run_two(heads, q, main, idx, lengths, extra, xidx, xlengths, xtopk, xpage, mode=mode, sink=sink,
                           lse_base=base)
        check_two(q, main, idx, lengths, extra, xidx, xlengths, xpage, out, lse, sink, base, empty_row=4)


@pytest.mark.parametrize("heads", (32, 64, 128))
def test_model1_one_split_runs_the_whole_row_kernel(heads):
    """A decode call whose rows alone fill the GPU (a plan for one SM) gets one split a row and
    runs the extend kernel of its spec (at 32 heads the heads-as-N producer form, at 64 and 128 the
    64-head producer form), which writes out, lse and the sink itself: main + C4 lists, a row with
    neither list, -1 and out-of-range ids."""
    rows, xwidth, xpage = 4, 512, 64
    p = v4_plan(heads, rows, 1024, xpage, num_sms=1)
    assert p.whole_row and p.splits(rows, 128 + xwidth)[0] == 1
    g = torch.Generator(device="cuda").manual_seed(heads + 5)
    main = pages(12, 256, g)
    extra = pages(xwidth // xpage + 8, xpage, g)
    q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, 12 * 256, (rows, 128), device="cuda", generator=g, dtype=torch.int32)
    xidx = torch.randint(0, extra.shape[0] * xpage, (rows, xwidth), device="cuda", generator=g, dtype=torch.int32)
    idx[0, ::7] = -1
    xidx[3, ::5] = extra.shape[0] * xpage + 3
    lengths = torch.tensor([128, 0, 90, 128], dtype=torch.int32, device="cuda")
    xlengths = torch.tensor([xwidth, 0, xwidth - 64, 200], dtype=torch.int32, device="cuda")   # row 1: neither list
    for sink, base in ((None, "e"), (torch.randn(heads, device="cuda", generator=g), "2")):
        out, lse = run_two(heads, q, main, idx, lengths, extra, xidx, xlengths, 1024, xpage, sink=sink,
                           lse_base=base, num_sms=1)
        check_two(q, main, idx, lengths, extra, xidx, xlengths, xpage, out, lse, sink, base, empty_row=1)


def test_model1_c128_extra_list_from_the_helper_in_a_graph():
    """The engine's C128 sequence: CompressedEntries fills the extra list from the device lengths
    and block table, then decode runs; both captured in one CUDA graph and replayed with new
    lengths, against the reference, with no allocation on replay."""
    from b12x.metadata import CompressedEntries

    g = torch.Generator(device="cuda").manual_seed(11)
    heads, rows, width, xpage = 16, 4, 8192, 2
    main = pages(8, 256, g)
    blocks = width // xpage
    extra = pages(blocks, xpage, g)
    table = torch.randperm(blocks, device="cuda", generator=g).to(torch.int32).repeat(rows, 1)
    q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, 8 * 256, (rows, 128), device="cuda", generator=g, dtype=torch.int32)
    lengths = torch.full((rows,), 128, dtype=torch.int32, device="cuda")
    seq = torch.tensor([5000, 128 * 8192 + 9, 0, 300000], dtype=torch.int32, device="cuda")
    entries = CompressedEntries(max_rows=rows, width=width, page=xpage, device="cuda")
    xidx = torch.empty(rows, width, dtype=torch.int32, device="cuda")
    xlen = torch.empty(rows, dtype=torch.int32, device="cuda")
    p = sm.plan(sm.Caps(num_heads=heads, topk=512, kv_format="model1_fp8", q_head_dim=V4_DIM, kv_lora_rank=448,
                        page_size=256, extra_topk=8192, extra_page_size=2, max_rows=rows))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    b = p.bind(scratch, q=q, indices=idx, lengths=lengths, extra_indices=xidx, extra_lengths=xlen)

    def step():
        entries.fill(seq, table, xidx, xlen)
        sm.run_decode(b, kv_cache=main, sm_scale=SM_SCALE, extra_kv_cache=extra)

    step()                                   # loads the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for lens in ([5000, 128 * 8192 + 9, 0, 300000], [128, 999999, 64 * 128, 1]):
        seq.copy_(torch.tensor(lens, dtype=torch.int32))
        before = torch.cuda.memory_allocated()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before
        ref, ref_lse = sparse_mla_v4_reference(q, main, idx, lengths, SM_SCALE, main_page=256, extra_kv=extra,
                                               extra_indices=xidx, extra_lengths=xlen, extra_page=xpage)
        assert torch.equal(xlen.cpu(), torch.tensor([min(v // 128, width) for v in lens], dtype=torch.int32))
        torch.testing.assert_close(b.out.float(), ref, atol=1e-2 * ref.abs().max().item() + 1e-4, rtol=5e-2)


def test_model1_vllm_adapter_and_custom_op_match_the_facade():
    """b12x.integration.vllm.SparseMLAV4.decode (vLLM's DeepSeek-V4 call shape) and the torch op
    b12x::sparse_mla_v4 give the facade's result (SWA + C4, sink on)."""
    from b12x.integration.vllm import SparseMLAV4

    g = torch.Generator(device="cuda").manual_seed(21)
    heads, rows = 16, 3
    main, extra = pages(8, 256, g), pages(20, 64, g)
    q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, 8 * 256, (rows, 128), device="cuda", generator=g, dtype=torch.int32)
    xidx = torch.randint(0, 20 * 64, (rows, 512), device="cuda", generator=g, dtype=torch.int32)
    lengths = torch.full((rows,), 128, dtype=torch.int32, device="cuda")
    xlengths = torch.tensor([512, 300, 0], dtype=torch.int32, device="cuda")
    sink = torch.randn(heads, device="cuda", generator=g)
    ref, _ = run_two(heads, q, main, idx, lengths, extra, xidx, xlengths, 1024, 64, sink=sink)
    mla = SparseMLAV4(num_heads=heads, swa_topk=512, swa_page_size=256, extra_topk=1024, extra_page_size=64, max_rows=8)
    ws = torch.empty(mla.scratch_bytes(), dtype=torch.uint8, device="cuda")
    out = torch.empty(rows, heads, V4_DIM, dtype=torch.bfloat16, device="cuda")
    mla.decode(q, main, idx, lengths, out=out, scratch=ws, sm_scale=SM_SCALE, extra_cache=extra, extra_indices=xidx,
               extra_lengths=xlengths, attn_sink=sink)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    out2 = torch.empty_like(out)
    lse2 = torch.empty(rows, heads, device="cuda")
    torch.ops.b12x.sparse_mla_v4(q, main, idx, lengths, extra, xidx, xlengths, ws, out2, lse2, SM_SCALE, sink, True,
                                 512, 256, 1024, 64, 8, "decode")
    torch.testing.assert_close(out2, ref, atol=0, rtol=0)


def test_v4_indexer_topk_feeds_the_c4_extra_list():
    """A DeepSeek-V4 C4 layer end to end: the 64-head c = 4 indexer's top-512 over the compressed
    index cache (b12x.integration.vllm.SparseIndexer), its positions turned into slots of the C4
    attention cache through the same block table (the engine's step), then SWA + C4 attention in
    one softmax, against the reference on those indices; the top-k sets are exact."""
    from b12x.indexer_reference import indexer_logits_paged_reference
    from b12x.integration import vllm as adapter

    from .indexer_cases import check_selection, paged_inputs

    k, c, heads = 512, 4, 16
    lengths_tok = [c * 3000 + 1, c * 700 + 2, c * 5000 + 3]      # never a multiple of c
    rows, width = len(lengths_tok), 8192
    qi, wi, kvi, bt, seq = paged_inputs(lengths_tok, heads=64, next_n=1, c=c, width=width, seed=5)
    sparse = adapter.SparseIndexer(num_heads=64, topk=k, max_rows=rows, max_width=width, compress_ratio=c)
    bufs = adapter.make_topk_buffers(rows, k, dcp_world_size=1, device="cuda")
    ws = torch.full((sparse.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
    sparse.topk(qi, wi, kvi, bt, seq, scratch=ws, out=bufs, width=width)
    torch.cuda.synchronize()
    ref_logits = indexer_logits_paged_reference(qi, wi, kvi, bt, seq, width, compress_ratio=c)
    entries = [L // c for L in lengths_tok]
    for r in range(rows):
        check_selection(bufs.indices[r], ref_logits[r, :entries[r]], k, what=f"row {r}", tol=1e-4)
    pos = bufs.indices[:rows]                                   # row-relative entry positions, -1 tail
    safe = pos.clamp(min=0).long()
    slots = torch.where(pos >= 0, bt.long().gather(1, safe // 64) * 64 + safe % 64, -1).to(torch.int32)
    xlen = torch.tensor([min(e, k) for e in entries], dtype=torch.int32, device="cuda")

    g = torch.Generator(device="cuda").manual_seed(6)
    c4 = pages(kvi.shape[0], 64, g)                             # the C4 attention cache: same pages, same table
    main = pages(8, 256, g)
    q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, 8 * 256, (rows, 128), device="cuda", generator=g, dtype=torch.int32)
    lengths = torch.full((rows,), 128, dtype=torch.int32, device="cuda")
    out, lse = run_two(heads, q, main, idx, lengths, c4, slots.contiguous(), xlen, 1024, 64)
    ref, ref_lse = sparse_mla_v4_reference(q, main, idx, lengths, SM_SCALE, main_page=256, extra_kv=c4,
                                           extra_indices=slots, extra_lengths=xlen, extra_page=64)
    torch.testing.assert_close(out.float(), ref, atol=1e-2 * ref.abs().max().item() + 1e-4, rtol=5e-2)
    torch.testing.assert_close(lse, ref_lse, atol=2e-3 * ref_lse.abs().max().item() + 2e-3, rtol=1e-3)


@pytest.mark.parametrize("heads", (64, 128))
@pytest.mark.parametrize("extra", (None, (512, 64), (1024, 2)))
def test_model1_matches_flashmla_model1_decode(heads, extra):
    """Cross-check against FlashMLA's MODEL1 decode on the same pages and indices (where the peer
    is installed): SWA 128 (pages of 256) alone, + C4 (page 64), + C128 (page 2), with a sink."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from benchmarks.peers import flashmla

    if not flashmla.available():
        pytest.skip(f"FlashMLA peer: {flashmla.unavailable_reason()}")
    g = torch.Generator(device="cuda").manual_seed(heads)
    rows = 6
    main = pages(16, 256, g)
    q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, 16 * 256, (rows, 128), device="cuda", generator=g, dtype=torch.int32)
    idx[0, ::9] = -1
    lengths = torch.tensor([128, 128, 64, 128, 1, 128], dtype=torch.int32, device="cuda")
    sink = torch.randn(heads, device="cuda", generator=g)
    pkw = {}
    if extra is None:
        out, lse = run(heads, 256, q, main, idx, lengths, sink=sink, topk=512)
    else:
        w, page = extra
        ext = pages(-(-4096 // page), page, g)
        xidx = torch.randint(0, ext.shape[0] * page, (rows, w), device="cuda", generator=g, dtype=torch.int32)
        xlen = torch.tensor([w, w // 2, 0, w, 7, w], dtype=torch.int32, device="cuda")
        xtopk = 1024 if page == 64 and heads == 128 else (512 if page == 64 else 8192)
        out, lse = run_two(heads, q, main, idx, lengths, ext, xidx, xlen, xtopk, page, sink=sink)
        pkw = dict(extra_pages=ext, extra_page=page, extra_indices=xidx, extra_lengths=xlen)
    fn, _ = flashmla.decode_model1(q, main, 256, idx, lengths, SM_SCALE, attn_sink=sink, **pkw)
    peer_out, peer_lse = fn()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), peer_out.float(), atol=2e-2 * peer_out.float().abs().max().item(), rtol=5e-2)
    fin = torch.isfinite(peer_lse) & torch.isfinite(lse)
    torch.testing.assert_close(lse[fin], peer_lse[fin].float(), atol=5e-3, rtol=1e-3)


@pytest.mark.parametrize("mode", ("decode", "extend"))
def test_model1_cache_past_2_31_bytes(mode):
    """Pages that sit past 2^31 bytes of the cache tensor (64-bit addressing), main and extra: only
    the last pages hold data; the reference reads a compact copy of them with remapped indices."""
    g = torch.Generator(device="cuda").manual_seed(31)
    heads, rows, live = 16, 3, 4
    blocks = (2 ** 31) // model1_page_bytes(256) + 64
    big = torch.zeros(blocks, model1_page_bytes(256), dtype=torch.uint8, device="cuda")
    big[-live:] = pages(live, 256, g)
    assert big[-live:].data_ptr() - big.data_ptr() > 2 ** 31
    xblocks = (2 ** 31) // model1_page_bytes(2) + 64
    xbig = torch.zeros(xblocks, model1_page_bytes(2), dtype=torch.uint8, device="cuda")
    xbig[-64:] = pages(64, 2, g)
    q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
    local = torch.randint(0, live * 256, (rows, 128), device="cuda", generator=g, dtype=torch.int32)
    xlocal = torch.randint(0, 64 * 2, (rows, 1024), device="cuda", generator=g, dtype=torch.int32)
    idx = local + (blocks - live) * 256
    xidx = xlocal + (xblocks - 64) * 2
    lengths = torch.full((rows,), 128, dtype=torch.int32, device="cuda")
    xlen = torch.tensor([1024, 500, 3], dtype=torch.int32, device="cuda")
    out, lse = run_two(heads, q, big, idx, lengths, xbig, xidx, xlen, 8192, 2, mode=mode)
    ref, ref_lse = sparse_mla_v4_reference(q, big[-live:], local, lengths, SM_SCALE, main_page=256,
                                           extra_kv=xbig[-64:], extra_indices=xlocal, extra_lengths=xlen, extra_page=2)
    torch.testing.assert_close(out.float(), ref, atol=1e-2 * ref.abs().max().item() + 1e-4, rtol=5e-2)
    torch.testing.assert_close(lse, ref_lse, atol=2e-3 * ref_lse.abs().max().item() + 2e-3, rtol=1e-3)
