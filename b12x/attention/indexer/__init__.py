"""The lightning indexer under upstream b12x's names (local-inference-lab/b12x 5af873a7,
`b12x.attention.indexer`), over this package's b12x.indexer plan / bind / run: what the vLLM
B12X indexer layer imports (docs/notes/upstream-b12x-surface.md, sections 4 and 5).

    plan = plan_indexer_scratch(B12XIndexerScratchCaps(device="cuda", source_layout="paged",
        num_q_heads=64, max_q_rows=rows, max_page_table_width=pages, topk=2048))
    scratch = [torch.empty(shape, dtype=dt, device="cuda") for shape, dt in plan.shapes_and_dtypes()]
    binding = plan.bind(scratch=scratch, real_page_table=block_table, cache_seqlens_int32=seq_lens,
                        active_width=active_width)
    index_topk_fp8(q_fp8=q, weights=w, index_k_cache=k_pages, binding=binding, out_indices=idx)

Every route upstream names runs b12x.indexer's paged kernels here: decode on the request's block
table, prefill ("packed_contiguous", a page table shared by every row as a stride-0 expand) on
that one table, rows causal through their own lengths. The route a plan reports is upstream's
name for the call shape, which the backend checks. A plan's scratch holds at most
LOGITS_BUDGET_MB of fp32 logits; a prefill of more rows than fit is scored and selected in row
batches (upstream streams 32K-token supertiles instead).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import torch

from ... import indexer as _ix
from ...integration.upstream_scratch import caps_device, checked_scratch
from ...validate import check_tensor, require

PAGED_INDEX_PAGE_SIZE = 64
INDEX_HEAD_DIM = 128
INDEXER_SOURCE_LAYOUT_PAGED = "paged"
INDEXER_SOURCE_LAYOUT_CONTIGUOUS = "contiguous"
ROUTE_AUTO, ROUTE_PAGED_FUSED, ROUTE_PAGED_TILED, ROUTE_PACKED_CONTIGUOUS = (
    "auto", "paged_fused", "paged_tiled", "packed_contiguous")
PAGED_MQA_LOGITS_SCHEDULE_PAGES_PER_SPLIT = 4
SUPPORTED_TOPK = (512, 1024, 2048)
PAGE_BYTES = PAGED_INDEX_PAGE_SIZE * (INDEX_HEAD_DIM + 4)      # 8448: 64 x 128 e4m3, then 64 fp32 scales
SCRATCH_KEY = "paged_indexer.scratch"
# the logits buffer a plan's scratch holds, at most (env B12X_INDEXER_LOGITS_MB overrides): larger
# calls are scored and selected in row batches (b12x.indexer Caps.logits_rows)
LOGITS_BUDGET_MB = 256


@dataclass(frozen=True, kw_only=True)
class B12XIndexerScratchCaps:
    """Upstream's indexer scratch caps, field for field (defaults and normalisation)."""

    device: torch.device | str
    source_layout: str
    num_q_heads: int
    max_q_rows: int
    topk: int
    mode: str = "decode"
    max_k_rows: Optional[int] = None
    max_page_table_width: Optional[int] = None
    page_size: int = 64
    supertile_k: int = 0
    shared_page_table: bool = False
    dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype = torch.uint8
    k_dtype: torch.dtype = torch.float8_e4m3fn
    max_batch: Optional[int] = None
    reserve_paged_logits: bool = False
    paged_logits_k_rows: int = 0
    route: str = "auto"
    prefill_block_k: int = 256
    score_mode: str = "nsa"
    num_idx_heads: int = 1

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        dev = caps_device(self.device)
        set_(self, "device", dev)
        for name in ("num_q_heads", "max_q_rows", "topk", "page_size", "num_idx_heads"):
            set_(self, name, max(int(getattr(self, name)), 1))
        if self.max_k_rows is not None:
            set_(self, "max_k_rows", max(int(self.max_k_rows), 0))
        if self.max_page_table_width is None and self.max_k_rows is not None:
            set_(self, "max_page_table_width", max(1, -(-self.max_k_rows // self.page_size)))
        if self.max_page_table_width is not None:
            set_(self, "max_page_table_width", max(int(self.max_page_table_width), 1))
        set_(self, "max_batch", max(int(self.max_q_rows if self.max_batch is None else self.max_batch), 1))


@dataclass(frozen=True)
class IndexerScratchLayout:
    """What the fork reads of a plan's layout: its bytes and the route."""
    nbytes: int
    route: str


@dataclass(frozen=True, kw_only=True)
class B12XIndexerPagedBinding:
    scratch: torch.Tensor
    real_page_table: torch.Tensor
    cache_seqlens_int32: torch.Tensor
    active_width: Optional[torch.Tensor]
    schedule_metadata: Optional[torch.Tensor] = None
    expected_num_q_heads: Optional[int] = None
    shared_page_table: bool = False
    route: str = ROUTE_PAGED_TILED
    plan: "B12XIndexerScratchPlan" = field(default=None, repr=False)
    block_table: Optional[torch.Tensor] = field(default=None, repr=False)   # what our kernels read


@dataclass(frozen=True)
class B12XIndexerScratchPlan:
    caps: B12XIndexerScratchCaps
    layout: IndexerScratchLayout
    inner: "_ix.IndexerPlan" = field(repr=False)

    @property
    def route(self) -> str:
        return self.layout.route

    @property
    def source_layout(self) -> str:
        return self.caps.source_layout

    def shapes_and_dtypes(self) -> tuple:
        return (((self.layout.nbytes,), torch.uint8),)

    def scratch_specs(self) -> tuple:
        return ((SCRATCH_KEY, (self.layout.nbytes,), torch.uint8),)

    def bind(self, *, scratch, real_page_table: torch.Tensor, cache_seqlens_int32: torch.Tensor,
             active_width: Optional[torch.Tensor] = None, schedule_metadata: Optional[torch.Tensor] = None,
             expected_num_q_heads: Optional[int] = None,
             shared_page_table: Optional[bool] = None) -> B12XIndexerPagedBinding:
        """Upstream's bind: check the tensors (the shared page table as a stride-0 expand), carve
        nothing yet (index_topk_fp8 binds the run). schedule_metadata is checked and not read:
        these kernels need no schedule (uses_paged_mqa_schedule says False)."""
        caps = self.caps
        scratch = checked_scratch(scratch, SCRATCH_KEY, self.layout.nbytes, caps.device)
        shared = caps.shared_page_table if shared_page_table is None else bool(shared_page_table)
        require(shared == caps.shared_page_table,
                f"shared_page_table: expected {caps.shared_page_table} (the plan's), got {shared}")
        check_tensor("cache_seqlens_int32", cache_seqlens_int32, dtype=torch.int32, ndim=1, contiguous=True,
                     device=caps.device)
        rows = cache_seqlens_int32.shape[0]
        require(rows <= caps.max_q_rows,
                f"cache_seqlens_int32: expected at most max_q_rows={caps.max_q_rows} rows, got {rows}")
        check_tensor("real_page_table", real_page_table, dtype=torch.int32, ndim=2, device=caps.device)
        require(real_page_table.shape[0] == rows,
                f"real_page_table: expected {rows} rows (cache_seqlens_int32's), got {real_page_table.shape[0]}")
        require(real_page_table.shape[1] <= caps.max_page_table_width,
                f"real_page_table: expected at most max_page_table_width={caps.max_page_table_width} pages, "
                f"got {real_page_table.shape[1]}")
        if shared:
            require(real_page_table.stride() == (0, 1) or rows == 1,
                    f"real_page_table: expected a row-shared table (strides (0, 1), a stride-0 expand) with "
                    f"shared_page_table=True, got strides {real_page_table.stride()}")
            # one request, every row of it: its one row, with a row stride the kernels accept
            table = real_page_table.as_strided((1, real_page_table.shape[1]), (real_page_table.shape[1], 1))
        else:
            require(real_page_table.is_contiguous(),
                    f"real_page_table: expected a contiguous tensor, got strides {real_page_table.stride()}")
            table = real_page_table
        if active_width is not None:
            check_tensor("active_width", active_width, dtype=torch.int32, shape=(1,), contiguous=True,
                         device=caps.device)
        if schedule_metadata is not None:
            check_tensor("schedule_metadata", schedule_metadata, dtype=torch.int32, shape=(None, 2), contiguous=True,
                         device=caps.device)
        require(expected_num_q_heads is None or expected_num_q_heads > 0,
                f"expected_num_q_heads: expected an int > 0 or None, got {expected_num_q_heads!r}")
        return B12XIndexerPagedBinding(scratch=scratch, real_page_table=real_page_table,
                                       cache_seqlens_int32=cache_seqlens_int32, active_width=active_width,
                                       schedule_metadata=schedule_metadata, expected_num_q_heads=expected_num_q_heads,
                                       shared_page_table=shared, route=self.route, plan=self, block_table=table)


def plan_indexer_scratch(caps: B12XIndexerScratchCaps) -> B12XIndexerScratchPlan:
    """Validate caps against what runs here and plan b12x.indexer under them."""
    require(isinstance(caps, B12XIndexerScratchCaps), f"caps: expected B12XIndexerScratchCaps, got {type(caps).__name__}")
    require(caps.source_layout == INDEXER_SOURCE_LAYOUT_PAGED,
            f"source_layout: expected {INDEXER_SOURCE_LAYOUT_PAGED!r} (the contiguous source is not served by this "
            f"layer; b12x.indexer's mode='contiguous' is), got {caps.source_layout!r}")
    require(caps.mode in ("decode", "prefill"), f"mode: expected 'decode' or 'prefill', got {caps.mode!r}")
    require(caps.topk in SUPPORTED_TOPK, f"topk: expected one of {SUPPORTED_TOPK}, got {caps.topk}")
    require(caps.page_size == PAGED_INDEX_PAGE_SIZE, f"page_size: expected {PAGED_INDEX_PAGE_SIZE}, got {caps.page_size}")
    require(caps.max_page_table_width is not None,
            "max_page_table_width: expected an int (or max_k_rows to derive it), got None")
    require(caps.score_mode == "nsa", f"score_mode: expected 'nsa' (MSA is not served), got {caps.score_mode!r}")
    require(caps.route in (ROUTE_AUTO, ROUTE_PAGED_FUSED, ROUTE_PAGED_TILED, ROUTE_PACKED_CONTIGUOUS),
            f"route: expected one of auto, paged_fused, paged_tiled, packed_contiguous, got {caps.route!r}")
    prefill = caps.shared_page_table or caps.mode == "prefill"
    route = caps.route
    if route == ROUTE_AUTO:
        route = ROUTE_PACKED_CONTIGUOUS if prefill else (
            ROUTE_PAGED_FUSED if caps.max_q_rows <= 6 else ROUTE_PAGED_TILED)
    width = caps.max_page_table_width * PAGED_INDEX_PAGE_SIZE
    # at most LOGITS_BUDGET_MB of logits: rows are scored and selected in batches beyond it
    budget = int(os.environ.get("B12X_INDEXER_LOGITS_MB", LOGITS_BUDGET_MB)) << 20
    inner = _ix.plan(_ix.Caps(num_heads=caps.num_q_heads, topk=caps.topk, mode="paged", max_rows=caps.max_q_rows,
                              max_width=width, with_scores=True,
                              logits_rows=_ix.logits_rows_for(budget, width, caps.max_q_rows)))
    return B12XIndexerScratchPlan(caps=caps, layout=IndexerScratchLayout(inner.scratch_bytes(), route), inner=inner)


def index_topk_fp8(*, q_fp8: torch.Tensor, weights: torch.Tensor, index_k_cache: torch.Tensor, metadata=None,
                   binding: B12XIndexerPagedBinding | None = None, page_size: int = PAGED_INDEX_PAGE_SIZE,
                   topk: Optional[int] = None, expected_num_q_heads: Optional[int] = None,
                   out_indices: Optional[torch.Tensor] = None, out_scores: Optional[torch.Tensor] = None,
                   supertile_k: Optional[int] = None) -> torch.Tensor:
    """Scores and exact top-k of every row: request-local token positions (-1 past the valid
    ones) into out_indices, their fp32 scores (-inf there) into out_scores when given. Returns
    out_indices (a scratch view when None). Allocates nothing."""
    if binding is None:
        raise TypeError("index_topk_fp8 requires binding")
    if metadata is not None:
        raise ValueError("index_topk_fp8: pass either binding or metadata, not both")
    require(isinstance(binding, B12XIndexerPagedBinding),
            f"binding: expected the binding of plan_indexer_scratch(...).bind(...), got {type(binding).__name__}")
    plan = binding.plan
    caps = plan.caps
    require(page_size == PAGED_INDEX_PAGE_SIZE, f"page_size: expected {PAGED_INDEX_PAGE_SIZE}, got {page_size}")
    rows = binding.cache_seqlens_int32.shape[0]
    check_tensor("q_fp8", q_fp8, dtype=torch.float8_e4m3fn, shape=(rows, None, INDEX_HEAD_DIM), contiguous=True,
                 device=caps.device)
    heads = q_fp8.shape[1]
    want = expected_num_q_heads or binding.expected_num_q_heads or caps.num_q_heads
    require(heads == want == caps.num_q_heads,
            f"q_fp8: expected {caps.num_q_heads} heads (expected_num_q_heads={want}), got {heads}")
    if weights.dim() == 3:
        check_tensor("weights", weights, dtype=torch.float32, shape=(rows, heads, 1), contiguous=True,
                     device=caps.device)
        weights = weights.view(rows, heads)
    check_tensor("weights", weights, dtype=torch.float32, shape=(rows, heads), contiguous=True, device=caps.device)
    k = topk if topk is not None else (out_indices.shape[1] if out_indices is not None else caps.topk)
    require(k in SUPPORTED_TOPK and k <= caps.topk, f"topk: expected one of {SUPPORTED_TOPK} up to the plan's "
                                                   f"{caps.topk}, got {k}")
    kv = _k_pages(index_k_cache, caps.device)
    width = binding.real_page_table.shape[1] * PAGED_INDEX_PAGE_SIZE
    b = plan.inner.bind(binding.scratch[: plan.inner.scratch_bytes()], lengths=binding.cache_seqlens_int32,
                        q=q_fp8, weights=weights, block_table=binding.block_table, width=width, k=k,
                        active_width=binding.active_width, indices=out_indices, scores=out_scores)
    idx, _ = _ix.run_index_topk(b, kv_cache=kv)
    return idx


def _k_pages(index_k_cache: torch.Tensor, device) -> torch.Tensor:
    """The fork's flat [blocks, 8448] view (page stride >= 8448) or b12x.indexer's [blocks, 64,
    132] pages: the same bytes, 64 x 128 e4m3 K then 64 fp32 scales a page."""
    if index_k_cache.dim() == 3:
        return index_k_cache
    check_tensor("index_k_cache", index_k_cache, dtype=torch.uint8, shape=(None, PAGE_BYTES), device=device)
    require(index_k_cache.stride(1) == 1 and index_k_cache.stride(0) >= PAGE_BYTES,
            f"index_k_cache: expected [blocks, {PAGE_BYTES}] with byte stride 1 and a page stride >= {PAGE_BYTES}, "
            f"got strides {index_k_cache.stride()}")
    return index_k_cache.as_strided((index_k_cache.shape[0], PAGED_INDEX_PAGE_SIZE, INDEX_HEAD_DIM + 4),
                                    (index_k_cache.stride(0), INDEX_HEAD_DIM + 4, 1))


def uses_paged_mqa_schedule(*, q_rows: int, max_pages: int) -> bool:
    """False: the paged kernels here split their work without a schedule (the engine then builds none)."""
    return False


def build_paged_mqa_schedule_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: Optional[int] = None,
                                      out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Upstream's schedule: each of num_sms splits starts at (row, segment), segments of
    block_kv * 4 tokens, split evenly over the total; row num_sms holds the end. Not read by the
    kernels here (uses_paged_mqa_schedule is False); kept for engines that build it anyway."""
    lens = context_lens if context_lens.dim() == 1 else context_lens[:, -1]
    check_tensor("context_lens", lens, dtype=torch.int32, ndim=1, device=None)
    if out is not None:
        check_tensor("out", out, dtype=torch.int32, shape=(None, 2), contiguous=True, device=lens.device)
        num_sms = out.shape[0] - 1 if num_sms is None else num_sms
        require(out.shape[0] == num_sms + 1, f"out: expected {num_sms + 1} rows (num_sms + 1), got {out.shape[0]}")
    require(isinstance(num_sms, int) and num_sms >= 1, f"num_sms: expected an int >= 1, got {num_sms!r}")
    seg = (lens.clamp(min=0).long() + block_kv * PAGED_MQA_LOGITS_SCHEDULE_PAGES_PER_SPLIT - 1) // (
        block_kv * PAGED_MQA_LOGITS_SCHEDULE_PAGES_PER_SPLIT)
    ends = torch.cumsum(seg, 0)
    total = ends[-1] if ends.numel() else torch.zeros((), dtype=torch.long, device=lens.device)
    starts = torch.arange(num_sms + 1, device=lens.device) * total // num_sms
    q_idx = torch.searchsorted(ends, starts, right=True)
    before = torch.where(q_idx > 0, ends[(q_idx - 1).clamp(min=0)], torch.zeros_like(starts))
    res = torch.stack([q_idx, starts - before], dim=1).int()
    if out is None:
        return res
    out.copy_(res)
    return out
