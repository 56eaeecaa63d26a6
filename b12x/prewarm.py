"""Prewarm bundles: make every kernel a model configuration can dispatch to built, loaded and
launched once, before CUDA-graph capture and before freeze().

A bundle is keyed by (q_head_dim, kv_lora_rank, topk, max_batched), qualified by arch, heads and
KV format. Prewarm binds caller-style scratch per call (plan.bind(scratch=...)), and a key is
recorded only after its warm-up launches succeeded."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from codegen.specs import KernelSpec

from . import registry
from .attention import sparse_mla
from .device import device_arch

_lock = threading.Lock()
_done: set["PrewarmKey"] = set()


@dataclass(frozen=True)
class PrewarmKey:
    q_head_dim: int
    kv_lora_rank: int
    topk: int
    max_batched: int
    num_heads: int
    kv_format: str
    arch: str

    def caps(self, mode: str = "decode") -> sparse_mla.Caps:
        return sparse_mla.Caps(num_heads=self.num_heads, topk=self.topk, kv_format=self.kv_format,
                               max_batched=self.max_batched, mode=mode, q_head_dim=self.q_head_dim,
                               kv_lora_rank=self.kv_lora_rank, arch=self.arch)

    def specs(self) -> list[KernelSpec]:
        """Every artifact the bundle needs: decode (split + combine) and extend. Each serves all
        row counts and split plans up to max_batched: those are launch arguments, not
        compile-time constants, so `sparse_mla.route` can pick either at any row count."""
        return [self.caps(m).spec(self.arch) for m in sparse_mla.MODES]


def prewarmed_keys() -> set[PrewarmKey]:
    with _lock:
        return set(_done)


def _warm_inputs(p: sparse_mla.SparseMLAPlan, rows: int, device: torch.device):
    """Small random inputs that touch one page; every launch really runs."""
    caps = p.caps
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(rows, caps.num_heads, sparse_mla.Q_DIM, device=device, dtype=torch.bfloat16, generator=g)
    idx = torch.randint(0, 64, (rows, caps.topk), device=device, dtype=torch.int32, generator=g)
    lengths = torch.full((rows,), caps.topk, device=device, dtype=torch.int32)
    dtype, last = sparse_mla._KV_LAST[caps.kv_format]
    kv = torch.zeros(1, 64, last, device=device, dtype=dtype)
    return q, idx, lengths, kv


def prewarm_sparse_mla(*, num_heads: int, kv_format: str = "fp8_ds_mla", topk: int = 2048, max_batched: int = 256,
                       q_head_dim: int = 576, kv_lora_rank: int = 512, device: torch.device | str | None = None,
                       scratch: torch.Tensor | None = None) -> PrewarmKey:
    """Resolve the bundle's artifacts and launch each kernel at 1 and at max_batched rows.

    `scratch` is the engine's own workspace when it has one (bound per call, never kept)."""
    device = torch.device(device or f"cuda:{torch.cuda.current_device()}")
    key = PrewarmKey(q_head_dim, kv_lora_rank, topk, max_batched, num_heads, kv_format, device_arch(device))
    with _lock:
        if key in _done:
            return key
    for spec in key.specs():
        registry.resolve(spec)
    with torch.cuda.device(device):
        plans = {m: sparse_mla.plan(key.caps(m)) for m in sparse_mla.MODES}
        need = max(p.scratch_bytes() for p in plans.values())
        if scratch is None:
            scratch = torch.empty(need, dtype=torch.uint8, device=device)
        run = {"decode": sparse_mla.run_decode, "extend": sparse_mla.run_extend}
        for mode, p in plans.items():
            # decode's split plans change with rows, extend's grid does: warm the row counts an
            # engine's graphs use, binding the caller's scratch for every call
            for rows in sorted({1, 2, 4, max_batched}):
                q, idx, lengths, kv = _warm_inputs(p, rows, device)
                b = p.bind(scratch, q=q, indices=idx, lengths=lengths)
                run[mode](b, kv_cache=kv, sm_scale=q_head_dim ** -0.5)
        torch.cuda.synchronize(device)
    with _lock:
        _done.add(key)
    return key


def prewarm_indexer(caps, *, device: torch.device | str | None = None, scratch: torch.Tensor | None = None) -> list:
    """Resolve an indexer plan's artifacts and launch every route a call with up to
    caps.max_batched rows can take: the fused path and logits + top-k, each at one row and at
    max_batched rows, at a one-chunk width and at caps.max_width (the wide top-k), plus MTP row
    pairs (the row-pair logits kernel) on paged sm_90a.

    Returns the (route, rows, width) triples that ran. `scratch` is the engine's workspace."""
    import dataclasses

    from . import indexer

    device = torch.device(device or f"cuda:{torch.cuda.current_device()}")
    base = indexer.plan(caps)
    for spec in base.specs():
        registry.resolve(spec)
    routes = [("unfused", False)] + ([("fused", True)] if base.fused_spec is not None else [])
    plans = {name: indexer.plan(dataclasses.replace(caps, fused=flag)) for name, flag in routes}
    if scratch is None:
        scratch = torch.empty(max(p.scratch_bytes() for p in plans.values()), dtype=torch.uint8, device=device)
    ran = []
    t = base.tiling
    widths = sorted({min(caps.max_width, t["chunk"]), min(caps.max_width, max(t["chunk"], t["row_chunk"])),
                     caps.max_width})
    with torch.cuda.device(device):
        for name, p in plans.items():
            for rows in sorted({1, caps.max_batched}):
                for width in widths:
                    _warm_indexer_call(p, scratch, rows, width, device)
                    ran.append((name, rows, width))
        if base.logits_pair_spec is not None and caps.max_batched >= 2:
            # MTP: two query rows per request take the row-pair logits kernel
            p = plans["unfused"]
            for rows in sorted({2, caps.max_batched // 2 * 2}):
                for width in widths:
                    _warm_indexer_call(p, scratch, rows, width, device, rows_per_req=2)
                    ran.append(("mtp-pairs", rows, width))
        torch.cuda.synchronize(device)
    return ran


def _warm_indexer_call(p, scratch: torch.Tensor, rows: int, width: int, device: torch.device,
                       rows_per_req: int = 1) -> None:
    """One index + top-k call on a tiny cache (every page of the block table is page 0)."""
    from . import indexer

    caps = p.caps
    h = caps.num_heads
    q = torch.zeros(rows, h, indexer.INDEX_DIM, device=device).to(torch.float8_e4m3fn)
    w = torch.ones(rows, h, device=device)
    if caps.mode == "paged":
        pages = -(-width // indexer.PAGE)
        bt = torch.zeros(rows // rows_per_req, pages, dtype=torch.int32, device=device)
        lengths = torch.full((rows,), width * caps.compress_ratio, dtype=torch.int32, device=device)
        kv = torch.zeros(1, indexer.PAGE, indexer.K_RECORD, dtype=torch.uint8, device=device)
        b = indexer.bind(p, scratch=scratch, q=q, weights=w, lengths=lengths, block_table=bt, width=width)
    else:
        kv = (torch.zeros(width, indexer.INDEX_DIM, device=device).to(torch.float8_e4m3fn),
              torch.ones(width, device=device))
        starts = torch.zeros(rows, dtype=torch.int32, device=device)
        ends = torch.full((rows,), width, dtype=torch.int32, device=device)
        b = indexer.bind(p, scratch=scratch, q=q, weights=w, lengths=ends, starts=starts, width=width)
    indexer.run_index_topk(b, kv_cache=kv)
