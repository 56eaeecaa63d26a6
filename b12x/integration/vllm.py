"""vLLM-shaped entry points for a DeepSeek-V3.2-style sparse attention backend.

The call sequence an attention backend uses (README "DCP global top-k, decode metadata, vLLM
adapter"; tests/test_readme_examples.py checks that these calls exist as written):

    # __init__ of the backend / indexer layer, once per layer kind:
    dcp = DcpConfig(world=dcp_size, rank=dcp_rank, interleave=interleave, group=dcp_group)
    bufs = make_topk_buffers(max_tokens, topk, dcp_world_size=dcp_size, device=dev)    # target AND MTP draft
    merged = make_topk_buffers(max_tokens, topk, dcp_world_size=dcp_size, device=dev)  # DCP > 1: the global top-k
    indexer = SparseIndexer(num_heads=64, topk=topk, max_rows=max_rows, max_width=max_width, dcp=dcp)
    mla = SparseMLA(num_heads=num_heads, topk=topk, kv_format="fp8_ds_mla", max_rows=max_rows)
    ws = torch.empty(max(indexer.scratch_bytes(), mla.scratch_bytes()), dtype=torch.uint8, device=dev)
    prewarm(num_heads=num_heads, topk=topk, max_rows=max_rows, indexer=indexer, dcp=dcp, scratch=ws)
    b12x.prewarm.prewarm(indexer.plan, scratch=ws)   # the adapter's prewarm covers sparse MLA and the DCP merge
    b12x.freeze()

    # per step (CUDA-graph capturable, no host sync):
    decode_metadata(active_width_buf, max_seq_len=max_seq_len, compress_ratio=c, seq_lens_cpu=shadow,
                    dcp_local_seq_lens_cpu=local_shadow)          # entries of the compressed cache
    indexer.topk(q_fp8, weights, kv_idx, block_table, seq_lens, scratch=ws, out=bufs, width=width,
                 active_width=active_width_buf)                   # fills bufs
    indexer.dcp_global_topk(bufs, rows, scratch=ws, merged=merged)  # DCP > 1
    mla.decode(q, kv_cache, slots, slot_lengths, out=attn_out, scratch=ws, sm_scale=softmax_scale)

DeepSeek-V4 layers (model1_fp8 pages; one SparseMLAV4 per layer kind, the extra list for C4 / C128
layers only):

    v4 = SparseMLAV4(num_heads=num_heads, swa_topk=128, swa_page_size=256, extra_topk=c4_topk,
                     extra_page_size=64, max_rows=max_rows)
    v4.decode(q, swa_cache, swa_indices, swa_lengths, out=attn_out, scratch=ws, sm_scale=softmax_scale,
              extra_cache=c4_cache, extra_indices=c4_slots, extra_lengths=c4_lengths, attn_sink=attn_sink)

`slots` are flat KV slots (block * 64 + offset) of each row's selection: the engine converts the
indexer's row-relative positions (or, under DCP, takes this rank's share of `merged`,
`b12x.dcp.filter_local`).

Units: seq_lens and the shadows count tokens; `width`, `active_width_buf` and the top-k positions
count entries of the (compressed) indexer cache, floor(L / c) per row of L tokens. The buffer that
`decode_metadata` fills goes to `topk(active_width=...)` as it is.

There is no cached workspace or arena: every call binds the caller's scratch, as vLLM's B12X
binding rule asks.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from .. import dcp as _dcp
from .. import indexer as _ix
from ..attention import sparse_mla as _mla
from ..metadata import decode_active_width
from ..plan import renamed_kw
from ..prewarm import prewarm_sparse_mla
from ..validate import require

make_topk_buffers = _dcp.allocate_topk_buffers
decode_metadata = decode_active_width


@dataclass(frozen=True)
class DcpConfig:
    """The decode-context-parallel group of this rank (world 1: no DCP)."""

    world: int = 1
    rank: int = 0
    interleave: int = 1
    group: Optional[dist.ProcessGroup] = None
    global_topk: bool = True  # False: convert-only (each rank keeps its own local top-k)


class SparseIndexer:
    """Lightning indexer + top-k for one layer kind (target or MTP draft: same buffers helper)."""

    def __init__(self, *, num_heads: int, topk: int, max_rows: int | None = None, max_width: int,
                 compress_ratio: int = 1, dcp: DcpConfig = DcpConfig(), max_batched: int | None = None):
        """(`max_batched` is the deprecated name of `max_rows`.)"""
        max_rows = renamed_kw(max_rows, max_batched, "max_batched", "max_rows", "SparseIndexer")
        require(max_rows is not None, "max_rows: expected an int >= 1 (most query rows per call), got None")
        self.dcp = dcp
        self.plan = _ix.plan(_ix.Caps(num_heads=num_heads, topk=topk, compress_ratio=compress_ratio,
                                      max_rows=max_rows, max_width=max_width, with_scores=dcp.world > 1,
                                      logits_in_scratch=True))
        self.dcp_plan = _dcp.plan(_dcp.Caps(topk=topk, world=dcp.world, interleave=dcp.interleave,
                                            max_rows=max_rows)) if dcp.world > 1 else None

    def scratch_bytes(self) -> int:
        return max(self.plan.scratch_bytes(), self.dcp_plan.scratch_bytes() if self.dcp_plan else 0)

    def topk(self, q_fp8, weights, kv_cache, block_table, seq_lens, *, scratch, out: _dcp.TopkBuffers,
             width: int, active_width: Optional[torch.Tensor] = None,
             max_len: Optional[torch.Tensor] = None) -> _dcp.TopkBuffers:
        """Fill out.indices (and out.scores under DCP) for the first q_fp8.shape[0] rows.

        seq_lens [rows] int32 in tokens (rank-local under DCP); width: the graph-stable logits
        width in entries; active_width: the [1] int32 device buffer `decode_metadata` filled
        (entries, passed on as it is). `max_len` is its deprecated name."""
        rows = q_fp8.shape[0]
        if self.dcp.world > 1 and out.scores is None:
            raise _ix.InputError("topk_scores_buffer: expected a scores buffer under DCP (make_topk_buffers), got None")
        if max_len is not None:
            warnings.warn("SparseIndexer.topk(max_len=...) is deprecated: pass active_width= (in entries)",
                          DeprecationWarning, stacklevel=2)
            if active_width is not None:
                raise _ix.InputError("max_len: expected None when active_width is given (max_len is its old name)")
            active_width = max_len
        b = self.plan.bind(scratch, q=q_fp8, weights=weights, lengths=seq_lens, block_table=block_table,
                           width=width, active_width=active_width, indices=out.indices[:rows],
                           scores=out.scores[:rows] if self.plan.caps.with_scores else None)
        _ix.run_index_topk(b, kv_cache=kv_cache)
        return out

    def dcp_global_topk(self, bufs: _dcp.TopkBuffers, rows: int, *, scratch: torch.Tensor,
                        merged: _dcp.TopkBuffers) -> _dcp.TopkBuffers:
        """Global merge (or convert-only) of this rank's local top-k; every rank calls it for every
        chunk, empty ones included."""
        d = self.dcp
        if self.dcp_plan is None:
            raise _ix.InputError("dcp_global_topk: expected a DcpConfig with world > 1")
        args = dict(local_ids=bufs.indices[:rows], local_scores=None if bufs.scores is None else bufs.scores[:rows],
                    out_ids=merged.indices[:rows], out_scores=None if merged.scores is None else merged.scores[:rows],
                    rank=d.rank)
        if d.global_topk:
            _dcp.merge_topk(self.dcp_plan, scratch=scratch, group=d.group, **args)
        else:
            _dcp.convert_to_global(self.dcp_plan, **args)
        return merged


class SparseMLA:
    """Sparse MLA decode for one layer kind; plans per batch bucket are made once."""

    def __init__(self, *, num_heads: int, topk: int = 2048, kv_format: str = "fp8_ds_mla", max_rows: int | None = None,
                 max_batched: int | None = None):
        """(`max_batched` is the deprecated name of `max_rows`; default 256.)"""
        max_rows = renamed_kw(max_rows, max_batched, "max_batched", "max_rows", "SparseMLA")
        self.plan = _mla.plan(_mla.Caps(num_heads=num_heads, topk=topk, kv_format=kv_format,
                                        max_rows=256 if max_rows is None else max_rows))

    def scratch_bytes(self) -> int:
        return self.plan.scratch_bytes()

    def decode(self, q, kv_cache, indices, lengths, *, out, scratch, sm_scale: float, lse=None, attn_sink=None):
        b = self.plan.bind(scratch, q=q, indices=indices, lengths=lengths, out=out, lse=lse)
        return _mla.run_decode(b, kv_cache=kv_cache, sm_scale=sm_scale, attn_sink=attn_sink)


class SparseMLAV4:
    """DeepSeek-V4 sparse attention for one layer kind, in the call shape of vLLM's DeepSeek-V4
    backend (FlashMLA's MODEL1 decode): the sliding-window cache with its indices and lengths,
    and for C4 / C128 layers the compressed cache with its own, in one softmax; attn_sink scales
    out and leaves lse. Caches are model1_fp8 pages ([blocks, page_bytes] uint8)."""

    def __init__(self, *, num_heads: int, swa_topk: int = 128, swa_page_size: int = 256, extra_topk: int = 0,
                 extra_page_size: int = 0, max_rows: int = 256):
        self.plan = _mla.plan(_mla.v4_caps(num_heads=num_heads, topk=swa_topk, page_size=swa_page_size,
                                           extra_topk=extra_topk, extra_page_size=extra_page_size, max_rows=max_rows))

    def scratch_bytes(self) -> int:
        return self.plan.scratch_bytes()

    def decode(self, q, swa_cache, swa_indices, swa_lengths, *, out, scratch, sm_scale: float, extra_cache=None,
               extra_indices=None, extra_lengths=None, attn_sink=None, lse=None):
        b = self.plan.bind(scratch, q=q, indices=swa_indices, lengths=swa_lengths, out=out, lse=lse,
                           extra_indices=extra_indices, extra_lengths=extra_lengths)
        return _mla.run_decode(b, kv_cache=swa_cache, sm_scale=sm_scale, attn_sink=attn_sink,
                               extra_kv_cache=extra_cache)


def prewarm(*, num_heads: int, topk: int = 2048, kv_format: str = "fp8_ds_mla", max_rows: int | None = None,
            indexer: Optional[SparseIndexer] = None, dcp: DcpConfig = DcpConfig(),
            scratch: Optional[torch.Tensor] = None, max_batched: int | None = None) -> None:
    """Prewarm sparse MLA decode and extend (binding `scratch` per call) and, under DCP, the real
    merge path with a barrier after each pass. Every rank must call it with the same arguments.
    (`max_batched` is the deprecated name of `max_rows`; default 256.)"""
    max_rows = renamed_kw(max_rows, max_batched, "max_batched", "max_rows", "prewarm")
    max_rows = 256 if max_rows is None else max_rows
    prewarm_sparse_mla(num_heads=num_heads, kv_format=kv_format, topk=topk, max_rows=max_rows, scratch=scratch)
    if indexer is not None and indexer.dcp_plan is not None:
        ws = scratch if scratch is not None else torch.empty(indexer.scratch_bytes(), dtype=torch.uint8,
                                                             device="cuda")
        _dcp.prewarm_dcp_merge(indexer.dcp_plan, scratch=ws, rank=dcp.rank, max_rows=max_rows, group=dcp.group)
