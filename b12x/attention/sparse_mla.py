"""Sparse MLA attention (DeepSeek-V3.2 DSA): Caps -> plan -> scratch_specs -> bind -> run_decode.

    caps = Caps(num_heads=16, topk=2048, kv_format="fp8_ds_mla", max_rows=256)
    p = plan(caps)                                   # resolves kernels, may allocate host state
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")  # engine-owned
    b = p.bind(scratch=scratch, q=q, indices=indices, lengths=lengths, out=out)   # views only
    out, lse = run_decode(b, kv_cache=kv, sm_scale=576 ** -0.5)                   # launches only

Decode splits each row's top-k over several CTAs (flash-decoding) and merges the splits in a
combine kernel; the number of splits comes from the rows and the SM count, so small batches
still fill the GPU. When the rows alone fill it (one split) and extend runs the same tile
loop, decode runs the extend kernel, which writes out and lse directly. `run_decode`
allocates nothing and is CUDA-graph capturable.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional

import torch

from codegen.cute_blocks.sparse_mla.kv_layout import kv_record
from codegen.specs import SPARSE_MLA_HEAD_DIMS, SparseMLASpec
from codegen.tiling import (COMBINE_FEW_SPLITS, HEADS_N_BF16_WHOLE_ROW_COST, MAX_SPLITS, ORDER_MIN_ROWS,  # noqa: F401
                            PRODUCER_WHOLE_ROW_COST, REGISTER_SM_SHARE,
                            WARP_GROUP_SM_SHARE)

from .. import registry
from .. import scratch as _scratch
from ..plan import Plan, module_bind, renamed_fields, spelled
from ..device import device_arch, l2_bytes, num_sms as device_num_sms
from ..errors import InputError
from ..reference import PAGE
from ..validate import check_cuda_anchor, check_tensor, require

LOG2E = 1.0 / math.log(2.0)
MODES = ("decode", "extend")
_KV_DTYPES = {"uint8": torch.uint8, "bfloat16": torch.bfloat16}


@renamed_fields(max_batched="max_rows")
@dataclass(frozen=True)
class Caps:
    """What the engine will ask of sparse MLA. Frozen: a plan is keyed by it. (`max_batched` is
    the deprecated name of `max_rows`.)"""

    num_heads: int
    topk: int = 2048
    kv_format: str = "fp8_ds_mla"
    max_rows: int = 256     # most query rows per call
    mode: str = "decode"    # "decode": split over the top-k + combine; "extend": one CTA per row
    q_head_dim: int = 576
    kv_lora_rank: int = 512
    arch: Optional[str] = None    # None: the current CUDA device's
    num_sms: Optional[int] = None  # None: the current CUDA device's
    rope_dim: int = 64            # q is kv_lora_rank NoPE dims then rope_dim RoPE dims
    v_head_dim: int = 512         # out: V is the first v_head_dim dims of K
    page_size: int = 64           # tokens per KV cache page (model1_fp8: 64 or 256)
    # DeepSeek-V4 layers with a compressed cache: a second index list over a second cache, in the
    # same softmax (bind's extra_indices / extra_lengths, run's extra_kv_cache). 0: none.
    extra_topk: int = 0           # the widest extra row (C4: 512 or 1024; C128: up to 8192)
    extra_page_size: int = 0      # its cache's page (C4: 64, C128: 2)
    # decode: 0, the split planner chooses every call's splits; N > 0, the scratch also holds the
    # partials of up to N splits per row at every row count, so bind(num_splits=...) can force a
    # count up to N (an engine's own graph-stable split policy)
    max_splits: int = 0

    def spec(self, arch: str) -> SparseMLASpec:
        return SparseMLASpec(q_head_dim=self.q_head_dim, kv_lora_rank=self.kv_lora_rank, rope_dim=self.rope_dim,
                             v_head_dim=self.v_head_dim, num_heads=self.num_heads, topk=self.topk,
                             kv_format=self.kv_format, page_size=self.page_size, mode=self.mode, arch=arch,
                             extra_topk=self.extra_topk, extra_page_size=self.extra_page_size)


def split_plan(rows: int, width: int, num_sms: int, head_blocks: int, ctas_per_sm: int = 1,
               block_partial: float = 0.0, sm_share: tuple[float, float] | None = None,
               whole_row_cost: float = 1.0) -> tuple[int, int]:
    """(num_splits, tokens_per_split) in 64-token tiles, from a small cost model in tile-times:

        waves(s) * (1 + tiles_per_split(s))  +  0.01 * rows * head_blocks * s

    waves counts rounds of rows * head_blocks * s CTAs over num_sms * ctas_per_sm slots (a CTA
    past the last full wave costs a whole extra round); the 1 is a CTA's fixed cost (Q load,
    first gather, epilogue); the last term is the combine's traffic in partials. One split
    writes none, so the term is dropped there where a CTA's partial is a whole 64-head x
    512-dim block (block_partial >= 1, partial_size), the size it stands for. Smaller blocks
    keep it at one split, where the model was fitted to their measured split counts
    (docs/notes/launch-and-splits.md).

    sm_share = (c, w), for forms whose resident CTAs share an SM's throughput
    (codegen.tiling.REGISTER_SM_SHARE, WARP_GROUP_SM_SHARE): within one wave a split costs

        tiles_per_split(s) * (c + k) / (c + ctas_per_sm)  +  w * rows * head_blocks * s

    with k the CTAs the busiest SM holds (ceil(CTAs / num_sms)): the CTAs' fixed parts overlap
    within a wave, the SM's throughput grows little with a second CTA (c small) or steadily up to
    four (c = 2). More waves count as above. whole_row_cost scales the one-split option's tiles
    where one split runs a faster form than the splits (fp8 at 32 heads: the producer form,
    codegen.tiling.PRODUCER_WHOLE_ROW_COST), or where its one wave of fewer CTAs shares HBM among
    fewer than the splits' full waves (bf16 at 8-32 heads, HEADS_N_BF16_WHOLE_ROW_COST). Ties go
    to fewer splits."""
    tiles = max(1, width // PAGE)
    ctas = max(1, rows * head_blocks)
    slots = max(1, num_sms * ctas_per_sm)
    best = None
    for s in range(1, min(tiles, MAX_SPLITS) + 1):   # the combine merges at most MAX_SPLITS
        tps = -(-tiles // s)
        if -(-tiles // tps) != s:
            continue  # same tiles per split as a smaller s: no new plan
        waves = -(-(ctas * s) // slots)
        if sm_share is not None and waves == 1:
            c = sm_share[0]
            busiest = -(-(ctas * s) // max(1, num_sms))
            tile_cost = tps * (c + busiest) / (c + ctas_per_sm)
        else:
            tile_cost = waves * (1 + tps)
        combine = 0.0 if s == 1 and block_partial >= 1 else (sm_share[1] if sm_share else 0.01) * ctas * s
        cost = tile_cost * (whole_row_cost if s == 1 else 1.0) + combine
        if best is None or cost < best[0] - 1e-9:
            best = (cost, s, tps)
    return best[1], best[2] * PAGE


def partial_size(num_heads: int, head_block: int, v_head_dim: int) -> float:
    """A split CTA's partial o (its block's real heads x v_head_dim) over 64 x 512."""
    return min(num_heads, head_block) * v_head_dim / (64 * 512)


@dataclass(frozen=True, kw_only=True)
class SparseMLAPlan(Plan):
    caps: Caps
    spec: SparseMLASpec
    num_sms: int
    head_block: int
    ctas_per_sm: int = 1
    # split_plan's sm_share of the plan's split form (the tiling's; None: the plain model)
    sm_share: Optional[tuple[float, float]] = None
    # split_plan's whole_row_cost: the whole-row kernel's tile against the split form's
    whole_row_cost: float = 1.0
    # decode: the extend kernel runs the same tile loop, so one-split calls may use it
    whole_row: bool = False
    # decode: the splits of the plan's widest row at 1 .. max_rows rows (what the scratch holds)
    widest_splits: tuple[int, ...] = ()
    # decode: calls of this many rows or more run the "split_warp_group" entry point (0: none)
    # on warp_group_ctas_per_sm CTAs an SM and no short-split rule (codegen.tiling.WARP_GROUP_MIN_ROWS)
    warp_group_min_rows: int = 0
    warp_group_ctas_per_sm: int = 1
    # extend (bf16 at 8-32 heads): calls of ORDER_MIN_ROWS rows or more over a cache larger than
    # L2 put each row's entries in cache order first (the "order" kernel, into the scratch)
    sort_rows: bool = False
    l2_bytes: int = 0

    @property
    def head_blocks(self) -> int:
        return -(-self.caps.num_heads // self.head_block)

    @property
    def kernels(self) -> registry.LoadedKernels:
        return registry.resolve(self.spec)

    @property
    def whole_row_kernels(self) -> registry.LoadedKernels:
        """The extend kernel of the same caps: decode calls with one split per row run it (it
        writes out and lse itself: no partials, no combine). Part of the prewarm bundle."""
        return registry.resolve(replace(self.spec, mode="extend"))

    def specs(self) -> list[SparseMLASpec]:
        """This plan's artifact, and for decode the extend one its one-split calls may run."""
        return [self.spec] + ([replace(self.spec, mode="extend")] if self.whole_row else [])

    def splits(self, rows: int, width: int) -> tuple[int, int]:
        """split_plan's choice for this call, capped at the splits of the plan's widest row: the
        cost model is not monotone in the width (a narrower row can want more splits), and the
        scratch holds partials for the widest row's splits only."""
        ctas_per_sm, share = self.split_form(rows)
        s, tps = split_plan(rows, width, self.num_sms, self.head_blocks, ctas_per_sm,
                            partial_size(self.caps.num_heads, self.head_block, self.caps.v_head_dim), share,
                            self.whole_row_cost)
        cap = self.widest_splits[rows - 1]
        if s > cap:
            tiles = max(1, width // PAGE)
            tps = -(-tiles // cap) * PAGE
            s = -(-tiles * PAGE // tps)
        return s, tps

    def split_entry(self, rows: int) -> str:
        """The split kernel's entry point for a call of `rows` rows."""
        wg = self.warp_group_min_rows
        return "split_warp_group" if wg and rows >= wg else "split"

    def split_form(self, rows: int) -> tuple[int, Optional[tuple[float, float]]]:
        """(ctas_per_sm, sm_share) of the split kernel that runs `rows` rows (split_plan's
        arguments)."""
        return _split_form(rows, self.ctas_per_sm, self.sm_share, self.warp_group_min_rows,
                           self.warp_group_ctas_per_sm)

    def bind(self, scratch: torch.Tensor, *, q: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
             out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
             num_rows: torch.Tensor | None = None, extra_indices: torch.Tensor | None = None,
             extra_lengths: torch.Tensor | None = None, num_splits: int | None = None) -> "Binding":
        """Check the per-call tensors and carve views of the caller's scratch. Never allocates.

        out [rows, H, 512] bf16 and lse [rows, H] fp32 are optional; when omitted they are views of
        the scratch, valid until the next run on that scratch.
        Extend only: num_rows, a [1] int32 device tensor, makes rows a capacity: the grid covers
        q.shape[0] rows and rows at or past num_rows[0] exit at once (one graph serves every count).
        q sets the device: every other tensor must be on q's, and run_* needs it to be a CUDA
        device (bind itself only makes views, so its checks also run on CPU tensors).
        Plans with an extra list (Caps.extra_topk) take extra_indices [rows, width_x] int32 (a
        multiple of 64 up to extra_topk) and extra_lengths [rows] int32: one softmax runs over the
        main entries and the extra ones.
        Decode only: num_splits forces the splits of every row (at most Caps.max_splits, and at
        most one per 64-entry tile); None: the split planner's choice, itself a function of the
        rows and the width only, so a captured graph replays the same plan."""
        return _bind(self, scratch, q, indices, lengths, out, lse, num_rows, extra_indices, extra_lengths, num_splits)


def plan(caps: Caps) -> SparseMLAPlan:
    """Validate caps, pick the kernel spec and split policy, lay out the scratch."""
    arch = caps.arch or device_arch()
    spec = caps.spec(arch)  # raises SpecError naming the field
    require(isinstance(caps.max_rows, int) and caps.max_rows >= 1,
            f"Caps.{spelled(caps, 'max_rows')}: expected an int >= 1, got {caps.max_rows!r}")
    sms = caps.num_sms or device_num_sms()
    tile = spec.tiling()
    # decode may hand one-split calls to the extend kernel where extend runs the same tile loop,
    # or the producer form (fp8 at 32 heads: faster for whole rows than decode's tiles)
    ext_tile = replace(spec, mode="extend").tiling()
    whole_row = caps.mode == "decode" and (ext_tile == tile or ext_tile["producer"])
    head_block, ctas_per_sm = int(tile["head_block"]), int(tile["ctas_per_sm"])
    share = tile["sm_share"]
    # one split runs a faster form than the splits (the producer form: fp8 at 32 heads), or the
    # same HBM-bound form on fewer CTAs than the splits' waves (bf16 heads as N)
    if whole_row and ext_tile["producer"] and not tile["producer"]:
        whole_cost = PRODUCER_WHOLE_ROW_COST
    elif caps.mode == "decode" and tile["heads_as_n"] and caps.kv_format == "bf16":
        whole_cost = HEADS_N_BF16_WHOLE_ROW_COST
    else:
        whole_cost = 1.0
    wg_rows, wg_ctas = int(tile["warp_group_min_rows"]), int(tile["warp_group_ctas_per_sm"])
    h, rows, d_v = caps.num_heads, caps.max_rows, caps.v_head_dim
    layout = [("out", torch.bfloat16, rows * h * d_v), ("lse", torch.float32, rows * h)]
    widest_splits = ()
    sort_rows = False
    if caps.mode == "decode":
        # The most partial rows any row count up to max_rows can need (splits shrink as rows grow).
        head_blocks = -(-h // head_block)
        width = caps.topk + caps.extra_topk
        part = partial_size(h, head_block, d_v)
        widest_splits = tuple(_widest(r, width, sms, head_blocks, part, ctas_per_sm, share, wg_rows, wg_ctas, whole_cost)
                              for r in range(1, rows + 1))
        partial_rows = max(r * s for r, s in enumerate(widest_splits, 1))
        require(isinstance(caps.max_splits, int) and 0 <= caps.max_splits <= MAX_SPLITS,
                f"Caps.max_splits: expected an int in [0, {MAX_SPLITS}] (0: the planner's splits), "
                f"got {caps.max_splits!r}")
        if caps.max_splits:
            partial_rows = max(partial_rows, rows * min(caps.max_splits, max(1, width // PAGE)))
        # fp16 partial o: half the bytes every split CTA writes and the combine reads (the
        # epilogue's stores were a fixed cost of every decode call), 11-bit mantissa
        layout = [("partial_o", torch.float16, partial_rows * h * d_v),
                  ("partial_lse", torch.float32, partial_rows * h)] + layout
    else:
        require(caps.max_splits == 0, f"Caps.max_splits: expected 0 for an extend plan (one CTA per row), "
                                      f"got {caps.max_splits!r}")
        layout.append(("num_rows", torch.int32, 1))  # live row count when the caller gives none
        sort_rows = tile["sort_rows"]
        if sort_rows:
            layout.append(("ordered", torch.int32, rows * caps.topk))   # the rows in cache order
    return SparseMLAPlan(caps=caps, regions=_scratch.layout(layout), spec=spec, num_sms=sms, head_block=head_block,
                         ctas_per_sm=ctas_per_sm, sm_share=share, whole_row_cost=whole_cost, whole_row=whole_row,
                         widest_splits=widest_splits, warp_group_min_rows=wg_rows, warp_group_ctas_per_sm=wg_ctas,
                         sort_rows=sort_rows, l2_bytes=l2_bytes() if sort_rows else 0)


@dataclass(frozen=True)
class Binding:
    plan: SparseMLAPlan
    q: torch.Tensor
    indices: torch.Tensor
    lengths: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    partial_o: Optional[torch.Tensor]     # decode only
    partial_lse: Optional[torch.Tensor]   # decode only
    tokens_per_split: int
    num_rows: Optional[torch.Tensor] = None  # extend: [1] int32 live rows (capacity-sized grid)
    owns_num_rows: bool = False              # extend: num_rows is scratch that run_extend fills
    ordered: Optional[torch.Tensor] = None   # extend plans that sort: [rows, width] int32, the rows in cache order
    extra_indices: Optional[torch.Tensor] = None   # plans with an extra list (Caps.extra_topk)
    extra_lengths: Optional[torch.Tensor] = None

    def lists(self, kv_cache: torch.Tensor, extra_kv_cache: torch.Tensor | None) -> tuple:
        """The kernels' cache, indices and lengths arguments: the main list's, then the extra's."""
        main = (kv_cache, self.indices, self.lengths)
        return main if self.extra_indices is None else main + (extra_kv_cache, self.extra_indices, self.extra_lengths)


def _bind(plan: SparseMLAPlan, scratch: torch.Tensor, q: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
          out: torch.Tensor | None, lse: torch.Tensor | None, num_rows: torch.Tensor | None,
          extra_indices: torch.Tensor | None = None, extra_lengths: torch.Tensor | None = None,
          num_splits: int | None = None) -> Binding:
    """SparseMLAPlan.bind."""
    caps = plan.caps
    h, d_v = caps.num_heads, caps.v_head_dim
    _check_head_dim("q", q, caps)
    check_tensor("q", q, dtype=torch.bfloat16, shape=(None, h, caps.q_head_dim), contiguous=True)
    check_cuda_anchor("q", q, indices, lengths, scratch, out, lse, num_rows)
    rows = q.shape[0]
    dev = q.device
    require(rows <= caps.max_rows, f"q: expected at most Caps.{spelled(caps, 'max_rows')}={caps.max_rows} rows, got {rows}")
    check_tensor("indices", indices, dtype=torch.int32, shape=(rows, None), contiguous=True, device=dev)
    width = indices.shape[1]
    require(width % PAGE == 0 and PAGE <= width <= caps.topk,
            f"indices: expected a width that is a multiple of {PAGE} in [{PAGE}, {caps.topk}], got {width}")
    # lengths and lse are read and written per element: a slice at any row offset will do
    check_tensor("lengths", lengths, dtype=torch.int32, shape=(rows,), contiguous=True, device=dev, align=4)
    extra = {}
    if caps.extra_topk:
        require(extra_indices is not None and extra_lengths is not None,
                f"extra_indices, extra_lengths: expected tensors for a plan with an extra list (Caps.extra_topk="
                f"{caps.extra_topk}), got {type(extra_indices).__name__}, {type(extra_lengths).__name__}")
        check_tensor("extra_indices", extra_indices, dtype=torch.int32, shape=(rows, None), contiguous=True, device=dev)
        wx = extra_indices.shape[1]
        require(wx % PAGE == 0 and PAGE <= wx <= caps.extra_topk,
                f"extra_indices: expected a width that is a multiple of {PAGE} in [{PAGE}, {caps.extra_topk}], got {wx}")
        check_tensor("extra_lengths", extra_lengths, dtype=torch.int32, shape=(rows,), contiguous=True, device=dev,
                     align=4)
        extra = dict(extra_indices=extra_indices, extra_lengths=extra_lengths)
        width += wx                        # the splits cover the main entries, then the extra ones
    else:
        require(extra_indices is None and extra_lengths is None,
                "extra_indices, extra_lengths: expected None for a plan without an extra list (Caps.extra_topk=0), "
                "got tensors")
    _scratch.check(scratch, plan.scratch_bytes(), dev)
    if out is None:
        out = _scratch.view(scratch, plan.regions["out"], (rows, h, d_v))
    check_tensor("out", out, dtype=torch.bfloat16, shape=(rows, h, d_v), contiguous=True, device=dev)
    if lse is None:
        lse = _scratch.view(scratch, plan.regions["lse"], (rows, h))
    check_tensor("lse", lse, dtype=torch.float32, shape=(rows, h), contiguous=True, device=dev, align=4)
    if caps.mode == "extend":
        own = num_rows is None
        if own:  # run_extend writes q's row count here before the launch
            num_rows = _scratch.view(scratch, plan.regions["num_rows"], (1,))
        check_tensor("num_rows", num_rows, dtype=torch.int32, shape=(1,), device=dev, align=4)
        ordered = _scratch.view(scratch, plan.regions["ordered"], (rows, width)) if plan.sort_rows else None
        return Binding(plan, q, indices, lengths, out, lse, None, None, width, num_rows, own, ordered, **extra)
    require(num_rows is None, "num_rows: only extend plans (Caps.mode='extend') take a live row count, got a tensor")
    if num_splits is None:
        splits, tps = plan.splits(rows, width)
    else:
        require(isinstance(num_splits, int) and 1 <= num_splits <= caps.max_splits,
                f"num_splits: expected an int in [1, Caps.max_splits={caps.max_splits}] (plan with "
                f"Caps(max_splits=N) to force split counts), got {num_splits!r}")
        tiles = max(1, width // PAGE)
        tps = -(-tiles // min(num_splits, tiles)) * PAGE
        splits = -(-tiles * PAGE // tps)
    return Binding(plan, q, indices, lengths, out, lse,
                   _scratch.view(scratch, plan.regions["partial_o"], (rows, splits, h, d_v)),
                   _scratch.view(scratch, plan.regions["partial_lse"], (rows, splits, h)), tps, **extra)


bind = module_bind(SparseMLAPlan, Binding, __name__)


def _check_head_dim(name: str, t: torch.Tensor, caps: Caps) -> None:
    """A q whose last dim is another head-dim set of the format (bf16 serves V3.2's 576 and V4's
    512): the plan's dims are named, and how to plan for the other set."""
    if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[-1] == caps.q_head_dim:
        return
    other = [d for d in SPARSE_MLA_HEAD_DIMS.get(caps.kv_format, ()) if d[0] == t.shape[-1]]
    if other:
        q_dim, lora, rope, v = other[0]
        raise InputError(f"{name}: expected last dim Caps.q_head_dim={caps.q_head_dim} (the plan's head dims), got "
                         f"{t.shape[-1]}: {caps.kv_format} also serves q_head_dim={q_dim}, plan with Caps(..., "
                         f"q_head_dim={q_dim}, kv_lora_rank={lora}, rope_dim={rope}, v_head_dim={v})")


def kv_token(kv_format: str, kv_lora_rank: int = SparseMLASpec.kv_lora_rank,
             rope_dim: int = SparseMLASpec.rope_dim) -> tuple[torch.dtype, int]:
    """(element dtype, elements per token) of a [blocks, page, record] cache of kv_format's
    token record for these head dims."""
    rec = kv_record(kv_format, kv_lora_rank, rope_dim)
    return _KV_DTYPES[rec.dtype], rec.last_dim


def check_kv_cache(kv_cache: torch.Tensor, kv_format: str, device: torch.device, *,
                   kv_lora_rank: int = SparseMLASpec.kv_lora_rank, rope_dim: int = SparseMLASpec.rope_dim,
                   page_size: int = PAGE, name: str = "kv_cache") -> None:
    if kv_format == "model1_fp8":
        _check_model1_pages(kv_cache, kv_record(kv_format, kv_lora_rank, rope_dim), page_size, device, name)
        return
    dtype, last = kv_token(kv_format, kv_lora_rank, rope_dim)
    check_tensor(name, kv_cache, dtype=dtype, shape=(None, PAGE, last), device=device)
    elem = kv_cache.element_size()
    require(kv_cache.stride(2) == 1 and kv_cache.stride(1) == last,
            f"{name}: expected token stride {last} and element stride 1 within a page ({kv_format}), "
            f"got strides {kv_cache.stride()}")
    require(kv_cache.stride(0) >= PAGE * last and (kv_cache.stride(0) * elem) % 16 == 0,
            f"{name}: expected a page stride >= {PAGE * last} elements and a multiple of 16 bytes, "
            f"got {kv_cache.stride(0)} elements")


def _check_model1_pages(kv_cache: torch.Tensor, rec, page_size: int, device: torch.device, name: str) -> None:
    """model1_fp8: [blocks, page_bytes] uint8 pages of page_size tokens; the page stride may be
    larger (a page-strided view of a bigger buffer)."""
    page_bytes = rec.page_bytes(page_size)
    check_tensor(name, kv_cache, dtype=torch.uint8, shape=(None, page_bytes), device=device)
    require(kv_cache.stride(1) == 1 and kv_cache.stride(0) >= page_bytes and kv_cache.stride(0) % 16 == 0,
            f"{name}: expected model1_fp8 pages of {page_size} tokens: byte stride 1 and a page stride >= "
            f"{page_bytes} bytes, a multiple of 16, got strides {kv_cache.stride()}")


def _check_run(binding: Binding, mode: str, kv_cache: torch.Tensor, sm_scale: float,
               attn_sink: torch.Tensor | None, lse_base: str, extra_kv_cache: torch.Tensor | None = None) -> None:
    p = binding.plan
    q = binding.q
    require(p.caps.mode == mode, f"plan: expected a Caps(mode={mode!r}) plan for run_{mode}, got mode={p.caps.mode!r}")
    check_cuda_anchor("q", q, kv_cache, attn_sink)
    check_kv_cache(kv_cache, p.caps.kv_format, q.device, kv_lora_rank=p.caps.kv_lora_rank, rope_dim=p.caps.rope_dim,
                   page_size=p.caps.page_size)
    if p.caps.extra_topk:
        require(extra_kv_cache is not None, "extra_kv_cache: expected the extra list's cache for a plan with an "
                                            f"extra list (Caps.extra_topk={p.caps.extra_topk}), got None")
        check_kv_cache(extra_kv_cache, p.caps.kv_format, q.device, kv_lora_rank=p.caps.kv_lora_rank,
                       rope_dim=p.caps.rope_dim, page_size=p.caps.extra_page_size, name="extra_kv_cache")
    else:
        require(extra_kv_cache is None, "extra_kv_cache: expected None for a plan without an extra list, got a tensor")
    require(isinstance(sm_scale, (int, float)) and sm_scale > 0, f"sm_scale: expected a float > 0, got {sm_scale!r}")
    require(lse_base in ("e", "2"), f"lse_base: expected 'e' or '2', got {lse_base!r}")
    if attn_sink is not None:
        check_tensor("attn_sink", attn_sink, dtype=torch.float32, shape=(p.caps.num_heads,), contiguous=True,
                     device=q.device, align=4)
    require(q.device.type == "cuda", f"q: expected a CUDA tensor to launch on, got device {q.device}")


def run_extend(binding: Binding, *, kv_cache: torch.Tensor, sm_scale: float,
               attn_sink: torch.Tensor | None = None, lse_base: str = "e",
               extra_kv_cache: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Many query rows (prefill chunks, MTP verify / draft extend), each with its own indices:
    one launch, one CTA per (row, head block), out and lse written directly. Allocates nothing."""
    _check_run(binding, "extend", kv_cache, sm_scale, attn_sink, lse_base, extra_kv_cache)
    if binding.q.shape[0] == 0:
        return binding.out, binding.lse
    if binding.owns_num_rows:
        binding.num_rows.fill_(binding.q.shape[0])  # a device-side fill: no host sync, graph-capturable
    lists = binding.lists(kv_cache, extra_kv_cache)
    if (binding.ordered is not None and binding.q.shape[0] >= ORDER_MIN_ROWS
            and kv_cache.numel() * kv_cache.element_size() > binding.plan.l2_bytes):
        # each row's entries in cache order first: the rows' tiles then sweep the cache together
        # and share what L2 holds of it (docs/notes/extend.md, "Rows in cache order")
        order_rows(binding)
        lists = (kv_cache, binding.ordered) + lists[2:]
    _launch_whole_rows(binding.plan.kernels, binding, lists, sm_scale, attn_sink, lse_base, binding.num_rows)
    return binding.out, binding.lse


def order_rows(binding: Binding) -> None:
    """The "order" kernel of an extend plan that sorts (plan.sort_rows): each row's first
    `lengths` entries into binding.ordered in cache order (a stable counting sort by bucket of
    the row's slot range, codegen/cute_blocks/sparse_mla/order.py), -1 past them."""
    binding.plan.kernels["order"](binding.indices, binding.lengths, binding.ordered, binding.num_rows, 1)


def _launch_whole_rows(kernels: registry.LoadedKernels, binding: Binding, lists: tuple, sm_scale: float,
                       attn_sink: torch.Tensor | None, lse_base: str, num_rows: torch.Tensor | None) -> None:
    """The extend kernel: one CTA per (row, head block) writes out and lse directly. num_rows,
    a [1] int32 device tensor, limits the live rows of the grid; None: every row is live."""
    kernels["extend"](binding.q, *lists, binding.out, binding.lse,
                      _sink_arg(binding, attn_sink),
                      binding.lengths[:1] if num_rows is None else num_rows,  # not read when None
                      float(sm_scale) * LOG2E, int(attn_sink is not None), int(lse_base == "e"),
                      int(num_rows is not None))


def combine_entry(splits: int) -> str:
    """The decode artifact's combine kernel for `splits` splits per row: "combine" loads a
    thread's first COMBINE_FEW_SPLITS splits before the weights (34 registers, for grids of many
    CTAs), "combine_many_splits" all of them (62 registers; its grids have few CTAs)."""
    return "combine_many_splits" if splits > COMBINE_FEW_SPLITS else "combine"


def _sink_arg(binding: Binding, attn_sink: torch.Tensor | None) -> torch.Tensor:
    """The kernels' sink argument: without a sink they never read it, and any [H] fp32 view
    satisfies the signature."""
    return binding.lse[0] if attn_sink is None else attn_sink


def _split_form(rows: int, ctas_per_sm: int, share, wg_min_rows: int, wg_ctas: int) -> tuple:
    if wg_min_rows and rows >= wg_min_rows:
        return wg_ctas, WARP_GROUP_SM_SHARE
    return ctas_per_sm, share


def _widest(rows, width, sms, head_blocks, part, ctas_per_sm, share, wg_rows, wg_ctas, whole_cost) -> int:
    ctas, sh = _split_form(rows, ctas_per_sm, share, wg_rows, wg_ctas)
    return split_plan(rows, width, sms, head_blocks, ctas, part, sh, whole_cost)[0]


def route(rows: int, rows_per_request: int, *, num_heads: int, num_sms: int, head_block: int = 64) -> str:
    """Which kernel family suits a call: "decode" (split over the top-k + combine) or "extend"
    (one CTA per row). One row per request is decode; several rows per request (MTP verify,
    prefill) are extend, unless rows x head blocks cannot cover the SMs once, where decode's
    splits keep the GPU busy. Both compute the same function."""
    if rows_per_request <= 1:
        return "decode"
    return "extend" if rows * -(-num_heads // head_block) >= num_sms else "decode"


def run_decode(binding: Binding, *, kv_cache: torch.Tensor, sm_scale: float,
               attn_sink: torch.Tensor | None = None, lse_base: str = "e",
               extra_kv_cache: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch split + combine on the current stream. Returns (out, lse); allocates nothing.
    extra_kv_cache: the extra list's cache, for plans with one (Caps.extra_topk)."""
    _check_run(binding, "decode", kv_cache, sm_scale, attn_sink, lse_base, extra_kv_cache)
    p = binding.plan
    q = binding.q
    if q.shape[0] == 0:
        return binding.out, binding.lse
    if binding.partial_o.shape[1] == 1 and p.whole_row:
        # one split per row: the whole-row kernel writes out and lse directly. Not where extend
        # tiles bf16 at 16/32 heads differently (one K stage): slower for decode rows
        # (docs/notes/launch-and-splits.md)
        _launch_whole_rows(p.whole_row_kernels, binding, binding.lists(kv_cache, extra_kv_cache), sm_scale, attn_sink,
                           lse_base, None)
        return binding.out, binding.lse
    k = p.kernels
    k[p.split_entry(q.shape[0])](q, *binding.lists(kv_cache, extra_kv_cache), binding.partial_o, binding.partial_lse,
               float(sm_scale) * LOG2E, binding.tokens_per_split)
    combine = k[combine_entry(binding.partial_o.shape[1])]
    combine(binding.partial_o, binding.partial_lse, binding.out, binding.lse, _sink_arg(binding, attn_sink),
            int(attn_sink is not None), int(lse_base == "e"))
    return binding.out, binding.lse


# -- torch custom op (torch.compile sees a mutating op with a fake implementation) ---------------
@lru_cache(maxsize=64)
def _cached_plan(caps: Caps) -> SparseMLAPlan:
    return plan(caps)


@torch.library.custom_op("b12x::sparse_mla_decode", mutates_args=("out", "lse", "scratch"), device_types="cuda")
def sparse_mla_decode_op(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
                         scratch: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, sm_scale: float,
                         attn_sink: Optional[torch.Tensor], lse_natural: bool, kv_format: str, topk: int,
                         max_batched: int) -> None:
    """out/lse <- sparse MLA decode. scratch must hold plan(Caps(...)).scratch_bytes() bytes."""
    p = _cached_plan(Caps(num_heads=q.shape[1], topk=topk, kv_format=kv_format, max_rows=max_batched))
    b = p.bind(scratch, q=q, indices=indices, lengths=lengths, out=out, lse=lse)
    run_decode(b, kv_cache=kv_cache, sm_scale=sm_scale, attn_sink=attn_sink, lse_base="e" if lse_natural else "2")


@sparse_mla_decode_op.register_fake
def _(q, kv_cache, indices, lengths, scratch, out, lse, sm_scale, attn_sink, lse_natural, kv_format, topk,
      max_batched) -> None:
    return None


# DeepSeek-V4: model1_fp8 pages, the sliding-window (main) list and an optional compressed (extra)
# list in one softmax, V all 512 dims. One op for decode and extend (mode); the extra tensors are
# None for sliding-window-only layers.
V4_HEAD_DIMS = dict(q_head_dim=512, kv_lora_rank=448, rope_dim=64, v_head_dim=512)


def v4_caps(*, num_heads: int, topk: int, page_size: int, extra_topk: int = 0, extra_page_size: int = 0,
            max_rows: int = 256, mode: str = "decode") -> Caps:
    """Caps of a DeepSeek-V4 layer kind: model1_fp8 pages and V4's head dims."""
    return Caps(num_heads=num_heads, topk=topk, kv_format="model1_fp8", max_rows=max_rows, mode=mode,
                page_size=page_size, extra_topk=extra_topk, extra_page_size=extra_page_size, **V4_HEAD_DIMS)


@torch.library.custom_op("b12x::sparse_mla_v4", mutates_args=("out", "lse", "scratch"), device_types="cuda")
def sparse_mla_v4_op(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
                     extra_kv_cache: Optional[torch.Tensor], extra_indices: Optional[torch.Tensor],
                     extra_lengths: Optional[torch.Tensor], scratch: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                     sm_scale: float, attn_sink: Optional[torch.Tensor], lse_natural: bool, topk: int, page_size: int,
                     extra_topk: int, extra_page_size: int, max_rows: int, mode: str) -> None:
    """out/lse <- DeepSeek-V4 sparse MLA (v4_caps). scratch must hold plan(v4_caps(...)).scratch_bytes()."""
    p = _cached_plan(v4_caps(num_heads=q.shape[1], topk=topk, page_size=page_size, extra_topk=extra_topk,
                             extra_page_size=extra_page_size, max_rows=max_rows, mode=mode))
    b = p.bind(scratch, q=q, indices=indices, lengths=lengths, out=out, lse=lse, extra_indices=extra_indices,
               extra_lengths=extra_lengths)
    run = run_extend if mode == "extend" else run_decode
    run(b, kv_cache=kv_cache, sm_scale=sm_scale, attn_sink=attn_sink, lse_base="e" if lse_natural else "2",
        extra_kv_cache=extra_kv_cache)


@sparse_mla_v4_op.register_fake
def _(q, kv_cache, indices, lengths, extra_kv_cache, extra_indices, extra_lengths, scratch, out, lse, sm_scale,
      attn_sink, lse_natural, topk, page_size, extra_topk, extra_page_size, max_rows, mode) -> None:
    return None
