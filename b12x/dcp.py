"""Decode-context-parallel (DCP) global top-k: exact merge of per-rank top-k over torch.distributed.

W ranks each hold an interleaved shard of the KV (interleave I); queries are replicated. Each rank
computes a local top-k over its shard; the merge makes every rank hold the exact top-K of the
unsharded row:

    1. local ids -> global ids (a -1 stays -1 with score -inf), packed with their scores
    2. one all-gather, rank-major, over the DCP group (NCCL on GPUs, gloo on CPU)
    3. top-K over the W*K candidates (b12x's top-k kernel on GPUs)
    4. winners' ids gathered; a winner whose score is -inf becomes -1

Every rank issues the same collective for every chunk: a rank with no local KV, or an empty
chunk, still takes part with (-1, -inf) candidates. All workspace comes from caller-owned
scratch laid out once by `plan`, so `merge_topk` allocates nothing on GPUs and is graph-capturable.

On CPU tensors (tests, gloo) the same steps run as torch ops; CUDA tensors always go through the
generated kernels (there is no fallback from one to the other).
"""
from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from codegen.specs import DcpSpec

from . import indexer, registry
from . import scratch as _scratch
from .plan import Plan, renamed_fields, spelled
from .device import device_arch
from .errors import InputError
from .validate import check_tensor, require

ALLOWED_K = tuple(range(128, 2049, 128))


# -- positions (torch, any device) -----------------------------------------------------------
def local_to_global(local: torch.Tensor, *, world: int, rank: int, interleave: int) -> torch.Tensor:
    g = ((local // interleave) * world + rank) * interleave + local % interleave
    return torch.where(local >= 0, g, torch.full_like(local, -1))


def owner_of(g: torch.Tensor, *, world: int, interleave: int) -> torch.Tensor:
    return (g // interleave) % world


def global_to_local(g: torch.Tensor, *, world: int, interleave: int) -> torch.Tensor:
    return (g // (interleave * world)) * interleave + g % interleave


def shard_topk_reference(full: torch.Tensor, *, world: int, rank: int, interleave: int,
                         k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What rank `rank` contributes for rows of global scores `full` [rows, L]: the top-k of its
    shard as local ids and scores, with a (-1, -inf) tail when the shard holds fewer than k."""
    rows, length = full.shape
    g = torch.arange(length, device=full.device)
    mine = owner_of(g, world=world, interleave=interleave) == rank
    ids = torch.full((rows, k), -1, dtype=torch.int32, device=full.device)
    scores = torch.full((rows, k), -math.inf, device=full.device)
    if mine.any():
        local = global_to_local(g[mine], world=world, interleave=interleave)
        shard = torch.full((rows, int(local.max()) + 1), -math.inf, device=full.device)
        shard[:, local] = full[:, mine].float()
        v, p = torch.topk(shard, min(k, shard.shape[1]), dim=-1)
        ids[:, : v.shape[1]] = torch.where(v > -math.inf, p, -1).to(torch.int32)
        scores[:, : v.shape[1]] = v
    return ids, scores


# -- plan ------------------------------------------------------------------------------------
@renamed_fields(k="topk")
@dataclass(frozen=True)
class DcpCaps:
    """What the engine will ask of the DCP merge (`dcp.Caps` is the same class). Frozen: a plan is
    keyed by it. (`k` is the deprecated name of `topk`.)"""

    topk: int = 2048               # K of the local and of the merged top-k
    world: int = 1
    interleave: int = 1
    max_rows: int = 256            # most query rows per call
    arch: Optional[str] = None     # CUDA plans: None = the current device's
    num_sms: Optional[int] = None


Caps = DcpCaps


@dataclass(frozen=True, kw_only=True)
class DcpPlan(Plan):
    """The merge's plan: `plan.bind(scratch, local_ids=..., ...)` then `run_merge(b, group=...)`
    (or, with convert_only=True, `run_convert(b)`); `merge_topk` and `convert_to_global` do both
    in one call. `filter_local` (the attention side) takes the plan and its tensors directly."""

    caps: DcpCaps
    device_type: str
    topk_plan: Optional[indexer.IndexerPlan] = None

    @property
    def kernels(self) -> registry.LoadedKernels:
        return registry.resolve(self._spec())

    def _spec(self) -> DcpSpec:
        return DcpSpec(arch=self.caps.arch or device_arch())

    def specs(self) -> list:
        """The DCP kernels and the top-k with scores that ranks the candidates (CUDA plans)."""
        return [] if self.device_type != "cuda" else [self._spec(), self.topk_plan.topk_spec]

    def bind(self, scratch: Optional[torch.Tensor] = None, *, local_ids: torch.Tensor,
             local_scores: Optional[torch.Tensor], out_ids: torch.Tensor, out_scores: Optional[torch.Tensor] = None,
             rank: int, convert_only: bool = False) -> "Binding":
        """Check one chunk's buffers (and the scratch, which the merge needs and convert-only mode
        does not). Never allocates; run_merge / run_convert launch."""
        _check_rank(self, rank)
        what = "convert-only mode" if convert_only else "global top-k merge"
        rows = _check_buffers(self, None if convert_only else scratch, local_ids, local_scores, out_ids, out_scores,
                              what)
        require(convert_only or scratch is not None, "scratch: expected the plan's uint8 scratch for the merge, got None")
        if convert_only and out_scores is None:
            require(self.caps.world == 1, "out_scores: expected a buffer under DCP world > 1, got None")
        return Binding(self, scratch, local_ids, local_scores, out_ids, out_scores, rank, rows, convert_only)


@dataclass(frozen=True)
class Binding:
    plan: DcpPlan
    scratch: Optional[torch.Tensor]
    local_ids: torch.Tensor
    local_scores: Optional[torch.Tensor]
    out_ids: torch.Tensor
    out_scores: Optional[torch.Tensor]
    rank: int
    rows: int
    convert_only: bool


def plan(caps: DcpCaps, device: torch.device | str = "cuda") -> DcpPlan:
    device = torch.device(device)
    require(caps.topk in ALLOWED_K,
            f"DcpCaps.{spelled(caps, 'topk')}: expected a multiple of 128 in [128, 2048], got {caps.topk}")
    require(caps.world >= 1 and caps.interleave >= 1,
            f"DcpCaps: expected world >= 1 and interleave >= 1, got world={caps.world} interleave={caps.interleave}")
    require(caps.max_rows >= 1, f"DcpCaps.max_rows: expected >= 1, got {caps.max_rows}")
    w, k, rows = caps.world, caps.topk, caps.max_rows
    layout = [("send", torch.int32, rows * 2 * k), ("gathered", torch.int32, w * rows * 2 * k),
              ("cand", torch.float32, rows * w * k), ("cand_lengths", torch.int32, rows),
              ("win_pos", torch.int32, rows * k), ("win_scores", torch.float32, rows * k)]
    topk_plan = None
    if device.type == "cuda":
        topk_plan = indexer.plan(indexer.Caps(topk=k, max_rows=rows, max_width=w * k, with_scores=True,
                                              logits_in_scratch=False, arch=caps.arch, num_sms=caps.num_sms))
        layout.append(("topk", torch.uint8, topk_plan.scratch_bytes()))
    return DcpPlan(caps=caps, regions=_scratch.layout(layout), device_type=device.type, topk_plan=topk_plan)


def _check_rank(p: DcpPlan, rank) -> None:
    """A rank outside the plan's world would give ids that another rank also produces."""
    w = p.caps.world
    require(isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < w,
            f"rank: expected an int in [0, {w}) (DcpCaps.world={w}), got {rank!r}")


def _all_gather_into(out: torch.Tensor, inp: torch.Tensor, group: Optional[dist.ProcessGroup]) -> None:
    """One all-gather into a flat tensor, rank-major. torch 2.13 deprecates
    all_gather_into_tensor (a FutureWarning on every call) in favour of all_gather_single, which
    older torch lacks."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def _view(scratch: torch.Tensor, p: DcpPlan, name: str, shape: Sequence[int]) -> torch.Tensor:
    return _scratch.view(scratch, p.regions[name], tuple(shape))


def _check_buffers(p: DcpPlan, scratch, local_ids, local_scores, out_ids, out_scores, what: str) -> int:
    k = p.caps.topk
    check_tensor("local_ids", local_ids, dtype=torch.int32, shape=(None, k), contiguous=True)
    rows = local_ids.shape[0]
    dev = local_ids.device
    # local_ids sets the device the other buffers are checked against: its own is checked first
    require(dev.type == p.device_type, f"local_ids: expected a {p.device_type} tensor (the plan's), got {dev}")
    require(rows <= p.caps.max_rows, f"local_ids: expected at most DcpCaps.max_rows={p.caps.max_rows} rows, got {rows}")
    if local_scores is None and p.caps.world > 1:
        raise InputError(f"topk_scores_buffer: expected an fp32 [rows, {k}] scores buffer for DCP {what} with "
                         f"world={p.caps.world}, got None (allocate it with b12x.dcp.allocate_topk_buffers)")
    if local_scores is not None:
        check_tensor("local_scores", local_scores, dtype=torch.float32, shape=(rows, k), contiguous=True, device=dev)
    check_tensor("out_ids", out_ids, dtype=torch.int32, shape=(rows, k), contiguous=True, device=dev)
    if out_scores is not None:
        check_tensor("out_scores", out_scores, dtype=torch.float32, shape=(rows, k), contiguous=True, device=dev)
    if scratch is not None:
        _scratch.check(scratch, p.scratch_bytes(), dev)
    return rows


def convert_to_global(p: DcpPlan, *, local_ids: torch.Tensor, local_scores: Optional[torch.Tensor],
                      out_ids: torch.Tensor, out_scores: Optional[torch.Tensor], rank: int,
                      scratch: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Convert-only mode: this rank's local top-k as global ids (the ranks' outputs together are
    the union of the local top-k). No collective. (`p.bind(..., convert_only=True)` + run_convert.)"""
    return run_convert(p.bind(scratch, local_ids=local_ids, local_scores=local_scores, out_ids=out_ids,
                              out_scores=out_scores, rank=rank, convert_only=True))


def run_convert(b: Binding) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Convert-only mode of a `bind(..., convert_only=True)` binding; see convert_to_global."""
    require(b.convert_only, "binding: expected plan.bind(..., convert_only=True) for run_convert, got a merge binding")
    p, c = b.plan, b.plan.caps
    local_ids, local_scores, out_ids, out_scores, rank = b.local_ids, b.local_scores, b.out_ids, b.out_scores, b.rank
    if local_ids.device.type == "cuda":
        scores_in = local_scores if local_scores is not None else out_ids.view(torch.float32)
        scores_out = out_scores if out_scores is not None else out_ids.view(torch.float32)
        if local_ids.shape[0]:
            p.kernels["convert_pack"](local_ids, scores_in, out_ids, scores_out, c.world, rank, c.interleave)
    else:
        out_ids.copy_(local_to_global(local_ids, world=c.world, rank=rank, interleave=c.interleave))
        if out_scores is not None:
            out_scores.copy_(local_scores.masked_fill(local_ids < 0, -math.inf))
    return out_ids, out_scores


def merge_topk(p: DcpPlan, *, scratch: torch.Tensor, local_ids: torch.Tensor, local_scores: torch.Tensor,
               out_ids: torch.Tensor, out_scores: Optional[torch.Tensor] = None, rank: int,
               group: Optional[dist.ProcessGroup] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Exact global top-K over the DCP group; the same result on every rank. Rows may be 0 (an
    empty chunk): the rank still issues the all-gather, with one (-1, -inf) row.

    As a set the row is exact; its order is unspecified (on GPUs, winners come in rank-major
    candidate order), and a winner with score -inf is -1 wherever it sits. out_scores, when
    given, is position-aligned with out_ids."""
    return run_merge(p.bind(scratch, local_ids=local_ids, local_scores=local_scores, out_ids=out_ids,
                            out_scores=out_scores, rank=rank), group=group)


def run_merge(b: Binding, *, group: Optional[dist.ProcessGroup] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The global top-K merge of a `plan.bind(...)` binding over `group`; see merge_topk."""
    require(not b.convert_only, "binding: expected a merge binding for run_merge, got convert_only=True")
    p, scratch, rows, rank = b.plan, b.scratch, b.rows, b.rank
    local_ids, local_scores, out_ids, out_scores = b.local_ids, b.local_scores, b.out_ids, b.out_scores
    c = p.caps
    w, k = c.world, c.topk
    n = max(rows, 1)  # every rank issues the collective, even for an empty chunk
    send = _view(scratch, p, "send", (n, 2 * k))
    gathered = _view(scratch, p, "gathered", (w, n, 2 * k))
    send_ids, send_scores = send[:, :k], send[:, k:].view(torch.float32)
    cuda = local_ids.device.type == "cuda"
    if rows == 0:
        send_ids.fill_(-1)
        send_scores.fill_(-math.inf)
    elif cuda:
        p.kernels["convert_pack"](local_ids, local_scores, send_ids, send_scores, w, rank, c.interleave)
    else:
        send_ids.copy_(local_to_global(local_ids, world=w, rank=rank, interleave=c.interleave))
        send_scores.copy_(local_scores.masked_fill(local_ids < 0, -math.inf))
    if w > 1:
        _all_gather_into(gathered.view(-1), send.view(-1), group)
    else:
        gathered[0].copy_(send)
    if rows == 0:
        return out_ids, out_scores
    cand = _view(scratch, p, "cand", (rows, w * k))
    g_ids = gathered[:, :rows, :k]
    g_scores = gathered.view(torch.float32)[:, :rows, k:]
    if cuda:
        kern = p.kernels
        kern["gather_scores"](gathered.view(torch.float32)[:, :rows], cand, k)
        lengths = _view(scratch, p, "cand_lengths", (rows,))
        lengths.fill_(w * k)
        win_pos = _view(scratch, p, "win_pos", (rows, k))
        win_scores = out_scores if out_scores is not None else _view(scratch, p, "win_scores", (rows, k))
        tb = p.topk_plan.bind(_view(scratch, p, "topk", (p.regions["topk"].numel,)), lengths=lengths, logits=cand,
                              k=k, indices=win_pos, scores=win_scores)
        indexer.run_topk(tb)
        kern["finalize"](gathered[:, :rows], win_pos, win_scores, out_ids, k)
    else:
        cand.view(rows, w, k).copy_(g_scores.transpose(0, 1))
        vals, pos = torch.topk(cand, k, dim=-1)
        ids = g_ids.transpose(0, 1).reshape(rows, w * k).gather(1, pos)
        out_ids.copy_(ids.masked_fill(vals == -math.inf, -1))
        if out_scores is not None:
            out_scores.copy_(vals)
    return out_ids, out_scores


def filter_local(p: DcpPlan, *, global_ids: torch.Tensor, out_local: torch.Tensor, lengths: torch.Tensor, rank: int,
                 local_lens: Optional[torch.Tensor] = None, block_table: Optional[torch.Tensor] = None,
                 rows_per_req: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention side: keep the global ids this rank owns, as local positions (or physical slots
    through `block_table` [reqs, pages]; row r reads table row r // rows_per_req), compacted to
    the front in order with a -1 tail; lengths = min(count, local_lens) (count without
    local_lens). With a block table, an owned id whose local position is at or past
    pages * 64 is dropped like -1 (neither kept nor counted)."""
    c = p.caps
    _check_rank(p, rank)
    check_tensor("global_ids", global_ids, dtype=torch.int32, ndim=2, contiguous=True)
    rows, width = global_ids.shape
    dev = global_ids.device
    require(dev.type == p.device_type, f"global_ids: expected a {p.device_type} tensor (the plan's), got {dev}")
    check_tensor("out_local", out_local, dtype=torch.int32, shape=(rows, width), contiguous=True, device=dev)
    check_tensor("lengths", lengths, dtype=torch.int32, shape=(rows,), contiguous=True, device=dev, align=4)
    if local_lens is not None:
        check_tensor("local_lens", local_lens, dtype=torch.int32, shape=(rows,), contiguous=True, device=dev, align=4)
    if block_table is not None:
        check_tensor("block_table", block_table, dtype=torch.int32, ndim=2, device=dev, align=4)
        require(block_table.stride(1) == 1, f"block_table: expected unit column stride, got {block_table.stride()}")
        require(isinstance(rows_per_req, int) and not isinstance(rows_per_req, bool) and rows_per_req >= 1,
                f"rows_per_req: expected an int >= 1, got {rows_per_req!r}")
        reqs = -(-rows // rows_per_req)
        require(block_table.shape[0] >= reqs,
                f"block_table: expected at least {reqs} rows ({rows} rows of global_ids / rows_per_req="
                f"{rows_per_req}), got {block_table.shape[0]}")
    if rows == 0:
        return out_local, lengths
    if dev.type == "cuda":
        p.kernels["filter_local"](global_ids, out_local, lengths, local_lens if local_lens is not None else lengths,
                                  block_table if block_table is not None else global_ids, c.world, rank, c.interleave,
                                  int(local_lens is not None), int(block_table is not None), rows_per_req)
        return out_local, lengths
    keep = (global_ids >= 0) & (owner_of(global_ids, world=c.world, interleave=c.interleave) == rank)
    local = global_to_local(global_ids, world=c.world, interleave=c.interleave)
    if block_table is not None:
        keep &= local < block_table.shape[1] * 64
        req = torch.arange(rows, device=dev) // rows_per_req
        if block_table.shape[1]:
            pages = block_table[req[:, None], torch.where(keep, local // 64, 0)]
            local = pages * 64 + local % 64
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # kept entries first, in order
    counts = keep.sum(1).to(torch.int32)
    compact = local.gather(1, order)
    compact[torch.arange(width, device=dev)[None, :] >= counts[:, None]] = -1
    out_local.copy_(compact)
    lengths.copy_(torch.minimum(counts, local_lens) if local_lens is not None else counts)
    return out_local, lengths


# -- buffers the engine owns -------------------------------------------------------------------
@dataclass
class TopkBuffers:
    indices: torch.Tensor              # [max_tokens, K] int32
    scores: Optional[torch.Tensor]     # [max_tokens, K] fp32, present whenever DCP world > 1


def allocate_topk_buffers(max_tokens: int, k: int, *, dcp_world_size: int, device, with_scores: bool = False) -> TopkBuffers:
    """The one helper every layer that produces top-k uses, the MTP draft layer included: under
    DCP the merge needs the scores, so a scores buffer always comes with the indices there."""
    require(k in ALLOWED_K, f"k: expected a multiple of 128 in [128, 2048], got {k}")
    idx = torch.full((max_tokens, k), -1, dtype=torch.int32, device=device)
    scores = None
    if dcp_world_size > 1 or with_scores:
        scores = torch.full((max_tokens, k), -math.inf, dtype=torch.float32, device=device)
    return TopkBuffers(idx, scores)


# -- rank-consistent warm-up -------------------------------------------------------------------
def sync_dcp_warmup(world: int, group: Optional[dist.ProcessGroup] = None) -> bool:
    """Barrier after a warm-up pass. W = 1, or a process group that was never initialised, is a
    no-op (returns False); a failing barrier raises."""
    if world <= 1 or not dist.is_available() or not dist.is_initialized():
        return False
    dist.barrier(group=group)
    return True


_warm_lock = threading.Lock()
_warmed: set = set()


def prewarm_dcp_merge(p: DcpPlan, *, scratch: torch.Tensor, rank: int, max_rows: int | None = None,
                      group: Optional[dist.ProcessGroup] = None, rows: Sequence[int] | None = None,
                      key: object = None, max_batched: int | None = None) -> list[int]:
    """Run the real merge path (all-gather included) for rows (1, 2, 4, max_rows), deduplicated
    and capped at the plan, with a barrier after each pass. Memoised per key, recorded only after
    every pass succeeded. Returns the row counts that ran (empty when already warm).
    `b12x.prewarm.prewarm(plan, group=...)` runs this and the other DCP kernels; max_rows None:
    the plan's DcpCaps.max_rows. (`max_batched` is the deprecated name of `max_rows`.)"""
    c = p.caps
    if max_batched is not None:
        warnings.warn("b12x.dcp.prewarm_dcp_merge(max_batched=...) is deprecated: use max_rows",
                      DeprecationWarning, stacklevel=2)
        require(max_rows is None, "max_batched: expected None when max_rows is given (max_batched is its old name)")
        max_rows = max_batched
    max_rows = c.max_rows if max_rows is None else max_rows
    _check_rank(p, rank)
    key = key if key is not None else (c, max_rows, p.device_type)
    with _warm_lock:
        if key in _warmed:
            return []
    want = sorted({r for r in (rows if rows is not None else (1, 2, 4, max_rows)) if 1 <= r <= c.max_rows})
    dev = scratch.device
    for r in want:
        ids = torch.full((r, c.topk), -1, dtype=torch.int32, device=dev)
        ids[:, : min(c.topk, 8)] = torch.arange(min(c.topk, 8), dtype=torch.int32, device=dev)
        scores = torch.where(ids >= 0, torch.zeros_like(ids, dtype=torch.float32), -math.inf)
        out = torch.empty_like(ids)
        merge_topk(p, scratch=scratch, local_ids=ids, local_scores=scores, out_ids=out, rank=rank, group=group)
        sync_dcp_warmup(c.world, group)
    with _warm_lock:
        _warmed.add(key)
    return want
