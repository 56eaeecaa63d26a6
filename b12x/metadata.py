"""Decode metadata without host syncs.

The sparse indexer needs a host-side max sequence length to size its active width. Reading it
from the device (`seq_lens.max().item()`) synchronises the stream on every generated token; these
helpers take it from the runner's CPU shadow instead, or fall back to a graph-stable bound.

Unit: every width here counts entries of the (compressed) indexer cache, one per c tokens, as the
engine's `active_width` does. The buffer `decode_active_width` fills is what `b12x.indexer.bind
(active_width=...)` and `b12x.integration.vllm.SparseIndexer.topk(active_width=...)` take, and the
kernels use its value as it is (clamped to the planned width), never dividing it by c again.
Sequence lengths (the shadows, the per-row `lengths` tensor) count tokens."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np
import torch

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[int]]


def _cpu_array(x: ArrayLike | None) -> Optional[np.ndarray]:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            return None  # a device tensor is not a shadow: reading it would sync
        return x.detach().numpy()
    return np.asarray(x)


def decode_topk_max_seq_len_from_cpu(seq_lens_cpu: ArrayLike | None, *, num_rows: int | None = None,
                                     dcp_local_seq_lens_cpu: ArrayLike | None = None, compress_ratio: int = 1,
                                     authoritative: bool = True) -> Optional[int]:
    """Exact max active width (in indexer entries: max over rows of floor(L / c)) from CPU shadows
    of the sequence lengths (tokens), or None.

    - `dcp_local_seq_lens_cpu`, when given, is preferred: under DCP the kernels see rank-local
      lengths, so the scalar must be in the same coordinates.
    - Shapes `[B]`, native MTP `[B, next_n]` and flattened MTP `[B * next_n]` are all accepted;
      `num_rows` limits the rows that count (the rest are padding).
    - Zero-length rows (flattened-MTP pad rows) are skipped; all-zero gives 0.
    - Compressed caches (`compress_ratio` c > 1) hold floor(L / c) entries per row.
    - None when there is no authoritative CPU shadow (absent, on the GPU, or asynchronous
      speculative decoding): the caller then uses `graph_stable_active_width`.
    """
    if compress_ratio < 1:
        raise ValueError(f"compress_ratio: expected an int >= 1, got {compress_ratio}")
    if not authoritative:
        return None
    src = _cpu_array(dcp_local_seq_lens_cpu) if dcp_local_seq_lens_cpu is not None else _cpu_array(seq_lens_cpu)
    if src is None:
        return None
    flat = src.reshape(-1)
    if num_rows is not None:
        flat = flat[:num_rows]
    flat = flat[flat > 0]
    if flat.size == 0:
        return 0
    return int(flat.max()) // compress_ratio


def graph_stable_active_width(max_seq_len: int, compress_ratio: int = 1) -> int:
    """ceil(max_seq_len / c) entries (max_seq_len in tokens): the width bound that never changes
    between graph replays."""
    return -(-int(max_seq_len) // compress_ratio)


def write_active_width(buffer: torch.Tensor, value: int) -> torch.Tensor:
    """Store the active width (entries) into the persistent device buffer the kernels read (a
    device-side fill launched on the current stream: no host sync, safe under graph capture)."""
    if buffer.dtype != torch.int32 or buffer.numel() != 1:
        raise ValueError(f"buffer: expected a one-element int32 tensor, got {buffer.dtype} {tuple(buffer.shape)}")
    return buffer.fill_(int(value))


def decode_active_width(buffer: torch.Tensor, *, max_seq_len: int, compress_ratio: int = 1,
                        seq_lens_cpu: ArrayLike | None = None, num_rows: int | None = None,
                        dcp_local_seq_lens_cpu: ArrayLike | None = None, authoritative: bool = True) -> int:
    """The per-step call: the exact active width from the CPU shadow when there is one, else the
    graph-stable bound ceil(max_seq_len / c); written into `buffer` ([1] int32 on the device).
    Both are in entries of the (compressed) cache: for c = 4 and a longest row of 16384 tokens it
    writes 4096. Returns the host value written."""
    exact = decode_topk_max_seq_len_from_cpu(seq_lens_cpu, num_rows=num_rows,
                                             dcp_local_seq_lens_cpu=dcp_local_seq_lens_cpu,
                                             compress_ratio=compress_ratio, authoritative=authoritative)
    value = exact if exact is not None else graph_stable_active_width(max_seq_len, compress_ratio)
    write_active_width(buffer, value)
    return value


class CompressedEntries:
    """The extra (compressed) list of a DeepSeek-V4 C128 layer: every compressed entry of each
    row, in order, as flat slots of the extra cache, and the row's entry count. A row of L tokens
    has floor(L / compress_ratio) entries (the completed groups, as the engine's compressed
    lengths count them); entry j of row r lives in page `block_table[r, j // page]` at offset
    `j % page`. Counts above `width` are clamped to it; positions past a row's count are -1.

    Built once per (max_rows, width, page, ratio, device) with its buffers; `fill` runs on the
    current stream with preallocated outputs only: no allocation, no host sync, safe under CUDA
    graph capture and replay. Engine sequence:

        entries = CompressedEntries(max_rows=256, width=8192, page=2, device="cuda")
        entries.fill(seq_lens, block_table, out_indices, out_lengths)   # every step, in the graph
    """

    def __init__(self, *, max_rows: int, width: int, page: int, compress_ratio: int = 128,
                 device: torch.device | str = "cuda"):
        for name, v in (("max_rows", max_rows), ("width", width), ("page", page), ("compress_ratio", compress_ratio)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        self.max_rows, self.width, self.page, self.compress_ratio = max_rows, width, page, compress_ratio
        self.device = torch.device(device)
        pos = torch.arange(width, dtype=torch.int32, device=self.device)
        self._pos = pos
        self._page_of = (pos // page).long()           # the block-table column of each position
        self._offset = pos % page
        self.table_columns = -(-width // page)        # block-table columns a full row reads
        self._pages = torch.empty(max_rows, width, dtype=torch.int32, device=self.device)
        self._past = torch.empty(max_rows, width, dtype=torch.bool, device=self.device)

    def fill(self, seq_lens: torch.Tensor, block_table: torch.Tensor, out_indices: torch.Tensor,
             out_lengths: torch.Tensor) -> None:
        """seq_lens [rows] int32 (tokens) and block_table [rows, >= table_columns] int32 of the
        extra cache -> out_indices [rows, width] int32 and out_lengths [rows] int32."""
        from .validate import check_tensor, require

        dev = self.device
        check_tensor("seq_lens", seq_lens, dtype=torch.int32, ndim=1, device=dev)
        rows = seq_lens.shape[0]
        require(rows <= self.max_rows, f"seq_lens: expected at most max_rows = {self.max_rows} rows, got {rows}")
        check_tensor("block_table", block_table, dtype=torch.int32, ndim=2, device=dev)
        require(block_table.shape[0] == rows,
                f"block_table: expected {rows} rows (as seq_lens), got {block_table.shape[0]}")
        require(block_table.shape[1] >= self.table_columns,
                f"block_table: expected at least {self.table_columns} columns (width {self.width} / page "
                f"{self.page}), got {block_table.shape[1]}")
        check_tensor("out_indices", out_indices, dtype=torch.int32, shape=(rows, self.width), contiguous=True, device=dev)
        check_tensor("out_lengths", out_lengths, dtype=torch.int32, shape=(rows,), device=dev)
        torch.div(seq_lens, self.compress_ratio, rounding_mode="floor", out=out_lengths)
        out_lengths.clamp_(0, self.width)
        pages = self._pages[:rows]
        torch.index_select(block_table, 1, self._page_of, out=pages)
        torch.mul(pages, self.page, out=out_indices)
        out_indices.add_(self._offset)
        past = self._past[:rows]
        torch.ge(self._pos[None, :], out_lengths[:, None], out=past)
        out_indices.masked_fill_(past, -1)
