"""Random sparse-MLA problems shared by the GPU tests and the benchmarks."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from b12x.reference import dequantize_fp8_ds_mla, quantize_fp8_ds_mla


@dataclass
class Case:
    q: torch.Tensor
    kv: torch.Tensor          # what the kernel reads (uint8 records or bf16)
    kv_ref: torch.Tensor      # what the reference reads (dequantized, float32), same slots
    indices: torch.Tensor
    lengths: torch.Tensor
    sm_scale: float = 576 ** -0.5


def random_kv(blocks: int, kv_format: str, device, g: torch.Generator, page_stride_pad: int = 0):
    """A paged cache of random data; page_stride_pad > 0 makes it a page-strided view."""
    k = torch.randn(blocks, 64, 576, device=device, generator=g)
    if kv_format == "fp8_ds_mla":
        dense = quantize_fp8_ds_mla(k)
        ref = dequantize_fp8_ds_mla(dense)
    else:
        dense = k.bfloat16()
        ref = dense.float()
    if page_stride_pad:
        last = dense.shape[-1]
        big = torch.empty(blocks, 64 * last + page_stride_pad, dtype=dense.dtype, device=device)
        big.fill_(0x7F if dense.dtype == torch.uint8 else float("nan"))  # poison the gaps
        view = big[:, : 64 * last].view(blocks, 64, last)
        view.copy_(dense)
        dense = view
    return dense, ref


def random_case(rows: int, heads: int, width: int, kv_format: str, *, blocks: int = 64, seed: int = 0,
                device="cuda", invalid_frac: float = 0.1, page_stride_pad: int = 0) -> Case:
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(rows, heads, 576, device=device, generator=g).bfloat16()
    kv, ref = random_kv(blocks, kv_format, device, g, page_stride_pad)
    idx = torch.randint(0, blocks * 64, (rows, width), device=device, generator=g, dtype=torch.int32)
    idx[torch.rand(rows, width, device=device, generator=g) < invalid_frac] = -1
    lengths = torch.randint(width // 2, width + 1, (rows,), device=device, generator=g, dtype=torch.int32)
    return Case(q, kv, ref, idx, lengths)
