"""FlashMLA sparse MLA kernels (wheel ``sgl-flash-mla==1.0.0``) as a benchmark peer.

The wheel installs the Python package ``flash_mla`` (there is no ``sgl_flash_mla``
module). Importing it dlopens two stable-ABI extensions with
``torch.ops.load_library``:

* ``flash_mla/cuda.abi3.so``       -> ``torch.ops.flash_mla``: the current upstream
  kernels. They carry only SM100/103/107 cubins and accept only the V4.1 KV formats.
* ``flash_mla/_C_legacy.abi3.so``  -> ``torch.ops.flash_mla_legacy``: the frozen
  kernels, including every SM90 kernel and the V3.2 "fp8_ds_mla" 656-byte KV format.

This means that on Hopper (H200), and for the V3.2 layout on any GPU, every call
must pass ``use_legacy=True``. Both shared objects need a CUDA build of torch
(``libtorch_cuda.so``) and ``libcudart.so.13``, so a CUDA-13 torch. They were
built against torch stable-ABI version 2.14.1, and the wheel declares
``torch>=2.14.1``. ``available()`` reports whether all of that loads here.

Shapes of the b12x-side tensors these wrappers accept:

* decode:  q [rows, H, 576] bf16, kv_fp8 uint8 [blocks, 64, 656],
           indices int32 [rows, topk]. Indices are flat slots ``block*64 + offset``,
           and -1 marks an invalid entry.
* prefill: q [s_q, H, 576] bf16, kv bf16 [s_kv, 576], indices int32 [s_q, topk].
           -1 (or any value >= s_kv) marks an invalid entry.

FlashMLA accepts only h_q in {64, 128}. Engines (SGLang's NSA/DSA backend) zero-pad
q up to 64 heads on Hopper (128 on Blackwell) and slice the output back. These
wrappers do the same, but only once, at setup, so the timed callable leaves out
the pad copy that an engine pays on every call. The padded heads still cost full
kernel time, so FlashMLA at H=16/32 takes the same time as at H=64.

Both returned callables run exactly FlashMLA's own launch(es), with no extra
copies:

* decode:  split-KV kernel + combine kernel. The tile-scheduler metadata is
           computed by an eager warm-up call inside ``decode_fp8``, so nothing
           shape-dependent runs in the callable.
* prefill: one kernel.

The ops allocate their outputs (and the fp32 split-KV scratch for decode) with
the torch caching allocator on every call. That works under CUDA-graph capture:
the tensors a call returns while the graph is being captured are where replays
write. Each callable therefore returns its output, and ``decode_fp8`` also
returns the output of its warm-up launch for correctness checks.

LSE convention (both paths): natural log of sum_j exp(sm_scale * q.k_j), over
the valid indices only. A row with no valid index gets lse = +inf and out = 0.
Multiply by log2(e) to compare against a base-2 LSE.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional, Tuple

import torch

D_QK = 576          # 512 latent ("NoPE") + 64 RoPE dims
D_V = 512
PAGE = 64           # b12x's page size; FlashMLA itself accepts any page_block_size
FP8_BYTES = 656     # V3.2 record: 512 x e4m3 | 4 x fp32 scale (one per 128 dims) | 64 x bf16 RoPE
DECODE_TOPK_ALIGN = 64     # SM90 decode kernel asserts topk % 64 == 0
PREFILL_TOPK_ALIGN = 128   # SM90 prefill kernel asserts topk % (2*64) == 0
LOG2E = 1.0 / math.log(2.0)

Launch = Callable[[], Tuple[torch.Tensor, Optional[torch.Tensor]]]


@functools.lru_cache(maxsize=None)
def _load():
    """Import ``flash_mla`` once; return (module, None) or (None, reason)."""
    try:
        import flash_mla  # noqa: PLC0415  (the wheel's package name)
    except Exception as exc:  # ImportError, or OSError from dlopen (libcudart.so.13, ABI)
        return None, f"import flash_mla failed: {type(exc).__name__}: {exc}"
    if not flash_mla.has_legacy():
        return None, "flash_mla was built without its legacy (SM90 / V3.2) extension"
    return flash_mla, None


def unavailable_reason() -> Optional[str]:
    """None if the peer can run on the current device, else a one-line reason."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    _, reason = _load()
    if reason is not None:
        return reason
    major, _ = torch.cuda.get_device_capability()
    if major not in (9, 10):  # legacy kernels: sm90a and sm100f only
        return f"FlashMLA sparse kernels need SM90/SM100, device is SM{major}x"
    return None


def available() -> bool:
    return unavailable_reason() is None


def _module():
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"FlashMLA peer unavailable: {reason}")
    return _load()[0]


def _kernel_heads(h: int) -> int:
    """Head count FlashMLA actually runs: 64 or 128 (zero-padded like engines do)."""
    if h <= 64:
        return 64
    if h <= 128:
        return 128
    raise ValueError(f"FlashMLA sparse kernels take at most 128 q heads, got {h}")


def _pad_heads(q: torch.Tensor, hp: int) -> torch.Tensor:
    """[n, H, D] -> contiguous [n, hp, D], with zero q rows in the padded heads."""
    if q.shape[1] == hp:
        return q.contiguous()
    qp = q.new_zeros(q.shape[0], hp, q.shape[2])
    qp[:, : q.shape[1]].copy_(q)
    return qp


def _check_common(q: torch.Tensor, indices: torch.Tensor, align: int) -> None:
    if q.dim() != 3 or q.shape[-1] != D_QK or q.dtype != torch.bfloat16:
        raise ValueError(f"q must be bf16 [rows, H, {D_QK}], got {q.dtype} {tuple(q.shape)}")
    if indices.dim() != 2 or indices.shape[0] != q.shape[0] or indices.dtype != torch.int32:
        raise ValueError(f"indices must be int32 [rows, topk], got {indices.dtype} {tuple(indices.shape)}")
    topk = indices.shape[1]
    if topk == 0 or topk % align != 0:
        # The SM90 kernels assert this on the device side instead of padding.
        raise ValueError(f"FlashMLA on SM90 needs topk % {align} == 0, got topk={topk}")


def decode_fp8(
    q: torch.Tensor,
    kv_fp8: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
) -> Tuple[Launch, torch.Tensor]:
    """FlashMLA sparse decode on the fp8 "fp8_ds_mla" (V3.2, 656 B/token) paged cache.

    Arguments:
        q:        [rows, H, 576] bf16; one decode token per row, H <= 128.
        kv_fp8:   [blocks, 64, 656] uint8 (int8 and float8_e4m3fn views are accepted too).
                  Tokens inside a block must be packed (stride(1) == 656), while the
                  block stride is free.
        indices:  [rows, topk] int32 flat slots (block*64 + offset). Only -1 means
                  invalid: the kernel does no upper-bound check.
        sm_scale: softmax scale applied to q.k (e.g. 1/sqrt(192) for DeepSeek).

    Returns ``(fn, out)``. ``fn()`` launches FlashMLA decode and returns
    ``(out [rows, H, 512] bf16, lse [rows, H] fp32, natural log)``, freshly allocated
    on every call, or in the graph pool when captured. ``out`` is the output of
    the warm-up launch that also built the scheduler metadata.
    """
    fm = _module()
    _check_common(q, indices, DECODE_TOPK_ALIGN)
    if kv_fp8.dim() != 3 or kv_fp8.shape[1:] != (PAGE, FP8_BYTES):
        raise ValueError(f"kv_fp8 must be [blocks, {PAGE}, {FP8_BYTES}], got {tuple(kv_fp8.shape)}")
    if kv_fp8.dtype not in (torch.uint8, torch.int8, torch.float8_e4m3fn):
        raise ValueError(f"kv_fp8 must be a byte tensor, got {kv_fp8.dtype}")
    if kv_fp8.stride(2) != 1 or kv_fp8.stride(1) != FP8_BYTES:
        raise ValueError("kv_fp8 tokens must be packed inside each block (stride(1) == 656)")

    rows, h, _ = q.shape
    hp = _kernel_heads(h)
    # FlashMLA decode layout: q [b, s_q, h_q, 576], k_cache [num_blocks, page, h_kv=1, 656],
    # indices [b, s_q, topk]. Like SGLang, use b = rows and s_q = 1.
    q4 = _pad_heads(q, hp).view(rows, 1, hp, D_QK)
    k_cache = kv_fp8.unsqueeze(2)
    idx3 = indices.contiguous().view(rows, 1, indices.shape[1])

    # get_mla_metadata() returns an empty FlashMLASchedMeta. The first
    # flash_mla_with_kvcache call fills it by running the scheduler kernel. Later
    # calls with the same shapes reuse it, so the warm-up below takes that
    # kernel out of fn. (For sparse decode the metadata depends only on
    # b, s_q, h_q and topk: block_table and cache_seqlens are ignored.)
    sched_meta, _ = fm.get_mla_metadata()
    call = functools.partial(
        fm.flash_mla_with_kvcache,
        q4, k_cache,
        block_table=None, cache_seqlens=None, head_dim_v=D_V,
        tile_scheduler_metadata=sched_meta, num_splits=None,
        softmax_scale=float(sm_scale), causal=False,
        is_fp8_kvcache=True, indices=idx3,
        use_legacy=True,   # V3.2 format + SM90 live only in the legacy extension
    )

    def fn():
        out4, lse = call()                           # out [rows, 1, hp, 512], lse [rows, hp, 1]
        return out4[:, 0, :h], lse[:, :h, 0]

    out, _ = fn()                                    # warm-up: builds sched_meta
    return fn, out


def prefill_bf16(
    q: torch.Tensor,
    kv_bf16_flat: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    return_lse: bool = True,
) -> Launch:
    """FlashMLA sparse prefill (``flash_mla_sparse_fwd``) on a flat bf16 latent cache.

    Arguments:
        q:            [s_q, H, 576] bf16, H <= 128.
        kv_bf16_flat: [s_kv, 576] bf16 (last dim contiguous).
        indices:      [s_q, topk] int32 rows into kv. -1 or >= s_kv means invalid.
        sm_scale:     softmax scale.
        return_lse:   False asks the legacy kernel to skip writing max_logits/lse.

    Returns ``fn``. ``fn()`` launches one kernel and returns
    ``(out [s_q, H, 512] bf16, lse [s_q, H] fp32 natural log, or None)``.
    """
    fm = _module()
    _check_common(q, indices, PREFILL_TOPK_ALIGN)
    if kv_bf16_flat.dim() != 2 or kv_bf16_flat.shape[1] != D_QK or kv_bf16_flat.dtype != torch.bfloat16:
        raise ValueError(f"kv must be bf16 [s_kv, {D_QK}], got {kv_bf16_flat.dtype} {tuple(kv_bf16_flat.shape)}")
    if kv_bf16_flat.stride(1) != 1:
        raise ValueError("kv last dim must be contiguous")

    s_q, h, _ = q.shape
    hp = _kernel_heads(h)
    # FlashMLA prefill layout: q [s_q, h_q, 576], kv [s_kv, h_kv=1, 576], indices [s_q, h_kv=1, topk].
    q3 = _pad_heads(q, hp)
    kv3 = kv_bf16_flat.unsqueeze(1)
    idx3 = indices.contiguous().view(s_q, 1, indices.shape[1])

    call = functools.partial(
        fm.flash_mla_sparse_fwd,
        q3, kv3, idx3, float(sm_scale),
        d_v=D_V,
        use_legacy=True,  # the SM90 kernel is in the legacy extension only
        # None: (out, max_logits, lse) in natural-log units. False: (out, None, None).
        return_log2_lse=None if return_lse else False,
    )

    def fn():
        out, _max_logits, lse = call()               # out [s_q, hp, 512], lse [s_q, hp]
        return out[:, :h], (lse[:, :h] if lse is not None else None)

    return fn


V4_D_QK = 512       # DeepSeek-V4 (MODEL1): 448 NoPE + 64 RoPE dims, V all 512


def decode_model1(
    q: torch.Tensor,
    swa_pages: torch.Tensor,
    swa_page: int,
    indices: torch.Tensor,
    lengths: torch.Tensor,
    sm_scale: float,
    *,
    extra_pages: Optional[torch.Tensor] = None,
    extra_page: int = 0,
    extra_indices: Optional[torch.Tensor] = None,
    extra_lengths: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
) -> Tuple[Launch, torch.Tensor]:
    """FlashMLA's MODEL1 sparse decode (DeepSeek-V4) on model1_fp8 pages, one decode row per b.

    q [rows, H, 512] bf16 (zero-padded to 64 or 128 heads at setup); swa_pages / extra_pages
    [blocks, page_bytes] uint8 as b12x.reference.quantize_model1_fp8 writes them; indices /
    extra_indices [rows, w] int32 flat slots (-1 invalid) with lengths [rows] int32. Returns
    ``(fn, out)`` as decode_fp8."""
    fm = _module()
    rows, h, d = q.shape
    if d != V4_D_QK or q.dtype != torch.bfloat16:
        raise ValueError(f"q must be bf16 [rows, H, {V4_D_QK}], got {q.dtype} {tuple(q.shape)}")

    def kcache(pages, page):
        # FlashMLA reads a page as [page, 1, 584]-shaped bytes at the page stride (its MODEL1 view)
        return pages.as_strided((pages.shape[0], page, 1, 584), (pages.stride(0), 584, 584, 1))

    hp = _kernel_heads(h)
    q4 = _pad_heads(q, hp).view(rows, 1, hp, V4_D_QK)
    sink = None
    if attn_sink is not None:
        sink = attn_sink.new_zeros(hp)
        sink[:h].copy_(attn_sink)
    kw = dict(indices=indices.contiguous().view(rows, 1, -1), topk_length=lengths, attn_sink=sink)
    if extra_pages is not None:
        kw.update(extra_k_cache=kcache(extra_pages, extra_page),
                  extra_indices_in_kvcache=extra_indices.contiguous().view(rows, 1, -1),
                  extra_topk_length=extra_lengths)
    sched_meta, _ = fm.get_mla_metadata()
    call = functools.partial(
        fm.flash_mla_with_kvcache, q4, kcache(swa_pages, swa_page),
        block_table=None, cache_seqlens=None, head_dim_v=V4_D_QK, tile_scheduler_metadata=sched_meta,
        num_splits=None, softmax_scale=float(sm_scale), causal=False, is_fp8_kvcache=True, use_legacy=True, **kw,
    )

    def fn():
        out4, lse = call()
        return out4[:, 0, :h], lse[:, :h, 0]

    out, _ = fn()
    return fn, out


def prefill_v4_bf16(
    q: torch.Tensor,
    kv_bf16_flat: torch.Tensor,
    indices: torch.Tensor,
    lengths: torch.Tensor,
    sm_scale: float,
    attn_sink: Optional[torch.Tensor] = None,
) -> Launch:
    """FlashMLA's sparse prefill at d_qk 512 (DeepSeek-V4) on a flat bf16 workspace, as engines
    run V4 prefill today after dequantising the selected KV: q [s_q, H, 512] bf16, kv [s_kv, 512]
    bf16, indices [s_q, topk] int32 rows of kv (-1 invalid), lengths [s_q] (topk_length)."""
    fm = _module()
    s_q, h, d = q.shape
    if d != V4_D_QK or kv_bf16_flat.shape[-1] != V4_D_QK:
        raise ValueError(f"q and kv must have {V4_D_QK} dims, got {tuple(q.shape)}, {tuple(kv_bf16_flat.shape)}")
    hp = _kernel_heads(h)
    sink = None
    if attn_sink is not None:
        sink = attn_sink.new_zeros(hp)
        sink[:h].copy_(attn_sink)
    call = functools.partial(
        fm.flash_mla_sparse_fwd, _pad_heads(q, hp), kv_bf16_flat.unsqueeze(1),
        indices.contiguous().view(s_q, 1, indices.shape[1]), float(sm_scale), d_v=V4_D_QK,
        attn_sink=sink, topk_length=lengths, use_legacy=True,
    )

    def fn():
        out, _max_logits, lse = call()
        return out[:, :h], lse[:, :h]

    return fn
