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
