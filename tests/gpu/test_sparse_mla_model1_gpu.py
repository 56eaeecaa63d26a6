"""DeepSeek-V4 sparse MLA over model1_fp8 pages (the sliding-window cache alone so far): decode
and extend at 8 and 16 heads, pages of 64 and 256 tokens, against the torch reference on the
dequantised pages. Build first: `b12x-codegen build --preset sparse-mla-model1 --arch sm_90a`."""
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


def run(heads, page, q, kv, idx, lengths, *, mode="decode", sink=None, lse_base="e"):
    rows = q.shape[0]
    p = sm.plan(sm.Caps(num_heads=heads, topk=2048, kv_format="model1_fp8", q_head_dim=V4_DIM,
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
    assert not out.isnan().any() and not lse.isnan().any(), "unwritten outputs"
    o = out.float()
    torch.testing.assert_close(o, ref, atol=1e-2 * ref.abs().max().item() + 1e-4, rtol=5e-2)
    want = ref_lse if lse_base == "e" else ref_lse / math.log(2.0)
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(lse), fin)
    torch.testing.assert_close(lse[fin], want[fin], atol=2e-3 * want[fin].abs().max().item() + 2e-3, rtol=1e-3)


@pytest.mark.parametrize("mode", ("decode", "extend"))
@pytest.mark.parametrize("page", (64, 256))
@pytest.mark.parametrize("heads", (8, 16))
def test_model1_main_cache_matches_reference(heads, page, mode):
    g = torch.Generator(device="cuda").manual_seed(heads + page)
    blocks = 40
    kv = pages(blocks, page, g)
    for rows, width in ((1, 128), (5, 512), (33, 2048)):
        q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
        idx = torch.randint(0, blocks * page, (rows, width), device="cuda", generator=g, dtype=torch.int32)
        idx[torch.rand(rows, width, device="cuda", generator=g) < 0.1] = -1
        lengths = torch.randint(width // 2, width + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
        out, lse = run(heads, page, q, kv, idx, lengths, mode=mode)
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
