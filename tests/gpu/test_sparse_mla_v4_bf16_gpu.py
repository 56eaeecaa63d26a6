"""Sparse MLA over a bf16 cache at DeepSeek-V4's head dims (512 = 448 NoPE + 64 RoPE, V all 512):
the cache engines dequantise model1_fp8 pages to for prefill. Decode and extend at every head
count against the torch reference, with the V3.2 contract's edge cases. Build first:
`b12x-codegen build --preset sparse-mla-v4-bf16`."""
import math

import pytest
import torch

from b12x.attention import sparse_mla as sm
from b12x.reference import V4_DIM, sparse_mla_v4_reference

pytestmark = pytest.mark.gpu

SM_SCALE = V4_DIM ** -0.5
HEADS = (8, 16, 32, 64, 128)


def run(heads, q, kv, idx, lengths, *, mode, sink=None, lse_base="e"):
    rows = q.shape[0]
    p = sm.plan(sm.Caps(num_heads=heads, topk=2048, kv_format="bf16", **sm.V4_HEAD_DIMS, max_rows=max(rows, 1),
                        mode=mode))
    scratch = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
    out = torch.full((rows, heads, V4_DIM), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((rows, heads), float("nan"), device="cuda")
    b = p.bind(scratch, q=q, indices=idx, lengths=lengths, out=out, lse=lse)
    (sm.run_extend if mode == "extend" else sm.run_decode)(b, kv_cache=kv, sm_scale=SM_SCALE, attn_sink=sink,
                                                          lse_base=lse_base)
    torch.cuda.synchronize()
    return out, lse


def check(q, kv, idx, lengths, out, lse, sink=None, lse_base="e"):
    ref, ref_lse = sparse_mla_v4_reference(q, kv, idx, lengths, SM_SCALE, attn_sink=sink)
    assert not out.isnan().any() and not lse.isnan().any(), "unwritten outputs"
    torch.testing.assert_close(out.float(), ref, atol=1e-2 * ref.abs().max().item() + 1e-4, rtol=5e-2)
    want = ref_lse if lse_base == "e" else ref_lse / math.log(2.0)
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(lse), fin)
    torch.testing.assert_close(lse[fin], want[fin], atol=2e-3 * want[fin].abs().max().item() + 2e-3, rtol=1e-3)


@pytest.mark.parametrize("mode", ("decode", "extend"))
@pytest.mark.parametrize("heads", HEADS)
def test_v4_dims_bf16_matches_reference(heads, mode):
    """Rows of 128 to 2048 entries (one to 32 tiles), -1 entries, lengths inside a tile. The RoPE
    block is part of V here, so P must not live in it (the 8-32-head extend keeps P beside its
    one K stage): a wrong placement shows in the last 64 value dims."""
    g = torch.Generator(device="cuda").manual_seed(heads)
    blocks = 48
    kv = torch.randn(blocks, 64, V4_DIM, device="cuda", generator=g).bfloat16()
    for rows, width in ((1, 128), (5, 512), (33, 2048)):
        q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
        idx = torch.randint(0, blocks * 64, (rows, width), device="cuda", generator=g, dtype=torch.int32)
        idx[torch.rand(rows, width, device="cuda", generator=g) < 0.1] = -1
        lengths = torch.randint(width // 2, width + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
        out, lse = run(heads, q, kv, idx, lengths, mode=mode)
        check(q, kv, idx, lengths, out, lse)
        ref, _ = sparse_mla_v4_reference(q, kv, idx, lengths, SM_SCALE)
        rope_v = ref[..., 448:]                 # V's RoPE block, at a tolerance of its own magnitude
        torch.testing.assert_close(out.float()[..., 448:], rope_v, atol=1e-2 * rope_v.abs().max().item() + 1e-4,
                                   rtol=5e-2)


@pytest.mark.parametrize("mode", ("decode", "extend"))
@pytest.mark.parametrize("heads", (16, 128))
def test_v4_dims_bf16_edge_cases(heads, mode):
    """Out-of-range and negative ids, duplicates, a zero-length row, an all-invalid row, a
    page-strided cache view, a sink and lse in base 2."""
    g = torch.Generator(device="cuda").manual_seed(7 + heads)
    blocks, width = 24, 256
    big = torch.full((blocks, 64 * V4_DIM + 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    kv = big[:, :64 * V4_DIM].view(blocks, 64, V4_DIM)        # a page stride past the page (poisoned gaps)
    kv.copy_(torch.randn(blocks, 64, V4_DIM, device="cuda", generator=g))
    q = torch.randn(5, heads, V4_DIM, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, blocks * 64, (5, width), device="cuda", generator=g, dtype=torch.int32)
    idx[0, ::3] = blocks * 64 + 7
    idx[0, 1::5] = -12345
    idx[1, :40] = idx[1, 0]
    idx[3] = -1
    lengths = torch.tensor([width, width, 0, width, 100], dtype=torch.int32, device="cuda")
    sink = torch.randn(heads, device="cuda", generator=g)
    out, lse = run(heads, q, kv, idx, lengths, mode=mode, sink=sink, lse_base="2")
    check(q, kv, idx, lengths, out, lse, sink=sink, lse_base="2")
    assert torch.all(out[2] == 0) and torch.all(out[3] == 0)
