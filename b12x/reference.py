"""Torch references: the semantics every generated kernel is tested against.

They are written for clarity and run on any device in float32 or float64."""
from __future__ import annotations

import math

import torch

PAGE = 64
NOPE, ROPE = 512, 64
FP8_RECORD = 656  # 512 e4m3 + 4 fp32 scales + 64 bf16
FP8_GROUP = 128   # one fp32 scale per 128 NoPE values


def dequantize_fp8_ds_mla(kv: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[..., 656] uint8 records -> [..., 576] (512 NoPE values times their group scale, then RoPE)."""
    if kv.dtype != torch.uint8 or kv.shape[-1] != FP8_RECORD:
        raise ValueError(f"kv: expected uint8 [..., {FP8_RECORD}], got {kv.dtype} {tuple(kv.shape)}")
    lead = kv.shape[:-1]
    kv = kv.contiguous()
    nope = kv[..., :NOPE].view(torch.float8_e4m3fn).to(dtype)
    scales = kv[..., NOPE:NOPE + 16].contiguous().view(torch.float32).to(dtype)  # [..., 4]
    rope = kv[..., NOPE + 16:].contiguous().view(torch.bfloat16).to(dtype)
    nope = (nope.reshape(*lead, 4, FP8_GROUP) * scales.unsqueeze(-1)).reshape(*lead, NOPE)
    return torch.cat([nope, rope], dim=-1)


def quantize_fp8_ds_mla(k: torch.Tensor) -> torch.Tensor:
    """[..., 576] float -> [..., 656] uint8 records in FlashMLA's V3.2 layout (scale = amax/448)."""
    if k.shape[-1] != NOPE + ROPE:
        raise ValueError(f"k: expected last dim {NOPE + ROPE}, got {tuple(k.shape)}")
    lead = k.shape[:-1]
    groups = k[..., :NOPE].float().reshape(*lead, 4, FP8_GROUP)
    scales = (groups.abs().amax(dim=-1) / 448.0).clamp(min=1e-8)  # [..., 4]
    fp8 = (groups / scales.unsqueeze(-1)).clamp(-448, 448).to(torch.float8_e4m3fn).reshape(*lead, NOPE)
    rope = k[..., NOPE:].to(torch.bfloat16)
    return torch.cat([fp8.view(torch.uint8), scales.contiguous().view(torch.uint8).reshape(*lead, 16),
                      rope.contiguous().view(torch.uint8).reshape(*lead, 2 * ROPE)], dim=-1)


def sparse_mla_reference(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
                         sm_scale: float, attn_sink: torch.Tensor | None = None,
                         dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA over a paged latent cache.

    q [rows, H, 576]; kv [blocks, 64, 576] (already dequantized, any float dtype) or
    [blocks, 64, 656] uint8 fp8_ds_mla records; indices [rows, width] flat slots (block*64+offset),
    outside [0, blocks*64) = invalid, like -1; lengths [rows]: only the first lengths[r] entries
    count.
    Returns out [rows, H, 512] and the natural-log lse [rows, H] (-inf and out 0 for rows with no
    valid entry). attn_sink [H] scales out by exp(lse) / (exp(lse) + exp(sink)); lse is unchanged.
    Duplicated indices count as often as they appear."""
    if kv.dtype == torch.uint8:
        kv = dequantize_fp8_ds_mla(kv, dtype)
    flat = kv.reshape(-1, kv.shape[-1]).to(dtype)
    rows, width = indices.shape
    pos = torch.arange(width, device=indices.device)
    valid = (indices >= 0) & (indices < flat.shape[0]) & (pos[None, :] < lengths[:, None].to(indices.device))
    k = flat[torch.where(valid, indices, 0).long()]  # [rows, width, 576]; masked rows read slot 0
    scores = torch.einsum("rhd,rwd->rhw", q.to(dtype), k) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [rows, H]
    p = torch.exp(scores - lse[..., None]).nan_to_num(0.0)  # all-masked rows: exp(-inf - -inf) = nan -> 0
    out = torch.einsum("rhw,rwd->rhd", p, k[..., :NOPE])
    if attn_sink is not None:
        out = out * torch.sigmoid(lse - attn_sink.to(dtype)[None, :])[..., None]
    return out, lse


def lse_to_base2(lse: torch.Tensor) -> torch.Tensor:
    return lse * (1.0 / math.log(2.0))
