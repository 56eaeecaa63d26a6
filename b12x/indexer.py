"""Lightning indexer (DeepSeek-V3.2 DSA): fp8 logits and exact top-k.

    caps = Caps(num_heads=64, topk=2048, max_rows=128, max_width=131072)
    p = plan(caps)                                                   # resolves kernels
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")       # engine-owned
    b = p.bind(scratch=scratch, q=q, weights=w, lengths=seq_lens, block_table=bt, width=W,
             active_width=active_width_buf)                          # optional, [1] int32, entries
    logits = run_logits(b, kv_cache=kv)          # [rows, W] fp32, -inf past each row
    idx, scores = run_topk(b)                     # [rows, K] int32 (-1 tail), fp32 (-inf tail)
    idx, scores = run_index_topk(b, kv_cache=kv)  # both at once (fused for small batches)

Paged (decode, MTP): q [rows, Hi, 128] e4m3, weights [rows, Hi] fp32, K cache [blocks, 64, 132]
uint8 (DeepGEMM's layout), block_table [requests, pages] int32 with rows = requests * next_n, and
per-row lengths in tokens; a row holds floor(len / compress_ratio) entries. Contiguous (prefill):
kv_cache is (kv [n, 128] e4m3, kv_scale [n] fp32) and rows are valid on [starts, ends).

Units: `lengths` count tokens; positions, `width` and the active width count entries of the
(compressed) cache, floor(tokens / c) per row. The active width is read on the device from
`active_width` ([1] int32, the buffer `b12x.metadata.decode_active_width` fills, in entries: the
exact max floor(L / c) or the graph-stable bound ceil(max_seq_len / c)), clamped to `width`, and
never divided again: no host sync, and columns past it are neither written by run_logits nor read
by run_topk. (`max_len` is its deprecated old name.) run_* allocate nothing and are CUDA-graph
capturable. run_index_topk over row batches of wide rows selects each batch on a side stream of its
own while the next batch is scored, and joins it back to the caller's stream before it returns
(events only, captured into a graph like the rest; Caps(overlap_batches=False) keeps every launch
on the caller's stream).

Block-table entries outside [0, kv_cache.shape[0]) never fault: run_logits and the fused path do
not read such a page and give its entries -inf, and physical top-k slots through such an entry are
-1 (run_topk knows the cache size from bind(num_blocks=...), else it only rejects entries whose
slot would not fit int32).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional

import torch

from codegen.indexer_specs import (COMPRESS_RATIOS, INDEXER_HEADS, TOPK_MAX, TOPK_WIDTH_MAX, IndexerLogitsSpec,
                                   IndexerTopKSpec, TopKSpec, logits_ctas_per_sm, topk_tiling)

from . import registry
from . import indexer_topk as tk
from . import scratch as _scratch
from .plan import Plan, module_bind, renamed_fields, spelled
from .device import device_arch, num_sms as device_num_sms
from .errors import InputError
from .validate import check_cuda_anchor, check_tensor, require

PAGE = 64
INDEX_DIM = 128
K_RECORD = INDEX_DIM + 4
# Physical slots are int32 (block * 64 + offset): block-table entries at or past this many pages
# have no slot, so the top-k never counts a larger cache than this (2^25 pages = 283 GB of K).
MAX_SLOT_BLOCKS = (1 << 31) // PAGE


@renamed_fields(max_batched="max_rows")
@dataclass(frozen=True)
class Caps:
    """What the engine will ask of the indexer. Frozen: a plan is keyed by it. (`max_batched` is
    the deprecated name of `max_rows`.)"""

    num_heads: int = 64
    topk: int = 2048                  # largest K asked (any multiple of 128 up to it)
    compress_ratio: int = 1
    mode: str = "paged"               # "paged" (decode / MTP) or "contiguous" (prefill)
    max_rows: int = 128               # most query rows per call
    max_width: int = 131072           # widest logits row, in entries
    with_scores: bool = False
    fused: Optional[bool] = None      # run_index_topk: True = the fused path; None, False = logits + top-k
    logits_in_scratch: bool = True    # reserve a [max_rows, max_width] fp32 logits region
    # rows of that region: 0 holds every row; N < max_rows holds N, and run_index_topk scores and
    # selects N rows at a time, so the scratch's logits stay N x max_width x 4 bytes however many
    # rows a call has (prefill chunks of thousands of rows over long contexts)
    logits_rows: int = 0
    # with row batches of wide rows, run_index_topk selects each batch on a side stream while the
    # next is scored (IndexerPlan.overlap_rows); False keeps every launch on the caller's stream
    overlap_batches: bool = True
    # rows wider than row_final's take the grouped top-k (sm_90a): the maxima of 8-logit groups,
    # their top-k, then the top-k among those groups' logits (codegen/cute_blocks/indexer/
    # group_select.py); False: the wide top-k. The same winners either way. Experimental: not yet
    # run on a GPU (docs/notes/topk.md), hence off by default.
    group_select: bool = False
    arch: Optional[str] = None        # None: the current CUDA device's
    num_sms: Optional[int] = None     # None: the current CUDA device's

    def logits_spec(self, arch: str, rows_per_unit: int = 1) -> IndexerLogitsSpec:
        return IndexerLogitsSpec(num_heads=self.num_heads, compress_ratio=self.compress_ratio, mode=self.mode,
                                 rows_per_unit=rows_per_unit, arch=arch)

    # One top-k artifact serves every K <= TOPK_MAX and width <= TOPK_WIDTH_MAX (both are launch
    # arguments), so plans always name the catalog's bucket rather than a spec per call shape.
    def topk_spec(self, arch: str) -> TopKSpec:
        return TopKSpec(k=TOPK_MAX, max_width=TOPK_WIDTH_MAX, with_scores=self.with_scores, arch=arch)

    def fused_spec(self, arch: str) -> IndexerTopKSpec:
        return IndexerTopKSpec(num_heads=self.num_heads, compress_ratio=self.compress_ratio, k=TOPK_MAX,
                               max_width=TOPK_WIDTH_MAX, with_scores=self.with_scores, arch=arch)


@dataclass(frozen=True)
class TopKStep:
    """One launch of the top-k sequence: entry point, groups in -> groups out, fan-in."""

    entry: str
    groups_in: int
    groups_out: int
    fan_in: int


def topk_schedule(width: int, k: int, chunk: int, merge_cap: int, first: str = "chunk") -> list[TopKStep]:
    """The launches that reduce a row of `width` entries to its top-k; fixed by the shapes alone."""
    groups = max(1, -(-width // chunk))
    if groups == 1:
        return [TopKStep(f"{first}_final", 0, 1, 1)]
    steps = [TopKStep(f"{first}_partial", 0, groups, 1)]
    fan_in = max(2, merge_cap // k)
    while groups > fan_in:
        nxt = -(-groups // fan_in)
        steps.append(TopKStep("merge_partial", groups, nxt, fan_in))
        groups = nxt
    steps.append(TopKStep("merge_final", groups, 1, groups))
    return steps


@dataclass(frozen=True, kw_only=True)
class IndexerPlan(Plan):
    caps: Caps
    arch: str
    num_sms: int
    logits_spec: IndexerLogitsSpec
    topk_spec: TopKSpec
    fused_spec: Optional[IndexerTopKSpec]
    tiling: dict
    # paged sm_90a: the logits kernel that scores each staged page for two rows of a request
    logits_pair_spec: Optional[IndexerLogitsSpec] = None

    def kernels(self, which: str) -> registry.LoadedKernels:
        spec = {"logits": self.logits_spec, "logits_pair": self.logits_pair_spec, "topk": self.topk_spec,
                "fused": self.fused_spec}[which]
        return registry.resolve(spec)

    def specs(self) -> list:
        return [s for s in (self.logits_spec, self.logits_pair_spec, self.topk_spec, self.fused_spec)
                if s is not None]

    def logits_rows_per_unit(self, rows: int, rows_per_req: int) -> int:
        """Query rows per logits unit: two rows share each K page load; paged, two rows of one
        request (MTP); contiguous, any two (an even row count)."""
        even = rows % 2 == 0 if self.caps.mode == "contiguous" else rows_per_req % 2 == 0
        return 2 if self.logits_pair_spec is not None and even else 1

    def pages_per_cta(self, rows: int, width: int) -> int:
        """Logits work split. sm_90a: (row group, page) units per CTA of the persistent grid, sized
        so that one wave of the resident CTAs covers all units evenly (`rows` counts row groups).
        Elsewhere: pages per CTA of the (row, page-run) grid, about 8 CTAs per SM."""
        pages = max(1, -(-width // PAGE))
        if self.arch == "sm_90a":
            slots = self.num_sms * logits_ctas_per_sm(self.caps.num_heads, self.arch)
            return max(1, -(-(rows * pages) // slots))
        return max(1, -(-(rows * pages) // (8 * self.num_sms)))

    def row_final(self, rows: int, width: int) -> bool:
        """Whether rows of `width` logits wider than one chunk are selected one CTA per row
        (row_final) instead of by the wide top-k: enough of them to fill the SMs, narrow enough."""
        t = self.tiling
        return t["chunk"] < width <= t["row_chunk"] and rows >= t["row_min_rows"]

    def group_route(self, width: int) -> bool:
        """Whether rows of `width` logits take the grouped top-k (Caps.group_select): wider than
        row_final's rows, on an arch that has it. Their maxima rows (width / group entries) then
        take chunk_final or row_final, at any row count."""
        return _grouped(self.caps, self.tiling) and width > _one_cta_width(self.tiling)

    def multi_cta(self, rows: int, width: int) -> bool:
        """Whether `rows` rows of `width` logits are selected by many CTAs a row (the wide top-k,
        or the grouped one): wider than one chunk and not selected one CTA per row (row_final)."""
        return width > self.tiling["chunk"] and not self.row_final(rows, width)

    def wide_route(self, rows: int, width: int) -> bool:
        """Whether `rows` rows of `width` logits take the wide top-k: selected by many CTAs a row,
        and not by the grouped top-k."""
        return self.multi_cta(rows, width) and not self.group_route(width)

    @property
    def wide_slots(self) -> int:
        """Wide top-k CTAs resident at once: the one wave its grid must fit (SMs x CTAs per SM)."""
        return self.num_sms * self.tiling["wide_min_ctas"]

    def wide_tiles_per_cta(self, rows: int, width: int) -> int:
        """Tiles per wide top-k CTA: the fewest that keep the grid within one wave of resident
        CTAs (the CTAs of a row wait for each other, so they must all be resident)."""
        t = self.tiling
        tiles = -(-width // t["wide_tile"])
        per_row = max(1, self.wide_slots // max(rows, 1))
        return -(-tiles // min(tiles, per_row))

    def batch_rows(self, held: int, width: int) -> int:
        """Rows of one batch when the logits region holds `held` rows of `width`. On the wide
        top-k's route (a row's CTAs resident together; slots = SMs x CTAs per SM, j CTAs a row when
        slots // rows = j) a batch that leaves slots idle gives way to the largest count <= held
        that fills them (slots // j, or whole waves of slots): 408 rows of 160K logits used 408 of
        528 slots, 264 use all of them. Fewer rows a batch cost the logits kernel nothing there
        (docs/notes/indexer-logits.md)."""
        if not self.wide_route(held, width) or held < 2:
            return held
        slots = self.wide_slots

        def filled(n: int) -> float:
            return n * (slots // n) / slots if n < slots else n / (-(-n // slots) * slots)

        if filled(held) >= 0.9:
            return held
        fits = [n - n % 2 for n in ([slots // j for j in range(1, slots + 1)]
                                    + [slots * m for m in range(1, held // slots + 1)])]
        return max([n for n in fits if 2 <= n <= held and filled(n) >= 0.9], default=held)

    def overlap_rows(self, held: int, width: int, rows: int, rows_per_req: int = 1) -> int:
        """Rows of an overlapped batch (0: none). Where row batches take the wide top-k (rows wider
        than a chunk), the logits region's two halves take batches in turn and each batch's top-k
        runs on a side stream beside the next batch's logits: the persistent logits grid and the
        wide top-k then fill each other's tails. Only where a half still holds a row per SM: the
        logits kernel reads each K page once for the rows of a batch, and fewer rows cost it more
        than the overlap gives (4096 rows x 1M tokens c 4: 128-row batches score 7.6% slower than
        256-row ones). Batches of whole requests (docs/notes/indexer-logits.md)."""
        half = self.batch_rows(held // 2, width)
        # whole requests, and an even count: the logits kernel pairs the rows of an even batch
        # (an odd one runs the one-row form, 23% slower at 160K: 295-row halves measured 15.9
        # against 12.9 ms of logits for 4096 rows)
        step = rows_per_req if rows_per_req % 2 == 0 else 2 * rows_per_req
        half -= half % step
        if half < max(2, self.num_sms) or rows <= half or not self.multi_cta(half, width):
            return 0
        return half

    def use_fused(self, rows: int, width: int) -> bool:
        """The fused score+select path only when Caps.fused asks for it: logits then the wide-row
        top-k are faster wherever the fused path used to be chosen (docs/notes/topk.md)."""
        return self.fused_spec is not None and bool(self.caps.fused)

    def bind(self, scratch: torch.Tensor, *, lengths: torch.Tensor, q: torch.Tensor | None = None,
             weights: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
             starts: torch.Tensor | None = None, active_width: torch.Tensor | None = None,
             logits: torch.Tensor | None = None, width: int | None = None, k: int | None = None,
             physical: bool = False, num_blocks: int | None = None, indices: torch.Tensor | None = None,
             scores: torch.Tensor | None = None, max_len: torch.Tensor | None = None) -> "Binding":
        """Check the per-call tensors and carve views of the caller's scratch. Never allocates.

        - lengths [rows] int32: paged plans (top-k of given logits included): tokens per row, a row
          holds floor(lengths[r] / c) entries (the kernels floor-divide); contiguous plans: the end of
          each row's valid range [starts, ends).
        - width (or logits.shape[1]): the graph-stable logits width, in entries.
        - active_width [1] int32 on the device, optional: the active width in entries, as
          `b12x.metadata.decode_active_width` writes it; the kernels use min(width, active_width[0])
          as it is (no division by c). `max_len` is its deprecated alias: the same buffer in the same
          unit (a token count there is still correct, only a looser bound).
        - physical=True returns block-table slots; `num_blocks` (the K cache's pages) makes run_topk
          give -1 for entries outside [0, num_blocks). run_index_topk takes it from kv_cache."""
        plan = self
        if max_len is not None:
            warnings.warn("b12x.indexer.bind(max_len=...) is deprecated: pass active_width= (in entries)",
                          DeprecationWarning, stacklevel=2)
            require(active_width is None, "max_len: expected None when active_width is given (max_len is its old name)")
            active_width = max_len
        caps = plan.caps
        # scratch sets the call's device: a CPU scratch beside CUDA inputs is named as such
        check_cuda_anchor("scratch", scratch, lengths, q, weights, block_table, starts, active_width, logits,
                          indices, scores)
        _scratch.check(scratch, plan.scratch_bytes(), None)
        dev = scratch.device
        check_tensor("lengths", lengths, dtype=torch.int32, ndim=1, contiguous=True, device=dev, align=4)
        rows = lengths.shape[0]
        require(rows <= caps.max_rows,
                f"lengths: expected at most Caps.{spelled(caps, 'max_rows')}={caps.max_rows} rows, got {rows}")
        h = caps.num_heads
        if q is not None:
            check_tensor("q", q, dtype=torch.float8_e4m3fn, shape=(rows, h, INDEX_DIM), contiguous=True, device=dev)
            require(weights is not None, "weights: expected a [rows, Hi] float32 tensor with q, got None")
            check_tensor("weights", weights, dtype=torch.float32, shape=(rows, h), contiguous=True, device=dev)
        if starts is not None:
            check_tensor("starts", starts, dtype=torch.int32, shape=(rows,), contiguous=True, device=dev, align=4)
        if active_width is not None:
            check_tensor("active_width", active_width, dtype=torch.int32, shape=(1,), device=dev, align=4)
        if num_blocks is None:
            num_blocks = MAX_SLOT_BLOCKS
        require(isinstance(num_blocks, int) and num_blocks >= 1,
                f"num_blocks: expected an int >= 1 (the K cache's pages) or None, got {num_blocks!r}")
        if logits is not None:
            _check_rowmajor("logits", logits, torch.float32, (rows, None), dev)
            require(rows <= plan_logits_rows(caps),
                    f"logits: expected at most Caps.logits_rows={caps.logits_rows} rows of caller logits (the "
                    f"plan's top-k state holds that many), got {rows}")
            require(width is None or width == logits.shape[1],
                    f"width: expected logits.shape[1]={logits.shape[1]} or None, got {width}")
            width = logits.shape[1]
        require(isinstance(width, int) and 1 <= width <= caps.max_width,
                f"width: expected an int in [1, Caps.max_width={caps.max_width}] (or a logits tensor), got {width!r}")
        row_batch = 0
        if logits is None and "logits" in plan.regions:
            held = plan_logits_rows(caps)
            row_batch = plan.batch_rows(held, width) if rows > held else 0
            logits = _scratch.view(scratch, plan.regions["logits"], (min(rows, held), width))
        k = caps.topk if k is None else k
        require(isinstance(k, int) and 128 <= k <= caps.topk and k % 128 == 0,
                f"k: expected a multiple of 128 in [128, Caps.topk={caps.topk}], got {k!r}")
        rows_per_req = 1
        if (caps.mode == "paged" and q is not None) or physical:
            require(block_table is not None, "block_table: expected a [requests, pages] int32 tensor, got None")
        if block_table is not None:
            _check_rowmajor("block_table", block_table, torch.int32, (None, None), dev)
            req = block_table.shape[0]
            require(req >= 1 and rows % req == 0,
                    f"block_table: expected a number of requests dividing rows={rows}, got {req}")
            rows_per_req = rows // req
            need_pages = -(-width // PAGE)
            require(block_table.shape[1] >= need_pages,
                    f"block_table: expected at least ceil(width / 64) = {need_pages} pages per request, "
                    f"got {block_table.shape[1]}")
        if indices is None:
            indices = _scratch.view(scratch, plan.regions["indices"], (rows, k))
        _check_rowmajor("indices", indices, torch.int32, (rows, k), dev)
        if caps.with_scores:
            if scores is None:
                scores = _scratch.view(scratch, plan.regions["scores"], (rows, k))
            _check_rowmajor("scores", scores, torch.float32, (rows, k), dev)
        else:
            require(scores is None, "scores: expected None (plan with Caps(with_scores=True) to get scores)")
        cand = tuple((scratch, plan.regions[f"cand_key_{s}"], plan.regions[f"cand_pos_{s}"],
                      plan.regions[f"cand_cnt_{s}"]) for s in "ab")
        g = plan.logits_rows_per_unit(rows, rows_per_req)
        # batches of whole requests (MTP rows share their request's pages)
        req_rows = rows_per_req if block_table is not None and block_table.shape[0] > 1 else 1
        if row_batch and req_rows > 1:
            row_batch -= row_batch % req_rows
            require(row_batch >= 1, f"Caps.logits_rows: expected at least the {rows_per_req} rows of one request, "
                                    f"got {plan_logits_rows(caps)}")
        overlap_batch = 0
        if row_batch and caps.overlap_batches:
            overlap_batch = plan.overlap_rows(plan_logits_rows(caps), width, rows, req_rows)
        return Binding(plan, rows, width, k, None if q is None else q.view(torch.uint8), weights, lengths, starts,
                       block_table, rows_per_req, active_width, physical, min(num_blocks, MAX_SLOT_BLOCKS), logits,
                       indices, scores, cand, plan.pages_per_cta(rows // g, width), row_batch, overlap_batch)


def plan_logits_rows(caps: Caps) -> int:
    """Rows the scratch's logits region holds (Caps.logits_rows, at most max_rows)."""
    return min(caps.max_rows, caps.logits_rows) if caps.logits_rows else caps.max_rows


def logits_rows_for(budget_bytes: int, max_width: int, max_rows: int) -> int:
    """The Caps.logits_rows that keeps the logits region within budget_bytes (an even count, so
    rows of one request still pair up in the logits kernel); 0 when every row fits."""
    fit = budget_bytes // (4 * max(1, max_width))
    return 0 if fit >= max_rows else max(2, fit - fit % 2)


def logits_rows_within(caps: Caps, scratch_bytes: int) -> int:
    """The Caps.logits_rows whose whole plan scratch fits scratch_bytes (0: every row's logits fit),
    cut to the rows its batches of caps.max_rows rows of caps.max_width use: two overlapped halves
    (IndexerPlan.overlap_rows), the batch the wide top-k fills its slots with, or equal batches.
    An engine gives its indexer workspace; this is the row batch that makes the most of it."""
    require(isinstance(scratch_bytes, int) and scratch_bytes > 0,
            f"scratch_bytes: expected a positive int, got {scratch_bytes!r}")

    def need(rows: int) -> int:
        return plan(replace(caps, logits_rows=rows)).scratch_bytes()

    rows = caps.max_rows
    if need(0) <= scratch_bytes:
        return 0
    lo, hi = 0, rows // 2          # even row counts 2 * lo fit; 2 * (hi + 1) is the first that might not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(2 * mid) <= scratch_bytes else (lo, mid - 1)
    require(lo >= 1, f"scratch_bytes: expected at least {need(2)} bytes (two rows of logits), got {scratch_bytes}")
    held, width = 2 * lo, caps.max_width
    p = plan(replace(caps, logits_rows=held))
    half = p.overlap_rows(held, width, rows) if caps.overlap_batches else 0
    if half:
        return 2 * half
    batch = p.batch_rows(held, width)
    if p.multi_cta(batch, width):
        return batch
    per = -(-rows // -(-rows // batch))        # the same number of batches, of equal size
    return min(held, per + per % 2)


def _grouped(caps: Caps, tiling: dict) -> bool:
    """Caps.group_select on an arch whose top-k has the grouped entries."""
    return caps.group_select and bool(tiling["group_cap"])


def _one_cta_width(tiling: dict) -> int:
    """The widest row one CTA selects (chunk_final, or row_final where the arch has it)."""
    return max(tiling["chunk"], tiling["row_chunk"])


def plan(caps: Caps) -> IndexerPlan:
    """Validate caps, pick the kernel specs, lay out the scratch."""
    arch = caps.arch or device_arch()
    logits_spec = caps.logits_spec(arch)   # raises SpecError naming the field
    topk_spec = caps.topk_spec(arch)
    fused_spec = caps.fused_spec(arch) if caps.mode == "paged" else None
    require(caps.fused is not True or fused_spec is not None,
            "Caps.fused: expected None or False with mode 'contiguous' (the fused path is paged only), got True")
    require(isinstance(caps.max_rows, int) and caps.max_rows >= 1,
            f"Caps.{spelled(caps, 'max_rows')}: expected an int >= 1, got {caps.max_rows!r}")
    require(isinstance(caps.max_width, int) and 1 <= caps.max_width <= TOPK_WIDTH_MAX,
            f"Caps.max_width: expected an int in [1, {TOPK_WIDTH_MAX}], got {caps.max_width!r}")
    sms = caps.num_sms or device_num_sms()
    tiling = topk_tiling(arch)
    pair = caps.logits_spec(arch, rows_per_unit=2) if arch == "sm_90a" else None
    rows, k = caps.max_rows, caps.topk
    require(isinstance(caps.logits_rows, int) and caps.logits_rows >= 0,
            f"Caps.logits_rows: expected an int >= 0 (0: every row), got {caps.logits_rows!r}")
    # the rows one top-k launch selects: all of them, or a row batch (Caps.logits_rows)
    sel = plan_logits_rows(caps)
    # candidate groups: the fused path's schedule merges up to width / fused_chunk of them per row
    # (over every row: it does not batch); every other launch passes one group as a placeholder
    fused = fused_spec is not None and bool(caps.fused)
    groups = max(-(-caps.max_width // tiling["chunk"]), -(-caps.max_width // tiling["fused_chunk"])) if fused else 1
    crows = rows if fused else sel
    layout = [("cand_key_a", torch.int32, crows * groups * k), ("cand_pos_a", torch.int32, crows * groups * k),
              ("cand_cnt_a", torch.int32, crows * groups),
              ("cand_key_b", torch.int32, crows * groups * k), ("cand_pos_b", torch.int32, crows * groups * k),
              ("cand_cnt_b", torch.int32, crows * groups),
              ("indices", torch.int32, rows * k), ("scores", torch.float32, rows * k)]
    grouped = _grouped(caps, tiling)
    require(not caps.group_select or grouped,
            f"Caps.group_select: expected False on {arch} (the grouped top-k is sm_90a only), got True")
    require(not grouped or k * tiling["group"] <= tiling["group_cap"],
            f"Caps.topk: expected at most {tiling['group_cap'] // tiling['group']} with group_select, got {k}")
    if caps.max_width > tiling["chunk"]:
        # wide rows: row histogram, per-chunk counts, row state, threshold-bin buffer. Rows no wider
        # than row_chunk take the wide top-k only in launches of fewer than row_min_rows rows
        # (IndexerPlan.wide_route), so the state covers that many there; a grouped plan's wider
        # rows never take it (their maxima rows are selected one CTA a row).
        narrow = caps.max_width <= tiling["row_chunk"] or grouped
        wide = min(sel, tiling["row_min_rows"] - 1) if narrow else sel
        layout += [("wide_hist", torch.int32, wide * ((1 << tiling["wide_bits"]) + 4)),
                   ("wide_cnt", torch.int32, wide * -(-caps.max_width // tiling["wide_tile"]) * 2),
                   ("wide_state", torch.int32, wide * 4),
                   ("tie_key", torch.int32, wide * tiling["tie_cap"]), ("tie_pos", torch.int32, wide * tiling["tie_cap"])]
    if grouped and caps.max_width > _one_cta_width(tiling):
        # the grouped top-k's maxima rows, and their top-k (the ids of each row's best groups)
        layout += [("group_max", torch.float32, sel * -(-caps.max_width // tiling["group"])),
                   ("group_idx", torch.int32, sel * k)]
        if caps.with_scores:
            layout.append(("group_scores", torch.float32, sel * k))
    if caps.logits_in_scratch:
        layout.append(("logits", torch.float32, sel * caps.max_width))
    return IndexerPlan(caps=caps, regions=_scratch.layout(layout), arch=arch, num_sms=sms, logits_spec=logits_spec,
                       topk_spec=topk_spec, fused_spec=fused_spec, tiling=tiling, logits_pair_spec=pair)


@dataclass(frozen=True)
class Binding:
    plan: IndexerPlan
    rows: int
    width: int
    k: int
    q: Optional[torch.Tensor]          # uint8 view of the e4m3 q
    weights: Optional[torch.Tensor]
    lengths: torch.Tensor              # paged: tokens per row; contiguous: ends
    starts: Optional[torch.Tensor]
    block_table: Optional[torch.Tensor]
    rows_per_req: int
    active_width: Optional[torch.Tensor]  # [1] int32 on the device, in entries
    physical: bool
    num_blocks: int                    # K cache pages run_topk checks physical slots against
    logits: Optional[torch.Tensor]
    indices: torch.Tensor
    scores: Optional[torch.Tensor]
    cand: tuple                        # ((key, pos, cnt) buffer a, buffer b) as flat region views
    pages_per_cta: int
    row_batch: int = 0                 # > 0: the logits region holds this many rows (Caps.logits_rows)
    # > 0: run_index_topk scores batches of this many rows into the two halves of the logits
    # region in turn, each batch's top-k on a side stream beside the next batch's logits
    overlap_batch: int = 0


def _check_rowmajor(name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple, device) -> None:
    check_tensor(name, t, dtype=dtype, shape=shape, device=device, align=4)
    require(t.shape[-1] <= 1 or t.stride(-1) == 1,
            f"{name}: expected unit stride in the last dim, got strides {t.stride()}")
    require(t.dim() < 2 or t.stride(0) >= t.shape[1],
            f"{name}: expected a row stride >= {t.shape[1]}, got strides {t.stride()}")


bind = module_bind(IndexerPlan, Binding, __name__)


def check_kv_cache(kv_cache, mode: str, device: torch.device) -> None:
    if mode == "paged":
        check_tensor("kv_cache", kv_cache, dtype=torch.uint8, shape=(None, PAGE, K_RECORD), device=device)
        require(kv_cache.stride(2) == 1 and kv_cache.stride(1) == K_RECORD,
                f"kv_cache: expected token stride {K_RECORD} and byte stride 1 within a page, got strides "
                f"{kv_cache.stride()}")
        require(kv_cache.stride(0) >= PAGE * K_RECORD and kv_cache.stride(0) % 16 == 0,
                f"kv_cache: expected a page stride >= {PAGE * K_RECORD} bytes and a multiple of 16, "
                f"got {kv_cache.stride(0)}")
    else:
        require(isinstance(kv_cache, (tuple, list)) and len(kv_cache) == 2,
                "kv_cache: expected (kv [n, 128] e4m3, kv_scale [n] float32) in contiguous mode, "
                f"got {type(kv_cache).__name__}")
        kv, sc = kv_cache
        check_tensor("kv_cache[0]", kv, dtype=torch.float8_e4m3fn, shape=(None, INDEX_DIM), contiguous=True,
                     device=device)
        check_tensor("kv_cache[1]", sc, dtype=torch.float32, shape=(kv.shape[0],), contiguous=True, device=device,
                     align=4)


def _launch_logits(b: Binding, kv_cache) -> None:
    p = b.plan
    fn = p.kernels("logits_pair" if p.logits_rows_per_unit(b.rows, b.rows_per_req) == 2 else "logits")["logits"]
    if p.caps.mode == "paged":
        fn(b.q, b.weights, kv_cache, b.block_table, b.lengths, tk.active_arg(b), b.logits, b.rows_per_req,
           int(b.active_width is not None), b.pages_per_cta)
    else:
        kv, sc = kv_cache
        fn(b.q, b.weights, kv.view(torch.uint8), sc, b.starts, b.lengths, b.logits, b.pages_per_cta)


def _kv_blocks(b: Binding, kv_cache) -> int:
    """Pages of a paged K cache as the top-k counts them (see MAX_SLOT_BLOCKS)."""
    require(not b.physical or kv_cache.shape[0] >= 1,
            "kv_cache: expected at least one page for physical=True, got 0")
    return min(int(kv_cache.shape[0]), MAX_SLOT_BLOCKS)


def _row_slice(b: Binding, r0: int, r1: int, logits_row0: int = 0) -> Binding:
    """Rows [r0, r1) of a binding as a binding of their own: views of its tensors, the logits
    region's rows from logits_row0. One shared page table (one request) stays whole; per-request
    tables give their requests' rows (batches are whole requests)."""
    p, n = b.plan, r1 - r0
    bt, rpr = b.block_table, b.rows_per_req
    if bt is not None and bt.shape[0] == 1:
        rpr = n
    elif bt is not None:
        bt = bt[r0 // rpr: r1 // rpr]
    sl = (lambda t: None if t is None else t[r0:r1])
    return replace(b, rows=n, q=sl(b.q), weights=sl(b.weights), lengths=b.lengths[r0:r1], starts=sl(b.starts),
                   block_table=bt, rows_per_req=rpr, logits=b.logits[logits_row0:logits_row0 + n],
                   indices=b.indices[r0:r1], scores=sl(b.scores),
                   pages_per_cta=p.pages_per_cta(n // p.logits_rows_per_unit(n, rpr), b.width), row_batch=0,
                   overlap_batch=0)


def _require_whole(b: Binding, what: str) -> None:
    require(not b.row_batch, f"logits: the plan's logits region holds {b.row_batch} of the call's {b.rows} rows "
                             f"(Caps.logits_rows); {what} needs them all: run_index_topk scores and selects row "
                             f"batch by row batch (or plan without Caps.logits_rows)")


def run_logits(b: Binding, *, kv_cache) -> torch.Tensor:
    """Launch the logits kernel on the current stream. Returns b.logits; allocates nothing."""
    _require_whole(b, "run_logits")
    p = b.plan
    require(b.q is not None, "q: expected e4m3 [rows, Hi, 128] in bind() to compute logits, got None")
    require(b.logits is not None, "logits: expected a tensor in bind() (or Caps.logits_in_scratch=True), got None")
    check_kv_cache(kv_cache, p.caps.mode, b.lengths.device)
    if p.caps.mode == "contiguous":
        require(b.starts is not None, "starts: expected [rows] int32 row starts in contiguous mode, got None")
    if b.rows:
        _launch_logits(b, kv_cache)
    return b.logits


def run_topk(b: Binding) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Top-k of b.logits. Returns (indices, scores or None); allocates nothing."""
    _require_whole(b, "run_topk")
    return _run_topk(b, b.num_blocks)


def _run_topk(b: Binding, num_blocks: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    p = b.plan
    require(b.logits is not None, "logits: expected a tensor in bind() (or Caps.logits_in_scratch=True), got None")
    if not b.rows:
        return b.indices, b.scores
    kernels = p.kernels("topk")
    if p.group_route(b.width):
        tk.run_group_topk(b, kernels, num_blocks)
        return b.indices, b.scores
    if p.wide_route(b.rows, b.width):
        tk.run_wide_topk(b, kernels, num_blocks)
        return b.indices, b.scores
    tk.one_cta_topk(b, kernels, num_blocks, row=p.row_final(b.rows, b.width))
    return b.indices, b.scores


def run_index_topk(b: Binding, *, kv_cache) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Logits + top-k: the fused kernel for small batches (no logits in HBM), else run_logits then
    run_topk. Returns (indices, scores or None); allocates nothing."""
    p = b.plan
    check_kv_cache(kv_cache, p.caps.mode, b.lengths.device)
    # physical slots are checked against the cache's own pages
    num_blocks = _kv_blocks(b, kv_cache) if p.caps.mode == "paged" else b.num_blocks
    if b.overlap_batch:
        _run_overlapped(b, kv_cache, num_blocks)
        return b.indices, b.scores
    if not p.use_fused(b.rows, b.width):
        # (a plan with Caps.logits_rows below the call's rows: one batch of rows at a time)
        for r0 in range(0, b.rows, b.row_batch or max(b.rows, 1)):
            sb = _row_slice(b, r0, min(b.rows, r0 + b.row_batch)) if b.row_batch else b
            run_logits(sb, kv_cache=kv_cache)
            _run_topk(sb, num_blocks)
        return b.indices, b.scores
    require(b.q is not None, "q: expected e4m3 [rows, Hi, 128] in bind() to compute logits, got None")
    if not b.rows:
        return b.indices, b.scores
    t = p.tiling
    steps = topk_schedule(b.width, b.k, t["fused_chunk"], t["merge_cap"], "fused")
    kernels = p.kernels("fused")

    def first(st, outs, bt, starts, active, ratio):
        kernels[st.entry](b.q, b.weights, kv_cache, b.block_table, b.lengths, active, *outs, *tk.outputs(b), b.k,
                          b.width, int(b.active_width is not None), tk.physical_arg(b, num_blocks), b.rows_per_req)

    tk.run_schedule(b, steps, kernels, first, num_blocks)
    return b.indices, b.scores


_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for the overlapped top-k (created once; a stream is not memory)."""
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(device=key)
    return _SIDE_STREAMS[key]


def _run_overlapped(b: Binding, kv_cache, num_blocks: int) -> None:
    """Row batches of b.overlap_batch rows, scored into the two halves of the logits region in
    turn on the caller's stream; each batch's top-k runs on the side stream once its logits are
    written, while the next batch is scored into the other half. A half is written again only
    after the top-k that read it; the caller's stream waits for the last top-ks before it goes
    on. Events only: no host sync, and the fork and join are captured into a CUDA graph."""
    n = b.overlap_batch
    main = torch.cuda.current_stream(b.lengths.device)
    side = _side_stream(b.lengths.device)
    done = [None, None]
    for i, r0 in enumerate(range(0, b.rows, n)):
        half = i % 2
        sb = _row_slice(b, r0, min(b.rows, r0 + n), logits_row0=half * n)
        if done[half] is not None:
            main.wait_event(done[half])
        run_logits(sb, kv_cache=kv_cache)
        scored = torch.cuda.Event()
        scored.record(main)
        side.wait_event(scored)
        with torch.cuda.stream(side):
            _run_topk(sb, num_blocks)
        done[half] = torch.cuda.Event()
        done[half].record(side)
    for ev in done:
        if ev is not None:
            main.wait_event(ev)


# -- torch custom ops (torch.compile sees mutating ops with fake implementations) --------------
@lru_cache(maxsize=64)
def _cached_plan(caps: Caps) -> IndexerPlan:
    return plan(caps)


def _op_caps(num_heads: int, topk: int, compress_ratio: int, mode: str, max_batched: int, max_width: int,
             with_scores: bool, logits_in_scratch: bool) -> Caps:
    return Caps(num_heads=num_heads, topk=topk, compress_ratio=compress_ratio, mode=mode, max_rows=max_batched,
                max_width=max_width, with_scores=with_scores, logits_in_scratch=logits_in_scratch)


@torch.library.custom_op("b12x::indexer_logits", mutates_args=("logits",), device_types="cuda")
def indexer_logits_op(q: torch.Tensor, weights: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                      lengths: torch.Tensor, active_width: Optional[torch.Tensor], scratch: torch.Tensor,
                      logits: torch.Tensor, compress_ratio: int, max_batched: int, max_width: int) -> None:
    """logits <- paged indexer logits. active_width: [1] int32 in entries (see bind). scratch:
    plan(Caps(..., logits_in_scratch=False)).scratch_bytes()."""
    p = _cached_plan(_op_caps(q.shape[1], TOPK_MAX, compress_ratio, "paged", max_batched, max_width, False, False))
    b = p.bind(scratch, q=q, weights=weights, lengths=lengths, block_table=block_table,
             active_width=active_width, logits=logits)
    run_logits(b, kv_cache=kv_cache)


@indexer_logits_op.register_fake
def _(q, weights, kv_cache, block_table, lengths, active_width, scratch, logits, compress_ratio, max_batched,
      max_width) -> None:
    return None


@torch.library.custom_op("b12x::indexer_topk", mutates_args=("indices", "scores", "scratch"), device_types="cuda")
def indexer_topk_op(logits: torch.Tensor, lengths: torch.Tensor, starts: Optional[torch.Tensor],
                    active_width: Optional[torch.Tensor], block_table: Optional[torch.Tensor], scratch: torch.Tensor,
                    indices: torch.Tensor, scores: Optional[torch.Tensor], compress_ratio: int, topk: int,
                    max_batched: int, max_width: int) -> None:
    """indices (and scores) <- exact top-k of logits; physical slots when block_table is given."""
    p = _cached_plan(_op_caps(8, topk, compress_ratio, "paged", max_batched, max_width, scores is not None, False))
    b = p.bind(scratch, lengths=lengths, starts=starts, active_width=active_width, block_table=block_table,
             logits=logits, k=indices.shape[1], physical=block_table is not None, indices=indices, scores=scores)
    run_topk(b)


@indexer_topk_op.register_fake
def _(logits, lengths, starts, active_width, block_table, scratch, indices, scores, compress_ratio, topk, max_batched,
      max_width) -> None:
    return None


@torch.library.custom_op("b12x::indexer_index_topk", mutates_args=("indices", "scores", "scratch"),
                         device_types="cuda")
def indexer_index_topk_op(q: torch.Tensor, weights: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                          lengths: torch.Tensor, active_width: Optional[torch.Tensor], scratch: torch.Tensor,
                          indices: torch.Tensor, scores: Optional[torch.Tensor], width: int, compress_ratio: int,
                          topk: int, max_batched: int, max_width: int, physical: bool) -> None:
    """indices (and scores) <- top-k of the paged indexer logits (fused when the batch is small).
    scratch: plan(Caps(..., logits_in_scratch=True)).scratch_bytes()."""
    p = _cached_plan(_op_caps(q.shape[1], topk, compress_ratio, "paged", max_batched, max_width, scores is not None,
                              True))
    b = p.bind(scratch, q=q, weights=weights, lengths=lengths, block_table=block_table,
             active_width=active_width, width=width, k=indices.shape[1], physical=physical, indices=indices,
             scores=scores)
    run_index_topk(b, kv_cache=kv_cache)


@indexer_index_topk_op.register_fake
def _(q, weights, kv_cache, block_table, lengths, active_width, scratch, indices, scores, width, compress_ratio, topk,
      max_batched, max_width, physical) -> None:
    return None


__all__ = ["Caps", "IndexerPlan", "Binding", "TopKStep", "plan", "bind", "run_logits", "run_topk",
           "run_index_topk", "topk_schedule", "check_kv_cache", "INDEXER_HEADS", "COMPRESS_RATIOS", "InputError"]
