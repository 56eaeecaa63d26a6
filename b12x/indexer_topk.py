"""The top-k launches of a bound indexer call (b12x.indexer.Binding): the arguments every top-k
kernel shares, the chunk / merge schedule, and the three routes for rows wider than one CTA's
share of shared memory: one CTA a row, the wide top-k (a row's CTAs share a histogram), the
grouped top-k (group maxima, then the best groups' logits). b12x.indexer picks the route
(IndexerPlan.group_route, wide_route, row_final) and calls these."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from . import scratch as _scratch

if TYPE_CHECKING:
    from .indexer import Binding, TopKStep


def placeholder(b: Binding) -> torch.Tensor:
    """A placeholder int32 tensor for arguments a launch does not read (flags say so)."""
    return b.lengths


def cand_views(b: Binding, which: int, groups: int):
    """Candidate buffer `which` (0: a, 1: b) of the chunk / merge schedule: (keys, positions,
    counts) of `groups` groups a row, views of the binding's scratch."""
    scratch, rk, rp, rc = b.cand[which]
    return (_scratch.view(scratch, rk, (b.rows, groups, b.k)), _scratch.view(scratch, rp, (b.rows, groups, b.k)),
            _scratch.view(scratch, rc, (b.rows, groups)))


def outputs(b: Binding) -> tuple:
    """The launch's output tensors: indices, and scores where the plan keeps them."""
    return (b.indices, b.scores) if b.plan.caps.with_scores else (b.indices,)


def active_arg(b: Binding) -> torch.Tensor:
    """The active-width buffer, or a placeholder the kernels do not read (has_active_width = 0)."""
    return b.active_width if b.active_width is not None else placeholder(b)


def physical_arg(b: Binding, num_blocks: int) -> int:
    """The top-k kernels' `physical` argument: 0 for row-relative positions, else the cache's
    pages (>= 1), against which each block-table entry of a winner is checked (-1 outside)."""
    return num_blocks if b.physical else 0


def row_args(b: Binding) -> tuple:
    """(starts, active_width, block_table, ratio) of the top-k launches; placeholders where the
    binding has none (their flags tell the kernels not to read them)."""
    dummy = placeholder(b)
    return (b.starts if b.starts is not None else dummy, active_arg(b),
            b.block_table if b.block_table is not None else dummy.view(1, -1),
            b.plan.caps.compress_ratio if b.plan.caps.mode == "paged" else 1)


def run_schedule(b: Binding, steps: list[TopKStep], kernels, first_launch, num_blocks: int) -> None:
    """Launch the steps; candidates ping-pong between scratch buffers a and b."""
    starts, active, bt, ratio = row_args(b)
    src = 0
    for i, st in enumerate(steps):
        out_groups = max(st.groups_out, 1)
        k_out, p_out, c_out = cand_views(b, 1 - src if i else 0, out_groups)
        if i == 0:
            first_launch(st, (k_out, p_out, c_out), bt, starts, active, ratio)
            src = 0
            continue
        k_in, p_in, c_in = cand_views(b, src, st.groups_in)
        # merge stages never read the logits: any [rows, *] fp32 view will do when there are none
        logits = b.logits if b.logits is not None else b.indices.view(torch.float32)
        kernels[st.entry](logits, starts, b.lengths, active, bt, k_in, p_in, c_in, k_out, p_out, c_out, *outputs(b),
                          b.k, ratio, int(b.starts is not None), int(b.active_width is not None),
                          physical_arg(b, num_blocks), b.rows_per_req, st.fan_in)
        src = 1 - src


def one_cta_topk(b: Binding, kernels, num_blocks: int, *, row: bool) -> None:
    """One CTA per row selects from its logits in shared memory (row_final past one chunk, else
    chunk_final): a single launch, whose candidate buffers (in and out) are unused placeholders.
    The winners come out in position order."""
    starts, active, bt, ratio = row_args(b)
    cand = cand_views(b, 0, 1)
    kernels["row_final" if row else "chunk_final"](
        b.logits, starts, b.lengths, active, bt, *cand, *cand, *outputs(b), b.k, ratio,
        int(b.starts is not None), int(b.active_width is not None), physical_arg(b, num_blocks), b.rows_per_req, 1)


def wide_args(b: Binding, num_blocks: int | None = None) -> tuple[torch.Tensor, tuple]:
    """(histogram, arguments) of the wide-row launches (wide_chunk, wide_ties): views of the
    binding's scratch. The histogram view also holds the sync words the chunk CTAs wait on."""
    p = b.plan
    t = p.tiling
    scratch, regions = b.cand[0][0], p.regions
    tpc = p.wide_tiles_per_cta(b.rows, b.width)
    tiles = -(-b.width // t["wide_tile"])
    ctas = -(-tiles // tpc)                                # CTAs per row
    starts, active, bt, ratio = row_args(b)
    hist = _scratch.view(scratch, regions["wide_hist"], (b.rows, (1 << t["wide_bits"]) + 4))
    return hist, (b.logits, starts, b.lengths, active, bt, hist,
                  _scratch.view(scratch, regions["wide_cnt"], (b.rows, 2 * ctas)),
                  _scratch.view(scratch, regions["wide_state"], (b.rows, 4)),
                  _scratch.view(scratch, regions["tie_key"], (b.rows, t["tie_cap"])),
                  _scratch.view(scratch, regions["tie_pos"], (b.rows, t["tie_cap"])),
                  *outputs(b), b.k, ratio, int(b.starts is not None), int(b.active_width is not None),
                  physical_arg(b, b.num_blocks if num_blocks is None else num_blocks), b.rows_per_req, tpc)


def wide_chunk_entry(b: Binding) -> str:
    """wide_chunk, or wide_chunk_long where a CTA has more tiles than wide_chunk keeps hit masks for."""
    t = b.plan.tiling
    long = t["wide_long_hit_tiles"] and b.plan.wide_tiles_per_cta(b.rows, b.width) > t["wide_hit_tiles"]
    return "wide_chunk_long" if long else "wide_chunk"


def run_wide_topk(b: Binding, kernels, num_blocks: int) -> None:
    """Rows wider than one chunk: zeroed histogram and sync words, then the chunk CTAs (histogram ->
    threshold bin -> ranked writes) and the per-row tie pass (see topk.py.j2)."""
    hist, args = wide_args(b, num_blocks)
    hist.zero_()        # the sync words must start at zero on every call; a memset node under capture
    kernels[wide_chunk_entry(b)](*args)
    kernels["wide_ties"](*args)


def group_topk_steps(b: Binding, kernels, num_blocks: int) -> tuple:
    """The grouped top-k's three steps (Caps.group_select, group_select.py), each a launch
    closure over views of the binding's scratch: group_max writes the maxima of each row's
    8-logit groups (its valid range only, from the group of its start on); one CTA a row selects
    each row's K best groups from them (a binding of the maxima rows: no starts, no active width,
    row-relative ids), in position order at any row count (the wide top-k's ranked writes are
    not, and group_final's tie rule needs it); group_final selects the row's winners among those
    groups' logits."""
    p = b.plan
    scratch, regions, group = b.cand[0][0], p.regions, p.tiling["group"]
    starts, active, bt, ratio = row_args(b)
    has_starts, has_active = int(b.starts is not None), int(b.active_width is not None)
    maxima = _scratch.view(scratch, regions["group_max"], (b.rows, -(-b.width // group)))
    # The maxima rows keep the row ends (lengths): [0, min(end, width / group)) holds every group
    # with a valid logit, at most ceil(end / group) of them, and the rest have the lowest key.
    ids = _scratch.view(scratch, regions["group_idx"], (b.rows, b.k))
    id_scores = _scratch.view(scratch, regions["group_scores"], (b.rows, b.k)) if p.caps.with_scores else None
    groups = replace(b, width=maxima.shape[1], logits=maxima, starts=None, active_width=None, physical=False,
                     indices=ids, scores=id_scores, row_batch=0, overlap_batch=0)
    cand = cand_views(b, 0, 1)            # placeholders: group_final reads the ids and the logits only
    return (lambda: kernels["group_max"](b.logits, starts, b.lengths, active, maxima, ratio, has_starts, has_active),
            lambda: one_cta_topk(groups, kernels, num_blocks, row=groups.width > p.tiling["chunk"]),
            lambda: kernels["group_final"](b.logits, starts, b.lengths, active, bt, cand[0], ids.view(b.rows, 1, b.k),
                                           cand[2], *cand, *outputs(b), b.k, ratio, has_starts, has_active,
                                           physical_arg(b, num_blocks), b.rows_per_req, 1))


def run_group_topk(b: Binding, kernels, num_blocks: int) -> None:
    for step in group_topk_steps(b, kernels, num_blocks):
        step()
