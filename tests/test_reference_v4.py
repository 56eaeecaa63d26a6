"""The DeepSeek-V4 references (b12x.reference): the model1_fp8 quantiser and dequantiser (layout,
round trip, page strides) and the two-cache attention, against independent loops."""
import math

import pytest
import torch

from b12x.reference import (V4_DIM, V4_GROUP, V4_NOPE, dequantize_model1_fp8, model1_page_bytes,
                            quantize_model1_fp8, sparse_mla_v4_reference)


@pytest.mark.parametrize("page,expected", [(64, 37440), (256, 149760), (2, 1728)])
def test_page_bytes_round_up_to_576(page, expected):
    assert model1_page_bytes(page) == expected
    assert expected % 576 == 0 and expected >= page * 584 > expected - 576


@pytest.mark.parametrize("page", [2, 64, 256])
def test_layout_and_round_trip(page):
    g = torch.Generator().manual_seed(page)
    k = torch.randn(3, page, V4_DIM, generator=g) * torch.logspace(-3, 2, V4_DIM)[None, None, :]
    pages = quantize_model1_fp8(k)
    assert pages.shape == (3, model1_page_bytes(page)) and pages.dtype == torch.uint8
    # token t: 448 e4m3 at t * 576, its 64 bf16 RoPE values right after; scales at page * 576 + 8 t
    t = page - 1
    rope = pages[1, t * 576 + 448:(t + 1) * 576].contiguous().view(torch.bfloat16)
    assert torch.equal(rope, k[1, t, V4_NOPE:].bfloat16())
    exps = pages[1, page * 576 + 8 * t:page * 576 + 8 * t + 8]
    assert exps[7] == 0                                   # the pad byte
    assert torch.all(pages[:, page * 584:] == 0)          # the page tail
    for grp in range(7):
        scale = 2.0 ** (int(exps[grp]) - 127)
        amax = k[1, t, grp * V4_GROUP:(grp + 1) * V4_GROUP].abs().max().item()
        assert amax / scale <= 448 and amax / scale > 224   # the smallest power of two that fits
        vals = pages[1, t * 576 + grp * V4_GROUP:t * 576 + (grp + 1) * V4_GROUP].view(torch.float8_e4m3fn).float()
        assert torch.allclose(vals * scale, k[1, t, grp * V4_GROUP:(grp + 1) * V4_GROUP], rtol=2 ** -4, atol=scale * 2 ** -9)
    deq = dequantize_model1_fp8(pages, page)
    assert deq.shape == (3, page, V4_DIM)
    assert torch.equal(deq[..., V4_NOPE:], k[..., V4_NOPE:].bfloat16().float())
    scale = torch.exp2((pages[:, page * 576:page * 584].reshape(3, page, 8)[..., :7].float() - 127))
    atol = (scale * 2 ** -9).repeat_interleave(V4_GROUP, dim=-1)
    assert torch.all((deq[..., :V4_NOPE] - k[..., :V4_NOPE]).abs() <= k[..., :V4_NOPE].abs() * 2 ** -4 + atol)


def test_page_strided_view_dequantises_the_same():
    k = torch.randn(4, 64, V4_DIM)
    dense = quantize_model1_fp8(k)
    wide = torch.zeros(4, dense.shape[1] + 576, dtype=torch.uint8)
    wide[:, :dense.shape[1]] = dense
    assert torch.equal(dequantize_model1_fp8(wide, 64), dequantize_model1_fp8(dense, 64))
    assert torch.equal(quantize_model1_fp8(k, page_bytes=dense.shape[1] + 576)[:, :dense.shape[1]], dense)
    with pytest.raises(ValueError, match="page_bytes: expected >= 37440"):
        quantize_model1_fp8(k, page_bytes=37439)
    with pytest.raises(ValueError, match="pages: expected uint8"):
        dequantize_model1_fp8(dense[:, :100], 64)


def loop_reference(q, caches, sm_scale, sink=None):
    """float64, one (row, head) at a time: every valid entry of every list in one softmax."""
    rows, heads, _ = q.shape
    out = torch.zeros(rows, heads, V4_DIM, dtype=torch.float64)
    lse = torch.full((rows, heads), -math.inf, dtype=torch.float64)
    for r in range(rows):
        keys = []
        for flat, idx, n in caches:
            for j in range(min(int(n[r]), idx.shape[1])):
                s = int(idx[r, j])
                if 0 <= s < flat.shape[0]:
                    keys.append(flat[s].double())
        if not keys:
            continue
        K = torch.stack(keys)
        for h in range(heads):
            sc = (K @ q[r, h].double()) * sm_scale
            m = sc.max()
            p = torch.exp(sc - m)
            lse[r, h] = m + torch.log(p.sum())
            o = (p[:, None] * K).sum(0) / p.sum()
            if sink is not None:
                o = o / (1 + math.exp(float(sink[h]) - float(lse[r, h])))
            out[r, h] = o
    return out, lse


@pytest.mark.parametrize("with_extra", [False, True])
@pytest.mark.parametrize("with_sink", [False, True])
def test_two_caches_in_one_softmax(with_extra, with_sink):
    g = torch.Generator().manual_seed(7)
    rows, heads, page_m, page_e = 5, 4, 64, 2
    main = quantize_model1_fp8(torch.randn(3, page_m, V4_DIM, generator=g))
    extra = quantize_model1_fp8(torch.randn(40, page_e, V4_DIM, generator=g))
    q = torch.randn(rows, heads, V4_DIM, generator=g).bfloat16()
    mi = torch.randint(-5, 3 * page_m + 5, (rows, 128), generator=g, dtype=torch.int32)   # -ids and past the cache
    mi[1, :10] = mi[1, 0]                                                             # duplicates
    ml = torch.tensor([128, 0, 77, 128, 0], dtype=torch.int32)
    ei = torch.randint(0, 80, (rows, 64), generator=g, dtype=torch.int32)
    ei[2, 5] = -1
    el = torch.tensor([64, 10, 0, 33, 0], dtype=torch.int32)                           # row 4: nothing valid
    sink = torch.randn(heads, generator=g) if with_sink else None
    kw = dict(main_page=page_m, attn_sink=sink, dtype=torch.float64)
    if with_extra:
        kw.update(extra_kv=extra, extra_indices=ei, extra_lengths=el, extra_page=page_e)
    out, lse = sparse_mla_v4_reference(q, main, mi, ml, V4_DIM ** -0.5, **kw)
    caches = [(dequantize_model1_fp8(main, page_m, torch.float64).reshape(-1, V4_DIM), mi, ml)]
    if with_extra:
        caches.append((dequantize_model1_fp8(extra, page_e, torch.float64).reshape(-1, V4_DIM), ei, el))
    ref_out, ref_lse = loop_reference(q, caches, V4_DIM ** -0.5, sink)
    assert torch.allclose(out, ref_out, atol=1e-9)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert torch.allclose(lse[fin], ref_lse[fin], atol=1e-9)
    assert torch.all(out[4] == 0) and torch.all(torch.isinf(lse[4]))
    with pytest.raises(ValueError, match="main_page"):
        sparse_mla_v4_reference(q, main, mi, ml, 1.0)
