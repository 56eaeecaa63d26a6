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


def _attend(q: torch.Tensor, lists, v_dim: int, sm_scale: float, attn_sink: torch.Tensor | None,
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One softmax over the entries of every (flat kv [slots, d], indices [rows, w], lengths [rows])
    in `lists`: an index outside [0, slots) or at a position >= its list's length is masked. V is
    the first v_dim dims of K. Returns out [rows, H, v_dim] and the natural-log lse [rows, H]."""
    keys, valids = [], []
    for flat, indices, lengths in lists:
        flat = flat.to(dtype)
        pos = torch.arange(indices.shape[1], device=indices.device)
        valid = (indices >= 0) & (indices < flat.shape[0]) & (pos[None, :] < lengths[:, None].to(indices.device))
        keys.append(flat[torch.where(valid, indices, 0).long()])  # masked entries read slot 0
        valids.append(valid)
    k, valid = torch.cat(keys, dim=1), torch.cat(valids, dim=1)
    scores = torch.einsum("rhd,rwd->rhw", q.to(dtype), k) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [rows, H]
    p = torch.exp(scores - lse[..., None]).nan_to_num(0.0)  # all-masked rows: exp(-inf - -inf) = nan -> 0
    out = torch.einsum("rhw,rwd->rhd", p, k[..., :v_dim])
    if attn_sink is not None:
        out = out * torch.sigmoid(lse - attn_sink.to(dtype)[None, :])[..., None]
    return out, lse


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
    return _attend(q, [(kv.reshape(-1, kv.shape[-1]), indices, lengths)], NOPE, sm_scale, attn_sink, dtype)


# ---- DeepSeek-V4: model1_fp8 pages (FlashMLA's MODEL1 layout) ---------------------------------
# A page of P tokens: P x 576 bytes of token data (448 e4m3 NoPE values, then 64 bf16 RoPE
# values), then P x 8 bytes of scales (7 UE8M0 exponents, one per 64 NoPE values, and a pad
# byte). The page stride is P x 584 rounded up to a multiple of 576 bytes, or more (a view).
V4_NOPE, V4_ROPE = 448, 64
V4_DIM = V4_NOPE + V4_ROPE          # q and K: 512 dims; V: all of them
V4_GROUP = 64                       # NoPE values per scale
V4_GROUPS = V4_NOPE // V4_GROUP     # 7
V4_TOKEN_BYTES = V4_NOPE + 2 * V4_ROPE   # 576
V4_SCALE_BYTES = 8


def model1_page_bytes(page: int) -> int:
    """Bytes of one model1_fp8 page of `page` tokens: page x 584 rounded up to a multiple of 576."""
    return -(-page * (V4_TOKEN_BYTES + V4_SCALE_BYTES) // V4_TOKEN_BYTES) * V4_TOKEN_BYTES


def quantize_model1_fp8(k: torch.Tensor, page_bytes: int | None = None) -> torch.Tensor:
    """[blocks, P, 512] float -> [blocks, page_bytes] uint8 model1_fp8 pages. Each group of 64
    NoPE values gets the power-of-two scale 2^ceil(log2(amax / 448)) (UE8M0), so every value fits
    e4m3; the pad bytes and the page tail are zero. page_bytes (default model1_page_bytes(P)) may
    be larger, as for a page-strided cache."""
    if k.dim() != 3 or k.shape[-1] != V4_DIM:
        raise ValueError(f"k: expected [blocks, page, {V4_DIM}], got {tuple(k.shape)}")
    blocks, page, _ = k.shape
    page_bytes = model1_page_bytes(page) if page_bytes is None else page_bytes
    if page_bytes < model1_page_bytes(page):
        raise ValueError(f"page_bytes: expected >= {model1_page_bytes(page)} for a page of {page}, got {page_bytes}")
    groups = k[..., :V4_NOPE].float().reshape(blocks, page, V4_GROUPS, V4_GROUP)
    amax = groups.abs().amax(dim=-1).clamp(min=2.0 ** -100)
    exp = torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127)            # [blocks, P, 7]
    fp8 = (groups / torch.exp2(exp)[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    tokens = torch.cat([fp8.reshape(blocks, page, V4_NOPE).view(torch.uint8),
                        k[..., V4_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)], dim=-1)
    scales = torch.zeros(blocks, page, V4_SCALE_BYTES, dtype=torch.uint8, device=k.device)
    scales[..., :V4_GROUPS] = (exp + 127).to(torch.uint8)
    out = torch.zeros(blocks, page_bytes, dtype=torch.uint8, device=k.device)
    out[:, :page * V4_TOKEN_BYTES] = tokens.reshape(blocks, -1)
    out[:, page * V4_TOKEN_BYTES:page * (V4_TOKEN_BYTES + V4_SCALE_BYTES)] = scales.reshape(blocks, -1)
    return out


def dequantize_model1_fp8(pages: torch.Tensor, page: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[blocks, >= model1_page_bytes(page)] uint8 model1_fp8 pages (a page-strided view too) ->
    [blocks, page, 512]: each NoPE value times 2^(its group's exponent - 127), then RoPE."""
    if pages.dtype != torch.uint8 or pages.dim() != 2 or pages.shape[1] < page * (V4_TOKEN_BYTES + V4_SCALE_BYTES):
        raise ValueError(f"pages: expected uint8 [blocks, >= {page * (V4_TOKEN_BYTES + V4_SCALE_BYTES)}] for a page "
                         f"of {page} tokens, got {pages.dtype} {tuple(pages.shape)}")
    blocks = pages.shape[0]
    tokens = pages[:, :page * V4_TOKEN_BYTES].contiguous().view(blocks, page, V4_TOKEN_BYTES)
    exps = pages[:, page * V4_TOKEN_BYTES:page * (V4_TOKEN_BYTES + V4_SCALE_BYTES)].reshape(
        blocks, page, V4_SCALE_BYTES)[..., :V4_GROUPS]
    nope = tokens[..., :V4_NOPE].contiguous().view(torch.float8_e4m3fn).to(dtype)
    scale = torch.exp2(exps.to(dtype) - 127.0)
    nope = (nope.reshape(blocks, page, V4_GROUPS, V4_GROUP) * scale[..., None]).reshape(blocks, page, V4_NOPE)
    rope = tokens[..., V4_NOPE:].contiguous().view(torch.bfloat16).to(dtype)
    return torch.cat([nope, rope], dim=-1)


def sparse_mla_v4_reference(q: torch.Tensor, main_kv: torch.Tensor, main_indices: torch.Tensor,
                            main_lengths: torch.Tensor, sm_scale: float, *, main_page: int | None = None,
                            extra_kv: torch.Tensor | None = None, extra_indices: torch.Tensor | None = None,
                            extra_lengths: torch.Tensor | None = None, extra_page: int | None = None,
                            attn_sink: torch.Tensor | None = None,
                            dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4 sparse attention: one softmax over the main (sliding-window) entries and the
    optional extra (compressed) entries, V = all 512 dims.

    q [rows, H, 512]; each cache is [blocks, page, 512] float (dequantised) or [blocks, page_bytes]
    uint8 model1_fp8 pages (then its page size is given); indices [rows, w] are flat slots
    block * page + offset, masked like -1 outside [0, blocks * page) or at positions >= the list's
    length. Returns out [rows, H, 512] and the natural-log lse [rows, H]; sink as in
    sparse_mla_reference."""
    def flat(kv, page, name):
        if kv.dtype == torch.uint8:
            if page is None:
                raise ValueError(f"{name}_page: expected the page size of uint8 model1_fp8 pages, got None")
            kv = dequantize_model1_fp8(kv, page, dtype)
        return kv.reshape(-1, V4_DIM)

    lists = [(flat(main_kv, main_page, "main"), main_indices, main_lengths)]
    if extra_kv is not None:
        if extra_indices is None or extra_lengths is None:
            raise ValueError("extra_indices, extra_lengths: expected tensors with extra_kv, got None")
        lists.append((flat(extra_kv, extra_page, "extra"), extra_indices, extra_lengths))
    return _attend(q, lists, V4_DIM, sm_scale, attn_sink, dtype)


def lse_to_base2(lse: torch.Tensor) -> torch.Tensor:
    return lse * (1.0 / math.log(2.0))
