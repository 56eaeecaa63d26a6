"""The sparse MLA scratch planner under upstream b12x's names (local-inference-lab/b12x 5af873a7,
`b12x.integration.sparse_mla_scratch`), over this package's plan / bind / run: what the vLLM B12X
backend imports. docs/notes/upstream-b12x-surface.md holds the contract; the README's "Using b12x
from the vLLM B12X backend on Hopper" what differs.

    caps = B12XSparseMLAScratchCaps(device="cuda", num_q_heads=16, max_q_rows=256, max_width=2048,
                                    kv_dtype=torch.uint8, mode="decode", max_chunks_per_row=32)
    plan = plan_sparse_mla_scratch(caps)
    scratch = torch.empty(plan.layout.nbytes, dtype=torch.uint8, device="cuda")
    binding = plan.bind(scratch=scratch, q=q, selected_indices=slots, cache_seqlens_int32=seq_lens,
                        nsa_cache_seqlens_int32=valid_counts)
    out = sparse_mla_decode_forward(binding=binding, kv_cache=kv, sm_scale=s)   # b12x.integration.mla

Head counts: 8, 16, 32, 64 and 128 run natively; any other multiple of 8 up to 128 (the backend
pads to multiples of 8: 24, 40, 48, ...) runs on the next native count, its q copied into a
zero-padded copy in the scratch and its out and lse copied back to the caller's head count: two
small copies per call, which the native counts do not pay.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Sequence

import torch

from ..attention import sparse_mla as _sm
from ..validate import check_tensor, require
from .upstream_scratch import caps_device, checked_scratch
from .. import scratch as _scratch

NATIVE_HEADS = (8, 16, 32, 64, 128)
MODES = ("decode", "extend", "verify", "draft_extend")
# upstream's kv_dtype names the record: uint8 records are fp8_ds_mla (656 bytes a token)
_KV_FORMATS = {torch.uint8: "fp8_ds_mla", torch.bfloat16: "bf16"}
SCRATCH_KEY = "sparse_mla.scratch"
log = logging.getLogger("b12x")


def native_heads(num_q_heads: int) -> int:
    """The head count a call of num_q_heads runs on: itself when native, else the next native count."""
    require(isinstance(num_q_heads, int) and num_q_heads % 8 == 0 and 8 <= num_q_heads <= 128,
            f"num_q_heads: expected a multiple of 8 in [8, 128], got {num_q_heads!r}")
    return next(h for h in NATIVE_HEADS if h >= num_q_heads)


@dataclass(frozen=True, kw_only=True)
class B12XSparseMLAScratchCaps:
    """Upstream's scratch caps, field for field (its defaults and normalisation). Fields upstream
    keeps but no layout uses (max_kv_rows, max_page_table_width, max_q_chunks) are accepted."""

    device: torch.device | str
    num_q_heads: int
    max_q_rows: int
    max_width: int
    dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype = torch.bfloat16
    head_dim: int = 576
    v_head_dim: int = 512
    mode: str = "decode"
    max_batch: Optional[int] = None
    max_kv_rows: int = 0
    max_page_table_width: Optional[int] = None
    max_chunks_per_row: int = 64
    max_q_chunks: Optional[int] = None
    page_size: int = 64

    def __post_init__(self) -> None:
        dev = caps_device(self.device)
        set_ = object.__setattr__
        set_(self, "device", dev)
        for name in ("num_q_heads", "max_q_rows", "max_width", "head_dim", "v_head_dim", "max_chunks_per_row",
                     "page_size"):
            set_(self, name, max(int(getattr(self, name)), 1))
        set_(self, "max_batch", max(int(self.max_q_rows if self.max_batch is None else self.max_batch), 1))
        set_(self, "max_kv_rows", max(int(self.max_kv_rows), 0))
        if self.max_page_table_width is None:
            set_(self, "max_page_table_width", self.max_width)


@dataclass(frozen=True)
class ScratchLayout:
    """What the backend reads of a plan's layout: the bytes of one scratch buffer."""
    nbytes: int


@dataclass(frozen=True, kw_only=True)
class B12XSparseMLABinding:
    """bind()'s result: upstream's fields, plus the binding of this package's run."""
    scratch: torch.Tensor
    q: torch.Tensor
    selected_indices: torch.Tensor
    cache_seqlens_int32: torch.Tensor
    nsa_cache_seqlens_int32: torch.Tensor
    plan: "B12XSparseMLAScratchPlan" = field(repr=False)
    inner: "_sm.Binding" = field(repr=False)
    out: torch.Tensor = field(repr=False)       # [rows, num_q_heads, 512], what the forward returns
    lse: torch.Tensor = field(repr=False)       # [rows, num_q_heads] fp32, the returned lse


@dataclass(frozen=True)
class B12XSparseMLAScratchPlan:
    caps: B12XSparseMLAScratchCaps
    layout: ScratchLayout
    inner: "_sm.SparseMLAPlan" = field(repr=False)
    regions: Mapping[str, _scratch.ScratchRegion] = field(repr=False)   # behind the inner plan's bytes

    @property
    def mode(self) -> str:
        """This package's mode: decode, or extend for upstream's extend / verify / draft_extend."""
        return self.inner.caps.mode

    @property
    def padded(self) -> bool:
        return self.inner.caps.num_heads != self.caps.num_q_heads

    def shapes_and_dtypes(self) -> tuple:
        return (((self.layout.nbytes,), torch.uint8),)

    def scratch_specs(self) -> tuple:
        return ((SCRATCH_KEY, (self.layout.nbytes,), torch.uint8),)

    def bind(self, *, scratch: torch.Tensor | Mapping[str, torch.Tensor] | Sequence[torch.Tensor], q: torch.Tensor,
             selected_indices: torch.Tensor, cache_seqlens_int32: torch.Tensor,
             nsa_cache_seqlens_int32: torch.Tensor) -> B12XSparseMLABinding:
        """Upstream's bind: check the tensors, carve views of the scratch. Never allocates.
        nsa_cache_seqlens_int32 is each row's count of valid entries (a dense prefix of
        selected_indices, -1 after it); above the width it counts as the width.
        cache_seqlens_int32 is checked, not read (as upstream)."""
        caps = self.caps
        scratch = checked_scratch(scratch, SCRATCH_KEY, self.layout.nbytes, caps.device)
        check_tensor("q", q, dtype=caps.dtype, ndim=3, contiguous=True, device=caps.device)
        rows, heads, dim = q.shape
        require(rows <= caps.max_q_rows, f"q: expected at most max_q_rows={caps.max_q_rows} rows, got {rows}")
        require(heads == caps.num_q_heads, f"q: expected num_q_heads={caps.num_q_heads} heads, got {heads}")
        require(dim == caps.head_dim, f"q: expected head_dim={caps.head_dim}, got {dim}")
        check_tensor("selected_indices", selected_indices, dtype=torch.int32, ndim=2, contiguous=True,
                     device=caps.device)
        require(selected_indices.shape[0] == rows,
                f"selected_indices: expected {rows} rows (q's), got {selected_indices.shape[0]}")
        width = selected_indices.shape[1]
        require(width <= caps.max_width and width % 64 == 0 and width >= 64,
                f"selected_indices: expected a width that is a multiple of 64 in [64, max_width={caps.max_width}], "
                f"got {width}")
        check_tensor("cache_seqlens_int32", cache_seqlens_int32, dtype=torch.int32, ndim=1, contiguous=True,
                     device=caps.device)
        require(cache_seqlens_int32.shape[0] <= caps.max_batch,
                f"cache_seqlens_int32: expected at most max_batch={caps.max_batch} rows, "
                f"got {cache_seqlens_int32.shape[0]}")
        check_tensor("nsa_cache_seqlens_int32", nsa_cache_seqlens_int32, dtype=torch.int32, shape=(rows,),
                     contiguous=True, device=caps.device)
        inner_scratch = scratch[: self.inner.scratch_bytes()]
        h = self.inner.caps.num_heads
        if self.padded:
            q_run = _scratch.view(scratch, self.regions["q_pad"], (rows, h, dim))
            q_run[:, caps.num_q_heads:].zero_()     # once: the forwards only copy the real heads in
        else:
            q_run = q
        inner = self.inner.bind(inner_scratch, q=q_run, indices=selected_indices, lengths=nsa_cache_seqlens_int32)
        n = caps.num_q_heads
        out = _scratch.view(scratch, self.regions["out"], (rows, n, caps.v_head_dim)) if self.padded else inner.out
        lse = _scratch.view(scratch, self.regions["lse"], (rows, n))
        return B12XSparseMLABinding(scratch=scratch, q=q, selected_indices=selected_indices,
                                    cache_seqlens_int32=cache_seqlens_int32,
                                    nsa_cache_seqlens_int32=nsa_cache_seqlens_int32, plan=self, inner=inner,
                                    out=out, lse=lse)


def plan_sparse_mla_scratch(caps: B12XSparseMLAScratchCaps) -> B12XSparseMLAScratchPlan:
    """Validate caps against what runs here and plan this package's kernels under them."""
    require(isinstance(caps, B12XSparseMLAScratchCaps),
            f"caps: expected B12XSparseMLAScratchCaps, got {type(caps).__name__}")
    require(caps.dtype == torch.bfloat16, f"dtype: expected torch.bfloat16 (q), got {caps.dtype}")
    require(caps.kv_dtype in _KV_FORMATS,
            f"kv_dtype: expected torch.uint8 (fp8_ds_mla records) or torch.bfloat16, got {caps.kv_dtype}")
    require(caps.head_dim == 576, f"head_dim: expected 576 (512 NoPE + 64 RoPE), got {caps.head_dim}")
    require(caps.v_head_dim == 512, f"v_head_dim: expected 512, got {caps.v_head_dim}")
    require(caps.page_size == 64, f"page_size: expected 64, got {caps.page_size}")
    require(caps.mode in MODES, f"mode: expected one of {', '.join(MODES)}, got {caps.mode!r}")
    require(caps.max_width <= 8192, f"max_width: expected at most 8192 entries, got {caps.max_width}")
    heads = native_heads(caps.num_q_heads)
    if heads != caps.num_q_heads:
        log.info("b12x sparse MLA: num_q_heads=%d runs on %d heads (q zero-padded into the scratch, out and lse "
                 "copied back: two small copies per call)", caps.num_q_heads, heads)
    mode = "decode" if caps.mode == "decode" else "extend"
    topk = max(64, -(-caps.max_width // 64) * 64)
    max_splits = min(caps.max_chunks_per_row, _sm.MAX_SPLITS, topk // 64) if mode == "decode" else 0
    inner = _sm.plan(_sm.Caps(num_heads=heads, topk=topk, kv_format=_KV_FORMATS[caps.kv_dtype],
                              max_rows=caps.max_q_rows, mode=mode, max_splits=max_splits))
    rows, n = caps.max_q_rows, caps.num_q_heads
    extra = [("lse", torch.float32, rows * n)]
    if heads != n:
        extra += [("q_pad", torch.bfloat16, rows * heads * caps.head_dim), ("out", torch.bfloat16, rows * n * 512)]
    # after the inner plan's bytes, on the scratch alignment
    base = -(-inner.scratch_bytes() // _scratch.ALIGN) * _scratch.ALIGN
    regions = {k: replace(r, offset=r.offset + base) for k, r in _scratch.layout(extra).items()}
    return B12XSparseMLAScratchPlan(caps=caps, layout=ScratchLayout(_scratch.total_bytes(regions)), inner=inner,
                                    regions=regions)

