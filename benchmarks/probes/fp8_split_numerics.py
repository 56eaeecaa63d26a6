"""Numerics of S = Q K^T on fp8 tensor cores for fp8_ds_mla records (session 12 design probe, CPU).

The idea: keep each tile's K as raw e4m3 in shared memory and run S on e4m3 wgmma, with the bf16 Q
split into two e4m3 matrices, Q / 2^e = Q_hi + Q_lo (2^e a power of two per head, so the split is
exact wherever Q_lo stays a normal e4m3). S then needs one accumulator per 128-dim block, scaled by
that block's per-token scale, because the scales vary along N (tokens), not along K.

Run: python benchmarks/probes/fp8_split_numerics.py  (prints relative errors against float64)
"""
import torch

E4M3 = torch.float8_e4m3fn


def split_hi_lo(q: torch.Tensor):
    """Per-row power-of-two scale 2^e with max|q| / 2^e <= 448, and the two e4m3 terms."""
    e = torch.ceil(torch.log2(q.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / 448.0))
    scale = torch.exp2(e)
    qs = q / scale
    hi = qs.to(E4M3).float()
    lo = (qs - hi).to(E4M3).float()
    return hi, lo, scale


def main():
    torch.manual_seed(0)
    heads, tokens, dims = 64, 64, 512
    for q_std in (0.02, 0.5, 3.0):
        q = (torch.randn(heads, dims) * q_std).to(torch.bfloat16).float()
        codes = (torch.randn(tokens, dims) * 40).clamp(-448, 448).to(E4M3)
        scales = torch.rand(tokens, 4) * 0.01 + 0.001          # one per 128 dims per token
        k = codes.float() * scales.repeat_interleave(128, dim=1)
        ref = q.double() @ k.double().T

        hi, lo, qscale = split_hi_lo(q)
        exact = ((hi + lo) * qscale == q).float().mean().item()
        s = torch.zeros(heads, tokens)
        for b in range(4):                                     # one e4m3 accumulator per block
            blk = slice(128 * b, 128 * (b + 1))
            acc = hi[:, blk] @ codes[:, blk].float().T + lo[:, blk] @ codes[:, blk].float().T
            s += acc * scales[:, b][None, :]
        s *= qscale
        today = q.half().float() @ k.half().float().T          # fp16 Q x fp16-dequantised K
        err = lambda x: ((x.double() - ref).norm() / ref.norm()).item()  # noqa: E731
        print(f"q std {q_std:5}: Q_hi + Q_lo exact for {exact:.4f} of the elements; "
              f"S rel. error e4m3 split {err(s):.1e}, fp16 today {err(today):.1e}")


if __name__ == "__main__":
    main()
