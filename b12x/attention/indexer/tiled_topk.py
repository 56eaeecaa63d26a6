"""Upstream b12x's `b12x.attention.indexer.tiled_topk.run_row_topk` (the DCP candidate merge of
the vLLM B12X indexer layer) on b12x.indexer's top-k."""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch

from ... import indexer as _ix
from ...validate import check_tensor, require
from . import SUPPORTED_TOPK

_scratch: dict = {}


@lru_cache(maxsize=32)
def _plan(rows: int, width: int, topk: int, device: torch.device):
    # the top-k artifact is one per arch; the logits spec is named but never launched here
    return _ix.plan(_ix.Caps(num_heads=64, topk=topk, mode="paged", max_rows=rows, max_width=width, with_scores=True,
                             logits_in_scratch=False))


def run_row_topk(*, row_logits: torch.Tensor, lengths: torch.Tensor, topk: int,
                 output_values: Optional[torch.Tensor] = None, output_indices: Optional[torch.Tensor] = None,
                 output_index_offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of each row's columns [0, lengths[r]): (values, indices), indices the column
    positions plus output_index_offset, -1 / -inf past a row's valid columns. Upstream's call has
    no scratch: the first call of each (rows, width, topk, device) allocates this call shape's
    scratch and keeps it (the engine's merge prewarm makes that call); later calls allocate only
    outputs not given."""
    require(topk in SUPPORTED_TOPK, f"topk: expected one of {SUPPORTED_TOPK}, got {topk!r}")
    check_tensor("row_logits", row_logits, dtype=torch.float32, ndim=2, contiguous=True)
    rows, width = row_logits.shape
    check_tensor("lengths", lengths, dtype=torch.int32, shape=(rows,), contiguous=True, device=row_logits.device)
    dev = row_logits.device
    if output_values is None:
        output_values = torch.empty(rows, topk, dtype=torch.float32, device=dev)
    if output_indices is None:
        output_indices = torch.empty(rows, topk, dtype=torch.int32, device=dev)
    check_tensor("output_values", output_values, dtype=torch.float32, shape=(rows, topk), contiguous=True, device=dev)
    check_tensor("output_indices", output_indices, dtype=torch.int32, shape=(rows, topk), contiguous=True, device=dev)
    if rows == 0:
        return output_values, output_indices
    p = _plan(rows, max(width, 1), topk, dev)
    key = (rows, width, topk, dev)
    if key not in _scratch:
        _scratch[key] = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device=dev)
    b = p.bind(_scratch[key], lengths=lengths, logits=row_logits, k=topk, indices=output_indices,
               scores=output_values)
    _ix.run_topk(b)
    if output_index_offset:
        output_indices.add_(torch.where(output_indices >= 0, output_index_offset, 0).to(torch.int32))
    return output_values, output_indices
