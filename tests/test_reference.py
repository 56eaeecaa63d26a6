"""Semantics of the torch reference that the kernels are tested against."""
import math

import torch

from b12x.reference import dequantize_fp8_ds_mla, quantize_fp8_ds_mla, sparse_mla_reference


def _naive(q, kv, idx, lengths, scale, sink=None):
    rows, h, _ = q.shape
    flat = kv.reshape(-1, 576).double()
    out = torch.zeros(rows, h, 512, dtype=torch.float64)
    lse = torch.full((rows, h), -math.inf, dtype=torch.float64)
    for r in range(rows):
        sel = [int(i) for j, i in enumerate(idx[r]) if j < lengths[r] and i >= 0]
        if not sel:
            continue
        k = flat[sel]
        s = q[r].double() @ k.T * scale
        lse[r] = torch.logsumexp(s, -1)
        out[r] = torch.softmax(s, -1) @ k[:, :512]
        if sink is not None:
            out[r] *= (torch.exp(lse[r]) / (torch.exp(lse[r]) + torch.exp(sink.double())))[:, None]
    return out, lse


def test_reference_matches_naive_with_masking_duplicates_and_sink():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, 16, 576, generator=g)
    kv = torch.randn(3, 64, 576, generator=g)
    idx = torch.randint(0, 192, (4, 128), generator=g, dtype=torch.int32)
    idx[0, ::3] = -1               # invalid entries
    idx[1, :10] = 7                # duplicates count each time
    lengths = torch.tensor([128, 50, 0, 128], dtype=torch.int32)  # row 2 is empty
    idx[3] = -1                    # row 3 has no valid entry
    sink = torch.randn(16, generator=g)
    for s in (None, sink):
        out, lse = sparse_mla_reference(q, kv, idx, lengths, 0.05, s, dtype=torch.float64)
        ref_out, ref_lse = _naive(q, kv, idx, lengths, 0.05, s)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(lse, ref_lse)
    assert torch.all(lse[2:] == -math.inf) and torch.all(out[2:] == 0)


def test_duplicates_shift_weight():
    q = torch.randn(1, 16, 576)
    kv = torch.randn(1, 64, 576)
    one = torch.tensor([[3, 5] + [-1] * 62], dtype=torch.int32)
    dup = torch.tensor([[3, 3, 5] + [-1] * 61], dtype=torch.int32)
    n = torch.tensor([64], dtype=torch.int32)
    a, la = sparse_mla_reference(q, kv, one, n, 0.1)
    b, lb = sparse_mla_reference(q, kv, dup, n, 0.1)
    assert not torch.allclose(a, b)
    s3 = (q[0] @ kv[0, 3]) * 0.1
    torch.testing.assert_close(lb, torch.logaddexp(la, s3))


def test_fp8_record_roundtrip_and_layout():
    k = torch.randn(2, 64, 576) * 3
    rec = quantize_fp8_ds_mla(k)
    assert rec.dtype == torch.uint8 and rec.shape == (2, 64, 656)
    deq = dequantize_fp8_ds_mla(rec)
    torch.testing.assert_close(deq[..., 512:], k[..., 512:].bfloat16().float())  # RoPE stays bf16
    rel = (deq[..., :512] - k[..., :512]).norm() / k[..., :512].norm()
    assert rel < 0.05  # e4m3 has 3 mantissa bits
    scales = rec[..., 512:528].contiguous().view(torch.float32)
    torch.testing.assert_close(scales[0, 0, 1], k[0, 0, 128:256].abs().max() / 448)


def test_out_of_range_indices_are_masked_like_minus_one():
    """An index outside [0, blocks * 64) (any negative value, or past the cache) counts as -1."""
    g = torch.Generator().manual_seed(2)
    blocks = 3
    q = torch.randn(3, 16, 576, generator=g)
    kv = torch.randn(blocks, 64, 576, generator=g)
    idx = torch.randint(0, blocks * 64, (3, 128), generator=g, dtype=torch.int32)
    lengths = torch.tensor([128, 100, 128], dtype=torch.int32)
    bad = torch.tensor([blocks * 64, blocks * 64 * 50, 2**31 - 1, -2**31, -2, -100], dtype=torch.int32)
    pos = torch.randperm(128, generator=g)[:30]
    wild = idx.clone()
    wild[:2, pos] = bad[torch.arange(30) % len(bad)]
    wild[2] = bad[torch.arange(128) % len(bad)]            # a row with no valid entry
    masked = torch.where((wild >= 0) & (wild < blocks * 64), wild, -1)
    for cache in (kv, quantize_fp8_ds_mla(kv)):
        out, lse = sparse_mla_reference(q, cache, wild, lengths, 0.05, dtype=torch.float64)
        ref_out, ref_lse = sparse_mla_reference(q, cache, masked, lengths, 0.05, dtype=torch.float64)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(lse, ref_lse)
        assert torch.isfinite(lse[:2]).all()
        assert torch.all(out[2] == 0) and torch.all(lse[2] == -math.inf)
